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
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefence/kubefence/proxy/admin"
)

// tlsWatchAPI is a watchAPI served over TLS with HTTP/2, as kube-apiserver, that counts the
// connections made to it. configure, when given, changes the server before it starts.
type tlsWatchAPI struct {
	*watchAPI
	caFile string
	conns  atomic.Int64
}

func newTLSWatchAPI(t *testing.T, name string, fr framing, configure ...func(*httptest.Server)) *tlsWatchAPI {
	a := &tlsWatchAPI{watchAPI: &watchAPI{fr: fr}}
	a.Server = httptest.NewUnstartedServer(a.handler(name))
	a.caFile = startCountingTLS(t, a.Server, &a.conns, configure...)
	return a
}

// startCountingTLS starts srv over TLS with HTTP/2, as kube-apiserver serves (configure may
// change that first), counts the connections made to it in conns, and returns the path of a
// file holding its CA certificate. It is closed at the test's end.
func startCountingTLS(t *testing.T, srv *httptest.Server, conns *atomic.Int64, configure ...func(*httptest.Server)) string {
	srv.EnableHTTP2 = true
	for _, c := range configure {
		c(srv)
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes cut by the test's end, or failed by the proxy
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	return caFile
}

// TestPreparedSwitchDialsNothing: watches moved by a switch to a backend prepared before the
// fence go over the connection the prepare opened: the switch dials nothing and no TLS handshake
// happens inside the window. Unprepared, the same switch dials one connection, which every watch
// shares (it used to dial one per watch that found none open, all but one closed again), besides
// the one the switch checks the backend's certificate on.
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
			case !prepare && dialed != 2:
				t.Fatalf("the switch to an unprepared backend dialed %d connection(s), want one for all %d watches and the switch's check", dialed, watches)
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

// TestPrepareReadsWatchesAhead: a watch's resourceVersion is read from its last event only when
// a switch asks for it (a copy per event, not a decode), which made every watch a switch moves
// parse its last event inside the write window. A prepare announces the switch: from then on the
// watches on the active backend have their last event read at once and every new one as it
// passes, until the switch (on the new backend they copy again) or until the prepare expires.
func TestPrepareReadsWatchesAhead(t *testing.T) {
	defer func(d time.Duration) { readAheadFor = d }(readAheadFor)
	for _, fr := range framings {
		for _, expire := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/expire=%v", fr, expire), func(t *testing.T) {
				readAheadFor = admin.PreparedFor
				if expire {
					readAheadFor = 200 * time.Millisecond
				}
				blue, green := newWatchAPI(t, "blue", fr), newTLSWatchAPI(t, "green", fr)
				p := startProxy(t, blue.URL, func(o *Options) {
					o.AllowedBackends = append(o.AllowedBackends, "https://127.0.0.1:*")
				})
				clients := make([]*watchClient, 2)
				for i := range clients {
					clients[i] = openWatch(t, p, fr, "resourceVersion=5")
					sendOne(t, blue, i+1, clients[i], fr, testEvent{"ADDED", "a", "10"})
				}
				if n, rvs := unread(p); n != 2 {
					t.Fatalf("%d watch(es) with their last event unread before the prepare (resourceVersions read: %v); the premise (read when a switch asks) is gone", n, rvs)
				}
				if _, err := p.admin.PrepareBackend(t.Context(), admin.PrepareRequest{URL: green.URL, CAFile: green.caFile}); err != nil {
					t.Fatal(err)
				}
				if n, rvs := unread(p); n != 0 || rvs[0] != "10" || rvs[1] != "10" {
					t.Fatalf("after the prepare: %d watch(es) with their last event unread, resourceVersions read %v; want none, both 10", n, rvs)
				}
				if expire {
					time.Sleep(2 * readAheadFor)
				}
				sendOne(t, blue, 1, clients[0], fr, testEvent{"MODIFIED", "a", "11"})
				if n, _ := unread(p); n != map[bool]int{false: 0, true: 1}[expire] {
					t.Fatalf("an event after the prepare (expired %v) left %d watch(es) with their last event unread", expire, n)
				}
				if expire {
					return
				}
				if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true}); err != nil {
					t.Fatal(err)
				}
				sw, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL, CAFile: green.caFile, ResumeWatches: true})
				if err != nil || sw.Drain.Resumed != 2 || !sw.Prepared {
					t.Fatalf("switch = %+v, %v; want both watches moved to the prepared backend", sw, err)
				}
				if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
					t.Fatal(err)
				}
				// The watches moved in any order: every one of green's gets the event.
				for i := range clients {
					green.watch(t, i+1).feed <- frame(t, fr, testEvent{"MODIFIED", "a", "12"}, nil)
				}
				for _, c := range clients {
					c.expect(t, testEvent{"MODIFIED", "a", "12"})
				}
				if n, _ := unread(p); n != 2 {
					t.Fatalf("on the new backend, %d watch(es) with their last event unread; want both (read when a switch asks, again)", n)
				}
			})
		}
	}
}

