package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefence/kubefence/proxy/admin"
)

// Hold mode: a write that arrives while the fence is on in hold mode is not refused but kept
// (its body already read, see writebody.go) until the fence lifts, then forwarded to the backend
// active at that moment, admitted in arrival order (up to --hold-release-concurrency forwarded
// at once), at most once (invariant held-at-most-once). Bounds:
// a hold timeout, after which it is refused as in refuse mode and never forwarded; a total of
// held requests and bytes, beyond which new writes are refused at once; of these totals, as of
// the write-body budget (writebody.go), a share that writes from clients whose certificate the
// proxy did not verify may not take (any pod can reach the proxy, and bodiless writes on many
// HTTP/2 streams cost it nothing), so that kubelets' and the control plane's writes are still
// held; and, per HTTP/2 connection, a share of its streams, so that reads on the same connection
// do not starve.

// holdQueue is the waiting room: it orders held writes by arrival and enforces the totals.
type holdQueue struct {
	maxCount int
	maxBytes int64
	// split: the proxy verifies client certificates, and unverified writes may hold at most
	// unverifiedMaxCount writes and unverifiedMaxBytes bytes of the totals.
	split              bool
	unverifiedMaxCount int
	unverifiedMaxBytes int64

	mu              sync.Mutex
	last            *heldWrite // the newest write still waiting for its turn, or nil
	count           int
	bytes           int64
	unverifiedCount int // of count, the writes from clients the proxy did not verify (when split)
	unverifiedBytes int64

	released, timedOut, abandoned, full atomic.Uint64
}

// heldWrite is one write in the waiting room. Its turn comes when the write that arrived before
// it has started forwarding or has left (timed out, client gone); it closes its own turn channel
// when it does either, so the next one may go.
type heldWrite struct {
	q          *holdQueue
	prev       <-chan struct{} // nil for the first
	turn       chan struct{}
	once       sync.Once
	size       int64
	unverified bool // counted in the unverified writes' share
	// forwarding: the write was released, and its bytes stay counted until forwarded says the
	// backend has answered it (its body is still in memory meanwhile).
	forwarding bool
	since      time.Time
}

// errHoldFull and the errors that wrap it say which bound of the waiting room a write is past;
// enter and hold add the bound, so that the 429's message names the flag.
var (
	errHoldFull = errors.New("the waiting room of held writes is full")
	// errHoldUnverifiedFull: beyond what writes from clients the proxy did not verify may hold.
	errHoldUnverifiedFull = fmt.Errorf("%w for clients without a certificate the proxy verified", errHoldFull)
	// errHoldConnFull: beyond the connection's share of its streams.
	errHoldConnFull = fmt.Errorf("%w on this connection", errHoldFull)
)

// newHoldQueue is the waiting room for at most maxCount writes and maxBytes bytes. When the
// proxy verifies client certificates (verifies), writes from the clients it verified have a
// share of it that the others cannot take, as of the write-body budget (unverifiedShare).
func newHoldQueue(maxCount int, maxBytes, maxBody int64, verifies bool) *holdQueue {
	q := &holdQueue{maxCount: maxCount, maxBytes: maxBytes, split: verifies}
	if verifies {
		q.unverifiedMaxCount = int(unverifiedShare(int64(maxCount), 1))
		q.unverifiedMaxBytes = unverifiedShare(maxBytes, maxBody)
	}
	return q
}

// leaderElectionRequestTimeout is the timeout of each request of client-go's leader-election
// lock client: --hold-timeout should stay under it (a startup warning says so otherwise).
const leaderElectionRequestTimeout = 5 * time.Second

// enter puts a write of size body bytes in the waiting room, or refuses it when the totals would
// be exceeded (errHoldFull), or unverified writes' share of them (errHoldUnverifiedFull: the
// write is from a client the proxy did not verify).
func (q *holdQueue) enter(size int64, verified bool, now time.Time) (*heldWrite, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	unverified := q.split && !verified
	var err error
	switch {
	case q.count+1 > q.maxCount:
		err = fmt.Errorf("%w: more than --max-held-requests, %d writes", errHoldFull, q.maxCount)
	case q.bytes+size > q.maxBytes:
		err = fmt.Errorf("%w: more than --max-held-bytes, %d bytes", errHoldFull, q.maxBytes)
	case unverified && q.unverifiedCount+1 > q.unverifiedMaxCount:
		err = fmt.Errorf("%w: more than their share of --max-held-requests, %d writes", errHoldUnverifiedFull, q.unverifiedMaxCount)
	case unverified && q.unverifiedBytes+size > q.unverifiedMaxBytes:
		err = fmt.Errorf("%w: more than their share of --max-held-bytes, %d bytes", errHoldUnverifiedFull, q.unverifiedMaxBytes)
	}
	if err != nil {
		q.full.Add(1)
		return nil, err
	}
	h := &heldWrite{q: q, turn: make(chan struct{}), size: size, unverified: unverified, since: now}
	if q.last != nil {
		h.prev = q.last.turn
	}
	q.last = h
	q.count++
	q.bytes += size
	if unverified {
		q.unverifiedCount++
		q.unverifiedBytes += size
	}
	return h, nil
}

