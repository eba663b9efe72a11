//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/internal/testenv"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// kf runs kubefence and returns stdout, stderr and its exit code.
func kf(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := framework.DiesWithParent(exec.CommandContext(ctx, kubefenceBin, args...))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kubefence %v: %v", args, err)
	}
	t.Logf("kubefence %s -> %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	return out.String(), errb.String(), code
}

// seqWriter writes key prefix+%06d, one after another, and counts what was acknowledged. A put
// that fails (etcd's client does not retry a put on "leader changed" or a timeout, which a
// starved 3-member cluster gives) is sent again, the same key with the same value: a writer that
// stopped at its first error would leave a live copy taken of a quiet cluster, proving nothing.
type seqWriter struct {
	acked, started atomic.Int64
	lastErr        atomic.Pointer[error]
	stop           context.CancelFunc
	done           chan struct{}
}

func startSeqWriter(ctx context.Context, put func(ctx context.Context, i int64) error) *seqWriter {
	ctx, cancel := context.WithCancel(ctx)
	w := &seqWriter{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := int64(0); ctx.Err() == nil; {
			w.started.Store(i + 1)
			if err := put(ctx, i); err != nil {
				// The key may or may not be written; it counts as acknowledged only once a
				// retry is.
				w.lastErr.Store(&err)
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
			w.acked.Store(i + 1)
			i++
		}
	}()
	return w
}

func (w *seqWriter) halt() { w.stop(); <-w.done }

func (w *seqWriter) waitAcked(t *testing.T, n int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); w.acked.Load() < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			var last error
			if e := w.lastErr.Load(); e != nil {
				last = *e
			}
			t.Fatalf("writer acknowledged only %d writes (its last error: %v)", w.acked.Load(), last)
		}
	}
}

// checkPrefix checks that keys under prefix are exactly prefix+000000 .. prefix+(m-1), each with
// its value, and returns m.
func checkPrefix(t *testing.T, what string, keys map[string]string, prefix string) int64 {
	t.Helper()
	var m int64
	for k := range keys {
		if strings.HasPrefix(k, prefix) {
			m++
		}
	}
	for i := int64(0); i < m; i++ {
		k := fmt.Sprintf("%s%06d", prefix, i)
		if v, ok := keys[k]; !ok || v != fmt.Sprintf("value-%d", i) {
			t.Fatalf("%s: %d keys under %s but %s is %q (present %v): not a prefix of the writer's sequence", what, m, prefix, k, v, ok)
		}
	}
	return m
}

// backendValues is readBackendKeys as key -> value.
func backendValues(t *testing.T, dataDir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, kv := range readBackendKeys(t, dataDir) {
		out[k] = string(kv.Value)
	}
	return out
}

func served(t *testing.T, cli *clientv3.Client) map[string]string {
	t.Helper()
	resp, err := cli.Get(t.Context(), "", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

func sameMaps(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	var diffs []string
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			diffs = append(diffs, fmt.Sprintf("%s: got %q (present %v), want %q", k, g, ok, v))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, k+": not expected")
		}
	}
	if len(diffs) > 0 {
		if len(diffs) > 10 {
			diffs = append(diffs[:10], fmt.Sprintf("... %d more", len(diffs)-10))
		}
		t.Fatalf("%s: %d keys differ:\n%s", what, len(diffs), strings.Join(diffs, "\n"))
	}
}

