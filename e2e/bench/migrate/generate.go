package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/e2e/framework"
)

// genConfig bounds a generation.
type genConfig struct {
	keys int
	// maxRSS stops the generation when etcd 3.4's resident memory passes it.
	maxRSS int64
	// memLimit is etcd's GOMEMLIMIT: its Go runtime collects hard before going past it.
	memLimit int64
	out      io.Writer
	// peak is the highest RSS seen of the generation's etcd processes.
	peak atomic.Int64
}

// generate makes dir a v2 member data dir holding cfg.keys keys, in three steps, none of which
// needs a v2 snapshot taken by a live etcd (at 1M keys etcd 3.4 holds the store, a clone and
// three copies of a 3 GB JSON per snapshot, and was OOM-killed at 24 GB):
//
//  1. etcd 3.4 starts on an empty dir with --snapshot-count=1 and takes a snapshot of its
//     membership-only store; it is stopped.
//  2. That snapshot is replaced, at the same index and term, by one holding the first 90% of the
//     keys, streamed to disk in the JSON etcd's v2store writes (byte for byte: a test checks it).
//  3. etcd 3.4 starts on the result (which checks it: it loads the snapshot and serves sample keys
//     as expected) and the last 10% are written through its v2 API with TTLs, updates and
//     deletes, by 8 writers: the WAL tail is etcd's own. It never snapshots again.
//
// etcd's RSS is watched all along; a failed generation removes what it made and says why.
func generate(ctx context.Context, dir string, cfg *genConfig) (err error) {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	env, err := framework.NewEnv("", nil)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, env.Close())
		if err != nil {
			os.RemoveAll(tmp)
			err = fmt.Errorf("generating the v2 store failed; nothing was kept in %s: %w", filepath.Dir(dir), err)
		}
		os.RemoveAll(env.Dir)
	}()
	d := dataset{n: cfg.keys, split: cfg.keys * 9 / 10, expire: time.Now().Add(time.Hour).UTC()}
	t := time.Now()
	if d.base, err = skeleton(ctx, env, tmp, d, cfg); err != nil {
		return err
	}
	fmt.Fprintf(cfg.out, "  snapshot of %d keys built in %s\n", d.split, time.Since(t).Round(time.Second))
	t = time.Now()
	if err := writeTail(ctx, env, tmp, d, cfg); err != nil {
		return err
	}
	fmt.Fprintf(cfg.out, "  etcd 3.4 loaded it and took %d more keys through its v2 API in %s\n", d.n-d.split, time.Since(t).Round(time.Second))
	fmt.Fprintf(cfg.out, "  etcd 3.4 peak RSS %.1f GiB (GOMEMLIMIT %.1f GiB, limit %.1f GiB)\n", gib(cfg.peak.Load()), gib(cfg.memLimit), gib(cfg.maxRSS))
	return os.Rename(tmp, dir)
}

// skeleton runs step 1 and 2: it returns the v2 store index the keys start after.
func skeleton(ctx context.Context, env *framework.Env, tmp string, d dataset, cfg *genConfig) (uint64, error) {
	e, err := startEtcd34(ctx, env, "skeleton", tmp, cfg, "--snapshot-count=1")
	if err != nil {
		return 0, err
	}
	snapDir := filepath.Join(tmp, "member", "snap")
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		snaps, err := filepath.Glob(filepath.Join(snapDir, "*.snap"))
		return len(snaps) > 0, err
	})
	if err = errors.Join(err, e.stop()); err != nil {
		return 0, fmt.Errorf("etcd 3.4 took no snapshot of a fresh member (see %s): %w", e.proc.LogPath, err)
	}
	// Listed only now that etcd has exited: it may have saved another snapshot after the one the
	// wait saw, and the newest is the one it boots from.
	newest, older, err := snapshotsIn(snapDir)
	if err != nil {
		return 0, err
	}
	skel, meta, err := readSkeleton(newest)
	if err != nil {
		return 0, err
	}
	d.base = skel.CurrentIndex
	jsonPath := filepath.Join(snapDir, "store.json.tmp")
	f, err := os.Create(jsonPath)
	if err != nil {
		return 0, err
	}
	defer os.Remove(jsonPath)
	size, err := writeStore(f, skel, d)
	if err = errors.Join(err, f.Close()); err != nil {
		return 0, fmt.Errorf("write the v2 store's JSON: %w", err)
	}
	for _, s := range append(older, newest) { // they hold the empty store: etcd would purge them too
		if err := os.Remove(s); err != nil {
			return 0, err
		}
	}
	if err := writeSnapFile(newest, meta, jsonPath, size); err != nil {
		return 0, fmt.Errorf("write the snapshot file: %w", err)
	}
	return skel.CurrentIndex, nil
}

// snapshotsIn returns the newest etcd snapshot file in dir and the older ones. Their names
// are etcd's term-index in fixed-width hex, so the order of the names is theirs.
func snapshotsIn(dir string) (newest string, older []string, err error) {
	snaps, err := filepath.Glob(filepath.Join(dir, "*.snap"))
	if err != nil {
		return "", nil, err
	}
	if len(snaps) == 0 {
		return "", nil, fmt.Errorf("no etcd snapshot in %s", dir)
	}
	sort.Strings(snaps)
	return snaps[len(snaps)-1], snaps[:len(snaps)-1], nil
}

// writeTail runs step 3.
func writeTail(ctx context.Context, env *framework.Env, tmp string, d dataset, cfg *genConfig) error {
	e, err := startEtcd34(ctx, env, "tail", tmp, cfg, "--snapshot-count=100000000", "--quota-backend-bytes=8589934592")
	if err != nil {
		return err
	}
	c := &framework.V2Client{Endpoint: e.url}
	err = errors.Join(checkSamples(e.ctx, c, d), writeKeys(e.ctx, c, d, cfg.out))
	return errors.Join(e.err(err), e.stop())
}

