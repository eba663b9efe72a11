package proxy

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

func fenceHold(t *testing.T, p *testProxy) {
	t.Helper()
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Mode: admin.ModeHold, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
}

type answer struct {
	code int
	body string
	err  error
	at   time.Time // when it came
}

// postAsync sends a write and delivers its answer on the returned channel.
func postAsync(ctx context.Context, c *http.Client, url string) <-chan answer {
	return sendAsync(ctx, c, "POST", url, `{"kind":"ConfigMap"}`)
}

// sendAsync sends a write with body (none if empty) and delivers its answer on the returned
// channel.
func sendAsync(ctx context.Context, c *http.Client, method, url, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		var rd io.Reader = http.NoBody
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequestWithContext(ctx, method, url, rd)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			ch <- answer{err: err, at: time.Now()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- answer{code: resp.StatusCode, body: string(b), at: time.Now()}
	}()
	return ch
}

// TestHoldModeForwardsToTheBackendAfterTheSwitch: writes that arrive while fenced in hold mode
// reach no backend while fenced, then go, once each, to the backend active when the fence lifts.
func TestHoldModeForwardsToTheBackendAfterTheSwitch(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	p := startProxy(t, blue.URL)
	fenceHold(t, p)
	const n = 20
	var answers []<-chan answer
	for range n {
		answers = append(answers, postAsync(t.Context(), http.DefaultClient, p.url+"/api/v1/namespaces/default/configmaps"))
	}
	waitFor(t, func() bool { return p.Status().Hold.Held == n })
	if len(blue.requests())+len(green.requests()) != 0 {
		t.Fatal("a held write reached a backend while fenced")
	}
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	for _, ch := range answers {
		a := <-ch
		if a.err != nil || a.code != 200 || !strings.Contains(a.body, `"green"`) {
			t.Fatalf("held write answered %+v, want 200 from green", a)
		}
	}
	if got := len(green.requests()); got != n || len(blue.requests()) != 0 {
		t.Fatalf("green saw %d writes, blue %d; want %d and 0", got, len(blue.requests()), n)
	}
	if h := p.Status().Hold; h.Held != 0 || h.Released != n {
		t.Fatalf("hold status %+v, want %d released", h, n)
	}
}

// TestHoldTimeoutRefusesAndNeverForwards: past --hold-timeout a held write gets 429 + Retry-After,
// saying it was held that long (not the fence's "writes are held" alone), and is not forwarded
// when the fence lifts later.
func TestHoldTimeoutRefusesAndNeverForwards(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL, func(o *Options) { o.HoldTimeout = 200 * time.Millisecond })
	fenceHold(t, p)
	start := time.Now()
	a := <-postAsync(t.Context(), http.DefaultClient, p.url+"/api/v1/namespaces/default/configmaps")
	if a.code != 429 || time.Since(start) < 200*time.Millisecond || !strings.Contains(a.body, "held for --hold-timeout (200ms)") {
		t.Fatalf("held past the timeout: %+v after %s, want 429 after 200ms saying so", a, time.Since(start))
	}
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if len(api.requests()) != 0 || p.Status().Hold.TimedOut != 1 {
		t.Fatalf("backend saw %q, hold %+v", api.requests(), p.Status().Hold)
	}
}

// TestHoldRefusesWhatItCannotTell: in hold mode, a write that asks for a protocol upgrade (an
// exec on a path the proxy does not parse is one kube-apiserver may still route, once decoded,
// to a session) and a write to a path the proxy could not parse are refused at once, as
// sessions are, not held and forwarded later.
func TestHoldRefusesWhatItCannotTell(t *testing.T) {
	cases := []struct {
		name, method, path string
		upgrade            bool
	}{
		{"exec upgrade on a path with an empty segment", "GET", "/api/v1/namespaces/d/pods/p//exec?command=sh", true},
		{"upgrade on an object", "POST", "/api/v1/namespaces/d/configmaps", true},
		{"service proxy on a path with an empty segment", "POST", "/api/v1/namespaces/d/services/s/proxy/a//b", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(t, "blue")
			p := startProxy(t, api.URL) // held, they would get 429 at the 4 s hold timeout
			fenceHold(t, p)
			req, _ := http.NewRequestWithContext(t.Context(), tc.method, p.url+tc.path, nil)
			if tc.upgrade {
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Upgrade", "websocket")
			}
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests || time.Since(start) > 2*time.Second || p.Status().Hold.TimedOut != 0 {
				t.Fatalf("%s after %s (hold %+v), want 429 at once, not at the hold timeout", resp.Status, time.Since(start), p.Status().Hold)
			}
			if h := p.Status().Hold; h.Held != 0 || h.TimedOut != 0 || len(api.requests()) != 0 {
				t.Fatalf("hold %+v, backend saw %q: want nothing held, nothing forwarded", h, api.requests())
			}
		})
	}
}