// TestMigrateCopyCluster: a 3-member etcd 3.4 cluster under a v3 writer. `migrate copy
// --endpoints` waits for convergence and takes a snapshot that holds a prefix of the writer's
// sequence at least as long as what was acknowledged before the copy; with the writer stopped,
// exactly what it acknowledged. Then the stopped members' data dirs are upgraded together to
// 3.6 (a multi-member upgrade) and every member holds every acknowledged key.
func TestMigrateCopyCluster(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd35, "etcd", framework.Etcd36)
	ctx := t.Context()
	env := newEnv(t)
	blue, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "copy3", Version: framework.Etcd34, Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := blue.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	w := startSeqWriter(ctx, func(ctx context.Context, i int64) error {
		_, err := cli.Put(ctx, fmt.Sprintf("/writer/%06d", i), fmt.Sprintf("value-%d", i))
		return err
	})
	w.waitAcked(t, 200)
	before := w.acked.Load()
	dir := t.TempDir()
	snap := filepath.Join(dir, "live.db")
	out, _, code := kf(t, "migrate", "copy", "--endpoints", strings.Join(blue.Endpoints(), ","), "--snapshot", snap, "--timeout", "60s", "-o", "json")
	started := w.started.Load()
	if code != 0 {
		t.Fatalf("copy exited %d", code)
	}
	var res struct {
		Snapshot datadir.SnapshotInfo `json:"snapshot"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Snapshot.Members) != 3 {
		t.Fatalf("report names %d members, want 3", len(res.Snapshot.Members))
	}
	lo, hi := res.Snapshot.Members[0].RaftIndex, res.Snapshot.Members[0].RaftIndex
	for _, m := range res.Snapshot.Members {
		lo, hi = min(lo, m.RaftIndex), max(hi, m.RaftIndex)
	}
	if hi-lo > 1 {
		t.Fatalf("raft indexes %d..%d when the copy was taken: not converged", lo, hi)
	}
	m := checkPrefix(t, "live snapshot", snapshotValues(t, snap, filepath.Join(dir, "live")), "/writer/")
	if m < before || m > started {
		t.Fatalf("live snapshot holds %d writes; the writer had %d acknowledged before the copy and had started %d after it", m, before, started)
	}
	t.Logf("live snapshot: %d writes (acknowledged before: %d, started by the end: %d)", m, before, started)

	w.halt()
	acked := w.acked.Load()
	snap2 := filepath.Join(dir, "quiet.db")
	if _, _, code := kf(t, "migrate", "copy", "--endpoints", strings.Join(blue.Endpoints(), ","), "--snapshot", snap2); code != 0 {
		t.Fatalf("copy exited %d", code)
	}
	// Not acknowledged does not mean not written: the write the halt interrupted may be there.
	if got := checkPrefix(t, "quiet snapshot", snapshotValues(t, snap2, filepath.Join(dir, "quiet")), "/writer/"); got != acked && got != acked+1 {
		t.Fatalf("quiet snapshot holds %d writes, the writer acknowledged %d", got, acked)
	}
	if _, _, code := kf(t, "migrate", "copy", "--endpoints", strings.Join(blue.Endpoints(), ","), "--snapshot", snap2); code != 2 {
		t.Fatalf("copy over an existing snapshot file exited %d, want 2", code)
	}

	// A multi-member upgrade of the stopped cluster: 3.4 -> 3.5 -> 3.6, all three together.
	if err := blue.Stop(); err != nil {
		t.Fatal(err)
	}
	want := backendValues(t, blue.Members[0].DataDir)
	args := []string{"migrate", "upgrade", "--target-version", framework.Etcd36, "--bin-dir", framework.BinDir(), "--backup-dir", filepath.Join(dir, "backups"), "-o", "json"}
	for _, mem := range blue.Members {
		args = append(args, "--data-dir", mem.DataDir)
	}
	out, _, code = kf(t, args...)
	if code != 0 {
		t.Fatalf("upgrade exited %d", code)
	}
	var rep datadir.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Steps) != 3 || len(rep.Backups) != 3 {
		t.Fatalf("report: %d steps, %d backups; want 3 steps (backup, 3.5, 3.6) and 3 backups", len(rep.Steps), len(rep.Backups))
	}
	for _, s := range rep.Steps {
		if len(s.Members) != 3 {
			t.Fatalf("step %s reports on %d members, want 3", s.Name, len(s.Members))
		}
	}
	for _, mem := range blue.Members {
		if got := rep.After[mem.DataDir]; got != framework.Etcd36+"/etcd3" {
			t.Fatalf("%s: version file %q", mem.DataDir, got)
		}
		sameMaps(t, mem.DataDir+" after the upgrade", backendValues(t, mem.DataDir), want)
	}
}

// snapshotValues opens a snapshot (a backend plus etcd's sha256) as a member dir's backend.
func snapshotValues(t *testing.T, snap, dir string) map[string]string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "member", "snap"), 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := datadir.CopyFile(t.Context(), snap, filepath.Join(dir, "member", "snap", "db"), st.Size()-32); err != nil {
		t.Fatal(err)
	}
	return backendValues(t, dir)
}

// TestMigrateCopyLiveMember: a running etcd 3.4 member under a v2 writer, snapshotting every
// 100 entries. Copying its data dir without --live is refused; with --live the copy is a
// consistent prefix of its log: the v2 keys migrated from it are exactly the writer's first m
// writes, at least those acknowledged before the copy began, and the copy passes its manifest.
func TestMigrateCopyLiveMember(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34)
	ctx := t.Context()
	env := newEnv(t)
	blue, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "live", Version: framework.Etcd34, EnableV2: true, ExtraArgs: []string{"--snapshot-count=100"}})
	if err != nil {
		t.Fatal(err)
	}
	mem := blue.Members[0]
	v2 := &framework.V2Client{Endpoint: mem.ClientURL}
	w := startSeqWriter(ctx, func(ctx context.Context, i int64) error {
		r, err := v2.Do(ctx, "PUT", fmt.Sprintf("/v2writer/%06d", i), url.Values{"value": {fmt.Sprintf("value-%d", i)}})
		if err == nil && r.ErrorCode != 0 {
			err = errors.New(r.Message)
		}
		return err
	})
	defer w.halt()
	w.waitAcked(t, 400)
	dir := t.TempDir()

	refused := filepath.Join(dir, "refused")
	_, stderr, code := kf(t, "migrate", "copy", "--data-dir", mem.DataDir, "--output-dir", refused)
	if code == 0 || !strings.Contains(stderr, "--live") || !strings.Contains(stderr, "running etcd") {
		t.Fatalf("copy of a running member without --live: exit %d, %s", code, stderr)
	}
	if _, err := os.Stat(refused); !os.IsNotExist(err) {
		t.Fatalf("the refused copy left %s behind", refused)
	}

	before := w.acked.Load()
	cp := filepath.Join(dir, "copy")
	if _, _, code := kf(t, "migrate", "copy", "--data-dir", mem.DataDir, "--output-dir", cp, "--live", "--endpoint", mem.ClientURL); code != 0 {
		t.Fatalf("live copy exited %d", code)
	}
	started := w.started.Load()
	if _, err := datadir.VerifyManifest(t.Context(), cp); err != nil {
		t.Fatal(err)
	}
	snaps, _ := filepath.Glob(filepath.Join(cp, "member", "snap", "*.snap"))
	if len(snaps) == 0 {
		t.Fatal("the copy has no v2 snapshot file: the test did not exercise snapshot + WAL")
	}
	out := filepath.Join(dir, "migrated")
	if _, _, code := kf(t, "migrate", "v2-to-v3", "--data-dir", cp, "--output-dir", out,
		"--name", "n", "--initial-cluster", "n=http://127.0.0.1:1", "--initial-advertise-peer-urls", "http://127.0.0.1:1"); code != 0 {
		t.Fatalf("migrating the live copy exited %d", code)
	}
	m := checkPrefix(t, "live member copy", backendValues(t, out), "/v2writer/")
	if m < before || m > started {
		t.Fatalf("the copy holds %d writes; %d were acknowledged before it began and %d started by its end", m, before, started)
	}
	t.Logf("live member copy: %d writes (acknowledged before: %d, started by the end: %d), %d snapshot file(s)", m, before, started, len(snaps))
}

// v2Fixture is a stopped etcd 3.4 data dir holding v2 keys (TTL keys among them) and v3 keys.
func v2Fixture(t *testing.T, env *framework.Env, name string) string {
	t.Helper()
	ctx := t.Context()
	e, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: name, Version: framework.Etcd34, EnableV2: true, ExtraArgs: []string{"--snapshot-count=100"}})
	if err != nil {
		t.Fatal(err)
	}
	writeV2Data(t, &framework.V2Client{Endpoint: e.Members[0].ClientURL})
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/v3/pods/p-%03d", i), fmt.Sprintf("pod %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	cli.Close()
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	return e.Members[0].DataDir
}

// startOn starts etcd version on an existing single-member data dir and returns what it serves.
func startOn(t *testing.T, env *framework.Env, version, name, dataDir string) map[string]string {
	t.Helper()
	e, err := env.StartEtcd(t.Context(), framework.EtcdConfig{Name: name, Version: version, DataDirs: []string{dataDir}})
	if err != nil {
		t.Fatalf("etcd %s on %s: %v", version, dataDir, err)
	}
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	got := served(t, cli)
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestMigrateUpgradeDowngrade: a 3.4 data dir with v2 and v3 content is upgraded to 3.6 through
// 3.5, with the run killed (kill -9) during the 3.5 step and run again: the rerun repeats that
// step, takes no second backup, migrates the v2 content, and etcd 3.6 serves every key; the
// version file says 3.6.x/etcd3. Then 3.6 -> 3.5: etcd 3.5 serves every key.
func TestMigrateUpgradeDowngrade(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd35, "etcd", framework.Etcd36)
	env := newEnv(t)
	src := v2Fixture(t, env, "up")
	dir := t.TempDir()
	// What the keys must be: the v2 -> v3 migration of the same data, checked against etcdctl
	// migrate by TestMigrateV2ToV3, next to the v3 keys.
	ref := filepath.Join(dir, "reference")
	if _, _, code := kf(t, "migrate", "v2-to-v3", "--data-dir", src, "--output-dir", ref,
		"--name", "n", "--initial-cluster", "n=http://127.0.0.1:1", "--initial-advertise-peer-urls", "http://127.0.0.1:1"); code != 0 {
		t.Fatal("reference migration failed")
	}
	want := backendValues(t, ref)
	if len(want) < 150 {
		t.Fatalf("reference has only %d keys", len(want))
	}
	backups := filepath.Join(dir, "backups")
	up := []string{"migrate", "upgrade", "--data-dir", src, "--target-version", framework.Etcd36, "--bin-dir", framework.BinDir(), "--backup-dir", backups}

	// Run, and kill -9 kubefence as soon as etcd 3.5 runs on the data dir.
	cmd := framework.DiesWithParent(exec.Command(kubefenceBin, up...))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var step35 int
	for deadline := time.Now().Add(60 * time.Second); step35 == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("etcd 3.5 never ran on %s:\n%s", src, out.String())
		}
		step35 = findCmdline("etcd-"+framework.Etcd35, src)
	}
	time.Sleep(300 * time.Millisecond) // let it get going
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	t.Logf("killed kubefence during the 3.5 step:\n%s", out.String())
	for deadline := time.Now().Add(10 * time.Second); framework.Running(step35); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			syscall.Kill(step35, syscall.SIGKILL)
			t.Fatal("the step's etcd outlived the killed kubefence")
		}
	}
	if _, err := datadir.Detect(src, ""); err != nil {
		t.Fatalf("after the kill the data dir is not readable: %v", err)
	}

	stdout, _, code := kf(t, up...)
	if code != 0 {
		t.Fatalf("rerun exited %d", code)
	}
	if !strings.Contains(stdout, "repeated") || !strings.Contains(stdout, "done by an earlier run") {
		t.Fatal("the rerun does not say it resumed")
	}
	if entries, _ := filepath.Glob(filepath.Join(backups, "*-*-*Z")); len(entries) != 1 {
		t.Fatalf("%d backups after a resumed upgrade, want 1: %v", len(entries), entries)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "version.txt")); strings.TrimSpace(string(b)) != framework.Etcd36+"/etcd3" {
		t.Fatalf("version.txt = %q", b)
	}
	sameMaps(t, "etcd 3.6 after the upgrade", startOn(t, env, framework.Etcd36, "up36", src), want)

	if _, _, code := kf(t, "migrate", "downgrade", "--data-dir", src, "--target-version", framework.Etcd35, "--bin-dir", framework.BinDir(), "--backup-dir", backups); code != 0 {
		t.Fatalf("downgrade exited %d", code)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "version.txt")); strings.TrimSpace(string(b)) != framework.Etcd35+"/etcd3" {
		t.Fatalf("version.txt = %q", b)
	}
	sameMaps(t, "etcd 3.5 after the downgrade", startOn(t, env, framework.Etcd35, "down35", src), want)

	// 3.5 -> 3.4 is what etcd cannot do: refused with the reason, nothing changed.
	before, _ := datadir.HashDir(t.Context(), src)
	_, stderr, code := kf(t, "migrate", "downgrade", "--data-dir", src, "--target-version", framework.Etcd34, "--bin-dir", framework.BinDir(), "--backup-dir", backups)
	if code == 0 || !strings.Contains(stderr, "3.6 to 3.5 only") {
		t.Fatalf("downgrade to 3.4: exit %d, %s", code, stderr)
	}
	after, _ := datadir.HashDir(t.Context(), src)
	if err := datadir.Compare(before.Map(), after); err != nil {
		t.Fatalf("a refused downgrade changed the data dir: %v", err)
	}
}

// findCmdline returns the pid of a process whose command line has bin as its program and
// contains want, or 0.
func findCmdline(bin, want string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) == bin && strings.Contains(string(b), want) {
			return pid
		}
	}
	return 0
}

// TestMigrateBadInputs: each bad input gets its clear error and leaves the data dir it was given
// exactly as it was (checked with kubefence's manifest and by modification times): the source,
// or the copy of it a case with a version file runs on.
func TestMigrateBadInputs(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd36)
	env := newEnv(t)
	src := v2Fixture(t, env, "bad")
	dir := t.TempDir()
	// untouched records dataDir as it is now; the check it returns fails when it changed since.
	untouched := func(dataDir string) func(what string) {
		t.Helper()
		manifest, err := datadir.HashDir(t.Context(), dataDir)
		if err != nil {
			t.Fatal(err)
		}
		digest := dirDigest(t, dataDir)
		return func(what string) {
			t.Helper()
			now, err := datadir.HashDir(t.Context(), dataDir)
			if err != nil {
				t.Fatal(err)
			}
			if err := datadir.Compare(manifest.Map(), now); err != nil {
				t.Fatalf("%s changed the data dir it was given, %s: %v", what, dataDir, err)
			}
			if dirDigest(t, dataDir) != digest {
				t.Fatalf("%s touched the data dir it was given, %s (file times or sizes changed)", what, dataDir)
			}
		}
	}
	intact := untouched(src)
	bins := framework.BinDir()
	onlyNew := filepath.Join(dir, "bin-without-3.5")
	if err := os.MkdirAll(onlyNew, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(bins, "etcd-"+framework.Etcd36), filepath.Join(onlyNew, "etcd-"+framework.Etcd36)); err != nil {
		t.Fatal(err)
	}
	nonEmpty := filepath.Join(dir, "not-empty")
	if err := os.MkdirAll(nonEmpty, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nonEmpty, "keep-me"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	backups := filepath.Join(dir, "backups")
	upgrade := func(binDir string) func(string) []string {
		return func(d string) []string {
			return []string{"migrate", "upgrade", "--data-dir", d, "--target-version", framework.Etcd36, "--bin-dir", binDir, "--backup-dir", backups}
		}
	}
	// A case with a version file runs on a copy of the source with that file added.
	cases := []struct {
		name       string
		versionTxt string
		args       func(dataDir string) []string
		want       []string
	}{
		{"garbled version file", "3.4.23/etcd", upgrade(bins), []string{"version.txt", "neither etcd2 nor etcd3", "Fix it by hand"}},
		{"empty version file", "\n", upgrade(bins), []string{"version.txt", "empty", "delete it"}},
		{"version file hides v2 content", "3.4.23/etcd3\n", upgrade(bins), []string{"holds v2 content", "3.4.23/etcd2"}},
		{"garbled version file, detect", "three.four", func(d string) []string { return []string{"migrate", "detect", "--data-dir", d} }, []string{"not <etcd version>/<etcd2|etcd3>"}},
		{"missing binary", "", upgrade(onlyNew), []string{"has no etcd-3.5.* binary", "etcd-" + framework.Etcd36}},
		{"downgrade to 3.3", "", func(d string) []string {
			return []string{"migrate", "downgrade", "--data-dir", d, "--target-version", "3.3.0", "--bin-dir", bins, "--backup-dir", backups}
		}, []string{"3.6 to 3.5 only"}},
		{"non-empty target", "", func(d string) []string { return []string{"migrate", "copy", "--data-dir", d, "--output-dir", nonEmpty} }, []string{"not empty"}},
		{"output inside the source", "", func(d string) []string {
			return []string{"migrate", "copy", "--data-dir", d, "--output-dir", filepath.Join(d, "copy")}
		}, []string{"must not be inside"}},
		{"live without an endpoint", "", func(d string) []string {
			return []string{"migrate", "copy", "--data-dir", d, "--output-dir", filepath.Join(dir, "x"), "--live"}
		}, []string{"--endpoint"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, given := src, intact
			if c.versionTxt != "" {
				d = filepath.Join(dir, fmt.Sprintf("case-%d", i))
				copyDir(t, src, d)
				if err := os.WriteFile(filepath.Join(d, "version.txt"), []byte(c.versionTxt), 0o600); err != nil {
					t.Fatal(err)
				}
				given = untouched(d)
			}
			_, stderr, code := kf(t, c.args(d)...)
			if code == 0 {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("error %q does not say %q", stderr, w)
				}
			}
			given(c.name)
			intact(c.name)
		})
	}
	if b, err := os.ReadFile(filepath.Join(nonEmpty, "keep-me")); err != nil || string(b) != "x" {
		t.Fatal("the non-empty target was changed")
	}
	if entries, _ := filepath.Glob(filepath.Join(backups, "*")); len(entries) > 0 {
		t.Fatalf("refused runs left backups or journals: %v", entries)
	}

	// A full disk: copy onto a small tmpfs. The error says so; nothing partial stays behind.
	mnt := filepath.Join(dir, "tmpfs")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt).CombinedOutput(); err != nil {
		if os.Geteuid() == 0 {
			t.Fatalf("mount a tmpfs as root: %v %s", err, out)
		}
		testenv.SkipOrFail(t, fmt.Sprintf("the full-disk case needs a tmpfs mount, which needs root: %v %s", err, out))
	}
	defer exec.Command("umount", mnt).Run()
	full := filepath.Join(mnt, "copy")
	_, stderr, code := kf(t, "migrate", "copy", "--data-dir", src, "--output-dir", full)
	if code == 0 || !strings.Contains(stderr, "no space left on device") || !strings.Contains(stderr, "is full") {
		t.Fatalf("copy onto a full disk: exit %d, %s", code, stderr)
	}
	if entries, _ := os.ReadDir(mnt); len(entries) != 0 {
		t.Fatalf("a failed copy left %d entries on the full disk", len(entries))
	}
	intact("the full-disk copy")
}

// TestMigrateDataWithAuth: data with etcd auth on (as every green of a replicating cutover has,
// and blue after a bake) is upgraded 3.5 -> 3.6 and downgraded back to 3.5: each step's etcd
// is checked as root by a client certificate kubefence makes for the run, whatever root's
// password, and the data keeps its keys, its users and auth on.
func TestMigrateDataWithAuth(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd35, "etcd", framework.Etcd36)
	env, pki := newEnvPKI(t)
	cfg := framework.EtcdConfig{Name: "auth", Version: framework.Etcd35, TLS: true, PKI: pki}
	e, err := env.StartEtcd(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	src := e.Members[0].DataDir
	want := authedData(t, e)
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	backups := filepath.Join(t.TempDir(), "backups")
	for _, run := range [][]string{
		{"upgrade", "--target-version", framework.Etcd36},
		{"downgrade", "--target-version", framework.Etcd35},
	} {
		args := append([]string{"migrate"}, run...)
		stdout, stderr, code := kf(t, append(args, "--data-dir", src, "--bin-dir", framework.BinDir(), "--backup-dir", backups, "--step-timeout", "30s")...)
		if code != 0 {
			t.Fatalf("migrate %s on data with auth on exited %d:\n%s\n%s", run[0], code, stdout, stderr)
		}
	}
	cfg.Name, cfg.DataDirs = "auth35", []string{src}
	after, err := env.StartEtcd(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := after.Client() // the health-check certificate: its user has role root
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if st, err := cli.AuthStatus(t.Context()); err != nil || !st.Enabled {
		t.Fatalf("after the migration: auth status %+v, %v; want auth on", st, err)
	}
	users, err := cli.UserList(t.Context())
	if err != nil || !slices.Contains(users.Users, "root") {
		t.Fatalf("after the migration: users %v, %v; want root among them", users, err)
	}
	sameMaps(t, "etcd 3.5 after the upgrade and the downgrade", served(t, cli), want)
}

// authedData writes keys to e (TLS, kubeadm's certificates) and turns auth on: root with a
// password, and the health-check certificate's user (no password) with role root, as a
// kubeadm cluster with etcd auth has; it returns the keys.
func authedData(t *testing.T, e *framework.Etcd) map[string]string {
	t.Helper()
	ctx := t.Context()
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	want := map[string]string{}
	for i := range 20 {
		k, v := fmt.Sprintf("/registry/configmaps/default/cm-%02d", i), fmt.Sprint(i)
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		want[k] = v
	}
	const certUser = "kube-etcd-healthcheck-client"
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", "a password kubefence does not know"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error {
			_, err := cli.UserAddWithOptions(ctx, certUser, "", &clientv3.UserAddOptions{NoPassword: true})
			return err
		},
		func() error { _, err := cli.UserGrantRole(ctx, certUser, "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	return want
}
