// Command cutover measures `kubefence cutover` (`make bench-cutover`): for clusters of N
// configmaps of ~2 KB (plus the defaults), the write-unavailability window (fence on → fence
// off) of the default cutover (migration.mode auto: replication onto a TLS green, hold mode),
// several runs per size, with and without a writer through the proxy, and a reader listing
// through the proxy the whole time. It also prints each run's replication throughput and the
// lag it had to drain at the fence.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
)

type config struct {
	bin    string
	sizes  []int
	rates  []int
	runs   int
	window time.Duration // the target for the median window
	// rollback also bakes each cutover and rolls it back, timing the rollback's window.
	rollback bool
	// rehearse runs 'kubefence cutover --rehearse' before each cutover, to print its prediction
	// beside the window.
	rehearse bool
	// greenMembers is the size of green's etcd cluster (all on this machine).
	greenMembers int
	// readerNamespace is the namespace whose configmaps the reader lists during each cutover.
	readerNamespace string
	// watches are held open through the proxy during each cutover (watchers.go), and quiet
	// watches on a namespace nothing changes.
	watches, quiet int
}

func main() {
	var c config
	flag.StringVar(&c.bin, "kubefence", "", "kubefence binary (default: build one)")
	sizes := flag.String("objects", "1000,10000,50000,200000", "cluster sizes (configmaps of ~2 KB) to measure")
	rates := flag.String("write-rates", "0,200", "writer rates (writes/s through the proxy during the whole cutover) to measure each size with; 0 is no writer")
	flag.IntVar(&c.runs, "runs", 3, "cutovers per size and writer rate (each on a fresh copy of the populated blue)")
	flag.BoolVar(&c.rollback, "rollback", true, "bake each cutover (bake.enabled, blue etcd with TLS) for 2 s and roll it back, timing the rollback's window too")
	flag.BoolVar(&c.rehearse, "rehearse", false, "rehearse each cutover first (kubefence cutover --rehearse, the load running) and print the window it predicted beside the window")
	flag.IntVar(&c.greenMembers, "green-members", 1, "members of green's etcd cluster (TLS, all on this machine, whereas a production green has a host for each)")
	flag.StringVar(&c.readerNamespace, "reader-namespace", "kube-system", "namespace whose configmaps the reader lists (50 at a time, 10 ms after each answer) during each cutover; \"bench\" lists the N configmaps, which on blue's etcd 3.4.23 costs a scan of all N per list and slows blue's writes with the size")
	flag.IntVar(&c.watches, "watches", 0, "watches to hold open through the proxy during each cutover (10 per client connection, on a namespace where one configmap changes every second), which the switch moves to green inside the window")
	flag.IntVar(&c.quiet, "quiet-watches", 0, "watches to hold open through the proxy on a namespace nothing changes after they open (10 per client connection): green's apiserver, started later, answers each 410, and the proxy lists the namespace to resume it")
	flag.Parse()
	var err error
	if c.sizes, err = ints(*sizes); err == nil {
		c.rates, err = ints(*rates)
	}
	if err != nil || c.runs < 1 || c.greenMembers < 1 || c.watches < 0 || c.quiet < 0 {
		fmt.Fprintln(os.Stderr, "bench-cutover: -objects and -write-rates take comma-separated integers, -runs and -green-members at least 1, -watches and -quiet-watches at least 0:", err)
		os.Exit(2)
	}
	c.window = time.Second
	err = framework.UntilInterrupted(func(ctx context.Context) error { return run(ctx, c, os.Stdout) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-cutover:", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// key is one size and writer rate.
type key struct{ objects, rate int }

func run(ctx context.Context, c config, out io.Writer) error {
	if c.bin == "" {
		dir, err := os.MkdirTemp("", "kubefence-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if c.bin, err = framework.Kubefence(dir); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "bench-cutover: blue etcd %s (1 member) + kube-apiserver %s -> green etcd %s (TLS, %d member(s)) + kube-apiserver %s, loopback;\n",
		framework.Etcd34, framework.Kube136, framework.Etcd36, c.greenMembers, framework.Kube136)
	fmt.Fprintf(out, "the default cutover (migration.mode auto -> replicate, proxy.fenceMode hold); %d run(s) per size and writer rate, each on a fresh copy of the populated blue\n", c.runs)
	fmt.Fprintf(out, "through the proxy the whole time: a reader listing 50 of namespace %s's configmaps, 10 ms after each answer\n", c.readerNamespace)
	if c.watches > 0 {
		fmt.Fprintf(out, "and %d watches open through the proxy (%d per client connection) on a namespace where one configmap changes every second\n", c.watches, watchersPerConn)
	}
	if c.quiet > 0 {
		fmt.Fprintf(out, "and %d watches open through the proxy (%d per client connection) on a namespace nothing changes after they open\n", c.quiet, watchersPerConn)
	}
	if c.rollback {
		fmt.Fprintf(out, "with bake.enabled (blue etcd with TLS): each cutover bakes %s, then 'kubefence cutover rollback' goes back to blue\n", bakeFor)
	}
	if c.rehearse {
		fmt.Fprintln(out, "each cutover rehearsed first (kubefence cutover --rehearse, the load running): its predicted window is printed beside the window")
	}
	fmt.Fprintln(out)
	results := map[key][]result{}
	for _, n := range c.sizes {
		tmpl, err := populateTemplate(ctx, n, out)
		if err != nil {
			return fmt.Errorf("%d objects: %w", n, err)
		}
		for _, rate := range c.rates {
			for i := range c.runs {
				r, err := measure(ctx, c, tmpl, rate)
				if err != nil {
					tmpl.remove()
					return fmt.Errorf("%d objects, writer %d/s, run %d: %w", n, rate, i+1, err)
				}
				fmt.Fprintln(out, r.line(i+1))
				results[key{n, rate}] = append(results[key{n, rate}], r)
			}
		}
		tmpl.remove()
	}
	summarize(out, c, results)
	return nil
}

// summarize prints the median and max window per size and writer rate, and the targets.
func summarize(out io.Writer, c config, results map[key][]result) {
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configmaps\twriter\truns\twindow median\twindow max\tpredicted median\tbarrier median\trollback median\trollback max\treplication median\tlag at fence (max)\tdrain median\twrites ok\twrites failed\tslowest write\tlists (failed)\t")
	for _, n := range c.sizes {
		for _, rate := range c.rates {
			rs := results[key{n, rate}]
			var reads, failedReads, ok, failed int64
			var lagMax int64
			var slowest time.Duration
			for _, r := range rs {
				reads, failedReads = reads+r.reads, failedReads+r.failedReads
				ok, failed = ok+r.writesOK, failed+r.writesFailed
				lagMax = max(lagMax, r.lagRevisions)
				slowest = max(slowest, r.slowestWrite)
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f rev/s\t%d rev\t%s\t%d\t%d\t%s\t%d (%d)\t\n", n, writerName(rate), len(rs),
				ms(medianOf(rs, func(r result) time.Duration { return r.window })), ms(maxOf(rs, func(r result) time.Duration { return r.window })),
				ms(medianOf(rs, func(r result) time.Duration { return r.predicted })),
				ms(medianOf(rs, func(r result) time.Duration { return r.barrier })),
				ms(medianOf(rs, func(r result) time.Duration { return r.rollback })), ms(maxOf(rs, func(r result) time.Duration { return r.rollback })),
				medianRate(rs), lagMax, ms(medianOf(rs, func(r result) time.Duration { return r.drain })), ok, failed, ms(slowest), reads, failedReads)
		}
	}
	tw.Flush()
	fmt.Fprintln(out)
	for _, rate := range c.rates {
		var medians []time.Duration
		for _, n := range c.sizes {
			medians = append(medians, medianOf(results[key{n, rate}], func(r result) time.Duration { return r.window }))
		}
		worst := slices.Max(medians)
		fmt.Fprintf(out, "%s: largest median window %s (target <= %s at every size)", writerName(rate), ms(worst), c.window)
		if c.rollback {
			var rb []time.Duration
			for _, n := range c.sizes {
				rb = append(rb, medianOf(results[key{n, rate}], func(r result) time.Duration { return r.rollback }))
			}
			fmt.Fprintf(out, "; largest median rollback window %s (target: the same)", ms(slices.Max(rb)))
		}
		if len(medians) > 1 {
			first, last := medians[0], medians[len(medians)-1]
			fmt.Fprintf(out, "; %d -> %d configmaps: %.2fx (target <= 1.3x)", c.sizes[0], c.sizes[len(c.sizes)-1], float64(last)/float64(first))
			if rate > 0 {
				// The barrier is blue's own latency for the writes in flight at the flip.
				steps := func(n int) time.Duration {
					return medianOf(results[key{n, rate}], func(r result) time.Duration { return r.window - r.barrier })
				}
				a, b := steps(c.sizes[0]), steps(c.sizes[len(c.sizes)-1])
				fmt.Fprintf(out, "; the window less the barrier: %s -> %s, %.2fx", ms(a), ms(b), float64(b)/float64(a))
			}
		}
		fmt.Fprintln(out)
	}
}

func writerName(rate int) string {
	if rate == 0 {
		return "no writer"
	}
	return fmt.Sprintf("writer %d/s", rate)
}

func ms(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }

func medianOf(rs []result, f func(result) time.Duration) time.Duration {
	if len(rs) == 0 {
		return 0
	}
	v := make([]time.Duration, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func maxOf(rs []result, f func(result) time.Duration) time.Duration {
	var m time.Duration
	for _, r := range rs {
		m = max(m, f(r))
	}
	return m
}

func medianRate(rs []result) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = r.revisionsPerSecond
	}
	slices.Sort(v)
	return v[len(v)/2]
}