// TestHoldRefusesWhatARuleRefuses: in hold mode a write an explicit `refuse` rule matches gets
// the rule's 429 at once, as it would in refuse mode; it is never held, nor forwarded when the
// fence lifts. Writes no rule matches are held as before.
func TestHoldRefusesWhatARuleRefuses(t *testing.T) {
	api := newFakeAPI(t, "blue")
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("apiVersion: kubefence.io/v1alpha1\nkind: FencePolicy\nrules:\n- name: no-configmap-creates\n  action: refuse\n  verbs: [create]\n  resources: [configmaps]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, api.URL, func(o *Options) { o.PolicyFile = pol }) // held, it would get 429 at the 4 s hold timeout
	fenceHold(t, p)
	held := postAsync(t.Context(), http.DefaultClient, p.url+"/api/v1/namespaces/default/secrets")
	waitFor(t, func() bool { return p.Status().Hold.Held == 1 })
	start := time.Now()
	a := <-postAsync(t.Context(), http.DefaultClient, p.url+"/api/v1/namespaces/default/configmaps")
	if a.code != http.StatusTooManyRequests || time.Since(start) > 2*time.Second || !strings.Contains(a.body, `rule \"no-configmap-creates\"`) {
		t.Fatalf("a write a refuse rule matches, in hold mode: %+v after %s; want 429 at once naming the rule", a, time.Since(start))
	}
	if h := p.Status().Hold; h.Held != 1 || h.TimedOut != 0 {
		t.Fatalf("hold %+v: want only the secret write held", h)
	}
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	if a := <-held; a.code != 200 {
		t.Fatalf("held write: %+v", a)
	}
	for _, r := range api.requests() {
		if strings.Contains(r, "configmaps") {
			t.Fatalf("the refused write reached the backend: %q", api.requests())
		}
	}
}

// TestHoldClientGoneNeverForwarded: a client that disconnects while held is never forwarded.
func TestHoldClientGoneNeverForwarded(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL)
	fenceHold(t, p)
	ctx, cancel := context.WithCancel(t.Context())
	ch := postAsync(ctx, http.DefaultClient, p.url+"/api/v1/namespaces/default/configmaps")
	waitFor(t, func() bool { return p.Status().Hold.Held == 1 })
	cancel()
	if a := <-ch; a.err == nil {
		t.Fatalf("cancelled client got %+v", a)
	}
	waitFor(t, func() bool { return p.Status().Hold.Abandoned == 1 })
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if len(api.requests()) != 0 {
		t.Fatalf("an abandoned held write was forwarded: %q", api.requests())
	}
}

// TestHoldBoundsRefuseAtOnce: beyond --max-held-requests a write gets 429 at once; reads and
// exempt writes are never held.
func TestHoldBoundsRefuseAtOnce(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL, func(o *Options) { o.MaxHeldRequests = 2 })
	fenceHold(t, p)
	a1 := postAsync(t.Context(), http.DefaultClient, p.url+"/api/v1/namespaces/default/configmaps")
	a2 := postAsync(t.Context(), http.DefaultClient, p.url+"/api/v1/namespaces/default/configmaps")
	waitFor(t, func() bool { return p.Status().Hold.Held == 2 })
	start := time.Now()
	if a := <-postAsync(t.Context(), http.DefaultClient, p.url+"/api/v1/namespaces/default/configmaps"); a.code != 429 || time.Since(start) > 2*time.Second || p.Status().Hold.TimedOut != 0 {
		t.Fatalf("write beyond the bound: %+v after %s (hold %+v), want an immediate 429, not one at the hold timeout", a, time.Since(start), p.Status().Hold)
	}
	if resp, _ := do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps"); resp.StatusCode != 200 {
		t.Fatalf("read while holding = %d", resp.StatusCode)
	}
	if resp, _ := do(t, "POST", p.url+"/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"); resp.StatusCode != 200 {
		t.Fatalf("review create while holding = %d, want forwarded at once", resp.StatusCode)
	}
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []<-chan answer{a1, a2} {
		if a := <-ch; a.code != 200 {
			t.Fatalf("held write: %+v", a)
		}
	}
}

