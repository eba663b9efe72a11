// Command migrate measures `kubefence migrate v2-to-v3` against `etcdctl migrate` (etcd 3.4.23)
// on a v2 data dir written by real etcd 3.4 through its v2 API (`make bench-migrate`):
// Kubernetes-like JSON values of 1-4 KB under /registry, ~5% events with a TTL, updates and
// deletes, a snapshot and a WAL tail. Each tool runs on its own fresh copy; wall time and peak
// RSS (getrusage) are printed side by side. The generated data dir is cached by size.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
)

func main() {
	bin := flag.String("kubefence", "", "kubefence binary (default: build one)")
	keys := flag.Int("keys", 1_000_000, "keys to write into the v2 store")
	cache := flag.String("cache", "", "where generated data dirs are kept (default: next to the e2e binaries)")
	flag.Parse()
	if err := run(context.Background(), *bin, *keys, *cache, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-migrate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin string, n int, cache string, out io.Writer) error {
	work, err := os.MkdirTemp("", "kubefence-bench-migrate-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if bin == "" {
		if bin, err = framework.Kubefence(work); err != nil {
			return err
		}
	}
	if cache == "" {
		cache = filepath.Join(filepath.Dir(framework.BinDir()), "bench-data")
	}
	src := filepath.Join(cache, fmt.Sprintf("v2-%d.etcd", n))
	if _, err := os.Stat(filepath.Join(src, "member")); err != nil {
		fmt.Fprintf(out, "generating a v2 store of %d keys with etcd %s (cached in %s) ...\n", n, framework.Etcd34, src)
		start := time.Now()
		if err := generate(ctx, src, n, out); err != nil {
			return err
		}
		fmt.Fprintf(out, "generated in %s\n", time.Since(start).Round(time.Second))
	}
	snapBytes := int64(0)
	snaps, _ := filepath.Glob(filepath.Join(src, "member", "snap", "*.snap"))
	for _, s := range snaps {
		if st, err := os.Stat(s); err == nil && st.Size() > snapBytes {
			snapBytes = st.Size()
		}
	}
	etcdctl, err := framework.Bin("etcdctl", framework.Etcd34)
	if err != nil {
		return err
	}
	type row struct {
		tool string
		wall time.Duration
		rss  int64
	}
	var rows []row
	// kubefence: builds a new member data dir that etcd 3.6 starts on.
	kcopy := filepath.Join(work, "kubefence-src")
	if err := cp(src, kcopy); err != nil {
		return err
	}
	wall, rss, err := timed(exec.CommandContext(ctx, bin, "migrate", "v2-to-v3", "--data-dir", kcopy, "--output-dir", filepath.Join(work, "kubefence-out"),
		"--name", "m", "--initial-cluster", "m=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380"))
	if err != nil {
		return fmt.Errorf("kubefence: %w", err)
	}
	rows = append(rows, row{"kubefence migrate v2-to-v3", wall, rss})
	os.RemoveAll(kcopy)
	os.RemoveAll(filepath.Join(work, "kubefence-out"))
	// etcdctl migrate: converts in place (the result still holds the v2 content etcd 3.6 refuses).
	ecopy := filepath.Join(work, "etcdctl-src")
	if err := cp(src, ecopy); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, etcdctl, "migrate", "--data-dir", ecopy)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	wall, rss, err = timed(cmd)
	if err != nil {
		return fmt.Errorf("etcdctl migrate: %w", err)
	}
	rows = append(rows, row{"etcdctl migrate (3.4.23)", wall, rss})

	fmt.Fprintf(out, "\nv2 store: %d keys; newest snapshot %.1f MB\n", n, float64(snapBytes)/1e6)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tool\twall\tpeak RSS\tRSS / snapshot\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.0f MB\t%.2fx\t\n", r.tool, r.wall.Round(10*time.Millisecond), float64(r.rss)/1e6, float64(r.rss)/float64(max(snapBytes, 1)))
	}
	tw.Flush()
	fmt.Fprintf(out, "kubefence / etcdctl: wall %.2fx (target <= 0.5x); kubefence peak RSS %.2fx the snapshot (target <= 1.5x)\n",
		float64(rows[0].wall)/float64(rows[1].wall), float64(rows[0].rss)/float64(max(snapBytes, 1)))
	return nil
}

// timed runs cmd and returns its wall time and peak RSS in bytes.
func timed(cmd *exec.Cmd) (time.Duration, int64, error) {
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, fmt.Errorf("%v: %s", err, stderr.String())
	}
	wall := time.Since(start)
	ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	var rss int64
	if ru != nil {
		rss = ru.Maxrss * 1024
	}
	return wall, rss, nil
}

func cp(src, dst string) error {
	if b, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v %s", err, b)
	}
	return nil
}

// generate writes n keys through etcd 3.4's v2 API into dir, pacing so that snapshots (every
// n/4 writes) are taken one at a time, then adds a WAL tail after the last snapshot.
func generate(ctx context.Context, dir string, n int, out io.Writer) error {
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	env, err := framework.NewEnv("", nil)
	if err != nil {
		return err
	}
	defer os.RemoveAll(env.Dir)
	defer env.Close()
	snapCount := max(n/4, 1000)
	e, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "gen", Version: framework.Etcd34, EnableV2: true, DataDirs: []string{tmp},
		ExtraArgs: []string{fmt.Sprintf("--snapshot-count=%d", snapCount), "--quota-backend-bytes=8589934592"}})
	if err != nil {
		return err
	}
	c := &framework.V2Client{Endpoint: e.Endpoints()[0]}
	resources := []string{"configmaps", "secrets", "pods", "services", "deployments", "replicasets", "endpoints", "serviceaccounts"}
	var next, done atomic.Int64
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 42))
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				p := url.Values{}
				key := fmt.Sprintf("/registry/%s/ns-%d/obj-%07d", resources[i%int64(len(resources))], i%50, i)
				if i%20 == 0 { // ~5% events with a TTL
					key = fmt.Sprintf("/registry/events/ns-%d/ev-%07d", i%50, i)
					p.Set("ttl", "3600")
				}
				size := 1024 + r.IntN(3072)
				p.Set("value", fmt.Sprintf(`{"kind":"Object","metadata":{"name":"obj-%d","uid":"%016x"},"spec":{"data":"%s"}}`, i, r.Uint64(), strings.Repeat("x", size)))
				if _, err := c.Do(ctx, "PUT", key, p); err != nil {
					errs <- err
					return
				}
				if i%10 == 5 { // updates and deletes
					p.Set("value", "updated")
					if _, err := c.Do(ctx, "PUT", key, p); err != nil {
						errs <- err
						return
					}
				}
				if i%50 == 7 {
					if _, err := c.Do(ctx, "DELETE", key, url.Values{}); err != nil {
						errs <- err
						return
					}
				}
				if d := done.Add(1); d%100000 == 0 {
					fmt.Fprintf(out, "  %d keys written\n", d)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if err := e.Stop(); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}
