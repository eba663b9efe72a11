// Command proxy benchmarks the kubefence proxy against a direct connection and against HAProxy
// configured as the same read-only fence (`make bench-proxy`). Everything runs on loopback on
// this machine: a small Go TLS backend (backend.go), the peers in front of it, and a closed-loop
// Go load generator (load.go) with keep-alive HTTP/1.1 or HTTP/2 connections. Beside throughput
// and latency it measures the CPU time of each proxy process alone.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/proxy/admin"
)

type config struct {
	kubefence   string
	concurrency int
	h2Conns     int
	duration    time.Duration
	warmup      time.Duration
	rounds      int
	watchers    int
	watchRate   int
	profile     string
	holdProfile string
	only        string
}

// want says whether the scenario runs: all of them unless -only names one.
func (c config) want(scenario string) bool { return c.only == "" || c.only == scenario }

func main() {
	var c config
	flag.StringVar(&c.kubefence, "kubefence", "", "kubefence binary (default: build one)")
	flag.IntVar(&c.concurrency, "concurrency", 32, "concurrent requests of the load generator (HTTP/1.1: one keep-alive connection each)")
	flag.IntVar(&c.h2Conns, "h2-connections", 8, "HTTP/2 connections the concurrent requests share in the HTTP/2 scenarios")
	flag.DurationVar(&c.duration, "duration", 5*time.Second, "measured time per run")
	flag.DurationVar(&c.warmup, "warmup", time.Second, "unmeasured time before each run")
	flag.IntVar(&c.rounds, "rounds", 3, "runs per scenario; the median run is reported")
	flag.IntVar(&c.watchers, "watchers", 1000, "watches open in the watch fan-out scenario")
	flag.IntVar(&c.watchRate, "watch-events", 10, "events per second sent to every watch in the watch fan-out scenario")
	flag.StringVar(&c.profile, "cpuprofile", "", "write a CPU profile of the kubefence proxy during its first measured run (of the scenario -only names, else HTTP/1.1 reads) to this file")
	flag.StringVar(&c.holdProfile, "hold-cpuprofile", "", "write a CPU profile of the kubefence proxy from fence off in the hold scenario to this file")
	flag.StringVar(&c.only, "only", "", "run only one scenario: "+strings.Join(scenarioNames, ", "))
	flag.Parse()
	err := framework.UntilInterrupted(func(ctx context.Context) error { return run(ctx, c, os.Stdout) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-proxy:", err)
		os.Exit(1)
	}
}

// scenarioNames in the order they run: hold measures the proxy's RSS growth, before the 1 MB
// lists grow its heap.
var scenarioNames = []string{"reads", "reads-h2", "refusals", "flips", "hold", "list-1mb", "watch"}

func (b *bench) scenarios() map[string]func(context.Context, io.Writer) error {
	return map[string]func(context.Context, io.Writer) error{
		"reads": b.reads, "reads-h2": b.readsH2, "list-1mb": b.bigLists, "refusals": b.refusals,
		"flips": b.flips, "hold": b.hold, "watch": b.watches,
	}
}

func run(ctx context.Context, c config, out io.Writer) error {
	b, cleanup, err := setup(ctx, &c)
	defer cleanup()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "bench-proxy: %d cores, GOMAXPROCS %d, %s; load: %d concurrent requests (HTTP/1.1: %d keep-alive TLS connections; HTTP/2: %d connections), %s per run after %s warm-up, median of %d runs\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), c.concurrency, c.concurrency, c.h2Conns, c.duration, c.warmup, c.rounds)
	fmt.Fprintf(out, "backend: Go TLS server (HTTP/2 and HTTP/1.1) answering a %d-byte or a %d-byte JSON list; HAProxy %s with nbthread 2, TLS termination (alpn h2,http/1.1), HTTP/1.1 to the backend, a method ACL\n",
		len(listBody), len(bigListBody), b.haVersion)
	fmt.Fprintf(out, "CPU/req: user+system CPU time of the proxy process alone (/proc/PID/stat) over the measured interval / requests answered; calls/req: kubefence's read+write system calls (/proc/PID/io, which counts read(2) and write(2), not HAProxy's recv/send) / requests answered\n\n")
	all := b.scenarios()
	for _, name := range scenarioNames {
		if !c.want(name) {
			continue
		}
		if err := all[name](ctx, out); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// setup starts the backend, kubefence and the two HAProxy peers, and the clients.
func setup(ctx context.Context, c *config) (*bench, func(), error) {
	var cleanups []func()
	cleanup := func() {
		for _, f := range slices.Backward(cleanups) {
			f()
		}
	}
	env, err := framework.NewEnv("", func(string, ...any) {})
	if err != nil {
		return nil, cleanup, err
	}
	cleanups = append(cleanups, func() { os.RemoveAll(env.Dir) }, func() { _ = env.Close() })
	if c.kubefence == "" {
		if c.kubefence, err = framework.Kubefence(env.Dir); err != nil {
			return nil, cleanup, err
		}
	}
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		return nil, cleanup, fmt.Errorf("haproxy not found: run 'make bench-deps'")
	}
	pki, err := framework.NewPKI(filepath.Join(env.Dir, "pki"))
	if err != nil {
		return nil, cleanup, err
	}
	b := &bench{c: *c, caFile: pki.CACert, bc: &broadcaster{subs: map[chan []byte]struct{}{}}, haVersion: haproxyVersion(haproxy)}
	backendURL, stopBackend, err := startBackend(pki, b.bc)
	if err != nil {
		return nil, cleanup, err
	}
	cleanups = append(cleanups, stopBackend)
	b.backendURL = backendURL
	b.px, err = env.StartProxy(ctx, framework.ProxyConfig{Binary: c.kubefence, Upstream: backendURL, PKI: pki, RetryAfter: 5, ExtraArgs: append([]string{"--profiling"}, strings.Fields(os.Getenv("BENCH_PROXY_ARGS"))...),
		Env: strings.Fields(os.Getenv("BENCH_PROXY_ENV"))})
	if err != nil {
		return nil, cleanup, err
	}
	if b.haOpen, b.haOpenPID, err = startHAProxy(env, haproxy, pki, backendURL, "haproxy-open", false); err != nil {
		return nil, cleanup, err
	}
	if b.haFenced, b.haFencedPID, err = startHAProxy(env, haproxy, pki, backendURL, "haproxy-fenced", true); err != nil {
		return nil, cleanup, err
	}
	return b, cleanup, b.newClients(pki)
}

func (b *bench) newClients(pki *framework.PKI) error {
	client, err := newClient(pki.CACert, b.c.concurrency, nil)
	if err != nil {
		return err
	}
	adminCert, err := tls.LoadX509KeyPair(pki.AdminCert, pki.AdminKey)
	if err != nil {
		return err
	}
	certClient, err := newClient(pki.CACert, b.c.concurrency, &adminCert)
	if err != nil {
		return err
	}
	b.h1, b.h1Cert = []*http.Client{client}, []*http.Client{certClient}
	return nil
}

// bench is what every scenario runs against.
type bench struct {
	c                                    config
	px                                   *framework.Proxy
	h1, h1Cert                           []*http.Client
	backendURL, haOpen, haFenced, caFile string
	haOpenPID, haFencedPID               int
	haVersion                            string
	bc                                   *broadcaster
	profiled                             bool
}

// peer is one way to the backend: its URL and the process whose CPU time is measured.
type peer struct {
	name, url string
	pid       int
}

func (b *bench) peers(names ...string) []peer {
	all := map[string]peer{
		"direct":    {"direct", b.backendURL, 0},
		"kubefence": {"kubefence", b.px.URL, b.px.Proc.Pid()},
		"haproxy":   {"haproxy", b.haOpen, b.haOpenPID},
	}
	var out []peer
	for _, n := range names {
		out = append(out, all[n])
	}
	return out
}

type row struct {
	name string
	r    result
}

// calls is kubefence's system calls per request ("-" for the other peers: /proc/PID/io does not
// count HAProxy's recv and send).
func (r row) calls() string {
	if !strings.HasPrefix(r.name, "kubefence") {
		return "-"
	}
	return r.r.callsPerReq()
}

// reads: HTTP/1.1 GETs straight to the backend, through kubefence, HAProxy, and kubefence with
// client certificates.
func (b *bench) reads(ctx context.Context, out io.Writer) error {
	rows, err := b.getRows(ctx, b.peers("direct", "kubefence", "haproxy"), b.h1, benchPath)
	if err != nil {
		return err
	}
	cert, err := b.getRows(ctx, b.peers("kubefence"), b.h1Cert, benchPath)
	if err != nil {
		return err
	}
	rows = append(rows, row{"kubefence+cert", cert[0].r})
	printGets(out, "Reads (HTTP/1.1 GET of the 4 KB list, 200):", rows)
	kf, kc, direct := rows[1].r, rows[3].r, rows[0].r
	fmt.Fprintf(out, "kubefence with client certificates (verified once per connection, identity forwarded): throughput %.2fx, added p99 %s of kubefence without (target: within 10%%)\n\n",
		kc.rps()/kf.rps(), ratio(kc.p(99)-direct.p(99), kf.p(99)-direct.p(99)))
	return nil
}

// readsH2: the same GETs from HTTP/2 clients, as client-go and kubectl send them.
func (b *bench) readsH2(ctx context.Context, out io.Writer) error {
	clients, err := h2Clients(b.caFile, b.c.h2Conns)
	if err != nil {
		return err
	}
	defer closeIdle(clients)
	rows, err := b.getRows(ctx, b.peers("direct", "kubefence", "haproxy"), clients, benchPath)
	if err != nil {
		return err
	}
	printGets(out, "Reads (HTTP/2 GET of the 4 KB list, 200):", rows)
	fmt.Fprintln(out)
	return nil
}

// bigLists: HTTP/2 GETs of a 1 MB list, as a 'list pods' of a real cluster returns.
func (b *bench) bigLists(ctx context.Context, out io.Writer) error {
	clients, err := h2Clients(b.caFile, b.c.h2Conns)
	if err != nil {
		return err
	}
	defer closeIdle(clients)
	rows, err := b.getRows(ctx, b.peers("direct", "kubefence", "haproxy"), clients, bigListPath)
	if err != nil {
		return err
	}
	printGets(out, fmt.Sprintf("Large lists (HTTP/2 GET of a %d-byte list, 200):", len(bigListBody)), rows)
	fmt.Fprintln(out)
	return nil
}

// getRows runs the GET load through each peer, rounds times, and keeps the median round.
func (b *bench) getRows(ctx context.Context, peers []peer, clients []*http.Client, path string) ([]row, error) {
	var rows []row
	for _, p := range peers {
		prof := b.startProfile(p.name)
		r := median(b.c.rounds, func() result { return load(ctx, clients, "GET", p.url+path, nil, b.c, p.pid) })
		if prof != nil {
			if err := <-prof; err != nil {
				return nil, err
			}
		}
		if r.errors > 0 || r.codes[200] != r.n {
			return nil, fmt.Errorf("%s GET %s: %d errors, codes %v", p.name, path, r.errors, r.codes)
		}
		rows = append(rows, row{p.name, r})
	}
	return rows, nil
}

// startProfile fetches a CPU profile of kubefence during its first measured run, once.
func (b *bench) startProfile(name string) chan error {
	if name != "kubefence" || b.c.profile == "" || b.profiled {
		return nil
	}
	b.profiled = true
	prof := make(chan error, 1)
	go func() { prof <- fetchProfile(b.px.MetricsURL, b.c.profile, b.c.warmup, int(b.c.duration/time.Second)) }()
	return prof
}

// printGets prints a GET table (rows[0] is direct) and kubefence against HAProxy.
func printGets(out io.Writer, title string, rows []row) {
	direct := rows[0].r
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out, title)
	fmt.Fprintln(tw, "peer\treq/s\trounds\tp50\tp99\tadded p50\tadded p99\tCPU/req\tcalls/req\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.name, r.r.rps(), r.r.spread(), ms(r.r.p(50)), ms(r.r.p(99)),
			ms(r.r.p(50)-direct.p(50)), ms(r.r.p(99)-direct.p(99)), us(r.r.cpuPerReq()), r.calls())
	}
	tw.Flush()
	kf, ha := rows[1].r, rows[2].r
	fmt.Fprintf(out, "kubefence vs haproxy: throughput %.2fx (target >= 1.0x), added p99 %s (target <= 1.0x), CPU/req %s (target <= 1.0x)\n",
		kf.rps()/ha.rps(), ratio(kf.p(99)-direct.p(99), ha.p(99)-direct.p(99)), ratio(kf.cpuPerReq(), ha.cpuPerReq()))
}

