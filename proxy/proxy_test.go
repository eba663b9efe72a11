package proxy

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefence/kubefence/proxy/admin"
)

// fakeAPI is a real HTTP server standing in for kube-apiserver: it records what reached it,
// can hold writes open, and streams watch events on demand.
type fakeAPI struct {
	*httptest.Server
	name     string
	mu       sync.Mutex
	seen     []string
	hold     chan struct{} // when non-nil, writes block until it is closed
	events   chan string
	writesIn atomic.Int32
	// warmed counts the GET /livez the proxy sends to open connections ahead of a hold's
	// release (backend.warm); they are not forwarded requests and are not in seen.
	warmed atomic.Int32
}

func newFakeAPI(t testing.TB, name string) *fakeAPI {
	f := &fakeAPI{name: name, events: make(chan string, 16)}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.RequestURI() == "/livez" {
			f.warmed.Add(1)
			return
		}
		f.mu.Lock()
		f.seen = append(f.seen, r.Method+" "+r.URL.RequestURI()+" "+headerDump(r.Header))
		hold := f.hold
		f.mu.Unlock()
		if r.URL.Query().Get("watch") == "true" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			http.NewResponseController(w).Flush()
			for {
				select {
				case ev := <-f.events:
					fmt.Fprintf(w, "{\"type\":\"ADDED\",\"object\":{\"from\":%q,\"name\":%q}}\n", f.name, ev)
					http.NewResponseController(w).Flush()
				case <-r.Context().Done():
					return
				}
			}
		}
		if r.Method != http.MethodGet && hold != nil {
			f.writesIn.Add(1)
			<-hold
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kind":"ConfigMap","from":%q}`, f.name)
	}))
	t.Cleanup(f.Close)
	return f
}

func headerDump(h http.Header) string {
	var parts []string
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "x-remote") || strings.HasPrefix(strings.ToLower(k), "impersonate") {
			parts = append(parts, k+"="+strings.Join(h[k], ","))
		}
	}
	return strings.Join(parts, ";")
}

func (f *fakeAPI) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

type testProxy struct {
	*Server
	url   string
	admin *admin.Client
	opts  *Options
}

func startProxy(t testing.TB, upstream string, mutate ...func(*Options)) *testProxy {
	t.Helper()
	dir := t.TempDir()
	o := NewOptions()
	o.Listen = "127.0.0.1:0"
	o.InsecureListen = true
	o.Upstream = upstream
	o.AdminSocket = filepath.Join(dir, "admin.sock")
	o.StateFile = filepath.Join(dir, "state.json")
	o.MetricsListen = "127.0.0.1:0"
	o.DrainTimeout = 2 * time.Second
	o.AllowedBackends = []string{"http://127.0.0.1:*"} // the fake backends
	for _, m := range mutate {
		m(o)
	}
	return startProxyWith(t, o)
}

// startProxyWith starts a proxy with o; its logs go to logs[0] when given, else nowhere.
func startProxyWith(t testing.TB, o *Options, logs ...io.Writer) *testProxy {
	t.Helper()
	var logw io.Writer = io.Discard
	if len(logs) > 0 {
		logw = logs[0]
	}
	if errs := o.Validate(); len(errs) > 0 {
		t.Fatalf("options: %v", errs)
	}
	cfg, err := o.Complete()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, slog.New(slog.NewTextHandler(logw, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(time.Second) })
	scheme := "https://"
	if o.InsecureListen {
		scheme = "http://"
	}
	return &testProxy{Server: s, url: scheme + s.Addr().String(), admin: admin.NewClient(o.AdminSocket), opts: o}
}

// restartProxy shuts p down and starts a proxy with its options (new listen ports, the same
// state file and admin socket).
func restartProxy(t testing.TB, p *testProxy) *testProxy {
	t.Helper()
	_ = p.Shutdown(time.Second)
	o := *p.opts
	o.Listen, o.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	return startProxyWith(t, &o)
}

