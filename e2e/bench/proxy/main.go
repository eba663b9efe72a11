// Command proxy benchmarks the kubefence proxy against a direct connection and against HAProxy
// configured as the same read-only fence (`make bench-proxy`). Everything runs on loopback on
// this machine: a small Go TLS backend answering a ~4 KB JSON list, the peers in front of it,
// and a closed-loop Go load generator with keep-alive HTTP/1.1 connections.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/proxy/admin"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

type config struct {
	kubefence   string
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	rounds      int
	profile     string
	holdProfile string
	only        string
}

// want says whether the scenario runs: all of them unless -only names one.
func (c config) want(scenario string) bool { return c.only == "" || c.only == scenario }

func main() {
	var c config
	flag.StringVar(&c.kubefence, "kubefence", "", "kubefence binary (default: build one)")
	flag.IntVar(&c.concurrency, "concurrency", 32, "concurrent keep-alive connections of the load generator")
	flag.DurationVar(&c.duration, "duration", 5*time.Second, "measured time per run")
	flag.DurationVar(&c.warmup, "warmup", time.Second, "unmeasured time before each run")
	flag.IntVar(&c.rounds, "rounds", 3, "runs per scenario; the median run is reported")
	flag.StringVar(&c.profile, "cpuprofile", "", "write a CPU profile of the kubefence proxy during its read run to this file")
	flag.StringVar(&c.holdProfile, "hold-cpuprofile", "", "write a CPU profile of the kubefence proxy from fence off in the hold scenario to this file")
	flag.StringVar(&c.only, "only", "", "run only one scenario: reads, refusals, flips or hold")
	flag.Parse()
	if err := run(context.Background(), c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-proxy:", err)
		os.Exit(1)
	}
}

const listJSONItems = 12

// listBody is a ~4 KB Kubernetes-like list.
var listBody = func() []byte {
	var b bytes.Buffer
	b.WriteString(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"123456"},"items":[`)
	for i := range listJSONItems {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"metadata":{"name":"config-%04d","namespace":"default","uid":"0b6a7c52-2f7e-4b1e-9c3e-%012d","resourceVersion":"%d"},"data":{"payload":"%s"}}`,
			i, i, 100000+i, strings.Repeat("x", 200))
	}
	b.WriteString("]}")
	return b.Bytes()
}()

func run(ctx context.Context, c config, out io.Writer) error {
	env, err := framework.NewEnv("", func(string, ...any) {})
	if err != nil {
		return err
	}
	defer os.RemoveAll(env.Dir)
	defer env.Close()
	if c.kubefence == "" {
		if c.kubefence, err = framework.Kubefence(env.Dir); err != nil {
			return err
		}
	}
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		return fmt.Errorf("haproxy not found: run 'make bench-deps'")
	}
	pki, err := framework.NewPKI(filepath.Join(env.Dir, "pki"))
	if err != nil {
		return err
	}

	// The backend: a fast TLS server standing in for kube-apiserver.
	backendURL, stopBackend, err := startBackend(pki)
	if err != nil {
		return err
	}
	defer stopBackend()

	px, err := env.StartProxy(ctx, framework.ProxyConfig{Binary: c.kubefence, Upstream: backendURL, PKI: pki, RetryAfter: 5, ExtraArgs: append([]string{"--profiling"}, strings.Fields(os.Getenv("BENCH_PROXY_ARGS"))...),
		Env: strings.Fields(os.Getenv("BENCH_PROXY_ENV"))})
	if err != nil {
		return err
	}
	haOpen, err := startHAProxy(env, haproxy, pki, backendURL, "haproxy-open", false)
	if err != nil {
		return err
	}
	haFenced, err := startHAProxy(env, haproxy, pki, backendURL, "haproxy-fenced", true)
	if err != nil {
		return err
	}

	client, err := newClient(pki.CACert, c.concurrency, nil)
	if err != nil {
		return err
	}
	adminCert, err := tls.LoadX509KeyPair(pki.AdminCert, pki.AdminKey)
	if err != nil {
		return err
	}
	certClient, err := newClient(pki.CACert, c.concurrency, &adminCert)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "bench-proxy: %d cores, GOMAXPROCS %d, %s; load: %d keep-alive TLS connections, %s per run after %s warm-up, median of %d runs\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), c.concurrency, c.duration, c.warmup, c.rounds)
	fmt.Fprintf(out, "backend: Go TLS server answering a %d-byte JSON list; HAProxy %s with nbthread 2, TLS termination and a method ACL\n\n", len(listBody), haproxyVersion(haproxy))

	b := &bench{c: c, px: px, client: client, certClient: certClient, backendURL: backendURL, haOpen: haOpen, haFenced: haFenced, caFile: pki.CACert}
	for _, sc := range []struct {
		name string
		run  func(context.Context, io.Writer) error
	}{{"reads", b.reads}, {"refusals", b.refusals}, {"flips", b.flips}, {"hold", b.hold}} {
		if !c.want(sc.name) {
			continue
		}
		if err := sc.run(ctx, out); err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
	}
	return nil
}