// refusals: POSTs answered 429 by the fence, never reaching the backend.
func (b *bench) refusals(ctx context.Context, out io.Writer) error {
	if _, err := b.px.Admin.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: "bench"}); err != nil {
		return err
	}
	backendPostsBefore := backendPosts.Load()
	var refusals []row
	for _, p := range []peer{{"kubefence", b.px.URL, b.px.Proc.Pid()}, {"haproxy", b.haFenced, b.haFencedPID}} {
		prof := b.startProfile(p.name)
		r := median(b.c.rounds, func() result {
			return load(ctx, b.h1, "POST", p.url+benchPath, []byte(`{"kind":"ConfigMap"}`), b.c, p.pid)
		})
		if prof != nil {
			if err := <-prof; err != nil {
				return err
			}
		}
		if r.errors > 0 || r.codes[429] != r.n {
			return fmt.Errorf("%s refusals: %d errors, codes %v", p.name, r.errors, r.codes)
		}
		refusals = append(refusals, row{p.name, r})
	}
	if n := backendPosts.Load() - backendPostsBefore; n != 0 {
		return fmt.Errorf("%d refused POSTs reached the backend", n)
	}
	if _, err := b.px.Admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		return err
	}
	fmt.Fprintln(out, "Fenced writes (HTTP/1.1 POST, refused 429 + Retry-After, none reached the backend):")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "peer\trefusals/s\trounds\tp50\tp99\tCPU/req\tcalls/req\t")
	for _, r := range refusals {
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", r.name, r.r.rps(), r.r.spread(), ms(r.r.p(50)), ms(r.r.p(99)), us(r.r.cpuPerReq()), r.calls())
	}
	tw.Flush()
	kf, ha := refusals[0].r, refusals[1].r
	fmt.Fprintf(out, "kubefence vs haproxy: refusals/s %.2fx (target >= 1.0x), CPU/req %s\n\n", kf.rps()/ha.rps(), ratio(kf.cpuPerReq(), ha.cpuPerReq()))
	return nil
}

