package proxy

import (
	"encoding/pem"
	"fmt"
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

	"github.com/kubefence/kubefence/proxy/admin"
)

// tlsWatchAPI is a watchAPI served over TLS with HTTP/2, as kube-apiserver, that counts the
// connections made to it.
type tlsWatchAPI struct {
	*watchAPI
	caFile string
	conns  atomic.Int64
}

func newTLSWatchAPI(t *testing.T, name string, fr framing) *tlsWatchAPI {
	a := &tlsWatchAPI{watchAPI: &watchAPI{fr: fr}}
	srv := httptest.NewUnstartedServer(a.handler(name))
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes cut by the test's end
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			a.conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	a.Server = srv
	a.caFile = filepath.Join(t.TempDir(), name+"-ca.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(a.caFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestPreparedSwitchDialsNothing: watches moved by a switch to a backend prepared before the
// fence go over the connection the prepare opened: the switch dials nothing and no TLS handshake
// happens inside the window. Unprepared, the same switch dials (one connection per watch that
// finds none open).
func TestPreparedSwitchDialsNothing(t *testing.T) {
	const watches = 20
	for _, prepare := range []bool{false, true} {
		t.Run(fmt.Sprintf("prepared=%v", prepare), func(t *testing.T) {
			blue := newWatchAPI(t, "blue", framingJSON)
			green := newTLSWatchAPI(t, "green", framingJSON)
			p := startProxy(t, blue.URL, func(o *Options) {
				o.AllowedBackends = append(o.AllowedBackends, "https://127.0.0.1:*")
			})
			clients := openWatches(t, p, blue, watches)
			if prepare {
				resp, err := p.admin.PrepareBackend(t.Context(), admin.PrepareRequest{URL: green.URL, CAFile: green.caFile})
				if err != nil {
					t.Fatal(err)
				}
				if resp.Connections == 0 {
					t.Fatalf("prepare = %+v, want connections opened", resp)
				}
			}
			before := green.conns.Load()
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true}); err != nil {
				t.Fatal(err)
			}
			sw, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL, CAFile: green.caFile, ResumeWatches: true})
			if err != nil {
				t.Fatal(err)
			}
			if sw.Drain.Resumed != watches || sw.Prepared != prepare {
				t.Fatalf("switch = %+v (prepared %v), want %d watches resumed, prepared %v", sw.Drain, sw.Prepared, watches, prepare)
			}
			sendAll(t, green.watchAPI, clients, testEvent{"MODIFIED", "a", "11"})
			// Every watch is on green now: the dials it took are all made.
			dialed := green.conns.Load() - before
			t.Logf("switch: %+v, %d connection(s) dialed to green", sw.Drain, dialed)
			switch {
			case prepare && dialed != 0:
				t.Fatalf("the switch to a prepared backend dialed %d connection(s), want none", dialed)
			case !prepare && dialed < 2:
				t.Fatalf("the switch to an unprepared backend dialed %d connection(s): the premise (it dials) is gone", dialed)
			}
		})
	}
}

// TestPrepareBackend: what a prepare checks, and when a switch uses what it made ready.
func TestPrepareBackend(t *testing.T) {
	other := newTLSWatchAPI(t, "other", framingJSON)
	unrelatedCA := newTestCA(t, t.TempDir(), "unrelated").pem
	cases := []struct {
		name     string
		prepare  func(g *tlsWatchAPI) admin.PrepareRequest
		wantErr  string // of the prepare
		between  func(t *testing.T, p *testProxy, g *tlsWatchAPI)
		wantUsed bool // the switch to green used the prepared backend
	}{
		{name: "used", prepare: func(g *tlsWatchAPI) admin.PrepareRequest {
			return admin.PrepareRequest{URL: g.URL, CAFile: g.caFile}
		}, wantUsed: true},
		{name: "the URL with a trailing slash is the same backend", prepare: func(g *tlsWatchAPI) admin.PrepareRequest {
			return admin.PrepareRequest{URL: g.URL + "/", CAFile: g.caFile}
		}, wantUsed: true},
		{name: "another backend prepared", prepare: func(*tlsWatchAPI) admin.PrepareRequest {
			return admin.PrepareRequest{URL: other.URL, CAFile: other.caFile}
		}},
		{name: "a newer prepare replaces it", prepare: func(*tlsWatchAPI) admin.PrepareRequest {
			return admin.PrepareRequest{URL: other.URL, CAFile: other.caFile}
		}, between: func(t *testing.T, p *testProxy, g *tlsWatchAPI) {
			if _, err := p.admin.PrepareBackend(t.Context(), admin.PrepareRequest{URL: g.URL, CAFile: g.caFile}); err != nil {
				t.Fatal(err)
			}
		}, wantUsed: true},
		{name: "the CA file changed since", prepare: func(g *tlsWatchAPI) admin.PrepareRequest {
			return admin.PrepareRequest{URL: g.URL, CAFile: g.caFile}
		}, between: func(t *testing.T, _ *testProxy, g *tlsWatchAPI) {
			ca, err := os.ReadFile(g.caFile)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(g.caFile, append(ca, '\n'), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "prepared too long ago", prepare: func(g *tlsWatchAPI) admin.PrepareRequest {
			return admin.PrepareRequest{URL: g.URL, CAFile: g.caFile}
		}, between: func(_ *testing.T, p *testProxy, _ *tlsWatchAPI) {
			p.prepared.mu.Lock()
			p.prepared.p.at = p.prepared.p.at.Add(-admin.PreparedFor)
			p.prepared.mu.Unlock()
		}},
		{name: "not allowed", prepare: func(*tlsWatchAPI) admin.PrepareRequest {
			return admin.PrepareRequest{URL: "https://127.0.0.2:6443"}
		}, wantErr: "not allowed"},
		{name: "its certificate does not verify", prepare: func(g *tlsWatchAPI) admin.PrepareRequest {
			return admin.PrepareRequest{URL: g.URL, CAFile: unrelatedCA}
		}, wantErr: "TLS handshake verified with its CA file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newTLSWatchAPI(t, "green", framingJSON)
			blue := newWatchAPI(t, "blue", framingJSON)
			p := startProxy(t, blue.URL, func(o *Options) {
				o.AllowedBackends = append(o.AllowedBackends, "https://127.0.0.1:*")
			})
			_, err := p.admin.PrepareBackend(t.Context(), tc.prepare(g))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("prepare: %v, want an error with %q", err, tc.wantErr)
				}
				if p.prepared.p != nil {
					t.Fatal("a refused prepare kept a backend")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.between != nil {
				tc.between(t, p, g)
			}
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true}); err != nil {
				t.Fatal(err)
			}
			sw, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: g.URL, CAFile: g.caFile})
			if err != nil {
				t.Fatal(err)
			}
			if sw.Prepared != tc.wantUsed || sw.Status.Backend != g.URL {
				t.Fatalf("switch: prepared %v on %s, want prepared %v on %s", sw.Prepared, sw.Status.Backend, tc.wantUsed, g.URL)
			}
			if p.prepared.p != nil {
				t.Fatal("the switch left a prepared backend behind")
			}
			if resp, body := do(t, "GET", p.url+"/api/v1/namespaces", "Authorization", "Bearer x"); resp.StatusCode != 200 || !strings.Contains(body, "green") {
				t.Fatalf("a read after the switch = %s %s, want green's answer", resp.Status, body)
			}
		})
	}
}
