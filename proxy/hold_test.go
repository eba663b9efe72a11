package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefence/kubefence/policy"
	"github.com/kubefence/kubefence/proxy/admin"
)

func newTestGate(t *testing.T, fenced bool) *gate {
	t.Helper()
	g := &gate{now: time.Now}
	g.publish(State{Version: stateVersion, Fenced: fenced})
	return g
}

func setFence(t *testing.T, g *gate, on bool) {
	t.Helper()
	if _, err := g.update(func(st *State) error { st.Fenced = on; return nil }); err != nil {
		t.Fatal(err)
	}
}

func testWrite() inflightWrite {
	return inflightWrite{attrs: &policy.Attributes{Verb: "create"}, start: time.Now()}
}

// TestHoldReleasesInArrivalOrder: held writes are admitted one after the other in the order they
// arrived, and only once the fence is open.
func TestHoldReleasesInArrivalOrder(t *testing.T) {
	g := newTestGate(t, true)
	q := &holdQueue{maxCount: 100, maxBytes: 1 << 20}
	const n = 50
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	held := make([]*heldWrite, n)
	for i := range n {
		h, err := q.enter(10, false, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		held[i] = h
	}
	if got := q.stats(); got.count != n || got.bytes != 10*n {
		t.Fatalf("stats = %+v", got)
	}
	for i := n - 1; i >= 0; i-- { // start the waiters in reverse: order must come from arrival
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id, out := g.awaitRelease(context.Background(), held[i], nil, nil, testWrite())
			if out != holdReleased {
				t.Errorf("write %d: outcome %d", i, out)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			held[i].leave()
			g.inflight.remove(id)
		}(i)
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	early := len(order)
	mu.Unlock()
	if early != 0 {
		t.Fatalf("%d held write(s) admitted while fenced", early)
	}
	setFence(t, g, false)
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Fatalf("admitted in order %v, want arrival order", order)
		}
	}
	if got := q.stats(); got != (heldNow{}) {
		t.Fatalf("after release: %+v", got)
	}
}