// sendOne has api's n-th watch send ev and checks that c gets it.
func sendOne(t *testing.T, api *watchAPI, n int, c *watchClient, fr framing, ev testEvent) {
	t.Helper()
	api.watch(t, n).feed <- frame(t, fr, ev, nil)
	c.expect(t, ev)
}

// unread counts the watches on p's active backend whose last event is kept unread, and returns
// the resourceVersions read so far (in no particular order).
func unread(p *testProxy) (int, []string) {
	n, rvs := 0, []string{}
	for _, s := range p.active.Load().list() {
		s.mu.Lock()
		w := s.body
		s.mu.Unlock()
		w.mu.Lock()
		if len(w.rv.last) > 0 {
			n++
		}
		rvs = append(rvs, w.rv.rv)
		w.mu.Unlock()
	}
	return n, rvs
}

// TestSwitchClosesTheOldWatchConnections: a resuming switch takes the watches idle at an event
// boundary (most of them) off the old backend itself, and wakes them by closing the old
// backend's watch connections once, rather than waiting for each to close its stream (a stream
// reset, a frame and a system call apiece) and leave, one after the other, inside the window; a
// busy watch in the middle of an event first finishes that event (its head already reached the
// client: cutting the connection under it would cut the event). Every watch goes on exactly on
// the new backend.
func TestSwitchClosesTheOldWatchConnections(t *testing.T) {
	const quiet = 10
	for _, c := range []struct {
		fr    framing
		http1 bool // the backends do not speak HTTP/2: each watch has its own connection
	}{{framingJSON, false}, {framingProtobuf, false}, {framingJSON, true}} {
		fr := c.fr
		t.Run(fmt.Sprintf("%s/http1-only=%v", fr, c.http1), func(t *testing.T) {
			h1 := func(s *httptest.Server) { s.EnableHTTP2 = !c.http1 }
			blue, green := newTLSWatchAPI(t, "blue", fr, h1), newTLSWatchAPI(t, "green", fr, h1)
			p := startProxy(t, blue.URL, func(o *Options) {
				o.UpstreamCAFile = blue.caFile
				o.AllowedBackends = []string{"https://127.0.0.1:*"}
			})
			clients := make([]*watchClient, quiet)
			for i := range clients {
				clients[i] = openWatch(t, p, fr, "resourceVersion=5")
				sendOne(t, blue.watchAPI, i+1, clients[i], fr, testEvent{"ADDED", "a", "10"})
			}
			busy := openWatch(t, p, fr, "resourceVersion=5")
			stop := busyFeed(t, fr, blue.watch(t, quiet+1))
			busy.expect(t, testEvent{"MODIFIED", "a", "10"})
			old := p.active.Load()
			sw := switchTo(t, p, green.URL, true)
			close(stop)
			if sw.Drain.Streams != quiet+1 || sw.Drain.Resumed != quiet+1 || sw.Drain.Forced != 0 {
				t.Fatalf("drain = %+v, want all %d watches moved, none cut at the timeout", sw.Drain, quiet+1)
			}
			// A quiet watch is taken off by the drain itself, or, if the proxy had not asked for
			// more since writing it its event, woken by closing the connections.
			if took, woken := old.tookOff.Load(), old.woken.Load(); took+woken < quiet || took+woken > quiet+1 || took == 0 {
				t.Fatalf("the drain took %d watch(es) off itself and woke %d by closing the old backend's watch connections; want the %d quiet ones (the busy one too if it was between events then), most taken off", took, woken, quiet)
			}
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
				t.Fatal(err)
			}
			for i := range quiet + 1 {
				green.watch(t, i+1).feed <- frame(t, fr, testEvent{"ADDED", "b", "1000"}, nil)
			}
			for _, c := range clients {
				c.expect(t, testEvent{"ADDED", "b", "1000"})
			}
			last := "10"
			for {
				got, err := busy.next()
				if err != nil {
					t.Fatalf("the busy watch after resourceVersion %s: %v", last, err)
				}
				if got.name == "b" {
					break
				}
				last = got.rv
			}
			asked := map[string]int{}
			for i := range quiet + 1 {
				asked[green.watch(t, i+1).query.Get("resourceVersion")]++
			}
			// The quiet ones from the revision before their one event's (the rest of its
			// revision's events, if any, come again: rvTracker.batch); the busy one, whose
			// events passed unread, from its last event's.
			if asked["9"] != quiet && !(asked["9"] == quiet+1 && last == "10") || asked[last] == 0 {
				t.Fatalf("green asked from %v; want the quiet watches from 9 and the busy one from %s, its last event", asked, last)
			}
		})
	}
}