// flips: fence on and off under a GET+POST load.
func (b *bench) flips(ctx context.Context, out io.Writer) error {
	flips, err := flipUnderLoad(ctx, b.h1, b.px, benchPath, b.c)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Fence flips under load (kubefence, %d flips, GET+POST mix, %d connections):\n", len(flips.durations), b.c.concurrency)
	fmt.Fprintf(out, "  flip inside the proxy (state fsynced, then writes refused): p50 %s, max %s (target <= 10ms)\n", ms(pct(flips.flips, 50)), ms(slices.Max(flips.flips)))
	fmt.Fprintf(out, "  as the admin client sees it (incl. barrier and scheduling on saturated cores): p50 %s, max %s\n", ms(pct(flips.durations, 50)), ms(slices.Max(flips.durations)))
	fmt.Fprintf(out, "  requests: %d, answered 429: %d, other errors: %d\n\n", flips.load.n, flips.load.codes[429], flips.load.errors+flips.load.n-flips.load.codes[200]-flips.load.codes[201]-flips.load.codes[429])
	return nil
}

// ratio is a/b as printed beside a target ("1.50x"), or "n/a" with why when either is not
// positive: an added latency at or below zero (the direct path slower in that run) makes no
// ratio, and 0.00x or a negative one would read as a target met.
func ratio(a, b time.Duration) string {
	if a < 0 || b <= 0 {
		return "n/a (an added figure at or below zero: compare the columns)"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/1e6) }