// leave frees the write's place and passes the turn on, once the write before it has had its
// own: one that leaves before its turn (timed out, client gone) must not let the writes behind
// it, or one arriving after it, pass the writes before it. Until then it keeps its place in the
// totals (within the hold timeout every write before it leaves too), so that writes abandoned
// behind a held one cannot grow past them. Calling it again is harmless.
func (h *heldWrite) leave() {
	h.once.Do(func() {
		if h.prev == nil {
			h.pass()
			return
		}
		select {
		case <-h.prev:
			h.pass()
		default:
			go func() { <-h.prev; h.pass() }()
		}
	})
}

// pass frees the write's place and gives the turn to the write after it; the bytes of a write
// being forwarded stay counted (forwarded frees them).
func (h *heldWrite) pass() {
	q := h.q
	q.mu.Lock()
	q.count--
	if h.unverified {
		q.unverifiedCount--
	}
	if !h.forwarding {
		q.dropBytes(h)
	}
	q.mu.Unlock()
	close(h.turn)
}

// forwarded frees the bytes of a released write once the backend has answered it.
func (h *heldWrite) forwarded() {
	h.q.mu.Lock()
	h.q.dropBytes(h)
	h.q.mu.Unlock()
}

// dropBytes stops counting h's bytes; q.mu is held.
func (q *holdQueue) dropBytes(h *heldWrite) {
	q.bytes -= h.size
	if h.unverified {
		q.unverifiedBytes -= h.size
	}
}

// heldNow is the waiting room's occupancy: all writes, and those from unverified clients.
type heldNow struct {
	count, unverified      int
	bytes, unverifiedBytes int64
}

// stats returns the writes and bytes held now.
func (q *holdQueue) stats() heldNow {
	q.mu.Lock()
	defer q.mu.Unlock()
	return heldNow{count: q.count, bytes: q.bytes, unverified: q.unverifiedCount, unverifiedBytes: q.unverifiedBytes}
}

// holdOutcome is how a hold ended.
type holdOutcome uint8

const (
	holdReleased  holdOutcome = iota // admitted after the fence lifted: forward it
	holdTimedOut                     // refuse it, as in refuse mode
	holdAbandoned                    // the client went away: answer nothing, forward nothing
)

// awaitRelease waits for h's turn, for the fence to be open and for one of slots (if any: the
// writes forwarded at once), then admits the write under the gate (so a fence that comes back
// on before that keeps it waiting). It gives up at deadline or when ctx (the client's) ends,
// whichever it is waiting for. On holdReleased the caller owns the registration id and the slot.
func (g *gate) awaitRelease(ctx context.Context, h *heldWrite, deadline <-chan time.Time, slots chan struct{}, w inflightWrite) (uint64, holdOutcome) {
	if out := waitHeld(ctx, h.prev, deadline); out != holdReleased {
		return 0, out
	}
	for {
		if out := waitHeld(ctx, g.openCh(), deadline); out != holdReleased {
			return 0, out
		}
		if slots != nil {
			select {
			case slots <- struct{}{}:
			case <-deadline:
				return 0, holdTimedOut
			case <-ctx.Done():
				return 0, holdAbandoned
			}
		}
		id, out, fencedAgain := g.admitHeld(ctx, deadline, w)
		if out == holdReleased {
			return id, out
		}
		if slots != nil {
			<-slots
		}
		if !fencedAgain {
			return 0, out
		}
	}
}

// admitHeld admits a held write whose turn has come, the fence open, unless its hold timeout has
// fired (the waits before may have taken another ready case over the deadline: a select picks
// among them at random; admitWrite may wait for a fence change's save) or its client has left.
// fencedAgain: the fence came back on first.
func (g *gate) admitHeld(ctx context.Context, deadline <-chan time.Time, w inflightWrite) (id uint64, out holdOutcome, fencedAgain bool) {
	if fired(deadline) {
		return 0, holdTimedOut, false
	}
	id, fence := g.admitWrite(w)
	switch {
	case fence != fenceIsOpen:
		return 0, holdTimedOut, true
	case fired(deadline):
		g.inflight.remove(id)
		return 0, holdTimedOut, false
	case ctx.Err() != nil: // the client left just as the fence opened: never forward
		g.inflight.remove(id)
		return 0, holdAbandoned, false
	}
	return id, holdReleased, false
}

// fired says whether the deadline has passed.
func fired(deadline <-chan time.Time) bool {
	select {
	case <-deadline:
		return true
	default:
		return false
	}
}