// TestStalledWatchDoesNotCostTheIdleOnes: a watch stalled in the middle of an event keeps the
// switch from closing the old backend's watch connections until the drain timeout, when it is
// cut, as before (counted once, even when cutting it does not make it leave at once: its client
// does not read); the idle watches parked meanwhile still move then, they are not cut with it.
func TestStalledWatchDoesNotCostTheIdleOnes(t *testing.T) {
	const quiet = 5
	// Long enough that one drain's wait on a loaded machine stays apart from two.
	const drain = 1500 * time.Millisecond
	cases := []struct {
		name string
		// stall has blue's n-th watch, open through the proxy for c, stop in the middle of an
		// event whose head reached c.
		stall func(t *testing.T, blue *watchAPI, n int, c *watchClient)
	}{
		{name: "the backend stalls", stall: func(t *testing.T, blue *watchAPI, n int, c *watchClient) {
			ev := frame(t, framingJSON, testEvent{"ADDED", "a", "10"}, nil)
			blue.watch(t, n).feed <- ev[:len(ev)/2] // and never the rest
			if _, err := c.r.Peek(1); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "the client stops reading", stall: func(t *testing.T, blue *watchAPI, n int, c *watchClient) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "default", ResourceVersion: "10"},
				Data: map[string]string{"x": strings.Repeat("x", 32<<20)}}
			ev := frameObject(t, framingJSON, "ADDED", cm)
			blue.watch(t, n).feed <- ev // more than the sockets between hold: the proxy's write blocks
			if _, err := c.r.Peek(1); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // the client reads no more
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			blue, green := newTLSWatchAPI(t, "blue", framingJSON), newTLSWatchAPI(t, "green", framingJSON)
			p := startProxy(t, blue.URL, func(o *Options) {
				o.UpstreamCAFile = blue.caFile
				o.AllowedBackends = []string{"https://127.0.0.1:*"}
				o.DrainTimeout = drain
			})
			clients := make([]*watchClient, quiet)
			for i := range clients {
				clients[i] = openWatch(t, p, framingJSON, "resourceVersion=5")
				sendOne(t, blue.watchAPI, i+1, clients[i], framingJSON, testEvent{"ADDED", "a", "10"})
			}
			tc.stall(t, blue.watchAPI, quiet+1, openWatch(t, p, framingJSON, "resourceVersion=5"))
			sw := switchTo(t, p, green.URL, true)
			if sw.Drain.Forced != 1 || sw.Drain.Resumed != quiet || time.Duration(sw.Drain.Duration) > drain*19/10 { // a second wait: twice the drain timeout
				t.Fatalf("drain = %+v; want the stalled watch cut once at the timeout, the %d idle ones moved, and no second wait", sw.Drain, quiet)
			}
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
				t.Fatal(err)
			}
			for i := range quiet {
				green.watch(t, i+1).feed <- frame(t, framingJSON, testEvent{"ADDED", "b", "1000"}, nil)
			}
			for _, c := range clients {
				c.expect(t, testEvent{"ADDED", "b", "1000"})
			}
		})
	}
}