func TestHoldBounds(t *testing.T) {
	q := &holdQueue{maxCount: 2, maxBytes: 100}
	a, err := q.enter(60, false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.enter(50, false, time.Now()); !errors.Is(err, errHoldFull) || !strings.Contains(err.Error(), "--max-held-bytes, 100 bytes") {
		t.Fatalf("over the byte bound: %v, want errHoldFull naming --max-held-bytes", err)
	}
	b, err := q.enter(40, false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.enter(0, false, time.Now()); !errors.Is(err, errHoldFull) || !strings.Contains(err.Error(), "--max-held-requests, 2 writes") {
		t.Fatalf("over the count bound: %v, want errHoldFull naming --max-held-requests", err)
	}
	a.leave()
	a.leave() // harmless twice
	if got := q.stats(); got.count != 1 || got.bytes != 40 {
		t.Fatalf("stats after one left = %+v", got)
	}
	b.leave()
	if q.full.Load() != 2 {
		t.Fatalf("full = %d, want 2", q.full.Load())
	}
}

// TestHoldQueueShares: what writes from unverified clients may hold of the waiting room, and that
// verified writes may take the rest, but no more than the totals.
func TestHoldQueueShares(t *testing.T) {
	cases := []struct {
		name                  string
		maxCount              int
		maxBytes, maxBody     int64
		verifies              bool
		size                  int64 // each write's body
		wantUnverified        int   // writes unverified clients may hold
		wantVerifiedAfterward int   // writes verified clients may then still hold
	}{
		{"a quarter of the writes kept", 8, 1 << 20, 1 << 10, true, 0, 6, 2},
		{"a quarter of the bytes kept", 100, 80, 10, true, 10, 6, 2},
		{"one largest body for unverified clients at least", 100, 80, 70, true, 10, 7, 1},
		{"one write for unverified clients at least", 1, 80, 10, true, 0, 1, 0},
		{"no certificates verified: no share kept", 8, 1 << 20, 1 << 10, false, 0, 8, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := newHoldQueue(tc.maxCount, tc.maxBytes, tc.maxBody, tc.verifies)
			var held []*heldWrite
			enter := func(n int, verified bool) error {
				for range n {
					h, err := q.enter(tc.size, verified, time.Now())
					if err != nil {
						return err
					}
					held = append(held, h)
				}
				return nil
			}
			if err := enter(tc.wantUnverified, false); err != nil {
				t.Fatalf("unverified writes could not hold %d: %v", tc.wantUnverified, err)
			}
			wantShown := 0 // a proxy that verifies no certificate has no unverified clients to show
			if tc.verifies {
				wantShown = tc.wantUnverified
			}
			if h := (&holder{q: q}).status(); h.Held != tc.wantUnverified || h.HeldUnverified != wantShown || h.HeldUnverifiedBytes != int64(wantShown)*tc.size {
				t.Errorf("fence status shows %d held, %d of them unverified (%d bytes), want %d, %d (%d bytes)",
					h.Held, h.HeldUnverified, h.HeldUnverifiedBytes, tc.wantUnverified, wantShown, int64(wantShown)*tc.size)
			}
			err := enter(1, false)
			if !errors.Is(err, errHoldFull) {
				t.Fatalf("unverified writes held %d, want %d at most (err %v)", tc.wantUnverified+1, tc.wantUnverified, err)
			}
			if !tc.verifies && errors.Is(err, errHoldUnverifiedFull) {
				t.Errorf("a proxy that verifies no certificate refused for the unverified clients' share: %v", err)
			}
			if err := enter(tc.wantVerifiedAfterward, true); err != nil {
				t.Fatalf("verified writes could not hold the %d left: %v", tc.wantVerifiedAfterward, err)
			}
			if err := enter(1, true); !errors.Is(err, errHoldFull) || errors.Is(err, errHoldUnverifiedFull) {
				t.Fatalf("a verified write beyond the totals: %v, want errHoldFull", err)
			}
			for _, h := range held {
				h.leave()
			}
			if n := q.stats(); n != (heldNow{}) {
				t.Fatalf("after leaving: %+v", n)
			}
		})
	}
}

// TestHoldTimeoutAndAbandon: a write whose hold times out, or whose client leaves, is never
// admitted and passes its turn on.
func TestHoldTimeoutAndAbandon(t *testing.T) {
	g := newTestGate(t, true)
	q := &holdQueue{maxCount: 10, maxBytes: 1 << 20}
	first, _ := q.enter(1, false, time.Now())
	second, _ := q.enter(1, false, time.Now())
	third, _ := q.enter(1, false, time.Now())

	if _, out := g.awaitRelease(context.Background(), first, time.After(20*time.Millisecond), nil, testWrite()); out != holdTimedOut {
		t.Fatalf("first: outcome %d, want timed out", out)
	}
	first.leave()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, out := g.awaitRelease(ctx, second, nil, nil, testWrite()); out != holdAbandoned {
		t.Fatalf("second: outcome %d, want abandoned", out)
	}
	second.leave()
	if g.inflight.len() != 0 {
		t.Fatal("a write that was not released is registered as in flight")
	}
	setFence(t, g, false)
	id, out := g.awaitRelease(context.Background(), third, time.After(time.Second), nil, testWrite())
	if out != holdReleased || id == 0 {
		t.Fatalf("third: outcome %d, want released after the others left", out)
	}
}

// TestHoldTimeoutDuringAdmission: a held write whose timeout fires while its admission waits for
// the gate's lock (a fence change saving the state file) is not admitted: it timed out.
func TestHoldTimeoutDuringAdmission(t *testing.T) {
	g := newTestGate(t, false)
	q := &holdQueue{maxCount: 10, maxBytes: 1 << 20}
	h, _ := q.enter(1, false, time.Now())
	deadline := make(chan time.Time)
	slots := make(chan struct{}, 1)
	slots <- struct{}{} // the release slots are taken: the write waits past the fence's checks
	out := make(chan holdOutcome, 1)
	go func() {
		_, o := g.awaitRelease(context.Background(), h, deadline, slots, testWrite())
		out <- o
	}()
	time.Sleep(20 * time.Millisecond)
	g.mu.Lock() // a state change in progress
	<-slots
	time.Sleep(50 * time.Millisecond) // the write took the slot and waits for the lock to be admitted
	close(deadline)
	time.Sleep(10 * time.Millisecond)
	g.mu.Unlock()
	if o := <-out; o != holdTimedOut || g.inflight.len() != 0 {
		t.Fatalf("outcome %d with %d write(s) registered, want timed out and none", o, g.inflight.len())
	}
}

// TestHoldRefenced: a fence that comes back on before a held write's turn keeps it waiting.
func TestHoldRefenced(t *testing.T) {
	g := newTestGate(t, true)
	q := &holdQueue{maxCount: 10, maxBytes: 1 << 20}
	first, _ := q.enter(1, false, time.Now())
	second, _ := q.enter(1, false, time.Now())
	setFence(t, g, false)
	if _, out := g.awaitRelease(context.Background(), first, nil, nil, testWrite()); out != holdReleased {
		t.Fatal("first not released")
	}
	setFence(t, g, true) // on again before second's turn
	first.leave()
	done := make(chan holdOutcome, 1)
	go func() {
		_, out := g.awaitRelease(context.Background(), second, time.After(5*time.Second), nil, testWrite())
		done <- out
	}()
	select {
	case out := <-done:
		t.Fatalf("second ended (%d) while fenced again", out)
	case <-time.After(50 * time.Millisecond):
	}
	setFence(t, g, false)
	if out := <-done; out != holdReleased {
		t.Fatalf("second: outcome %d after the fence lifted again", out)
	}
}

// TestHoldLeaverKeepsTheOrder: a write that leaves before its turn (its client gone) lets
// neither the writes behind it nor one arriving after it pass the write before it.
func TestHoldLeaverKeepsTheOrder(t *testing.T) {
	for _, tc := range []struct {
		name       string
		enterAfter bool // the write that must wait enters after the leaver left
	}{{"queued behind the leaver", false}, {"arriving after the leaver left", true}} {
		t.Run(tc.name, func(t *testing.T) {
			g := newTestGate(t, false)
			q := &holdQueue{maxCount: 10, maxBytes: 1 << 20}
			w1, _ := q.enter(1, false, time.Now())
			w2, _ := q.enter(1, false, time.Now())
			var w3 *heldWrite
			if !tc.enterAfter {
				w3, _ = q.enter(1, false, time.Now())
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, out := g.awaitRelease(ctx, w2, nil, nil, testWrite()); out != holdAbandoned {
				t.Fatalf("w2: outcome %d, want abandoned", out)
			}
			w2.leave()
			if tc.enterAfter {
				w3, _ = q.enter(1, false, time.Now())
			}
			if _, out := g.awaitRelease(context.Background(), w3, time.After(100*time.Millisecond), nil, testWrite()); out != holdTimedOut {
				t.Fatalf("w3 released (outcome %d) while w1, before it, was still waiting", out)
			}
			w3.leave()
			id, out := g.awaitRelease(context.Background(), w1, nil, nil, testWrite())
			if out != holdReleased {
				t.Fatalf("w1: outcome %d", out)
			}
			g.inflight.remove(id)
			w1.leave()
		})
	}
}

// TestAbandonedWritesStayCounted: a held write whose client leaves before its turn waits for the
// writes before it to pass the turn on; until then it keeps its place in the totals, so a client
// that opens and abandons writes behind a held head cannot grow the proxy past
// --max-held-requests. Once the head leaves, every place is freed.
func TestAbandonedWritesStayCounted(t *testing.T) {
	q := &holdQueue{maxCount: 3, maxBytes: 1 << 20}
	head, err := q.enter(1, false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for range 10 {
		h, err := q.enter(1, false, time.Now())
		if err != nil {
			break
		}
		accepted++
		h.leave() // its client went away, its turn not come
	}
	if accepted != 2 {
		t.Fatalf("%d abandoned writes taken behind the held head, want 2 (--max-held-requests 3)", accepted)
	}
	head.leave()
	waitFor(t, func() bool { return q.stats() == heldNow{} })
}

// TestHeldPastItsTimeoutNeverForwarded: a held write whose hold timeout fired before it ran
// again (thousands released on two busy cores) is refused, even when its turn, the open fence and
// a release slot are all ready at once: a select picks among ready cases at random.
func TestHeldPastItsTimeoutNeverForwarded(t *testing.T) {
	g := newTestGate(t, false)
	q := &holdQueue{maxCount: 1000, maxBytes: 1 << 30}
	const n = 200
	released := 0
	for range n {
		h, err := q.enter(1, false, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		timer := time.NewTimer(time.Nanosecond)
		time.Sleep(time.Millisecond) // fired before the write's goroutine runs again
		slots := make(chan struct{}, 4)
		id, out := g.awaitRelease(t.Context(), h, timer.C, slots, testWrite())
		if out == holdReleased {
			released++
			g.inflight.remove(id)
			<-slots
		}
		if len(slots) != 0 {
			t.Fatalf("outcome %v left %d release slot(s) taken", out, len(slots))
		}
		h.leave()
	}
	if released > 0 {
		t.Fatalf("%d of %d writes admitted after their hold timeout had fired", released, n)
	}
}

// TestHoldModeReadWithTheFence: a write decides between hold and refuse from the fence it was
// refused admission by, not from a second read: with the fence only ever on in hold mode,
// flipping on and off under 16 writers must refuse none of them (the fence and its mode were
// two reads: a fence off between them refused a write that arrived in hold mode, a fence on
// between them refused one unread).
func TestHoldModeReadWithTheFence(t *testing.T) {
	g := newTestGate(t, false)
	o := NewOptions()
	o.HoldTimeout = time.Minute
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rf := newRefusals(1, time.Second, prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"}), log)
	rf.setReason("test")
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if done := reqStateFrom(r.Context()).answeredBy; done != nil {
			done()
		}
		w.WriteHeader(http.StatusOK)
	})
	limits := bodyLimits{max: 1 << 20, timeout: time.Second, budget: newBodyBudget(1<<30, 1<<20, false), retryAfter: 1}
	h := withAttributes(withFence(ok, g, &policy.Policy{}, limits, rf, newHolder(o, false, log), log), policy.NewClassifier())
	stop := make(chan struct{})
	var refused, answered atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("DELETE", "/api/v1/namespaces/default/configmaps/x", nil))
				answered.Add(1)
				if rec.Code == http.StatusTooManyRequests {
					refused.Add(1)
				}
			}
		})
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		for _, on := range []bool{true, false} {
			if _, err := g.update(func(st *State) error { st.Fenced, st.Mode = on, map[bool]string{true: admin.ModeHold}[on]; return nil }); err != nil {
				t.Error(err)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	close(stop)
	wg.Wait()
	if refused.Load() > 0 || answered.Load() == 0 {
		t.Fatalf("%d of %d writes refused with 429, the fence only ever on in hold mode", refused.Load(), answered.Load())
	}
}