func do(t *testing.T, method, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	resp, body, err := doErr(method, url, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// doErr is do for goroutines other than the test's, which must not call t.Fatal.
// boundedClient is http.DefaultClient with a bound: a request a defect leaves unanswered (sent
// to a backend that holds it) fails its test instead of hanging the package.
var boundedClient = &http.Client{Timeout: time.Minute}

func doErr(method, url string, hdr ...string) (*http.Response, string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader("{}"))
	if err != nil {
		return nil, "", err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := boundedClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", fmt.Errorf("%s %s: reading the body: %w", method, url, err)
	}
	return resp, string(body), nil
}

func TestFenceRefusesWritesAndPassesReads(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL)
	ctx := t.Context()

	cm := p.url + "/api/v1/namespaces/default/configmaps"
	if resp, _ := do(t, "POST", cm); resp.StatusCode != 200 {
		t.Fatalf("open: create = %d", resp.StatusCode)
	}
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: "moving etcd"}); err != nil {
		t.Fatal(err)
	}
	before := len(api.requests())
	cases := []struct {
		method, path string
		want         int
	}{
		{"GET", "/api/v1/namespaces/default/configmaps", 200},
		{"GET", "/api/v1/namespaces/default/configmaps/x", 200},
		{"POST", "/api/v1/namespaces/default/configmaps", 429},
		{"PUT", "/api/v1/namespaces/default/configmaps/x", 429},
		{"PATCH", "/api/v1/namespaces/default/configmaps/x", 429},
		{"DELETE", "/api/v1/namespaces/default/configmaps/x", 429},
		{"POST", "/api/v1/namespaces/default/configmaps?dryRun=All", 200},
		{"POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", 200},
		{"GET", "/api/v1/namespaces/default/pods/p/exec", 429},
		{"POST", "//api/v1/namespaces/default/configmaps", 429},
	}
	forwarded := 0
	for _, c := range cases {
		resp, body := do(t, c.method, p.url+c.path)
		if resp.StatusCode != c.want {
			t.Errorf("%s %s = %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
		if c.want == 200 {
			forwarded++
			continue
		}
		// The default is 1 s: client-go's leader election times out each request at 5 s.
		if got := resp.Header.Get("Retry-After"); got != "1" {
			t.Errorf("Retry-After = %q", got)
		}
		var st metav1.Status
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("429 body is not a Status: %v: %s", err, body)
		}
		if st.Kind != "Status" || st.Reason != metav1.StatusReasonTooManyRequests || st.Code != 429 ||
			!strings.Contains(st.Message, "fenced read-only") || !strings.Contains(st.Message, "moving etcd") ||
			st.Details == nil || st.Details.RetryAfterSeconds != 1 {
			t.Errorf("429 Status = %+v", st)
		}
	}
	// Invariant refused-never-forwarded: nothing refused reached the backend.
	if got := len(api.requests()) - before; got != forwarded {
		t.Errorf("backend saw %d requests while fenced, want the %d allowed ones: %v", got, forwarded, api.requests()[before:])
	}
	if st := p.Status(); st.RefusedWrites != 6 {
		t.Errorf("refused = %d, want 6", st.RefusedWrites)
	}
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, "POST", cm); resp.StatusCode != 200 {
		t.Fatalf("after fence off: create = %d", resp.StatusCode)
	}
}

func TestIdentityHeadersStripped(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL)
	do(t, "GET", p.url+"/api/v1/namespaces", "X-Remote-User", "system:admin", "x-remote-group", "system:masters",
		"X-Remote-Extra-Scopes", "all", "X-REMOTE-EXTRA-foo", "bar", "Impersonate-User", "bob")
	got := api.requests()
	if len(got) != 1 || strings.Contains(strings.ToLower(got[0]), "x-remote") || !strings.Contains(got[0], "Impersonate-User=bob") {
		t.Fatalf("backend saw %q: identity headers must go, Impersonate-* must stay", got)
	}
}

// heldAPI is a fake blue whose writes wait at the backend until release is called (at the
// latest when the test ends: before the server's Close, which waits for them).
func heldAPI(t *testing.T) (api *fakeAPI, release func()) {
	t.Helper()
	api = newFakeAPI(t, "blue")
	api.hold = make(chan struct{})
	release = sync.OnceFunc(func() { close(api.hold) })
	t.Cleanup(release)
	return api, release
}