const benchPath = "/api/v1/namespaces/default/configmaps"

// bench is what every scenario runs against.
type bench struct {
	c                                    config
	px                                   *framework.Proxy
	client, certClient                   *http.Client
	backendURL, haOpen, haFenced, caFile string
}

type row struct {
	name string
	r    result
}

// reads: GETs straight to the backend, through kubefence, HAProxy, and kubefence with client
// certificates.
func (b *bench) reads(ctx context.Context, out io.Writer) error {
	var reads []row
	for _, peer := range []struct {
		name, url string
		client    *http.Client
	}{{"direct", b.backendURL, b.client}, {"kubefence", b.px.URL, b.client}, {"haproxy", b.haOpen, b.client}, {"kubefence+cert", b.px.URL, b.certClient}} {
		var prof chan error
		if peer.name == "kubefence" && b.c.profile != "" {
			prof = make(chan error, 1)
			go func() { prof <- fetchProfile(b.px.MetricsURL, b.c.profile, b.c.warmup, 3) }()
		}
		r := median(b.c.rounds, func() result { return load(ctx, peer.client, "GET", peer.url+benchPath, nil, b.c) })
		if prof != nil {
			if err := <-prof; err != nil {
				return err
			}
		}
		if r.errors > 0 || r.codes[200] != r.n {
			return fmt.Errorf("%s reads: %d errors, codes %v", peer.name, r.errors, r.codes)
		}
		reads = append(reads, row{peer.name, r})
	}
	direct := reads[0].r
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out, "Reads (GET, 200):")
	fmt.Fprintln(tw, "peer\treq/s\tp50\tp99\tadded p50\tadded p99\t")
	for _, r := range reads {
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t\n", r.name, r.r.rps(), ms(r.r.p(50)), ms(r.r.p(99)), ms(r.r.p(50)-direct.p(50)), ms(r.r.p(99)-direct.p(99)))
	}
	tw.Flush()
	kf, ha := reads[1].r, reads[2].r
	addedKF, addedHA := kf.p(99)-direct.p(99), ha.p(99)-direct.p(99)
	fmt.Fprintf(out, "kubefence vs haproxy: added p99 %.2fx (target <= 1.5x), throughput %.2fx (target >= 0.7x)\n",
		ratio(addedKF, addedHA), kf.rps()/ha.rps())
	kc := reads[3].r
	fmt.Fprintf(out, "kubefence with client certificates (verified once per connection, identity forwarded): throughput %.2fx, added p99 %.2fx of kubefence without (target: within 10%%)\n\n",
		kc.rps()/kf.rps(), ratio(kc.p(99)-direct.p(99), addedKF))
	return nil
}