// TestTakeOff: the drain takes a parked watch off the old backend itself, whether or not what
// it read last has been written to its client yet, when it is still open and its client
// certificate, if it forwards one, still verifies; a watch taken off counts as
// pending on the new backend until it goes on there, or until its client leaves first.
func TestTakeOff(t *testing.T) {
	cases := []struct {
		name               string
		out                bool // the last Read returned bytes not yet written
		identity, verifies bool
		// ended, when set, ends the watch before the drain comes to it: its old body ended
		// (Read returned an error), or its client left (Close).
		ended func(*watchBody)
		taken bool
	}{
		{name: "idle", taken: true},
		{name: "its old body ended", ended: func(w *watchBody) { _, _ = w.Read(make([]byte, 64)) }},
		{name: "its client left", ended: func(w *watchBody) { _ = w.Close() }},
		// Its goroutine writes them to a client that may read slowly, or not at all: the
		// switch waited for it up to --drain-timeout (10 s, twice the window's budget).
		{name: "its last events not written yet", out: true, taken: true},
		{name: "a forwarded identity that verifies", identity: true, verifies: true, taken: true},
		{name: "a forwarded identity that no longer verifies", identity: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, nb, w := watchToMove(t)
			w.resume.identity, w.resume.verified = tc.identity, func() bool { return tc.verifies }
			w.out = tc.out
			tracked := 1
			if tc.ended != nil {
				tc.ended(w)
				tracked = b.openStreams()
			}
			w.mu.Lock()
			w.takeOff(nb)
			w.mu.Unlock()
			want := map[bool]int{true: 1}[tc.taken]
			// Pending on the new backend only once its goroutine is free to ask it: not while it
			// writes to a client that may never read again.
			pending := map[bool]int64{true: 1}[tc.taken && !tc.out]
			if w.takenOff != tc.taken || b.openStreams() != tracked-want || b.resumed != want || nb.resumesPending.Load() != pending || w.takenRV != map[bool]string{true: "5"}[tc.taken] {
				t.Fatalf("taken off %v (from %q), %d stream(s) left on the old backend (%d counted resumed), %d pending on the new; want taken off %v, %d pending", w.takenOff, w.takenRV, b.openStreams(), b.resumed, nb.resumesPending.Load(), tc.taken, pending)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if w.takenOff || nb.resumesPending.Load() != 0 {
				t.Fatalf("after its client left: taken off %v, %d pending; want nothing left pending", w.takenOff, nb.resumesPending.Load())
			}
		})
	}
}

// TestMoveTakesOffAWatchStillWriting: on a backend whose watches are not parked (each on a
// connection of its own), a watch at a boundary whose goroutine is still writing what it read
// last to its client is taken off by the switch itself: that goroutine comes back to read only
// once its client has taken the bytes, which a client that stopped reading never does. One
// whose goroutine waits in Read is woken and moves itself, as before.
func TestMoveTakesOffAWatchStillWriting(t *testing.T) {
	for _, park := range []bool{false, true} {
		for _, out := range []bool{true, false} {
			b, nb, w := watchToMove(t)
			old := &closeRecorder{ReadCloser: w.rc}
			w.rc, w.out = old, out
			want := map[bool]departure{true: departGone, false: departs}[out]
			if park && !out {
				want = departParked
			}
			if d := w.moveTo(nb, park); d != want {
				t.Fatalf("park %v out %v: departure %v, want %v", park, out, d, want)
			}
			if w.takenOff != (out || park) || b.openStreams() != map[bool]int{false: 1}[out || park] {
				t.Errorf("park %v out %v: taken off %v, %d stream(s) left on the old backend", park, out, w.takenOff, b.openStreams())
			}
			// Taken off while it writes, nothing more is read from the old body: it is closed at
			// once, not kept open (its events buffered) until the client reads again.
			if out && !old.closed.Load() {
				t.Errorf("park %v out %v: the old body is still open", park, out)
			}
			_ = w.Close()
		}
	}
}

// closeRecorder records that its body was closed.
type closeRecorder struct {
	io.ReadCloser
	closed atomic.Bool
}

func (c *closeRecorder) Close() error {
	c.closed.Store(true)
	return c.ReadCloser.Close()
}

// TestEndingWatchStillWritingLeavesAtOnce: a watch a switch ends rather than moves (it cannot
// be resumed, or the switch does not resume watches), at a boundary while its goroutine is still
// writing what it read last to its client, is taken off the old backend by the switch itself:
// it reads nothing more there (its next Read ends it), and a client that stopped reading (a
// paused 'kubectl get -w | less') would otherwise hold the switch, and the fence, for
// --drain-timeout. One whose goroutine waits in Read is woken and leaves itself, as before.
func TestEndingWatchStillWritingLeavesAtOnce(t *testing.T) {
	for _, resume := range []bool{true, false} {
		for _, out := range []bool{true, false} {
			b, nb, w := watchToMove(t)
			w.rv.unanchored = true // started without a resourceVersion: not resumable
			w.out = out
			s := w.resume.s
			s.body = w
			to := map[bool]*backend{true: nb}[resume]
			if parked := b.ask(s, to, false); parked {
				t.Fatalf("resume %v out %v: parked", resume, out)
			}
			if got, want := b.openStreams(), map[bool]int{false: 1}[out]; got != want {
				t.Errorf("resume %v out %v: %d stream(s) left on the old backend, want %d", resume, out, got, want)
			}
			if n, err := w.Read(make([]byte, 64)); n != 0 || err != io.EOF {
				t.Errorf("resume %v out %v: next Read = %d, %v; want the watch ended", resume, out, n, err)
			}
			_ = w.Close()
		}
	}
}