func TestBarrierWaitsForInflightWrites(t *testing.T) {
	api, releaseHold := heldAPI(t)
	p := startProxy(t, api.URL)

	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, _, err := doErr("PUT", p.url+"/api/v1/namespaces/default/configmaps/slow", "User-Agent", "slow-writer")
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{code: resp.StatusCode}
	}()
	waitFor(t, func() bool { return api.writesIn.Load() == 1 })

	// Timeout: the fence is on, the barrier reports the running write.
	resp, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, WaitTimeout: admin.Duration(100 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Barrier.Complete || len(resp.Barrier.Remaining) != 1 || resp.Barrier.Remaining[0].Name != "slow" ||
		resp.Barrier.Remaining[0].UserAgent != "slow-writer" || !resp.Status.Fenced {
		t.Fatalf("barrier = %+v", resp.Barrier)
	}
	// A second fence on waits until the write finishes.
	time.AfterFunc(200*time.Millisecond, releaseHold)
	start := time.Now()
	resp, err = p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, WaitTimeout: admin.Duration(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Barrier.Complete || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("barrier = %+v after %s", resp.Barrier, time.Since(start))
	}
	select {
	case res := <-done:
		if res.err != nil || res.code != 200 {
			t.Fatalf("the write admitted before the fence got %d, %v; want 200", res.code, res.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the write admitted before the fence got no answer in 5s after the barrier completed")
	}
}

func TestBackendSwitch(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	p := startProxy(t, blue.URL)
	ctx := t.Context()

	// Invariant switch-only-fenced: not while open.
	_, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL})
	if apiErr, ok := err.(*admin.APIError); !ok || apiErr.Code != 409 {
		t.Fatalf("switch while open: %v, want 409", err)
	}

	// A watch through the proxy, on blue; bounded, so that a watch the switch does not end fails
	// the test instead of hanging it.
	watchCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(watchCtx, "GET", p.url+"/api/v1/namespaces/default/configmaps?watch=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewReader(resp.Body)
	blue.events <- "a"
	if l, err := lines.ReadString('\n'); !strings.Contains(l, `"from":"blue","name":"a"`) {
		t.Fatalf("watch event = %q, %v", l, err)
	}
	waitFor(t, func() bool { return p.Status().OpenStreams == 1 })

	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: true}); err != nil {
		t.Fatal(err)
	}
	sw, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL})
	if err != nil {
		t.Fatal(err)
	}
	if sw.Drain.Streams != 1 || sw.Drain.Forced != 0 || sw.Status.Backend != green.URL {
		t.Fatalf("switch = %+v", sw)
	}
	// The watch ended cleanly: EOF after whole events, no error, no partial line.
	rest, err := io.ReadAll(lines)
	if err != nil || len(rest) != 0 {
		t.Fatalf("after switch the watch gave %q, %v; want a clean end", rest, err)
	}
	if _, body := do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps/x"); !strings.Contains(body, "green") {
		t.Fatalf("after switch, read served by %s", body)
	}
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	if _, body := do(t, "POST", p.url+"/api/v1/namespaces/default/configmaps"); !strings.Contains(body, "green") {
		t.Fatalf("after unfence, write served by %s", body)
	}
}

func TestWatchBodyEndsAtEventBoundary(t *testing.T) {
	cases := []struct {
		name   string
		fr     framing
		chunks [][]byte
		// after chunks are read, endAtBoundary is called; want the reads that follow
		wantMore string
	}{
		{"json idle", framingJSON, [][]byte{[]byte("{\"a\":1}\n")}, ""},
		{"json mid event", framingJSON, [][]byte{[]byte("{\"a\":1}\n{\"b\""), []byte(":2}\n"), []byte("{\"c\":3}\n")}, ":2}\n"},
		{"protobuf idle", framingProtobuf, [][]byte{{0, 0, 0, 2, 'h', 'i'}}, ""},
		{"protobuf split header", framingProtobuf, [][]byte{{0, 0}, {0, 3, 'a', 'b', 'c'}, {0, 0, 0, 1, 'z'}}, "\x00\x03abc"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			ctx, cancel := context.WithCancel(t.Context())
			go func() {
				<-ctx.Done()
				pw.CloseWithError(ctx.Err())
			}()
			go func() {
				for _, c := range tc.chunks {
					if _, err := pw.Write(c); err != nil {
						return
					}
				}
			}()
			wb := newWatchBody(pr, cancel, tc.fr)
			buf := make([]byte, 64)
			// Read the first chunk, then ask for the end.
			n, err := wb.Read(buf)
			if err != nil || n != len(tc.chunks[0]) {
				t.Fatalf("first read %d, %v", n, err)
			}
			if wb.endAtBoundary() == departCut {
				t.Fatal("endAtBoundary refused a known framing")
			}
			rest, err := io.ReadAll(wb)
			if err != nil {
				t.Fatalf("drained watch ended with %v, want clean EOF", err)
			}
			if string(rest) != tc.wantMore {
				t.Fatalf("after drain read %q, want %q", rest, tc.wantMore)
			}
		})
	}
}

func TestStatePersistsAcrossRestart(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	p := startProxy(t, blue.URL)
	ctx := t.Context()
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: "cutover"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL}); err != nil {
		t.Fatal(err)
	}
	gen := p.Status().Generation
	// Simulate a crash: the process goes away without a clean shutdown; the state file stays.
	_ = p.Shutdown(time.Second)
	o := *p.opts
	o.Listen, o.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	p2 := startProxyWith(t, &o)
	st := p2.Status()
	if !st.Fenced || st.Reason != "cutover" || st.Backend != green.URL || st.Generation != gen {
		t.Fatalf("restarted proxy state = %+v, want fenced on green at generation %d", st, gen)
	}
	if resp, _ := do(t, "POST", p2.url+"/api/v1/namespaces/default/configmaps"); resp.StatusCode != 429 {
		t.Fatalf("restarted proxy: write = %d, want 429", resp.StatusCode)
	}
}