// refusals: POSTs answered 429 by the fence, never reaching the backend.
func (b *bench) refusals(ctx context.Context, out io.Writer) error {
	if _, err := b.px.Admin.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: "bench"}); err != nil {
		return err
	}
	backendPostsBefore := backendPosts.Load()
	var refusals []row
	for _, peer := range []struct{ name, url string }{{"kubefence", b.px.URL}, {"haproxy", b.haFenced}} {
		r := median(b.c.rounds, func() result {
			return load(ctx, b.client, "POST", peer.url+benchPath, []byte(`{"kind":"ConfigMap"}`), b.c)
		})
		if r.errors > 0 || r.codes[429] != r.n {
			return fmt.Errorf("%s refusals: %d errors, codes %v", peer.name, r.errors, r.codes)
		}
		refusals = append(refusals, row{peer.name, r})
	}
	if n := backendPosts.Load() - backendPostsBefore; n != 0 {
		return fmt.Errorf("%d refused POSTs reached the backend", n)
	}
	if _, err := b.px.Admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		return err
	}
	fmt.Fprintln(out, "Fenced writes (POST, refused 429 + Retry-After, none reached the backend):")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "peer\trefusals/s\tp50\tp99\t")
	for _, r := range refusals {
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t\n", r.name, r.r.rps(), ms(r.r.p(50)), ms(r.r.p(99)))
	}
	tw.Flush()
	fmt.Fprintf(out, "kubefence refusals/s: %.0f (target >= 20000)\n\n", refusals[0].r.rps())
	return nil
}

// flips: fence on and off under a GET+POST load.
func (b *bench) flips(ctx context.Context, out io.Writer) error {
	flips, err := flipUnderLoad(ctx, b.client, b.px, benchPath, b.c)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Fence flips under load (kubefence, %d flips, GET+POST mix, %d connections):\n", len(flips.durations), b.c.concurrency)
	fmt.Fprintf(out, "  flip inside the proxy (state fsynced, then writes refused): p50 %s, max %s (target <= 10ms)\n", ms(pct(flips.flips, 50)), ms(slices.Max(flips.flips)))
	fmt.Fprintf(out, "  as the admin client sees it (incl. barrier and scheduling on saturated cores): p50 %s, max %s\n", ms(pct(flips.durations, 50)), ms(slices.Max(flips.durations)))
	fmt.Fprintf(out, "  requests: %d, answered 429: %d, other errors: %d\n\n", flips.load.n, flips.load.codes[429], flips.load.errors+flips.load.n-flips.load.codes[200]-flips.load.codes[201]-flips.load.codes[429])
	return nil
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/1e6) }

func haproxyVersion(bin string) string {
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	if len(f) > 2 {
		return f[2]
	}
	return "?"
}

var backendPosts atomic.Int64

func startBackend(pki *framework.PKI) (string, func(), error) {
	cert, err := tls.LoadX509KeyPair(pki.APIServerCert, pki.APIServerKey)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	created := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}`)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if r.Method == http.MethodGet {
				_, _ = w.Write(listBody)
				return
			}
			backendPosts.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(created)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}},
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return "https://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

func startHAProxy(env *framework.Env, bin string, pki *framework.PKI, backendURL, name string, fenced bool) (string, error) {
	ports, err := framework.FreePorts(1)
	if err != nil {
		return "", err
	}
	pem := filepath.Join(env.Dir, name+".pem")
	var combined []byte
	for _, f := range []string{pki.ProxyServingCert, pki.ProxyServingKey} {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		combined = append(combined, b...)
	}
	if err := os.WriteFile(pem, combined, 0o600); err != nil {
		return "", err
	}
	fence := ""
	if fenced {
		fence = `  http-request return status 429 content-type application/json hdr Retry-After 5 string "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"fenced\",\"reason\":\"TooManyRequests\",\"code\":429}" if !read` + "\n"
	}
	cfg := fmt.Sprintf(`global
  nbthread 2
  maxconn 4000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
frontend api
  bind 127.0.0.1:%d ssl crt %s alpn http/1.1
  acl read method GET HEAD
%s  default_backend apiserver
backend apiserver
  http-reuse always
  server blue %s ssl verify required ca-file %s
