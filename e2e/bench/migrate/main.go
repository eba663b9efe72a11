// Command migrate measures `kubefence migrate v2-to-v3` against `etcdctl migrate` (etcd 3.4.23)
// on a v2 member data dir etcd 3.4 loads and wrote the WAL tail of (`make bench-migrate`):
// Kubernetes-like JSON values of 1-4 KB under /registry, ~5% events with a TTL, updates and
// deletes, a snapshot and a WAL tail (see generate). Each tool runs on its own fresh copy; wall
// time and peak RSS (getrusage) are printed side by side. The generated data dir is cached by
// size.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
)

func main() {
	bin := flag.String("kubefence", "", "kubefence binary (default: build one)")
	keys := flag.Int("keys", 1_000_000, "keys to write into the v2 store")
	cache := flag.String("cache", "", "where generated data dirs are kept (default: next to the e2e binaries)")
	maxRSS := flag.Float64("max-etcd-rss", 10, "GiB of RSS at which the generation stops etcd 3.4 and fails")
	memLimit := flag.Float64("etcd-memory-limit", 6, "GiB given to etcd 3.4 as GOMEMLIMIT while generating")
	flag.Parse()
	if *keys < 1 || *keys > maxKeys {
		fmt.Fprintf(os.Stderr, "bench-migrate: --keys %d: use 1 to %d\n", *keys, maxKeys)
		os.Exit(2)
	}
	gen := &genConfig{keys: *keys, maxRSS: int64(*maxRSS * (1 << 30)), memLimit: int64(*memLimit * (1 << 30)), out: os.Stdout}
	// Ctrl-C cancels the run, so that its temporary dirs (copies of a store of gigabytes) go.
	if err := framework.UntilInterrupted(func(ctx context.Context) error { return run(ctx, *bin, gen, *cache, os.Stdout) }); err != nil {
		fmt.Fprintln(os.Stderr, "bench-migrate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin string, gen *genConfig, cache string, out io.Writer) error {
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
	src, snapBytes, err := source(ctx, gen, cache, out)
	if err != nil {
		return err
	}
	kf, phases, err := runKubefence(ctx, bin, src, work)
	if err != nil {
		return err
	}
	ec, err := runEtcdctl(ctx, src, work)
	if err != nil {
		return err
	}
	printResult(out, gen.keys, snapBytes, []row{kf, ec}, phases)
	return nil
}

type row struct {
	tool string
	wall time.Duration
	rss  int64
}

// source returns the cached v2 store of gen.keys keys, generating it first when missing, and the
// size of its newest snapshot.
func source(ctx context.Context, gen *genConfig, cache string, out io.Writer) (string, int64, error) {
	if cache == "" {
		cache = filepath.Join(filepath.Dir(framework.BinDir()), "bench-data")
	}
	src := filepath.Join(cache, fmt.Sprintf("v2-%d.etcd", gen.keys))
	if _, err := os.Stat(filepath.Join(src, "member")); err != nil {
		fmt.Fprintf(out, "generating a v2 store of %d keys with etcd %s (cached in %s) ...\n", gen.keys, framework.Etcd34, src)
		start := time.Now()
		if err := generate(ctx, src, gen); err != nil {
			return "", 0, err
		}
		fmt.Fprintf(out, "generated in %s\n", time.Since(start).Round(time.Second))
	} else {
		fmt.Fprintf(out, "using the v2 store of %d keys generated before in %s\n", gen.keys, src)
	}
	snapBytes := int64(0)
	snaps, _ := filepath.Glob(filepath.Join(src, "member", "snap", "*.snap"))
	for _, s := range snaps {
		if st, err := os.Stat(s); err == nil && st.Size() > snapBytes {
			snapBytes = st.Size()
		}
	}
	return src, snapBytes, nil
}

// runKubefence builds a new member data dir that etcd 3.6 starts on, from a fresh copy of src,
// and returns the phase times of its report.
func runKubefence(ctx context.Context, bin, src, work string) (row, map[string]float64, error) {
	kcopy, kout := filepath.Join(work, "kubefence-src"), filepath.Join(work, "kubefence-out")
	defer os.RemoveAll(kcopy)
	defer os.RemoveAll(kout)
	if err := cp(src, kcopy); err != nil {
		return row{}, nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "migrate", "v2-to-v3", "--data-dir", kcopy, "--output-dir", kout, "-o", "json",
		"--name", "m", "--initial-cluster", "m=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380")
	var report strings.Builder
	cmd.Stdout = &report
	wall, rss, err := timed(cmd)
	if err != nil {
		return row{}, nil, fmt.Errorf("kubefence: %w", err)
	}
	var rep struct {
		Phases map[string]float64 `json:"phases"`
	}
	if err := json.Unmarshal([]byte(report.String()), &rep); err != nil {
		return row{}, nil, fmt.Errorf("kubefence -o json: %w", err)
	}
	return row{"kubefence migrate v2-to-v3", wall, rss}, rep.Phases, nil
}

// runEtcdctl converts a fresh copy of src in place (the result still holds the v2 content etcd
// 3.6 refuses).
func runEtcdctl(ctx context.Context, src, work string) (row, error) {
	etcdctl, err := framework.Bin("etcdctl", framework.Etcd34)
	if err != nil {
		return row{}, err
	}
	ecopy := filepath.Join(work, "etcdctl-src")
	defer os.RemoveAll(ecopy)
	if err := cp(src, ecopy); err != nil {
		return row{}, err
	}
	cmd := exec.CommandContext(ctx, etcdctl, "migrate", "--data-dir", ecopy)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	wall, rss, err := timed(cmd)
	if err != nil {
		return row{}, fmt.Errorf("etcdctl migrate: %w", err)
	}
	return row{"etcdctl migrate (3.4.23)", wall, rss}, nil
}

func printResult(out io.Writer, n int, snapBytes int64, rows []row, phases map[string]float64) {
	fmt.Fprintf(out, "\nv2 store: %d keys; newest snapshot %.1f MB\n", n, float64(snapBytes)/1e6)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tool\twall\tpeak RSS\tRSS / snapshot\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.0f MB\t%.2fx\t\n", r.tool, r.wall.Round(10*time.Millisecond), float64(r.rss)/1e6, float64(r.rss)/float64(max(snapBytes, 1)))
	}
	tw.Flush()
	// The targets of issue 20 (reading the snapshot once and writing the db once): at 1M keys
	// wall <= 0.2x and peak RSS <= 0.5x the snapshot; at 100k wall <= 0.25x.
	wallTarget, rssTarget := "0.25x", "none below 1M keys"
	if n >= 1_000_000 {
		wallTarget, rssTarget = "0.2x", "<= 0.5x"
	}
	fmt.Fprintf(out, "kubefence / etcdctl: wall %.2fx (target <= %s); kubefence peak RSS %.2fx the snapshot (target %s)\n",
		float64(rows[0].wall)/float64(rows[1].wall), wallTarget, float64(rows[0].rss)/float64(max(snapBytes, 1)), rssTarget)
	fmt.Fprint(out, "kubefence phases (-o json):")
	for _, p := range []string{"readSnapshot", "readWAL", "scanSnapshot", "replayWAL", "transform", "restoreBase", "writeKeys", "verify"} {
		fmt.Fprintf(out, " %s %.2fs", p, phases[p])
	}
	fmt.Fprintln(out)
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