// TestUnconfirmedSurvivesRestart: a fence on while unconfirmed saves the guessed backend (the
// --upstream) with the fence; a restart must not take that file for a confirmed state and allow
// a fence off there, maybe on blue while the other proxies write green.
func TestUnconfirmedSurvivesRestart(t *testing.T) {
	api := newFakeAPI(t, "blue")
	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, api.URL, func(o *Options) { o.StateFile = state })
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Reason: "by hand"}); err != nil {
		t.Fatal(err)
	}
	p2 := restartProxy(t, p)
	if st := p2.Status(); !st.Fenced || !st.Unconfirmed {
		t.Fatalf("restarted status = %+v, want fenced and still unconfirmed", st)
	}
	if _, err := p2.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err == nil || !strings.Contains(err.Error(), "backend set") {
		t.Fatalf("fence off after the restart: %v, want refused naming 'backend set'", err)
	}
	if _, err := p2.admin.SetBackend(t.Context(), admin.BackendRequest{URL: api.URL}); err != nil {
		t.Fatal(err)
	}
	p3 := restartProxy(t, p2)
	if st := p3.Status(); st.Unconfirmed {
		t.Fatalf("status after backend set and a restart = %+v, want confirmed", st)
	}
}

// TestFailedSaveLeavesUnconfirmed: a backend set whose state cannot be saved changes nothing:
// an unconfirmed proxy stays unconfirmed (serves nothing, refuses fence off) and the backend
// stays the old one.
func TestFailedSaveLeavesUnconfirmed(t *testing.T) {
	api, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	if err := os.WriteFile(state, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, api.URL, func(o *Options) {
		o.StateFile = state
		o.AllowedBackends = append(o.AllowedBackends, green.URL)
	})
	// The rename over the state file fails, even as root: it is now a directory, not empty.
	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(state, "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL}); err == nil {
		t.Fatal("backend set succeeded with a state file that cannot be written")
	} else if apiErr, ok := err.(*admin.APIError); !ok || apiErr.Code != http.StatusInternalServerError {
		t.Fatalf("backend set with a state file that cannot be written: %v, want 500 (the proxy's failure, not the request's)", err)
	}
	if st := p.Status(); !st.Unconfirmed || st.Backend == green.URL {
		t.Fatalf("status after the failed backend set = %+v, want unconfirmed, not on green", st)
	}
	if resp, _ := do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps/x"); resp.StatusCode != 503 {
		t.Fatalf("read after the failed backend set = %d, want 503 (still unconfirmed)", resp.StatusCode)
	}
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err == nil || !strings.Contains(err.Error(), "backend set") {
		t.Fatalf("fence off after the failed backend set: %v, want refused naming 'backend set'", err)
	}
	if len(api.requests())+len(green.requests()) != 0 {
		t.Fatalf("forwarded: blue %q, green %q", api.requests(), green.requests())
	}
}

// TestStateBackendMustBeAllowed: a state file naming a backend that is neither --upstream nor
// allowed by --allowed-backends (flags narrowed since, or a file someone else wrote) is not
// resumed: the proxy forwards clients' bearer tokens, and would hand them to a server the
// operator does not allow. It starts fenced and unconfirmed, serving nothing.
func TestStateBackendMustBeAllowed(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, []byte(`{"version":1,"fenced":false,"backend":"`+green.URL+`","generation":4}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, blue.URL, func(o *Options) { o.StateFile, o.AllowedBackends = state, nil })
	if st := p.Status(); !st.Fenced || !st.Unconfirmed || !strings.Contains(st.Reason, "allowed") {
		t.Fatalf("status = %+v, want fenced and unconfirmed, saying the backend is not allowed", st)
	}
	if resp, _ := do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps/x"); resp.StatusCode != 503 {
		t.Fatalf("read = %d, want 503", resp.StatusCode)
	}
	if len(green.requests())+len(blue.requests()) != 0 {
		t.Fatalf("forwarded: green %q, blue %q", green.requests(), blue.requests())
	}
}

// TestStateBackendNotAllowedWithoutUpstream: with no --upstream to fall back to, a state file
// whose backend is not allowed any more still starts the proxy, fenced and unconfirmed, on that
// backend, which it does not use (it serves nothing) until 'backend set' names an allowed one;
// it does not exit (and crash-loop).
func TestStateBackendNotAllowedWithoutUpstream(t *testing.T) {
	green := newFakeAPI(t, "green")
	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, []byte(`{"version":1,"fenced":false,"backend":"`+green.URL+`","generation":4}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "", func(o *Options) { o.StateFile, o.AllowedBackends = state, nil })
	if st := p.Status(); !st.Fenced || !st.Unconfirmed {
		t.Fatalf("status = %+v, want fenced and unconfirmed", st)
	}
	if resp, _ := do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps/x"); resp.StatusCode != 503 || len(green.requests()) != 0 {
		t.Fatalf("read = %d, green saw %q: want 503, nothing forwarded", resp.StatusCode, green.requests())
	}
}