// waitHeld waits for ready (nil: ready now), the deadline or the end of ctx.
func waitHeld(ctx context.Context, ready <-chan struct{}, deadline <-chan time.Time) holdOutcome {
	if ready == nil {
		return holdReleased
	}
	select {
	case <-ready:
		return holdReleased
	case <-deadline:
		return holdTimedOut
	case <-ctx.Done():
		return holdAbandoned
	}
}

// holder holds writes in hold mode: the waiting room, its bounds and its metrics.
type holder struct {
	q       *holdQueue
	timeout time.Duration
	// perConn bounds the held writes of one HTTP/2 connection: a share of its streams, so that
	// reads on it are never starved of streams.
	perConn int32
	// release bounds the held writes forwarded at once when the fence lifts: thousands at once
	// would open as many backend connections (a TLS handshake each) instead of reusing a pool.
	release chan struct{}
	seconds prometheus.Histogram
	log     *slog.Logger
}

// newHolder holds writes within o's bounds; verifies: the proxy verifies client certificates
// (--client-ca-file), and keeps a share of the waiting room for the clients it verified.
func newHolder(o *Options, verifies bool, log *slog.Logger) *holder {
	return &holder{
		q:       newHoldQueue(o.MaxHeldRequests, o.MaxHeldBytes, o.MaxWriteBodyBytes, verifies),
		timeout: o.HoldTimeout,
		perConn: int32(o.MaxConcurrentStreams / 2),
		release: make(chan struct{}, o.HoldReleaseConcurrency),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubefence_hold_duration_seconds",
			Help:    "How long writes were held in hold mode, whatever the outcome.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 3, 4, 5, 10},
		}),
		log: log,
	}
}

// connHoldsKey keys the count of writes held on one client connection.
type connHoldsKey struct{}

// hold keeps a write that arrived while fenced in hold mode until the fence lifts, then forwards
// it to the backend active at that moment; past the hold timeout, or beyond the bounds, it is
// refused as in refuse mode and never forwarded. A client that leaves while held gets nothing
// and nothing is forwarded. Once held, the write's size body bytes count against the waiting
// room's bound (--max-held-bytes) instead of the write-body budget: body is given back.
func (hd *holder) hold(w http.ResponseWriter, r *http.Request, st *reqState, next http.Handler, g *gate, rf *refusals, size int64, body *reservation) {
	if n, _ := r.Context().Value(connHoldsKey{}).(*atomic.Int32); n != nil && r.ProtoMajor == 2 {
		if n.Add(1) > hd.perConn {
			n.Add(-1)
			hd.q.full.Add(1)
			rf.refuseHold(w, r, st, fmt.Errorf("%w: more than half of --http2-max-streams-per-connection, %d streams", errHoldConnFull, hd.perConn))
			return
		}
		defer n.Add(-1)
	}
	start := time.Now()
	h, err := hd.q.enter(size, st.identity != nil, start)
	if err != nil {
		rf.refuseHold(w, r, st, err)
		return
	}
	body.release()
	a := &st.attrs
	hd.log.Info("held write: fence is on", fencedWriteLogArgs(a, r.UserAgent())...)
	timer := time.NewTimer(hd.timeout)
	defer timer.Stop()
	id, out := g.awaitRelease(r.Context(), h, timer.C, hd.release, inflightWrite{attrs: a, userAgent: r.UserAgent(), start: start})
	h.forwarding = out == holdReleased
	h.leave()
	hd.seconds.Observe(time.Since(start).Seconds())
	switch out {
	case holdTimedOut:
		hd.q.timedOut.Add(1)
		rf.refuseHold(w, r, st, fmt.Errorf("this write was held for --hold-timeout (%s) and the fence has not lifted", hd.timeout))
	case holdAbandoned:
		hd.q.abandoned.Add(1)
		st.answered = decisionAbandoned
		w.WriteHeader(499) // nobody reads it: the client is gone
	case holdReleased:
		hd.q.released.Add(1)
		// The registration and the release slot awaitRelease took, and the body's bytes in the
		// waiting room, end when the backend answers (or fails): a client slow to read its
		// answer holds none of them.
		var once sync.Once
		done := func() { once.Do(func() { g.inflight.remove(id); <-hd.release; h.forwarded() }) }
		st.answeredBy = done
		defer done()
		next.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
	}
}

// status is the waiting room for 'fence status'.
func (hd *holder) status() admin.HoldStatus {
	n := hd.q.stats()
	return admin.HoldStatus{Held: n.count, HeldBytes: n.bytes, HeldUnverified: n.unverified, HeldUnverifiedBytes: n.unverifiedBytes, Released: hd.q.released.Load(), TimedOut: hd.q.timedOut.Load(),
		Abandoned: hd.q.abandoned.Load(), Full: hd.q.full.Load()}
}