// checkSamples reads back keys of the built snapshot through etcd: one of each kind.
func checkSamples(ctx context.Context, c *framework.V2Client, d dataset) error {
	for _, i := range []int{0, 1, 5, 7, d.split / 2, d.split - 1} {
		if i < 0 || i >= d.split {
			continue
		}
		r, err := c.Do(ctx, "GET", key(i), nil)
		switch {
		case err != nil:
			return err
		case deleted(i) && r.ErrorCode != 100:
			return fmt.Errorf("etcd 3.4 serves deleted key %s from the built snapshot: %+v", key(i), r)
		case !deleted(i) && (r.Node.Value != finalValue(i) || r.Node.ModifiedIndex < d.index(i)):
			return fmt.Errorf("etcd 3.4 serves key %s from the built snapshot as %.80q (index %d, error code %d %q), not as built", key(i), r.Node.Value, r.Node.ModifiedIndex, r.ErrorCode, r.Message)
		}
	}
	return nil
}

// writeKeys writes keys split..n-1 as the dataset says, by 8 concurrent writers.
func writeKeys(ctx context.Context, c *framework.V2Client, d dataset, out io.Writer) error {
	var next, done atomic.Int64
	next.Store(int64(d.split))
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < d.n; i = int(next.Add(1) - 1) {
				if err := writeKey(ctx, c, i); err != nil {
					errs <- err
					return
				}
				if n := done.Add(1); n%50000 == 0 {
					fmt.Fprintf(out, "  %d keys written\n", d.split+int(n))
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func writeKey(ctx context.Context, c *framework.V2Client, i int) error {
	p := url.Values{"value": {value(i)}}
	if isEvent(i) {
		p.Set("ttl", "3600")
	}
	for _, op := range []struct {
		do     bool
		method string
		p      url.Values
	}{{true, "PUT", p}, {updated(i), "PUT", url.Values{"value": {"updated"}}}, {deleted(i), "DELETE", url.Values{}}} {
		if !op.do {
			continue
		}
		r, err := c.Do(ctx, op.method, key(i), op.p)
		if err != nil {
			return err
		}
		if r.ErrorCode != 0 {
			return fmt.Errorf("v2 %s %s: %s", op.method, key(i), r.Message)
		}
	}
	return nil
}

// etcd34 is one etcd 3.4 process under an RSS watch: ctx is cancelled when it exits or passes
// the limit, and err says which.
type etcd34 struct {
	proc   *framework.Process
	url    string
	cfg    *genConfig
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func startEtcd34(ctx context.Context, env *framework.Env, name, dataDir string, cfg *genConfig, extra ...string) (*etcd34, error) {
	bin, err := framework.Bin("etcd", framework.Etcd34)
	if err != nil {
		return nil, err
	}
	ports, err := framework.FreePorts(2)
	if err != nil {
		return nil, err
	}
	client, peer := "http://127.0.0.1:"+strconv.Itoa(ports[0]), "http://127.0.0.1:"+strconv.Itoa(ports[1])
	args := append([]string{"--name", "gen", "--data-dir", dataDir, "--enable-v2", "--logger", "zap",
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "gen=" + peer}, extra...)
	e := &etcd34{url: client, cfg: cfg}
	if e.proc, err = env.Start(name, bin, args, fmt.Sprintf("GOMEMLIMIT=%d", cfg.memLimit)); err != nil {
		return nil, err
	}
	e.ctx, e.cancel = context.WithCancelCause(ctx)
	go e.watch()
	c := &framework.V2Client{Endpoint: client}
	// Loading a multi-GB snapshot takes etcd 3.4 minutes on a shared core: wait while it lives.
	err = wait.PollUntilContextCancel(e.ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := c.Do(ctx, "GET", "/", nil)
		return err == nil, nil
	})
	// One sample once etcd serves, so that even a short run is measured at least once.
	if err != nil || e.sample() {
		return nil, errors.Join(e.err(err), e.stop())
	}
	return e, nil
}

// watch samples etcd's RSS until it exits or passes the limit.
func (e *etcd34) watch() {
	_ = wait.PollUntilContextCancel(e.ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		return e.sample(), nil
	})
}

// sample records etcd's RSS; it says true, with the reason as the context's cause, when etcd
// has exited or is over the limit (then it is stopped).
func (e *etcd34) sample() bool {
	if e.proc.Exited() {
		e.cancel(fmt.Errorf("etcd 3.4 exited; see %s", e.proc.LogPath))
		return true
	}
	rss := vmRSS(e.proc.Pid())
	for peak := e.cfg.peak.Load(); rss > peak && !e.cfg.peak.CompareAndSwap(peak, rss); peak = e.cfg.peak.Load() {
	}
	if rss > e.cfg.maxRSS {
		e.cancel(fmt.Errorf("etcd 3.4 reached %.2f GiB RSS, over the %.2f GiB limit (--max-etcd-rss); it was stopped", gib(rss), gib(e.cfg.maxRSS)))
		_ = e.proc.Stop(time.Second)
		return true
	}
	return false
}

// err prefers the watch's reason (etcd exited, too much memory) to what a request saw then.
func (e *etcd34) err(err error) error {
	if cause := context.Cause(e.ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

func (e *etcd34) stop() error {
	e.cancel(context.Canceled)
	return e.proc.Stop(30 * time.Second)
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// vmRSS is a process's resident set in bytes (0 when it cannot be read).
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
