package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubefence/kubefence/internal/testnet"
)

// TestUpstreamProtocols: to a backend that offers HTTP/2, writes and watches go over HTTP/2, with
// and without a forwarded identity; other reads and upgrades (SPDY and WebSocket need it) over
// HTTP/1.1; with --upstream-http2=false everything goes over HTTP/1.1.
func TestUpstreamProtocols(t *testing.T) {
	for _, tc := range []struct {
		name       string
		http2      bool
		writeProto int
	}{{"http2", true, 2}, {"http1-only", false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newIdentityFixture(t, func(o *Options, _ string) { o.UpstreamHTTP2 = tc.http2 })
			alice, _, _ := f.clientCA.issue(t, f.dir, "alice", "alice", nil, x509.ExtKeyUsageClientAuth)
			const path = "/api/v1/namespaces/default/configmaps"
			upgrade, _ := http.NewRequest(http.MethodGet, f.proxyURL+"/api/v1/namespaces/default/pods/p/exec?command=ls", nil)
			upgrade.Header.Set("Connection", "Upgrade")
			upgrade.Header.Set("Upgrade", "SPDY/3.1")
			steps := []struct {
				client *http.Client
				req    *http.Request
				proto  int
			}{
				{f.client(nil), mustRequest(t, http.MethodPost, f.proxyURL+path), tc.writeProto},
				{f.client(&alice), mustRequest(t, http.MethodPost, f.proxyURL+path), tc.writeProto},
				{f.client(nil), mustRequest(t, http.MethodGet, f.proxyURL+path), 1},
				{f.client(&alice), mustRequest(t, http.MethodGet, f.proxyURL+path), 1},
				{f.client(nil), mustRequest(t, http.MethodGet, f.proxyURL+path+"?watch=true"), tc.writeProto},
				{f.client(&alice), mustRequest(t, http.MethodGet, f.proxyURL+path+"?watch=true"), tc.writeProto},
				{f.client(&alice), upgrade, 1},
			}
			for _, s := range steps {
				resp, err := s.client.Do(s.req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			seen := f.backend.requests()
			if len(seen) != len(steps) {
				t.Fatalf("backend saw %d requests, want %d", len(seen), len(steps))
			}
			for i, s := range steps {
				if seen[i].protoMajor != s.proto {
					t.Errorf("%s %s reached the backend over HTTP/%d, want HTTP/%d", s.req.Method, s.req.URL.Path, seen[i].protoMajor, s.proto)
				}
			}
		})
	}
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	var body *strings.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"kind":"ConfigMap"}`)
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestWriteBodyResendable: a write's body, read whole before the fence admits it, can be produced
// again (GetBody), so that the HTTP/2 transport resends a write the backend refused unprocessed
// (graceful GOAWAY, REFUSED_STREAM) instead of failing it.
func TestWriteBodyResendable(t *testing.T) {
	const body = `{"kind":"ConfigMap","metadata":{"name":"x"}}`
	r := httptest.NewRequest(http.MethodPost, "/api/v1/namespaces/default/configmaps", strings.NewReader(body))
	if _, _, err := readWriteBody(httptest.NewRecorder(), r, bodyLimits{max: 1 << 20, timeout: time.Second, budget: newBodyBudget(1<<20, 1<<20, false)}, false); err != nil {
		t.Fatal(err)
	}
	if r.GetBody == nil {
		t.Fatal("no GetBody: a write refused unprocessed by the backend could not be sent again")
	}
	for range 2 {
		rc, err := r.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		if string(b) != body {
			t.Fatalf("GetBody gave %q, want %q", b, body)
		}
	}
	if b, _ := io.ReadAll(r.Body); string(b) != body {
		t.Fatalf("Body gave %q, want %q", b, body)
	}
}

// TestWriteNotSentTwiceOverHTTP1: Go's HTTP/1.1 transport sends a request again on a new
// connection when a reused one closed after the backend read it, if it takes the request for
// idempotent, which a write with an Idempotency-Key header and a GetBody is to it. The
// backend may have applied the write: it must reach the backend once.
func TestWriteNotSentTwiceOverHTTP1(t *testing.T) {
	var mu sync.Mutex
	posts := 0
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		posts++
		n := posts
		mu.Unlock()
		if n == 2 { // read it (applied, say), then the connection goes without an answer
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()
	p := startProxy(t, api.URL, func(o *Options) { o.UpstreamHTTP2 = false })
	url := p.url + "/api/v1/namespaces/default/configmaps"
	if got := send(t, "POST", url, "application/json", "{}"); got != http.StatusCreated {
		t.Fatalf("first write = %d", got) // leaves a connection to reuse
	}
	req, _ := http.NewRequest("POST", url, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if posts != 2 {
		t.Fatalf("the backend got %d writes, want 2: the second was sent again after the backend read it (answer %d)", posts, resp.StatusCode)
	}
}

// TestBackendErrorsTellClientsNothing: a backend failure is answered to any client, anonymous
// ones included, with a generic Status: the backend's address and the transport's error (green's
// internal address, certificate details) go to the proxy's log only, with the request's path but
// not its query.
func TestBackendErrorsTellClientsNothing(t *testing.T) {
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
	}))
	defer hangUp.Close()
	cases := []struct {
		name, upstream, retryAfter string
	}{
		{"connection refused", "http://" + freeAddr(t), "1"},
		{"closed without an answer", hangUp.URL, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o := NewOptions()
			o.Listen, o.InsecureListen, o.Upstream, o.MetricsListen = "127.0.0.1:0", true, tc.upstream, ""
			o.AdminSocket, o.StateFile = filepath.Join(dir, "admin.sock"), filepath.Join(dir, "state.json")
			logs := &syncBuf{}
			p := startProxyWith(t, o, logs)
			resp, body := do(t, "GET", p.url+"/api/v1/namespaces?labelSelector=team%3Ds3cret")
			host := strings.TrimPrefix(tc.upstream, "http://")
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Retry-After") != tc.retryAfter || !strings.Contains(body, `"kind":"Status"`) {
				t.Errorf("answer %d Retry-After=%q %s, want 502 Retry-After=%q and a Status", resp.StatusCode, resp.Header.Get("Retry-After"), body, tc.retryAfter)
			}
			for _, secret := range []string{host, "refused", "EOF", "dial"} {
				if strings.Contains(body, secret) {
					t.Errorf("the client was told %q: %s", secret, body)
				}
			}
			log := logs.String()
			if !strings.Contains(log, host) || !strings.Contains(log, "path=/api/v1/namespaces") || strings.Contains(log, "s3cret") {
				t.Errorf("log %q: want the backend and the path, not the query", log)
			}
		})
	}
}

// timeoutErr is a network error that timed out, as a dial to a host that drops SYNs gives.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestFailedDialIsRetried: a request whose connection was never made was sent nowhere, so it is
// answered with Retry-After (client-go sends it again), whether the dial was refused or timed
// out (a green host behind a firewall that drops SYNs); one that timed out after it left is not.
func TestFailedDialIsRetried(t *testing.T) {
	u, _ := url.Parse("https://10.0.0.9:6443")
	cases := []struct {
		name       string
		err        error
		code       int
		retryAfter string
	}{
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, http.StatusBadGateway, "1"},
		{"dial timed out", &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, http.StatusBadGateway, "1"},
		{"timed out after it was sent", &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, http.StatusGatewayTimeout, ""},
		// A fatal TLS alert may end a connection that carried other writes, one the backend
		// already acted on among them: not retried.
		{"a TLS alert", &net.OpError{Op: "remote error", Err: tls.AlertError(20)}, http.StatusBadGateway, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := &reqState{backend: &backend{url: u}}
			r := httptest.NewRequest(http.MethodPost, "/api/v1/namespaces/default/configmaps", nil)
			r = r.WithContext(withReqState(r.Context(), st))
			w := httptest.NewRecorder()
			upstreamError(slog.New(slog.DiscardHandler))(w, r, tc.err)
			if w.Code != tc.code || w.Header().Get("Retry-After") != tc.retryAfter {
				t.Errorf("answer %d Retry-After=%q, want %d Retry-After=%q", w.Code, w.Header().Get("Retry-After"), tc.code, tc.retryAfter)
			}
		})
	}
}

// TestHandshakeTimeoutIsRetried: a backend that takes the connection and never answers its TLS
// handshake (a host half up) was sent nothing, over HTTP/1.1 as over HTTP/2: the client gets 502
// with Retry-After (client-go sends it again), not 504 without.
func TestHandshakeTimeoutIsRetried(t *testing.T) {
	defer func(d time.Duration) { upstreamHandshakeTimeout = d }(upstreamHandshakeTimeout)
	upstreamHandshakeTimeout = 300 * time.Millisecond
	addr := testnet.Silent(t)
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%v", h2), func(t *testing.T) {
			p := startProxy(t, "https://"+addr, func(o *Options) { o.UpstreamHTTP2 = h2 })
			for _, m := range []string{"GET", "POST"} {
				resp, body := do(t, m, p.url+"/api/v1/namespaces/default/configmaps")
				if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Retry-After") != "1" {
					t.Errorf("%s to a backend that never finishes its handshake: %d Retry-After=%q %s; want 502 with Retry-After: 1", m, resp.StatusCode, resp.Header.Get("Retry-After"), body)
				}
			}
		})
	}
}