// TestHoldPerConnectionShare: on one HTTP/2 connection at most half the streams may be held
// writes; reads on that connection go on meanwhile.
func TestHoldPerConnectionShare(t *testing.T) {
	f := newIdentityFixture(t, func(o *Options, _ string) { o.MaxConcurrentStreams = 4 })
	c := f.h2Client(nil)
	if code, _ := getReused(t, c, f.proxyURL); code != 200 {
		t.Fatal("warm-up read failed")
	}
	if _, err := f.p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Mode: admin.ModeHold}); err != nil {
		t.Fatal(err)
	}
	var held []<-chan answer
	for range 2 {
		held = append(held, postAsync(t.Context(), c, f.proxyURL+"/api/v1/namespaces/default/configmaps"))
	}
	waitForT(t, 5*time.Second, "two held writes", func() bool { return f.p.Status().Hold.Held == 2 })
	if a := <-postAsync(t.Context(), c, f.proxyURL+"/api/v1/namespaces/default/configmaps"); a.code != 429 {
		t.Fatalf("third held write on one connection of 4 streams: %+v, want 429", a)
	}
	// The reads run in goroutines, so they report over a channel (t.Fatal there would end only
	// the goroutine), and a read that hangs fails the test at the bound instead of hanging it.
	reads := make(chan error, 2)
	for range 2 { // the streams not held
		go func() {
			code, reused, err := tryGetReused(c, f.proxyURL)
			if err == nil && (code != 200 || !reused) {
				err = fmt.Errorf("read on the holding connection: %d (reused %v)", code, reused)
			}
			reads <- err
		}()
	}
	for range 2 {
		select {
		case err := <-reads:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a read on the holding connection did not finish in 10 s")
		}
	}
	if _, err := f.p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	for _, ch := range held {
		if a := <-ch; a.code != 200 {
			t.Fatalf("held write: %+v", a)
		}
	}
}

// TestHoldKeepsAShareForVerifiedClients: with --client-ca-file, writes from clients whose
// certificate the proxy did not verify (anonymous, bearer tokens: any pod can reach the proxy)
// may fill at most three quarters of the waiting room, in writes and in bytes, so that a node's
// lease renewal is still held, and answered once the fence lifts, instead of getting 429: hold
// mode would otherwise turn into refusing everyone whom an anonymous client outran.
func TestHoldKeepsAShareForVerifiedClients(t *testing.T) {
	const sent = 8 // anonymous writes, enough to fill the whole waiting room
	cases := []struct {
		name         string
		bound        func(o *Options)
		method, body string
		wantHeld     int // of the anonymous writes
	}{
		{"--max-held-requests", func(o *Options) { o.MaxHeldRequests = sent }, "DELETE", "", 6},
		{"--max-held-bytes", func(o *Options) { o.MaxHeldBytes, o.MaxWriteBodyBytes = sent*20, 64 }, "POST", `{"kind":"ConfigMap"}`, 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newIdentityFixture(t, func(o *Options, _ string) { tc.bound(o) })
			node, _, _ := f.clientCA.issue(t, f.dir, "node", "system:node:n1", []string{"system:nodes"}, x509.ExtKeyUsageClientAuth)
			if _, err := f.p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Mode: admin.ModeHold}); err != nil {
				t.Fatal(err)
			}
			anon := f.h2Client(nil)
			var anons []<-chan answer
			for range sent {
				anons = append(anons, sendAsync(t.Context(), anon, tc.method, f.proxyURL+"/api/v1/namespaces/default/configmaps/a", tc.body))
			}
			waitForT(t, 10*time.Second, "every anonymous write held or refused", func() bool {
				h := f.p.Status().Hold
				return h.Held+int(h.Full) == sent
			})
			if h := f.p.Status().Hold; h.Held != tc.wantHeld {
				t.Fatalf("anonymous writes held: %d of %d (hold %+v), want %d: a quarter of the room kept for verified clients", h.Held, sent, h, tc.wantHeld)
			}
			lease := sendAsync(t.Context(), f.h2Client(&node), "PUT", f.proxyURL+"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1", `{"kind":"Lease"}`)
			waitForT(t, 10*time.Second, "the node's lease renewal held", func() bool {
				select {
				case a := <-lease:
					t.Fatalf("the node's lease renewal answered while fenced: %+v, want it held", a)
				default:
				}
				return f.p.Status().Hold.Held == tc.wantHeld+1
			})
			if _, err := f.p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
				t.Fatal(err)
			}
			if a := <-lease; a.code != 200 {
				t.Fatalf("the node's held lease renewal after fence off: %+v", a)
			}
			codes := map[int]int{}
			for _, ch := range anons {
				codes[(<-ch).code]++
			}
			if codes[200] != tc.wantHeld || codes[429] != sent-tc.wantHeld {
				t.Fatalf("anonymous writes answered %v, want %d × 200 (held, then forwarded) and %d × 429", codes, tc.wantHeld, sent-tc.wantHeld)
			}
		})
	}
}