`, ports[0], pem, fence, strings.TrimPrefix(backendURL, "https://"), pki.CACert)
	cfgPath := filepath.Join(env.Dir, name+".cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return "", err
	}
	proc, err := env.Start(name, bin, []string{"-db", "-f", cfgPath})
	if err != nil {
		return "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = framework.WaitUntil(ctx, 50*time.Millisecond, name+" listening", func(context.Context) (bool, error) {
		if proc.Exited() {
			b, _ := os.ReadFile(proc.LogPath)
			return false, fmt.Errorf("haproxy exited: %s", b)
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, err
		}
		c.Close()
		return true, nil
	})
	return "https://" + addr, err
}

func newClient(caFile string, conc int, cert *tls.Certificate) (*http.Client, error) {
	pool, err := tlsutil.LoadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	tc := &tls.Config{RootCAs: pool}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     tc,
		MaxIdleConnsPerHost: conc,
		MaxConnsPerHost:     conc,
		ForceAttemptHTTP2:   false,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableCompression:  true,
	}}, nil
}

// result is one load run.
type result struct {
	n, errors int
	codes     map[int]int
	lat       []time.Duration
	elapsed   time.Duration
}

func (r result) rps() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r result) p(q float64) time.Duration { return pct(r.lat, q) }

func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	s := slices.Clone(sorted)
	slices.Sort(s)
	i := int(float64(len(s)-1) * q / 100)
	return s[i]
}

// median runs f rounds times and returns the run with the median throughput.
func median(rounds int, f func() result) result {
	var rs []result
	for range rounds {
		rs = append(rs, f())
	}
	slices.SortFunc(rs, func(a, b result) int {
		switch {
		case a.rps() < b.rps():
			return -1
		case a.rps() > b.rps():
			return 1
		}
		return 0
	})
	return rs[len(rs)/2]
}

// load runs a closed loop of c.concurrency workers for warm-up then c.duration.
func load(ctx context.Context, client *http.Client, method, url string, body []byte, c config) result {
	return loadMix(ctx, client, func(int) (string, string, []byte) { return method, url, body }, c.concurrency, c.warmup, c.duration)
}

func loadMix(ctx context.Context, client *http.Client, next func(i int) (string, string, []byte), conc int, warmup, d time.Duration) result {
	var wg sync.WaitGroup
	var mu sync.Mutex
	res := result{codes: map[int]int{}}
	start := time.Now()
	measureFrom := start.Add(warmup)
	end := measureFrom.Add(d)
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 1<<16)
			codes := map[int]int{}
			errs := 0
			for i := w; ; i += conc {
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				method, url, body := next(i)
				req, _ := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
				if body != nil {
					req.Header.Set("Content-Type", "application/json")
				}
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if t0.Before(measureFrom) {
					continue
				}
				lat = append(lat, time.Since(t0))
				if err != nil {
					errs++
					continue
				}
				codes[resp.StatusCode]++
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			res.errors += errs
			for k, v := range codes {
				res.codes[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.n = len(res.lat)
	res.elapsed = d
	slices.Sort(res.lat)
	return res
}

type flipResult struct {
	durations []time.Duration // admin call: state persisted, writes refused, barrier done
	flips     []time.Duration // inside the proxy: state persisted (fsync) and published
	load      result
}

// flipUnderLoad flips the fence on and off every 200 ms while GETs and POSTs run, timing each
// admin call (fence on includes the barrier) and counting every answer that is not 2xx or 429.
func flipUnderLoad(ctx context.Context, client *http.Client, px *framework.Proxy, path string, c config) (flipResult, error) {
	url := px.URL + path
	post := []byte(`{"kind":"ConfigMap"}`)
	var fr flipResult
	done := make(chan result)
	go func() {
		done <- loadMix(ctx, client, func(i int) (string, string, []byte) {
			if i%2 == 0 {
				return "POST", url, post
			}
			return "GET", url, nil
		}, c.concurrency, 0, c.duration)
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