// TestStateBackendCAGoneWithoutUpstream: a state file whose backend's CA file is gone, on a
// proxy without --upstream, starts it fenced and unconfirmed, as a backend no longer allowed
// does: it serves nothing (503) and forwards nothing until 'backend set' names the backend;
// it did not start at all ("no --upstream to fall back to"), a crash loop under a supervisor.
func TestStateBackendCAGoneWithoutUpstream(t *testing.T) {
	green := newFakeAPI(t, "green")
	dir := t.TempDir()
	state, gone := filepath.Join(dir, "state.json"), filepath.Join(dir, "gone-ca.crt")
	if err := os.WriteFile(state, []byte(`{"version":1,"fenced":false,"backend":"`+green.URL+`","backendCAFile":"`+gone+`","generation":4}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "", func(o *Options) { o.StateFile, o.AllowedBackends = state, []string{green.URL} })
	st := p.Status()
	if !st.Fenced || !st.Unconfirmed || st.Generation < 4 || !strings.Contains(st.Reason, gone) {
		t.Fatalf("status = %+v, want fenced and unconfirmed, the generation kept, the reason naming the CA file", st)
	}
	if resp, _ := do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps/x"); resp.StatusCode != 503 || len(green.requests()) != 0 {
		t.Fatalf("read = %d, green saw %q: want 503, nothing forwarded", resp.StatusCode, green.requests())
	}
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err == nil {
		t.Fatal("fence off on an unconfirmed backend succeeded")
	}
	// A backend set naming no CA file keeps the state's, which is gone: not the system's roots.
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL}); err == nil || !strings.Contains(err.Error(), gone) {
		t.Fatalf("backend set without a CA file: %v, want an error naming %s", err, gone)
	}
}

// TestMissingStateWithoutUpstream: a proxy given a state file that is not there (a copy that
// landed elsewhere) and no --upstream has no backend to start on; it says so, naming the file
// and the flag, rather than that an empty URL has the wrong scheme.
func TestMissingStateWithoutUpstream(t *testing.T) {
	o := NewOptions()
	o.Listen, o.InsecureListen, o.MetricsListen = "127.0.0.1:0", true, "127.0.0.1:0"
	dir := t.TempDir()
	o.AdminSocket, o.StateFile = filepath.Join(dir, "admin.sock"), filepath.Join(dir, "state.json")
	if errs := o.Validate(); len(errs) > 0 {
		t.Fatalf("options: %v", errs)
	}
	cfg, err := o.Complete()
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), o.StateFile) || !strings.Contains(err.Error(), "--upstream") {
		t.Fatalf("New = %v; want an error naming the missing state file and --upstream", err)
	}
}

// TestStateFileInAnUntrustedDir: the proxy reads its state file back as root and acts on it (open
// or fenced, which backend): in a directory another user owns, or may write to, or below one,
// that user could write a state file of theirs (fenced false, mid-cutover) for the next start.
// The proxy refuses to start there, as it refuses such an admin socket directory.
func TestStateFileInAnUntrustedDir(t *testing.T) {
	mkdir := ownedDirs(t, t.TempDir())
	for _, tc := range []struct{ name, dir, want string }{
		{"owned by another user", mkdir("ops", 0o700, 12345), "uid 12345"},
		{"others may write to it", mkdir("open", 0o777, 0), "others can write"},
		{"below another user's", mkdir("home/ops/kf", 0o700, 0), "uid 12345"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.name, "below") {
				if err := os.Chown(filepath.Dir(tc.dir), 12345, -1); err != nil {
					t.Fatal(err)
				}
			}
			o := NewOptions()
			o.Listen, o.InsecureListen, o.MetricsListen = "127.0.0.1:0", true, "127.0.0.1:0"
			o.Upstream = "https://127.0.0.1:1"
			o.AdminSocket, o.StateFile = filepath.Join(t.TempDir(), "admin.sock"), filepath.Join(tc.dir, "state.json")
			if errs := o.Validate(); len(errs) > 0 {
				t.Fatalf("options: %v", errs)
			}
			cfg, err := o.Complete()
			if err != nil {
				t.Fatal(err)
			}
			_, err = New(cfg, slog.New(slog.DiscardHandler)) // New starts nothing: Start listens
			if err == nil || !strings.Contains(err.Error(), "--state-file") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v; want a refusal of the state file's directory saying %q", err, tc.want)
			}
		})
	}
}

// TestCorruptStateServesNothing: a proxy whose state file cannot be read does not know which
// backend it was on, so it serves nothing, reads included (503 + Retry-After), and cannot be
// unfenced until 'backend set' names the backend; then reads flow, still fenced.
func TestCorruptStateServesNothing(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":       "{not json",
		"empty":         "",
		"wrong version": `{"version":99,"backend":"http://x"}`,
		"no backend":    `{"version":1,"fenced":false}`,
		// Readable, but its backend cannot be used (a CA file removed since, a URL that is none):
		// the proxy must not exit (and crash-loop), nor guess.
		"backend CA file gone": `{"version":1,"fenced":false,"backend":"https://10.0.0.9:6443","backendCAFile":"/nonexistent/ca.crt","generation":7}`,
		"backend no URL":       `{"version":1,"fenced":false,"backend":"10.0.0.9:6443","generation":7}`,
		// A field this version does not know: a later one may have added it to keep the proxy
		// safe (as unconfirmed and unchecked were added): not ignored.
		"unknown field": `{"version":1,"fenced":false,"backend":"BACKEND","generation":7,"aFutureSafetyFlag":true}`,
		"trailing data": `{"version":1,"fenced":false,"backend":"BACKEND","generation":7}{"fenced":true}`,
		// json.Decoder.More says no more values before a closing delimiter: still trailing data.
		"trailing brace":   `{"version":1,"fenced":false,"backend":"BACKEND","generation":7}}`,
		"trailing bracket": `{"version":1,"fenced":false,"backend":"BACKEND","generation":7}]junk`,
	} {
		t.Run(name, func(t *testing.T) {
			api := newFakeAPI(t, "blue")
			dir := t.TempDir()
			state := filepath.Join(dir, "state.json")
			if err := os.WriteFile(state, []byte(strings.ReplaceAll(content, "BACKEND", api.URL)), 0o600); err != nil {
				t.Fatal(err)
			}
			p := startProxy(t, api.URL, func(o *Options) { o.StateFile = state })
			if st := p.Status(); !st.Fenced || !st.Unconfirmed || !strings.Contains(st.Reason, "state file") {
				t.Fatalf("status = %+v, want fenced and unconfirmed because of the state file", st)
			}
			// Serving nothing, it is not ready: a load balancer or probe should look elsewhere.
			if resp, body := do(t, "GET", "http://"+p.MetricsAddr().String()+"/readyz"); resp.StatusCode != 503 || !strings.Contains(body, "backend set") {
				t.Fatalf("readyz while unconfirmed = %d %q, want 503 naming 'backend set'", resp.StatusCode, body)
			}
			for _, m := range []string{"GET", "DELETE"} {
				resp, body := do(t, m, p.url+"/api/v1/namespaces/default/configmaps/x")
				if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "backend set") {
					t.Fatalf("%s = %d %q (Retry-After %q), want 503 + Retry-After naming 'backend set'", m, resp.StatusCode, body, resp.Header.Get("Retry-After"))
				}
			}
			if len(api.requests()) != 0 {
				t.Fatalf("an unconfirmed proxy forwarded %q", api.requests())
			}
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err == nil || !strings.Contains(err.Error(), "backend set") {
				t.Fatalf("fence off while unconfirmed: %v, want refused naming 'backend set'", err)
			}
			if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: api.URL}); err != nil {
				t.Fatal(err)
			}
			if resp, _ := do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps/x"); resp.StatusCode != 200 {
				t.Fatalf("read after backend set = %d, want 200", resp.StatusCode)
			}
			if resp, _ := do(t, "DELETE", p.url+"/api/v1/namespaces/default/configmaps/x"); resp.StatusCode != 429 {
				t.Fatalf("write after backend set = %d, want 429 (still fenced)", resp.StatusCode)
			}
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
				t.Fatalf("fence off after backend set: %v", err)
			}
		})
	}
}

// TestFenceOffExpectsBackend: fence off naming the backend it expects opens writes only on that
// backend; on another it is refused (409, naming both) and the fence stays on, so a caller that
// could not look at the proxy first never opens writes on the wrong side.
func TestFenceOffExpectsBackend(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	p := startProxy(t, blue.URL)
	ctx := t.Context()
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL}); err != nil {
		t.Fatal(err)
	}
	_, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false, ExpectBackend: blue.URL})
	var ae *admin.APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusConflict || !strings.Contains(err.Error(), green.URL) || !strings.Contains(err.Error(), blue.URL) {
		t.Fatalf("fence off expecting blue while on green: %v; want 409 naming both", err)
	}
	if st := p.Status(); !st.Fenced {
		t.Fatalf("status %+v: want still fenced", st)
	}
	if resp, _ := do(t, "DELETE", p.url+"/api/v1/namespaces/default/configmaps/x"); resp.StatusCode != 429 {
		t.Fatalf("write after the refused fence off = %d, want 429", resp.StatusCode)
	}
	// The same URL spelled otherwise (a trailing slash, the scheme and host in capitals) is
	// the same backend.
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false, ExpectBackend: strings.ToUpper(green.URL) + "/"}); err != nil {
		t.Fatalf("fence off expecting green (in capitals, trailing slash) while on green: %v", err)
	}
	if st := p.Status(); st.Fenced {
		t.Fatalf("status %+v: want open", st)
	}
}

func TestAdminSocketMode(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL)
	fi, err := os.Stat(p.opts.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("admin socket mode = %v, want socket 0600", fi.Mode())
	}
	// A second proxy on the same socket is refused rather than stealing it.
	o := *p.opts
	o.Listen, o.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg, err := o.Complete()
	if err != nil {
		t.Fatal(err)
	}
	s2, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second proxy on the same socket: %v", err)
	}
}

// TestFailedStartClosesListeners: a Start that fails at its last listener (--admin-listen on an
// address in use) leaves nothing bound: the API and metrics addresses and the admin socket can
// all be bound again.
func TestFailedStartClosesListeners(t *testing.T) {
	api := newFakeAPI(t, "blue")
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	_, certFile, keyFile := ca.issue(t, dir, "proxy", "proxy", nil, x509.ExtKeyUsageServerAuth)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	o := NewOptions()
	o.Listen, o.MetricsListen = freeAddr(t), freeAddr(t)
	o.TLSCertFile, o.TLSKeyFile = certFile, keyFile
	o.Upstream = api.URL
	o.AdminSocket, o.StateFile = filepath.Join(dir, "admin.sock"), filepath.Join(dir, "state.json")
	o.AdminListen, o.AdminClientCAFile = busy.Addr().String(), ca.pem
	if errs := o.Validate(); len(errs) > 0 {
		t.Fatalf("options: %v", errs)
	}
	cfg, err := o.Complete()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil {
		_ = s.Shutdown(time.Second)
		t.Fatal("Start succeeded with --admin-listen on an address in use")
	} else if !strings.Contains(err.Error(), "admin API on "+o.AdminListen) {
		t.Fatalf("Start: %v, want the --admin-listen failure", err)
	}
	for _, addr := range []string{o.Listen, o.MetricsListen} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s is still bound after the failed start: %v", addr, err)
			continue
		}
		ln.Close()
	}
	if _, err := os.Lstat(o.AdminSocket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("admin socket left behind after the failed start: %v", err)
	}
	ln, err := net.Listen("unix", o.AdminSocket)
	if err != nil {
		t.Fatalf("admin socket cannot be bound again: %v", err)
	}
	ln.Close()
}

// freeAddr returns a loopback address no one listens on at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestMetricsNameWhoAnswered: a write whose body the proxy refused (413) was answered by the
// proxy, not forwarded; an unconfirmed proxy's 503s are counted too.
func TestMetricsNameWhoAnswered(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL, func(o *Options) { o.MaxWriteBodyBytes = 1 })
	do(t, "POST", p.url+"/api/v1/namespaces/default/configmaps") // "{}": 2 bytes
	_, body := do(t, "GET", "http://"+p.MetricsAddr().String()+"/metrics")
	if want := `kubefence_requests_total{class="write",code="413",decision="rejected"} 1`; !strings.Contains(body, want) {
		t.Errorf("metrics lack %q", want)
	}

	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	u := startProxy(t, api.URL, func(o *Options) { o.StateFile = state })
	do(t, "GET", u.url+"/api/v1/namespaces/default/configmaps")
	_, body = do(t, "GET", "http://"+u.MetricsAddr().String()+"/metrics")
	if want := `kubefence_requests_total{class="read",code="503",decision="unavailable"} 1`; !strings.Contains(body, want) {
		t.Errorf("metrics lack %q", want)
	}

	// The proxy's own 502 for a backend it cannot reach was not forwarded anywhere.
	down := startProxy(t, "http://"+freeAddr(t))
	do(t, "GET", down.url+"/api/v1/namespaces")
	_, body = do(t, "GET", "http://"+down.MetricsAddr().String()+"/metrics")
	if want := `kubefence_requests_total{class="read",code="502",decision="backend-failed"} 1`; !strings.Contains(body, want) {
		t.Errorf("metrics lack %q", want)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL)
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true}); err != nil {
		t.Fatal(err)
	}
	do(t, "POST", p.url+"/api/v1/namespaces/default/configmaps")
	do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps")
	m := "http://" + p.MetricsAddr().String()
	_, body := do(t, "GET", m+"/metrics")
	for _, want := range []string{
		`kubefence_requests_total{class="write",code="429",decision="refused"} 1`,
		`kubefence_requests_total{class="read",code="200",decision="forwarded"} 1`,
		"kubefence_refused_writes_total 1",
		"kubefence_fenced 1",
		"kubefence_fence_generation 1",
		`kubefence_backend_info{url="` + api.URL + `"} 1`,
		"kubefence_inflight_writes 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if resp, _ := do(t, "GET", m+"/readyz"); resp.StatusCode != 200 {
		t.Errorf("readyz = %d with a live backend", resp.StatusCode)
	}
	api.Close()
	if resp, _ := do(t, "GET", m+"/readyz"); resp.StatusCode != 503 {
		t.Errorf("readyz = %d with the backend down, want 503", resp.StatusCode)
	}
	resp, body := do(t, "GET", p.url+"/api/v1/namespaces")
	if resp.StatusCode != 502 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, `"kind":"Status"`) {
		t.Errorf("backend down: %d %q Retry-After=%q", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
}

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Options)
		want   []string
	}{
		{"defaults need tls and upstream", func(*Options) {}, []string{"--tls-cert-file and --tls-key-file are required", "--upstream is required"}},
		{"bad values", func(o *Options) {
			o.Listen = "nope"
			o.InsecureListen = true
			o.Upstream = "ftp://x"
			o.RetryAfter = 0
			o.MetricsListen = "x"
		}, []string{"--listen", "--upstream: backend URL", "--retry-after 0", "--metrics-listen"}},
		{"upstream with path", func(o *Options) { o.InsecureListen = true; o.Upstream = "https://h:6443/api" }, []string{"no path"}},
		{"body budget below one body", func(o *Options) { o.MaxBufferedWriteBytes = o.MaxWriteBodyBytes - 1 }, []string{"--max-buffered-write-bytes 3145727 must be at least --max-write-body-bytes"}},
		// Profiles let whoever reaches them load the proxy (a 30 s CPU profile, a trace).
		{"profiling beyond loopback", func(o *Options) { o.Profiling, o.MetricsListen = true, "0.0.0.0:9445" }, []string{"--profiling serves /debug/pprof/ on --metrics-listen 0.0.0.0:9445"}},
		{"profiling on a name", func(o *Options) { o.Profiling, o.MetricsListen = true, "proxy.example:9445" }, []string{"--profiling serves"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			tc.mutate(o)
			var msgs []string
			for _, e := range o.Validate() {
				msgs = append(msgs, e.Error())
			}
			all := strings.Join(msgs, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("errors %q lack %q", all, w)
				}
			}
		})
	}
}

// TestProfilingOnLoopback: --profiling on a loopback --metrics-listen (the default) is fine.
func TestProfilingOnLoopback(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:9445", "[::1]:9445", "localhost:9445"} {
		o := NewOptions()
		o.Profiling, o.MetricsListen = true, addr
		for _, e := range o.Validate() {
			if strings.Contains(e.Error(), "--profiling") {
				t.Errorf("%s: %v", addr, e)
			}
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAdminListenNeedsItsCAWithoutValidate: a program embedding the proxy that skips Validate
// and sets --admin-listen without a client CA must not get an admin API that trusts the
// system's roots (a nil ClientCAs pool): Complete refuses it.
func TestAdminListenNeedsItsCAWithoutValidate(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	_, certFile, keyFile := ca.issue(t, dir, "proxy", "proxy", nil, x509.ExtKeyUsageServerAuth)
	o := NewOptions()
	o.Listen = "127.0.0.1:0"
	o.TLSCertFile, o.TLSKeyFile = certFile, keyFile
	o.Upstream = "http://127.0.0.1:1"
	o.AdminSocket, o.StateFile = filepath.Join(dir, "admin.sock"), filepath.Join(dir, "state.json")
	o.AdminListen = "127.0.0.1:0"
	cfg, err := o.Complete()
	if err == nil {
		t.Fatalf("Complete accepted --admin-listen without --admin-client-ca-file (admin CA pool %v)", cfg.adminCAs)
	}
	if !strings.Contains(err.Error(), "--admin-client-ca-file") {
		t.Fatalf("Complete: %v, want it to name --admin-client-ca-file", err)
	}
}

// TestStatusSaysItsDrainTimeout: the status says how long a switch may wait for the watches
// (--drain-timeout), over the admin API: a cutover bounds its switch call to each proxy by it.
func TestStatusSaysItsDrainTimeout(t *testing.T) {
	p := startProxy(t, "http://127.0.0.1:1", func(o *Options) { o.DrainTimeout = 7 * time.Second })
	st, err := p.admin.Status(t.Context())
	if err != nil || time.Duration(st.DrainTimeout) != 7*time.Second {
		t.Fatalf("status %+v %v: want drainTimeout 7s", st, err)
	}
}

// TestStatusNamesItsInstance: each proxy process answers its status with a name of its own, so
// that a cutover can tell one proxy named twice in its plan (its socket and its address) from
// two proxies.
func TestStatusNamesItsInstance(t *testing.T) {
	api := newFakeAPI(t, "blue")
	a, b := startProxy(t, api.URL), startProxy(t, api.URL)
	ia, ib := a.Status().Instance, b.Status().Instance
	if ia == "" || ia == ib || a.Status().Instance != ia {
		t.Fatalf("instances %q and %q: want each proxy's own, the same at every status", ia, ib)
	}
}