func TestFenceModeChecked(t *testing.T) {
	p := startProxy(t, newFakeAPI(t, "blue").URL)
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Mode: "queue"}); err == nil || !strings.Contains(err.Error(), "hold") {
		t.Fatalf("unknown mode: %v", err)
	}
	if p.Status().Fenced {
		t.Fatal("a refused fence request fenced")
	}
}

// TestHoldByteBound: beyond --max-held-bytes a write gets 429 at once, never held or forwarded;
// the held writes within the bound are answered after the fence lifts.
func TestHoldByteBound(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL, func(o *Options) { o.MaxHeldBytes = 100 })
	fenceHold(t, p)
	small := postAsync(t.Context(), http.DefaultClient, p.url+"/api/v1/namespaces/default/configmaps") // 20 bytes
	waitFor(t, func() bool { return p.Status().Hold.Held == 1 })
	start := time.Now()
	req, _ := http.NewRequest("POST", p.url+"/api/v1/namespaces/default/configmaps", strings.NewReader(strings.Repeat("x", 200)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || time.Since(start) > 2*time.Second || p.Status().Hold.TimedOut != 0 {
		t.Fatalf("a write over the byte bound: %d after %s (hold %+v), want an immediate 429, not one at the hold timeout", resp.StatusCode, time.Since(start), p.Status().Hold)
	}
	if h := p.Status().Hold; h.Full != 1 || h.Held != 1 || h.HeldBytes != int64(len(`{"kind":"ConfigMap"}`)) {
		t.Fatalf("hold status %+v", h)
	}
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	if a := <-small; a.code != 200 {
		t.Fatalf("the held write within the bound: %+v", a)
	}
	if n := len(api.requests()); n != 1 {
		t.Fatalf("backend saw %d writes, want only the held one", n)
	}
}

// TestHeldBytesBoundByMaxHeldBytes: a held write's body counts against --max-held-bytes, not
// --max-buffered-write-bytes: with both at 8 KiB, the write that would take the held bytes past
// 8 KiB gets 429 at once naming --max-held-bytes, counted as the waiting room's refusal (fence
// status, kubefence_hold_full_total), and raising --max-held-bytes holds more. The held bodies
// kept the write-body budget full, so a 429 named --max-buffered-write-bytes instead, and
// --max-held-bytes, the documented knob, changed nothing.
func TestHeldBytesBoundByMaxHeldBytes(t *testing.T) {
	const kib = 1 << 10
	cases := []struct {
		name     string
		maxHeld  int64
		wantHeld int // 1 KiB writes held before one gets 429
	}{
		{"--max-held-bytes as --max-buffered-write-bytes", 8 * kib, 8},
		{"--max-held-bytes raised", 12 * kib, 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(t, "blue")
			p := startProxy(t, api.URL, func(o *Options) {
				o.MaxWriteBodyBytes, o.MaxBufferedWriteBytes, o.MaxHeldBytes = kib, 8*kib, tc.maxHeld
			})
			fenceHold(t, p)
			url, body := p.url+"/api/v1/namespaces/default/configmaps", strings.Repeat("x", kib)
			var held []<-chan answer
			var refused answer
			for i := 0; refused.code == 0 && i < 2*tc.wantHeld; i++ {
				ch := sendAsync(t.Context(), http.DefaultClient, "POST", url, body)
				waitFor(t, func() bool {
					select {
					case refused = <-ch:
						return true
					default:
						return p.Status().Hold.Held == len(held)+1
					}
				})
				if refused.code == 0 {
					held = append(held, ch)
				}
			}
			if refused.code != 429 || len(held) != tc.wantHeld {
				t.Fatalf("after %d held writes: %+v, want 429 after %d", len(held), refused, tc.wantHeld)
			}
			if !strings.Contains(refused.body, "--max-held-bytes") {
				t.Errorf("the 429 does not name --max-held-bytes: %s", refused.body)
			}
			if h := p.Status().Hold; h.Full < 1 {
				t.Errorf("hold status %+v: the refusal is not counted as the waiting room's", h)
			}
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
				t.Fatal(err)
			}
			for _, ch := range held {
				if a := <-ch; a.code != 200 {
					t.Fatalf("held write after fence off: %+v", a)
				}
			}
		})
	}
}