// watchToMove is a JSON watch at resourceVersion 5, tracked on a backend b, and the backend nb
// a switch would move it to.
func watchToMove(t *testing.T) (b, nb *backend, w *watchBody) {
	t.Helper()
	b, err := newBackend("http://127.0.0.1:1", "", TransportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nb, err = newBackend("http://127.0.0.1:2", "", TransportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := &stream{cancel: func() {}}
	if err := b.track(s); err != nil {
		t.Fatal(err)
	}
	w = newWatchBody(io.NopCloser(strings.NewReader("")), func() {}, framingJSON)
	w.resume = &resumeInfo{s: s, on: b}
	w.rv = &rvTracker{fr: framingJSON, start: "5"}
	return b, nb, w
}

// TestMovedWatchKeepsTheRestOfARevision: one revision may carry many events (a lease's expiry
// deletes all its keys at once, kube-apiserver gives each event that resourceVersion). A watch
// moved after some of them were delivered asks the new backend from the revision before and
// drops the events of that revision its client has: asked from the revision itself, the new
// backend sends only what comes after it, and the rest of the revision was lost.
func TestMovedWatchKeepsTheRestOfARevision(t *testing.T) {
	for _, fr := range framings {
		t.Run(fr.String(), func(t *testing.T) {
			blue, green := newWatchAPI(t, "blue", fr), newTLSWatchAPI(t, "green", fr)
			p := startProxy(t, blue.URL, func(o *Options) {
				o.AllowedBackends = append(o.AllowedBackends, "https://127.0.0.1:*")
			})
			ctx := t.Context()
			c := openWatch(t, p, fr, "resourceVersion=5")
			if _, err := p.admin.PrepareBackend(ctx, admin.PrepareRequest{URL: green.URL, CAFile: green.caFile}); err != nil {
				t.Fatal(err)
			}
			sendOne(t, blue, 1, c, fr, testEvent{"ADDED", "x", "9"})
			// Two of revision 10's deletes in one read; a third is not sent before the move.
			blue.watch(t, 1).feed <- append(frame(t, fr, testEvent{"DELETED", "a", "10"}, nil), frame(t, fr, testEvent{"DELETED", "b", "10"}, nil)...)
			c.expect(t, testEvent{"DELETED", "a", "10"})
			c.expect(t, testEvent{"DELETED", "b", "10"})
			moveTo(t, p, green)
			gw := green.watch(t, 1)
			if got := gw.query.Get("resourceVersion"); got != "9" {
				t.Fatalf("green was asked from resourceVersion %q, want 9: the revision before the one whose events were delivered in part", got)
			}
			// As kube-apiserver answers a watch from 9: every event after it.
			for _, ev := range []testEvent{{"DELETED", "a", "10"}, {"DELETED", "b", "10"}, {"DELETED", "c", "10"}, {"ADDED", "d", "11"}} {
				gw.feed <- frame(t, fr, ev, nil)
			}
			c.expect(t, testEvent{"DELETED", "c", "10"})
			c.expect(t, testEvent{"ADDED", "d", "11"})
		})
	}
}

// TestMovedWatchAfterABookmarkInARevision: kube-apiserver may send a BOOKMARK in the middle of a
// revision's events; those delivered before it are not known then, so the watch goes on from
// the revision itself, as before (asked from the one before, they would come twice).
func TestMovedWatchAfterABookmarkInARevision(t *testing.T) {
	fr := framingJSON
	blue, green := newWatchAPI(t, "blue", fr), newTLSWatchAPI(t, "green", fr)
	p := startProxy(t, blue.URL, func(o *Options) { o.AllowedBackends = append(o.AllowedBackends, "https://127.0.0.1:*") })
	ctx := t.Context()
	c := openWatch(t, p, fr, "resourceVersion=5&allowWatchBookmarks=true")
	if _, err := p.admin.PrepareBackend(ctx, admin.PrepareRequest{URL: green.URL, CAFile: green.caFile}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range []testEvent{{"DELETED", "a", "10"}, {"BOOKMARK", "", "10"}, {"DELETED", "b", "10"}} {
		sendOne(t, blue, 1, c, fr, ev)
	}
	moveTo(t, p, green)
	if got := green.watch(t, 1).query.Get("resourceVersion"); got != "10" {
		t.Fatalf("green asked from %q, want 10: a@10 came before the bookmark, and is not known to skip", got)
	}
}

// moveTo fences p, switches it to green resuming its watches, and lifts the fence, so that the
// moved watches ask green.
func moveTo(t *testing.T, p *testProxy, green *tlsWatchAPI) {
	t.Helper()
	ctx := t.Context()
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL, CAFile: green.caFile, ResumeWatches: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
}
