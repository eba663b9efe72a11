// Command demo runs a local blue/green control-plane move with real etcd and kube-apiserver
// behind the kubefence proxy, printing each step with its duration (`make demo`).
//
// Blue is etcd 3.4 + kube-apiserver 1.36 behind `kubefence proxy`, with kube-controller-manager
// and kube-scheduler (leader election on) and a writer, a watcher and a reader running through
// the proxy the whole time. `kubefence cutover --rehearse` predicts the window; then the default
// cutover moves it to green (etcd 3.6 with TLS + kube-apiserver 1.36): snapshot, restore without
// a revision bump, green started, replicated and verified while writes flow, then fence (hold),
// drain, switch, unfence. The plan has bake.enabled: blue (etcd with TLS client certificates)
// follows green after the switch; `kubefence cutover rollback` goes back to blue in the same kind
// of window, then the demo moves forward again and ends the bake with `kubefence cutover finish`.
// It checks that every acknowledged write is on blue after the rollback and on green at the end,
// and that both leaders kept their Leases through the three switches.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	o := options{}
	flag.StringVar(&o.kubefence, "kubefence", "", "kubefence binary (default: build one)")
	flag.BoolVar(&o.keep, "keep", false, "leave everything running at the end and print how to use and stop it")
	flag.BoolVar(&o.manual, "manual", false, "stop before the cutover, leave blue running with the plan written, and print the commands to run it by hand (docs/runbook.md)")
	flag.StringVar(&o.dir, "dir", "", "work dir (default: a new temp dir)")
	flag.IntVar(&o.objects, "objects", 200, "configmaps of ~2 KB to create before the cutover (rehearse at the size of your cluster)")
	flag.IntVar(&o.writeRate, "write-rate", -1, "the client-go writer's writes per second through the proxy during the move; 0 for none, -1 as fast as the API lets it")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP) // a closed terminal too: green is stopped on the way out
	defer stop()
	if o.kubefence != "" {
		if abs, err := filepath.Abs(o.kubefence); err == nil {
			o.kubefence = abs
		}
	}
	if _, err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
		os.Exit(1)
	}
}

type options struct {
	kubefence string
	keep      bool
	manual    bool
	dir       string
	// objects scales the workload (configmaps in the demo namespace).
	objects int
	// writeRate is the client-go writer's rate: writes/s, 0 none, < 0 as fast as it can.
	writeRate int
	// cutoverBound bounds each kubefence cutover command; 0: the plan's timeouts
	// (framework.CutoverBound), for a workload of any size.
	cutoverBound time.Duration
}

// printer prints numbered steps with durations.
type printer struct {
	out   io.Writer
	start time.Time
	step  int
}

func (p *printer) begin(format string, args ...any) func(detail string) {
	p.step++
	n := p.step
	t := time.Now()
	fmt.Fprintf(p.out, "[%6.2fs] %2d. %s ...\n", time.Since(p.start).Seconds(), n, fmt.Sprintf(format, args...))
	return func(detail string) {
		if detail != "" {
			detail = ": " + detail
		}
		fmt.Fprintf(p.out, "[%6.2fs] %2d. done in %s%s\n", time.Since(p.start).Seconds(), n, time.Since(t).Round(time.Millisecond), detail)
	}
}

func (p *printer) note(format string, args ...any) {
	fmt.Fprintf(p.out, "            %s\n", fmt.Sprintf(format, args...))
}