// TestHoldWarmsTheBackend: fencing in hold mode, and switching the backend while so fenced, open
// connections to the backend that will receive the release (GET /livez, no write), as many as
// --hold-release-concurrency over HTTP/1.1, so that the release pays no handshakes.
func TestHoldWarmsTheBackend(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	p := startProxy(t, blue.URL, func(o *Options) { o.HoldReleaseConcurrency = 8 })
	fenceHold(t, p)
	waitFor(t, func() bool { return blue.warmed.Load() == 8 })
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return green.warmed.Load() == 8 })
	if n := len(blue.requests()) + len(green.requests()); n != 0 {
		t.Fatalf("warming forwarded %d requests", n)
	}
}

// TestHoldWarmsNoUnconfirmedBackend: a proxy that started unconfirmed on a backend its flags no
// longer allow never uses it, warm-up included: 'fence on --mode hold' sends it nothing. The
// backend 'backend set' then names is warmed as usual.
func TestHoldWarmsNoUnconfirmedBackend(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, []byte(`{"version":1,"fenced":false,"backend":"`+green.URL+`","generation":4}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "", func(o *Options) {
		o.StateFile, o.AllowedBackends, o.HoldReleaseConcurrency = state, []string{blue.URL}, 4
	})
	if st := p.Status(); !st.Unconfirmed {
		t.Fatalf("status = %+v, want unconfirmed", st)
	}
	fenceHold(t, p)
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: blue.URL}); err != nil {
		t.Fatal(err)
	}
	// Warmed after the fence's warm-up would have begun: by now that one would have been seen.
	waitFor(t, func() bool { return blue.warmed.Load() == 4 })
	if n := green.warmed.Load(); n != 0 || len(green.requests()) != 0 {
		t.Fatalf("the disallowed, unconfirmed backend was sent %d warm-ups and %q", n, green.requests())
	}
}

// TestHoldReleaseSlotWaitKeepsTheBounds: a released write waiting for one of
// --hold-release-concurrency's slots is still held: a client that leaves meanwhile is never
// forwarded, and one still waiting at --hold-timeout gets 429 and is never forwarded.
func TestHoldReleaseSlotWaitKeepsTheBounds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		cancel  bool // the second client leaves while the first write holds the only slot
		want    int  // the second write's answer (0: none, the client left)
	}{
		{name: "client gone", timeout: 4 * time.Second, cancel: true},
		// Long enough that the fence is off before it passes (the polls and the state file's
		// fsyncs before that take their time on a loaded machine).
		{name: "hold timeout", timeout: 3 * time.Second, want: 429},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unblock := make(chan struct{})
			var mu sync.Mutex
			seen := 0
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != "POST" {
					return // the warming GET /livez
				}
				mu.Lock()
				seen++
				first := seen == 1
				mu.Unlock()
				if first {
					<-unblock
				}
				w.WriteHeader(http.StatusCreated)
			}))
			defer api.Close()
			p := startProxy(t, api.URL, func(o *Options) { o.HoldReleaseConcurrency, o.HoldTimeout = 1, tc.timeout })
			fenceHold(t, p)
			url := p.url + "/api/v1/namespaces/default/configmaps"
			first := postAsync(t.Context(), http.DefaultClient, url)
			waitFor(t, func() bool { return p.Status().Hold.Held == 1 })
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			second := postAsync(ctx, http.DefaultClient, url)
			waitFor(t, func() bool { return p.Status().Hold.Held == 2 })
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
				t.Fatal(err)
			}
			opened := time.Now()
			waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return seen == 1 })
			var unblockOnce sync.Once
			release := func() { unblockOnce.Do(func() { close(unblock) }) }
			defer release()
			if tc.cancel {
				cancel()
			}
			select {
			case a := <-second:
				if tc.cancel && a.err == nil || !tc.cancel && a.code != tc.want {
					t.Fatalf("second write answered %+v while the only release slot was taken, want %d", a, tc.want)
				}
				if a.at.Before(opened) {
					t.Fatalf("the second write ended (%+v) before the fence opened: the wait for a slot was not tested", a)
				}
			case <-time.After(tc.timeout + 3*time.Second):
				t.Fatalf("second write unanswered %s after fence off, with a hold timeout of %s: it waits for a release slot past its bounds", tc.timeout+3*time.Second, tc.timeout)
			}
			time.Sleep(100 * time.Millisecond) // a forward of the second write would happen now
			release()
			if a := <-first; a.code != http.StatusCreated {
				t.Fatalf("first write answered %+v", a)
			}
			time.Sleep(100 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if seen != 1 {
				t.Fatalf("backend got %d writes, want 1: a write that was no longer held was forwarded", seen)
			}
		})
	}
}

// TestLongHoldTimeoutWarned: a --hold-timeout of 5 s or more is allowed (a cutover test may
// want it) but warned about at start: a held leader-election renewal would already have failed
// at its client.
func TestLongHoldTimeoutWarned(t *testing.T) {
	api := newFakeAPI(t, "blue")
	for _, tc := range []struct {
		timeout time.Duration
		warned  bool
	}{{4 * time.Second, false}, {5 * time.Second, true}} {
		var logs bytes.Buffer
		o := NewOptions()
		o.Listen, o.InsecureListen, o.Upstream, o.MetricsListen = "127.0.0.1:0", true, api.URL, ""
		o.AdminSocket = filepath.Join(t.TempDir(), "admin.sock")
		o.HoldTimeout = tc.timeout
		startProxyWith(t, o, &logs)
		if got := strings.Contains(logs.String(), "is not under 5s, the request timeout of client-go"); got != tc.warned {
			t.Errorf("--hold-timeout %s: warned %v, want %v\n%s", tc.timeout, got, tc.warned, logs.String())
		}
	}
}

// TestOptionWarnings: what the options allow but should be heard at start. Settings meant for
// tests (plain HTTP to clients, or to a backend) warn only beyond this host, where the clients'
// bearer tokens would cross the network in clear; a hold timeout of 5 s or more warns always.
func TestOptionWarnings(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string // "" for no warning
	}{
		{"TLS, https backends", func(*Options) {}, ""},
		{"insecure listen on loopback", func(o *Options) { o.InsecureListen, o.Listen = true, "127.0.0.1:6443" }, ""},
		{"insecure listen on every address", func(o *Options) { o.InsecureListen, o.Listen = true, "0.0.0.0:6443" }, "--insecure-listen on 0.0.0.0:6443"},
		{"http upstream on loopback", func(o *Options) { o.Upstream = "http://127.0.0.1:8080" }, ""},
		{"http upstream elsewhere", func(o *Options) { o.Upstream = "http://10.0.0.10:8080" }, "backend http://10.0.0.10:8080 is plain http"},
		{"http allowed backend, any port", func(o *Options) { o.AllowedBackends = []string{"http://green.example:*"} }, "backend http://green.example:* is plain http"},
		{"hold timeout 5s", func(o *Options) { o.HoldTimeout = 5 * time.Second }, "--hold-timeout 5s is not under 5s"},
		{"admin CA of its own", func(o *Options) {
			o.ClientCAFile, o.AdminClientCAFile = "/etc/kubernetes/pki/ca.crt", "/etc/kubefence/admin-ca.crt"
		}, ""},
		// Every kubelet's certificate, and any the CSR API signs, would pass the admin API.
		{"admin CA the cluster's client CA", func(o *Options) {
			o.ClientCAFile, o.AdminClientCAFile = "/etc/kubernetes/pki/ca.crt", "/etc/kubernetes/pki/../pki/ca.crt"
		}, "--admin-client-ca-file is --client-ca-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.Listen, o.Upstream, o.AllowedBackends = "10.0.0.1:6443", "https://10.0.0.10:6443", []string{"https://10.0.0.20:*"}
			tc.edit(o)
			got := strings.Join(o.Warnings(), "\n")
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("warnings %q, want %q", got, tc.want)
			}
		})
	}
}