// us prints a CPU time per request, or "-" when it was not measured.
func us(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fµs", float64(d)/1e3)
}

type flipResult struct {
	durations []time.Duration // admin call: state persisted, writes refused, barrier done
	flips     []time.Duration // inside the proxy: state persisted (fsync) and published
	load      result
}

// flipUnderLoad flips the fence on and off every 200 ms while GETs and POSTs run, timing each
// admin call (fence on includes the barrier) and counting every answer that is not 2xx or 429.
func flipUnderLoad(ctx context.Context, clients []*http.Client, px *framework.Proxy, path string, c config) (flipResult, error) {
	url := px.URL + path
	post := []byte(`{"kind":"ConfigMap"}`)
	var fr flipResult
	done := make(chan result)
	go func() {
		done <- loadMix(ctx, loadSpec{clients: clients, next: func(i int) (string, string, []byte) {
			if i%2 == 0 {
				return "POST", url, post
			}
			return "GET", url, nil
		}, conc: c.concurrency, d: c.duration})
	}()
	deadline := time.Now().Add(c.duration - 200*time.Millisecond)
	on := true
	for time.Now().Before(deadline) {
		t0 := time.Now()
		resp, err := px.Admin.Fence(ctx, admin.FenceRequest{Fenced: on, Reason: "flip", WaitTimeout: admin.Duration(5 * time.Second)})
		if err != nil {
			return fr, err
		}
		fr.durations = append(fr.durations, time.Since(t0))
		fr.flips = append(fr.flips, time.Duration(resp.Flip))
		on = !on
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := px.Admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		return fr, err
	}
	fr.load = <-done
	return fr, nil
}

func fetchProfile(metricsURL, path string, delay time.Duration, seconds int) error {
	time.Sleep(delay)
	resp, err := http.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", metricsURL, seconds))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
