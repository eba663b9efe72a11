package proxy

import (
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestDialOneConnectionAtATime: writes, or watches, sent at once through the proxy to an HTTP/2
// backend share its connections, and each new connection is dialled once, when the open ones
// are full: they used to dial one connection apiece whenever none had room, and close all but
// one after its TLS handshake (a switch moving 5,000 watches made ~780 handshakes with green's
// apiserver for ~20 connections kept). To a backend that does not speak HTTP/2 they go over
// HTTP/1.1, sent again there after the dial that found it out (nothing of them was sent on it),
// a watch on a connection of its own, and none waits for another.
func TestDialOneConnectionAtATime(t *testing.T) {
	const n = 60
	type kind struct {
		name string
		send func(url string) (*http.Response, error)
	}
	watch := kind{"watches", func(url string) (*http.Response, error) {
		return http.Get(url + "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=5")
	}}
	write := kind{"writes", func(url string) (*http.Response, error) {
		return http.Post(url+"/api/v1/namespaces/default/configmaps", "application/json", strings.NewReader(`{"kind":"ConfigMap"}`))
	}}
	http2 := func(s *httptest.Server) { s.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 10} }
	http1 := func(s *httptest.Server) { s.EnableHTTP2 = false }
	cases := []struct {
		kind      kind
		backend   string
		configure func(*httptest.Server)
		maxDials  int64
	}{
		{watch, "HTTP/2, 10 streams a connection", http2, n / 10},
		{write, "HTTP/2, 10 streams a connection", http2, n / 10},
		{watch, "HTTP/1.1 only", http1, n + 1}, // +1: the dial that found HTTP/2 not negotiated
		{write, "HTTP/1.1 only", http1, n + 1},
	}
	for _, tc := range cases {
		t.Run(tc.kind.name+"/"+tc.backend, func(t *testing.T) {
			b := newHoldingBackend(t, tc.configure)
			p := startProxy(t, b.URL, func(o *Options) {
				o.UpstreamCAFile = b.caFile
				o.AllowedBackends = append(o.AllowedBackends, "https://127.0.0.1:*")
			})
			statuses := make(chan int, n)
			for range n {
				go func() {
					resp, err := tc.kind.send(p.url)
					if err != nil {
						statuses <- 0
						return
					}
					statuses <- resp.StatusCode
					<-b.release // a watch stays open until then
					resp.Body.Close()
				}()
			}
			waitFor(t, func() bool { return b.arrived.Load() == n })
			dialed := b.conns.Load()
			close(b.release)
			for range n {
				if st := <-statuses; st != http.StatusOK && st != http.StatusCreated {
					t.Errorf("answered %d, want 200 (a watch) or 201 (a write)", st)
				}
			}
			t.Logf("%d %s at once, %d connection(s) dialed", n, tc.kind.name, dialed)
			if dialed > tc.maxDials {
				t.Fatalf("%d connections dialed for %d %s, want at most %d", dialed, n, tc.kind.name, tc.maxDials)
			}
		})
	}
}

// holdingBackend is a TLS backend that holds every request it gets until release is closed: a
// watch after its answer's headers, a write (its body checked) before its answer. It counts the
// requests that arrived and the connections made to it.
type holdingBackend struct {
	*httptest.Server
	caFile         string
	arrived, conns atomic.Int64
	release        chan struct{}
}

func newHoldingBackend(t *testing.T, configure func(*httptest.Server)) *holdingBackend {
	b := &holdingBackend{release: make(chan struct{})}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			b.arrived.Add(1)
			select {
			case <-b.release:
			case <-r.Context().Done():
			}
			return
		}
		if body, err := io.ReadAll(r.Body); err != nil || string(body) != `{"kind":"ConfigMap"}` {
			t.Errorf("the backend got body %q, %v", body, err)
		}
		b.arrived.Add(1)
		<-b.release
		w.WriteHeader(http.StatusCreated)
	}))
	srv.EnableHTTP2 = true
	configure(srv)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake the proxy fails
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			b.conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	b.Server = srv
	b.caFile = filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(b.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}
