package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Watch resumption. A backend switch made with resumeWatches (the new backend serves the same
// etcd revisions as the old: a replication cutover, or a second apiserver on the same etcd)
// moves each open watch to the new backend instead of ending it: at an event boundary the proxy
// re-issues the watch there from the last resourceVersion it delivered, and streams the new
// body on the same client response. The client sees one stream: no relist, no event lost or
// repeated. Anything that does not fit (an event that does not parse, a watch still sending its
// initial events, the new backend answering anything but 200 with the same Content-Type) ends
// the watch as a switch without resumption does.

// initialEventsEnd is the annotation of the bookmark that ends a sendInitialEvents watch's
// initial events (metav1.InitialEventsAnnotationKey).
const initialEventsEnd = "k8s.io/initial-events-end"

// maxTrackedEvent bounds the bytes kept of one event that spans reads; a larger event makes the
// watch not resumable rather than the proxy's memory unbounded.
const maxTrackedEvent = 64 << 20

// resumeInfo is how to re-issue a watch on another backend.
type resumeInfo struct {
	req         *http.Request // the outbound request as first sent, after Rewrite
	identity    bool          // it forwards a client-certificate identity (the front-proxy pool)
	verified    func() bool   // with identity: the client's certificate still verifies now
	contentType string        // the first backend's answer; a resumed answer must match
	started     time.Time     // when the first backend answered: timeoutSeconds counts from there
	s           *stream
	on          *backend // the backend the stream is tracked on now
	log         *slog.Logger
}

// lapsed reports whether the client identity the watch forwards may no longer be sent: its
// certificate no longer verifies (expired, or the client CA bundle was reloaded without its
// CA). Then it is ended, not re-issued on its behalf.
func (ri *resumeInfo) lapsed() bool {
	return ri.identity && (ri.verified == nil || !ri.verified())
}

// enableResume lets a resuming switch move this watch; req is the outbound request.
func (w *watchBody) enableResume(ri *resumeInfo) {
	q := ri.req.URL.Query()
	w.resume = ri
	start := q.Get("resourceVersion")
	_, asked := q["sendInitialEvents"]
	w.rv = &rvTracker{fr: w.fr, start: start, initialPending: asked && truthy(q.Get("sendInitialEvents")),
		unanchored: !asked && (start == "" || start == "0"), ahead: &ri.on.readAhead}
	if ri.req.ContentLength != 0 {
		w.rv.broken = true // a watch with a body is not one the proxy can re-issue
	}
}

// truthy reads a boolean query parameter as kube-apiserver does: anything but "0" or "false"
// (any case), the empty value included, is true.
func truthy(v string) bool { return v != "0" && !strings.EqualFold(v, "false") }

func (ri *resumeInfo) untrack() { ri.on.untrack(ri.s) }

// turn waits for the watch's turn to ask nb (awaitTurn: the caller gives the slot back) and
// says whether to ask: not once its client left or the proxy left nb, nor once its
// timeoutSeconds has passed meanwhile (its apiserver would have ended it), nor once the client's
// certificate no longer verifies (the slot is given back here in both).
func (ri *resumeInfo) turn(from, nb *backend, log *slog.Logger) bool {
	if !awaitTurn(ri.req.Context(), from, nb) {
		log.Info("watch not resumed: its client left, or the proxy switched away from the new backend first; ended")
		return false
	}
	if left, ok := ri.timeoutLeft(); ok && left <= 0 {
		<-nb.resumeSlots
		log.Info("watch not resumed: its timeoutSeconds has passed; ended, as its apiserver would have ended it")
		return false
	}
	if ri.lapsed() {
		// Checked at the switch, and again now that the watch asks in the client's name: the
		// wait may have lasted seconds.
		<-nb.resumeSlots
		log.Info("watch not resumed: the client's certificate no longer verifies; ended")
		return false
	}
	return true
}

// maxTimeoutSeconds is the largest timeoutSeconds a resumed watch is held to (a century): a
// larger one is as good as none, and would overflow a Duration.
const maxTimeoutSeconds = 100 * 365 * 24 * 3600

// timeoutLeft is what is left of the watch's timeoutSeconds, in whole seconds (rounded down:
// the client sees its watch end no later than it asked), and whether it asked for one.
func (ri *resumeInfo) timeoutLeft() (int64, bool) {
	n, err := strconv.ParseInt(ri.req.URL.Query().Get("timeoutSeconds"), 10, 64)
	if err != nil || n <= 0 || n > maxTimeoutSeconds {
		return 0, false
	}
	return int64((time.Duration(n)*time.Second - time.Since(ri.started)) / time.Second), true
}

// moveTo asks the watch to go on on nb from its next event boundary, or to end there when it
// cannot be resumed. A watch idle at a boundary is woken by closing its old body; with park it
// is left parked instead (departParked), for the caller to wake by closing the old backend's
// watch connections (backend.drain), and taken off the old backend at once when it can be
// (takeOff).
func (w *watchBody) moveTo(nb *backend, park bool) departure {
	if w.fr == framingUnknown {
		return departCut
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.draining = true
	if w.resume == nil || !w.rv.resumable() {
		if w.boundary {
			return w.endHere() // as endAtBoundary
		}
		return departs
	}
	w.resumeTo = nb
	if !w.boundary {
		return departs
	}
	// From here no byte of a new event reaches the client (advance cuts it back): a Read that
	// returns some moves the watch at once, and the old body may be closed under it any time.
	w.interrupted = true
	if park || w.out {
		// Parked; or its goroutine is still writing what the last Read returned to a client
		// that may read slowly (or not at all): taken off here, the switch waits for neither.
		w.takeOff(nb)
	}
	switch {
	case w.out:
		// Taken off; or takeOff left it (it will end: not resumable after all, or its
		// certificate no longer verifies), and it reads nothing more there either: the old
		// body is closed now, not when its client reads again (its backend would go on
		// sending it events, buffered for nobody).
		_ = w.rc.Close()
		return departGone
	case park:
		return departParked
	}
	// Wake a Read blocked on an idle watch by closing the old body, not by cancelling the
	// request's context: that context also carries the re-issued watch.
	_ = w.rc.Close()
	return departs
}

// takeOff takes a watch at a boundary off its backend for nb, as resumeOn would, without
// waiting for its goroutine to get there, unless the watch cannot be resumed (its goroutine
// ends it). From here nothing more is read from the old body (Read): what was read before, its
// resourceVersions noted (noteDelivered), may still be on its way to the client, the next
// events come from nb after it; the switch need not wait for the watch. Called with w.mu held.
func (w *watchBody) takeOff(nb *backend) {
	ri := w.resume
	if w.ended || ri.lapsed() {
		return
	}
	rv, ok := w.rv.from()
	if !ok || !ri.on.handOff(ri.s) { // not tracked: it ended as the drain began
		return
	}
	nb.noteDelivered(w.rv.rv)
	// Pending on nb (consumed by resumeOn, or by Close if the client leaves first) only when
	// its goroutine is free to ask nb: one still writing to a client that stopped reading would
	// hold the count, and the unfence waiting for it, as long as its client does not read.
	w.takenPending = !w.out
	if w.takenPending {
		nb.resumesPending.Add(1)
	}
	ri.on.tookOff.Add(1)
	w.takenOff, w.takenRV, w.takenTo = true, rv, nb
}

// resumeOn re-issues the watch on nb from the last resourceVersion delivered and, when nb
// answers as the old backend did, makes its body this stream's. Called by Read at a boundary.
//
// The watch leaves the old backend (its body closed, the stream handed off) before nb is asked:
// nothing more of the old backend reaches the client from here, which is all the switch waits
// for (invariant watch-resume-exact). nb is asked after the switch, once the fence lifts (awaitTurn): the time the new
// apiserver takes to answer every moved watch, which grows with the watches open through the
// proxy, stays out of the write window, and the client's stream meanwhile just has no events.
// A watch nb does not take ends cleanly, as one a switch does not resume, and is counted
// (resumedThenEnded).
func (w *watchBody) resumeOn(nb *backend) bool {
	ri := w.resume
	w.mu.Lock()
	old := w.rc
	takenOff := w.takenOff // by the drain (takeOff), which did the hand-off below
	rv, ok := w.takenRV, true
	if !takenOff {
		rv, ok = w.rv.from()
		nb.noteDelivered(w.rv.rv) // before the hand-off: the switch returns with it noted
	} else if !w.takenPending {
		nb.resumesPending.Add(1) // taken off while its client was still being written to
	}
	w.takenOff, w.takenPending = false, false
	// Nothing more of the old backend is observed from here (taken off, or about to be).
	bfrom, skip := w.rv.batch()
	w.mu.Unlock()
	if skip != nil && ok {
		rv = bfrom
	}
	from := ri.on
	// Made only once the watch has left from: the switch waits for every watch to, and a
	// logger's attributes are formatted when it is made.
	logger := func() *slog.Logger {
		return ri.log.With("path", ri.req.URL.Path, "from", from.url.String(), "to", nb.url.String())
	}
	if !takenOff {
		if !ok {
			_ = old.Close()
			logger().Info("watch not resumable; ended", "reason", w.rv.why())
			return false
		}
		if ri.lapsed() {
			// A new request to the new backend in the client's name: its certificate must
			// verify now, as any request's must (takeOff checked it).
			_ = old.Close()
			logger().Info("watch not resumed: the client's certificate no longer verifies; ended")
			return false
		}
		nb.resumesPending.Add(1) // before the hand-off: the switch's answer counts it
		from.handOff(ri.s)
	}
	defer nb.resumesPending.Add(-1)
	// Closed after the hand-off, so that the switch does not wait for the stream reset this
	// may write: nothing reads old after this point.
	_ = old.Close()
	log := logger()
	ri.on = nb // not tracked there until nb answers: a switch away from nb meanwhile ends it
	if !ri.turn(from, nb, log) {
		return false
	}
	resp, err := reissue(ri, nb, rv)
	<-nb.resumeSlots
	if err != nil {
		if ri.req.Context().Err() == nil {
			nb.resumedThenEnded.Add(1)
		}
		log.Warn("watch resume failed; ended", "resourceVersion", rv, "err", err)
		return false
	}
	if err := ri.acceptable(resp); err != nil {
		_ = resp.Body.Close()
		nb.resumedThenEnded.Add(1)
		log.Warn("watch resume refused by the new backend; ended", "resourceVersion", rv, "err", err)
		return false
	}
	// Tracked on nb and given its body as one step under w.mu: a switch away from nb that
	// starts meanwhile finds the watch with its new body (its moveTo waits for w.mu), and its
	// draining is not undone here.
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := nb.track(ri.s); err != nil {
		_ = resp.Body.Close()
		log.Info("watch not resumed: the proxy switched away from the new backend before it answered; ended")
		return false
	}
	w.goOnWith(resp.Body, skip, nb, log)
	w.asked = rv
	log.Debug("watch resumed", "resourceVersion", rv)
	return true
}

// goOnWith makes body, nb's answer to the re-issued watch, this stream's: past the events its
// client has (skip, when it asked from the revision before theirs), checked at its first event.
// Called with w.mu held.
func (w *watchBody) goOnWith(body io.ReadCloser, skip *batchSkip, nb *backend, log *slog.Logger) {
	if skip != nil {
		skip.rc, skip.fr = body, w.fr
		body = skip
	}
	w.rc = &firstEventGuard{rc: body, fr: w.fr, log: log, ended: &nb.resumedThenEnded, pastExpiry: true}
	w.draining, w.interrupted = false, false
	w.boundary, w.hdrSeen, w.due = true, 0, 0
	w.rv.cur, w.rv.ahead = w.rv.cur[:0], &nb.readAhead
}

// acceptable checks the new backend's answer to a re-issued watch: 200, in the content type the
// old backend's answer had, not encoded (the client reads one stream).
func (ri *resumeInfo) acceptable(resp *http.Response) error {
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != ri.contentType {
		return fmt.Errorf("answered %s, %s (want 200, %s)", resp.Status, ct, ri.contentType)
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" {
		return fmt.Errorf("answered in %s encoding onto a plain stream", enc)
	}
	return nil
}

// resumeAnswerTimeout bounds how long a moved watch waits for the new backend's answer (its
// headers): one that never answers would otherwise keep the client's stream silent, and one of
// the backend's resume slots taken, for good.
var resumeAnswerTimeout = 30 * time.Second

// reissue sends the watch ri to nb from resourceVersion rv. The request's context (which then
// carries the watch's stream) is cancelled if nb has not answered within resumeAnswerTimeout.
func reissue(ri *resumeInfo, nb *backend, rv string) (*http.Response, error) {
	req := ri.req
	ctx, cancel := context.WithCancelCause(req.Context())
	timer := time.AfterFunc(resumeAnswerTimeout, func() {
		cancel(fmt.Errorf("the new backend did not answer the watch within %s", resumeAnswerTimeout))
	})
	out := resumeRequest(req, nb, rv)
	if left, ok := ri.timeoutLeft(); ok {
		q := out.URL.Query()
		q.Set("timeoutSeconds", strconv.FormatInt(max(left, 1), 10))
		out.URL.RawQuery = q.Encode()
	}
	resp, err := nb.transportFor(ri.identity, &reqStateFrom(req.Context()).attrs).RoundTrip(out.WithContext(ctx))
	if !timer.Stop() {
		if resp != nil {
			_ = resp.Body.Close()
		}
		return nil, context.Cause(ctx)
	}
	if err != nil {
		cancel(err)
	}
	return resp, err
}

// resumeDeferral bounds how long a moved watch waits for the fence to lift before it asks the
// new backend anyway (a cutover that stopped after its switch may leave the fence on).
var resumeDeferral = 5 * time.Second

// resumeConcurrency bounds the moved watches that ask a new backend at once. Unbounded, 500
// watches asking at the unfence made the writes released then wait behind them (the slowest
// write 1.25-1.53 s against 0.40-0.60 s with 32, docs/benchmarks.md).
const resumeConcurrency = 32

// awaitTurn waits until a watch moved off from may ask nb, and takes one of nb's resume slots
// (the caller gives it back): once every watch has left from (its drain ended: their re-issues
// would slow the leaving, which is all the switch waits for), once the fence has lifted (or
// resumeDeferral passed: the window's remaining steps and the unfence then do not wait behind
// the new apiserver answering every moved watch), and then resumeConcurrency at a time. The
// client's stream has no events meanwhile; none is lost: the watch asks from the last
// resourceVersion it delivered. False when ctx ended first, or nb began to drain (a switch away from it: the watch, tracked nowhere meanwhile, ends rather than ask a backend the proxy left).
func awaitTurn(ctx context.Context, from, nb *backend) bool {
	drained, lifted := from.drainGates()
	leaving := nb.leavingCh()
	select {
	case <-drained:
	case <-leaving:
		return false
	case <-ctx.Done():
		return false
	}
	t := time.NewTimer(resumeDeferral)
	defer t.Stop()
	select {
	case <-lifted:
	case <-t.C:
	case <-leaving:
		return false
	case <-ctx.Done():
		return false
	}
	return takeSlot(ctx, nb, nb.resumeSlots)
}

// takeSlot takes one of slots, nb's (the caller gives it back); false when ctx ended or nb began
// to drain first. select picks at random among the cases ready, so a slot free at that moment
// is given back at once then: a request to a backend the proxy left is a wasted one.
func takeSlot(ctx context.Context, nb *backend, slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
	case <-nb.leavingCh():
		return false
	case <-ctx.Done():
		return false
	}
	select {
	case <-nb.leavingCh():
	case <-ctx.Done():
	default:
		return true
	}
	<-slots
	return false
}

// batchSkip is the body of a watch re-issued from the revision before rv, whose client has the
// events at rv of the objects in skip: those are dropped, the rest passed on. It looks at whole
// events until one comes after rv (or one it cannot judge), then passes everything through.
type batchSkip struct {
	rc   io.ReadCloser
	fr   framing
	rv   int64
	skip []eventKey
	buf  []byte // read, not passed on: whole events to pass (the first pass bytes), then the head of one
	pass int
	done bool
	err  error // the inner body's, returned once buf is passed on
}

func (s *batchSkip) Read(p []byte) (int, error) {
	for {
		switch {
		case s.pass > 0:
			n := copy(p, s.buf[:s.pass])
			s.buf, s.pass = s.buf[n:], s.pass-n
			return n, nil
		case s.done && len(s.buf) > 0:
			n := copy(p, s.buf)
			s.buf = s.buf[n:]
			return n, nil
		case s.err != nil:
			return 0, s.err
		case s.done:
			return s.rc.Read(p)
		}
		var chunk [4096]byte
		n, err := s.rc.Read(chunk[:])
		s.buf, s.err = append(s.buf, chunk[:n]...), err
		s.sift()
		if s.err != nil || len(s.buf)-s.pass > maxTrackedEvent {
			s.done = true // what is left passes on as it is, then the error
		}
	}
}

// sift drops the whole events at buf's start (after pass) that the client has, and counts the
// others in pass, until one comes after rv.
func (s *batchSkip) sift() {
	for !s.done {
		end := firstEventEnd(s.fr, s.buf[s.pass:])
		if end == 0 {
			return
		}
		if s.drop(s.buf[s.pass : s.pass+end]) {
			s.buf = append(s.buf[:s.pass], s.buf[s.pass+end:]...)
			continue
		}
		s.pass += end
	}
}

// drop says whether the client has ev already; an event after rv, or one that does not parse
// (an ERROR, which firstEventGuard judges), ends the sifting.
func (s *batchSkip) drop(ev []byte) bool {
	var e eventMeta
	rv, err := int64(0), parseEvent(s.fr, &e, ev, false)
	if err == nil && e.typ != "ERROR" {
		rv, err = strconv.ParseInt(e.rv, 10, 64)
	}
	switch {
	case err != nil || e.typ == "ERROR" || rv > s.rv:
		s.done = true
		return false
	case rv < s.rv: // a bookmark before the revision: the client is past it
		return true
	case e.typ == "BOOKMARK":
		return false
	}
	i := slices.Index(s.skip, e.key)
	if i >= 0 {
		s.skip = slices.Delete(s.skip, i, i+1)
	}
	return i >= 0
}

func (s *batchSkip) Close() error { return s.rc.Close() }

// firstEventGuard is a resumed watch's new body: it passes nothing on until the first event is
// whole, and ends the stream cleanly (io.EOF, at the boundary the resume left) if that event is
// an ERROR. kube-apiserver answers a watch from a resourceVersion its cache no longer holds
// with 200 and one ERROR event (410 Expired): the client is better served by a normal end of
// the watch (informers relist either way; `kubectl get -w` ends rather than fails).
type firstEventGuard struct {
	rc    io.ReadCloser
	fr    framing
	log   *slog.Logger
	ended *atomic.Int64 // counts the resumes so ended (the new backend's, for status)
	// pastExpiry: an ERROR 410 (Expired) that names the oldest revision the backend's cache
	// holds returns an *expiredError, for resumePastExpiry, rather than ending the stream.
	pastExpiry bool
	// undo, when set, is decremented when the stream so ends: it counted this one as going on.
	undo    *atomic.Int64
	checked bool
	buf     []byte // read, not passed on yet
}

func (g *firstEventGuard) Read(p []byte) (int, error) {
	for !g.checked {
		var chunk [4096]byte
		n, err := g.rc.Read(chunk[:])
		g.buf = append(g.buf, chunk[:n]...)
		// The event is looked at before the error: the read that completes it may also end
		// the stream (HTTP/1.1 returns the last data with io.EOF).
		if end := firstEventEnd(g.fr, g.buf); end > 0 || len(g.buf) > maxKeptEvent {
			var e eventMeta
			if end > 0 && parseEvent(g.fr, &e, g.buf[:end], false) == nil && e.typ == "ERROR" {
				if exp, ok := expiredEvent(g.fr, g.buf[:end]); ok && g.pastExpiry {
					return 0, exp
				}
				g.log.Info("watch resumed, then ended by the new backend (an ERROR event, e.g. 410 Expired); ended cleanly")
				g.ended.Add(1)
				if g.undo != nil {
					g.undo.Add(-1)
				}
				return 0, io.EOF
			}
			g.checked = true
			break
		}
		if err != nil {
			if len(g.buf) > 0 {
				g.checked = true // pass on what came: the stream's own end follows
				break
			}
			return 0, err
		}
	}
	if len(g.buf) > 0 {
		n := copy(p, g.buf)
		g.buf = g.buf[n:]
		if len(g.buf) == 0 {
			g.buf = nil
		}
		return n, nil
	}
	return g.rc.Read(p)
}

func (g *firstEventGuard) Close() error { return g.rc.Close() }

// firstEventEnd is the length of the first whole event in b, or 0 when b holds none yet.
func firstEventEnd(fr framing, b []byte) int {
	if fr == framingJSON {
		return bytes.IndexByte(b, '\n') + 1
	}
	if len(b) < 4 {
		return 0
	}
	if end := 4 + int(binary.BigEndian.Uint32(b)); len(b) >= end {
		return end
	}
	return 0
}

// parseEvent reads the type and resourceVersion of one whole event (its annotations only when
// asked).
func parseEvent(fr framing, e *eventMeta, ev []byte, annotations bool) error {
	if fr == framingProtobuf {
		return e.parseProtobuf(ev, annotations)
	}
	return e.parseJSON(ev, annotations)
}

// resumeRequest is req re-addressed to nb, from resourceVersion rv. resourceVersionMatch and
// sendInitialEvents go: the watch continues from an exact revision, its initial events are
// behind it (rvTracker refuses to resume before their end).
func resumeRequest(req *http.Request, nb *backend, rv string) *http.Request {
	out := req.Clone(req.Context())
	out.URL.Scheme, out.URL.Host = nb.url.Scheme, nb.url.Host
	out.Host = ""
	q := out.URL.Query()
	q.Set("resourceVersion", rv)
	q.Del("resourceVersionMatch")
	q.Del("sendInitialEvents")
	out.URL.RawQuery = q.Encode()
	out.Body, out.GetBody, out.ContentLength = nil, nil, 0
	return out
}

// rvTracker follows the resourceVersion of the last event delivered to the client. It is fed
// whole events only (at boundaries) and keeps a copy of the last one, parsed only when a switch
// asks for it: per event the watch path pays a copy, not a decode. Events are parsed as they
// pass only while a sendInitialEvents watch waits for the bookmark that ends its initial
// events, when one is over maxKeptEvent (rare; a copy would cost memory for the life of the
// watch), and while a switch away from the watch's backend is expected (a prepare: the switch
// then finds every watch's resourceVersion read instead of parsing them all in the window).
type rvTracker struct {
	fr    framing
	start string // the request's resourceVersion, used when no event was delivered yet
	rv    string // of the last event parsed as it passed
	last  []byte // the last event delivered, when newer than rv; parsed by from
	// ahead is the readAhead of the backend the watch is on: while not 0, each event is
	// parsed as it passes (a switch is expected: it then finds the resourceVersion read).
	ahead *atomic.Uint64
	// initialPending: sendInitialEvents=true and its closing bookmark not delivered yet.
	initialPending bool
	// unanchored: started without a resourceVersion or at 0 (and no sendInitialEvents): the
	// apiserver begins with the state as synthetic ADDED events, each at its object's own
	// resourceVersion, and marks no end of them; no event is a point to resume from.
	unanchored bool
	// broken: an event did not parse, had no resourceVersion, or was an ERROR (after which
	// the apiserver ends the watch); the watch can only end.
	broken bool
	err    error
	cur    []byte // the bytes of an event that began in an earlier read
	// atRV are the objects of the events delivered at rv, when atRVKnown: every event since
	// the one that brought rv was parsed (read ahead), or rv came with a BOOKMARK (every event
	// up to it delivered: none to skip). One revision may carry many events (a lease's expiry
	// deletes all its keys in one); a watch moved in the middle of them asks from the revision
	// before and skips these (batch). gap: an event passed unparsed since the last parse.
	atRV      []eventKey
	atRVKnown bool
	gap       bool
	// bookmarked: the last event parsed was a BOOKMARK. kube-apiserver may send one in the
	// middle of a revision's events: those delivered before it are then not in atRV.
	bookmarked bool
}

// maxKeptEvent is the largest event the tracker copies rather than parses at once.
const maxKeptEvent = 64 << 10

func (t *rvTracker) resumable() bool {
	return t != nil && !t.broken && !t.initialPending && !t.unanchored
}

// from is the resourceVersion to resume from: the last event's (a BOOKMARK's counts), else the
// request's own.
func (t *rvTracker) from() (string, bool) {
	if !t.resumable() {
		return "", false
	}
	if t.settle(); t.broken {
		return "", false
	}
	switch {
	case t.rv != "":
		return t.rv, true
	case t.start == "" || t.start == "0":
		// Asked from "now" (sendInitialEvents=false) and no event came: no revision to go on
		// from; "now" on the new backend could miss what happened in between.
		return "", false
	}
	return t.start, true
}

// settle parses the last event delivered, if it was kept unparsed.
func (t *rvTracker) settle() {
	if len(t.last) > 0 {
		t.take(t.last)
		t.last = t.last[:0]
	}
}

func (t *rvTracker) why() string {
	switch {
	case t.broken:
		return fmt.Sprint(t.err)
	case t.initialPending:
		return "its initial events (sendInitialEvents) are not all delivered"
	case t.unanchored:
		return "it started without a resourceVersion (or at 0): its first events are the state, at their objects' own resourceVersions"
	case t.rv == "" && (t.start == "" || t.start == "0"):
		return "it asked for events from now (no initial events) and none came yet: no revision to go on from"
	}
	return ""
}

// observe takes the bytes b just delivered; ends are the offsets in b just past each event that
// ends there.
func (t *rvTracker) observe(b []byte, ends []int) {
	if t.broken || len(b) == 0 {
		return
	}
	if len(ends) == 0 {
		if len(t.cur)+len(b) > maxTrackedEvent {
			t.fail(fmt.Errorf("an event over %d bytes", maxTrackedEvent))
			return
		}
		t.cur = append(t.cur, b...)
		return
	}
	first := b[:ends[0]]
	if len(t.cur) > 0 {
		t.cur = append(t.cur, first...)
		first = t.cur
	}
	event := func(i int) []byte {
		if i == 0 {
			return first
		}
		return b[ends[i-1]:ends[i]]
	}
	i := 0
	for ; i < len(ends) && t.initialPending; i++ {
		t.take(event(i))
	}
	switch {
	case i == len(ends):
	case t.ahead != nil && t.ahead.Load() != 0:
		// A switch is expected: every event parsed, so that the events of the last revision
		// delivered are known (batch).
		t.gap = t.gap || len(t.last) > 0
		t.last = t.last[:0]
		for ; i < len(ends); i++ {
			t.take(event(i))
		}
	default:
		// Events before the last pass unparsed, and a kept one replaced: a gap.
		t.gap = t.gap || len(t.last) > 0 || i < len(ends)-1
		if ev := event(len(ends) - 1); len(ev) > maxKeptEvent {
			t.last = t.last[:0]
			t.take(ev)
		} else {
			t.last = append(t.last[:0], ev...)
		}
	}
	rest := b[ends[len(ends)-1]:]
	if cap(t.cur) > maxKeptEvent {
		t.cur = nil // do not keep a large event's buffer for the life of the watch
	}
	t.cur = append(t.cur[:0], rest...)
}

// take parses one event and moves rv to it.
func (t *rvTracker) take(ev []byte) {
	if t.broken {
		return
	}
	var e eventMeta
	var err error
	err = parseEvent(t.fr, &e, ev, t.initialPending)
	switch {
	case err != nil:
		t.fail(err)
	case e.typ == "ERROR":
		t.fail(errors.New("the backend sent an ERROR event, after which it ends the watch"))
	case e.rv == "":
		t.fail(fmt.Errorf("a %s event without a resourceVersion", e.typ))
	default:
		t.noteKey(&e)
		t.rv = e.rv
		if t.initialPending && e.typ == "BOOKMARK" && e.initialEnd {
			t.initialPending = false
		}
	}
}

// noteKey keeps the objects of the events delivered at the revision of e, while every event of
// that revision was parsed (batch).
func (t *rvTracker) noteKey(e *eventMeta) {
	switch {
	case e.typ == "BOOKMARK": // everything up to it delivered
		t.atRV, t.atRVKnown = t.atRV[:0], true
	case t.gap || e.rv == t.rv && (!t.atRVKnown || t.bookmarked):
		t.atRV, t.atRVKnown = t.atRV[:0], false
	case e.rv != t.rv:
		t.atRV, t.atRVKnown = append(t.atRV[:0], e.key), true
	default:
		t.atRV = append(t.atRV, e.key)
	}
	t.gap, t.bookmarked = false, e.typ == "BOOKMARK"
}

// batch is how to go on from a revision whose events may be delivered in part: from the
// revision before it, skipping the events of that revision the client has (skip, its body to
// be set). skip is nil when there is none to skip (the last event a BOOKMARK, none delivered
// yet) or they are not known (not read ahead: from() goes on from the revision itself).
func (t *rvTracker) batch() (from string, skip *batchSkip) {
	if t.settle(); t.broken || !t.atRVKnown || len(t.atRV) == 0 {
		return "", nil
	}
	rv, err := strconv.ParseInt(t.rv, 10, 64)
	if err != nil || rv < 2 {
		return "", nil
	}
	return strconv.FormatInt(rv-1, 10), &batchSkip{rv: rv, skip: slices.Clone(t.atRV)}
}

func (t *rvTracker) fail(err error) {
	t.broken, t.err, t.cur, t.last = true, err, nil, nil
}

// eventMeta is what the tracker needs of one watch event.
type eventMeta struct {
	typ, rv    string
	key        eventKey
	initialEnd bool // a bookmark annotated k8s.io/initial-events-end: "true"
}

// eventKey is the object an event is about: one revision has at most one event per object.
type eventKey struct{ namespace, name string }

type jsonMeta struct {
	ResourceVersion string `json:"resourceVersion"`
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
}

type jsonEvent struct {
	Type   string `json:"type"`
	Object struct {
		Metadata jsonMeta `json:"metadata"`
		// Rows, of a Table: kubectl get -w asks for them (application/json;as=Table), and
		// kube-apiserver sends each event's object as a Table whose metadata has the
		// resourceVersion alone, the object's in its one row. Raw: no allocation for an object
		// that has none.
		Rows json.RawMessage `json:"rows"`
	} `json:"object"`
}

type jsonEventAnnotated struct {
	Type   string `json:"type"`
	Object struct {
		Metadata struct {
			jsonMeta
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Rows json.RawMessage `json:"rows"`
	} `json:"object"`
}

// tableRowKey is the object of a Table's one row (includeObject=Metadata, the default, or
// Object), or the zero key when it has another number of rows or none carries an object.
func tableRowKey(rows json.RawMessage) eventKey {
	var rs []struct {
		Object struct {
			Metadata jsonMeta `json:"metadata"`
		} `json:"object"`
	}
	if err := json.Unmarshal(rows, &rs); err != nil || len(rs) != 1 {
		return eventKey{}
	}
	md := rs[0].Object.Metadata
	return eventKey{md.Namespace, md.Name}
}

// parseJSON reads one line of a JSON watch stream (a metav1.WatchEvent); annotations only when
// asked, to spare the map on every event.
func (e *eventMeta) parseJSON(ev []byte, annotations bool) error {
	var md jsonMeta
	var rows json.RawMessage
	if annotations {
		var v jsonEventAnnotated
		if err := json.Unmarshal(ev, &v); err != nil {
			return fmt.Errorf("watch event: %w", err)
		}
		e.typ, md, rows = v.Type, v.Object.Metadata.jsonMeta, v.Object.Rows
		e.initialEnd = v.Object.Metadata.Annotations[initialEventsEnd] == "true"
	} else {
		var v jsonEvent
		if err := json.Unmarshal(ev, &v); err != nil {
			return fmt.Errorf("watch event: %w", err)
		}
		e.typ, md, rows = v.Type, v.Object.Metadata, v.Object.Rows
	}
	e.rv, e.key = md.ResourceVersion, eventKey{md.Namespace, md.Name}
	if md.Name == "" && rows != nil {
		e.key = tableRowKey(rows)
	}
	return nil
}

// protobufMagic prefixes an object encoded by apimachinery's protobuf serializer.
var protobufMagic = []byte("k8s\x00")

// The field numbers read from a protobuf watch frame (k8s.io/apimachinery generated.proto).
const (
	fieldWatchEventType   = 1 // metav1.WatchEvent.type
	fieldWatchEventObject = 2 // metav1.WatchEvent.object (runtime.RawExtension)
	fieldRawExtensionRaw  = 1 // runtime.RawExtension.raw
	fieldUnknownRaw       = 2 // runtime.Unknown.raw
	fieldUnknownEncoding  = 3 // runtime.Unknown.contentEncoding
	fieldObjectMeta       = 1 // every object's metadata
	fieldName             = 1 // metav1.ObjectMeta.name
	fieldNamespace        = 3 // metav1.ObjectMeta.namespace
	fieldResourceVersion  = 6 // metav1.ObjectMeta.resourceVersion
	fieldAnnotations      = 12
	fieldMapKey           = 1
	fieldMapValue         = 2
)

var errNotWatchEvent = errors.New("protobuf watch frame does not parse as a WatchEvent")

// parseProtobuf reads one frame of a protobuf watch stream: a 4-byte length, then a
// metav1.WatchEvent whose object is "k8s\x00" and a runtime.Unknown holding the object, whose
// field 1 is its ObjectMeta.
func (e *eventMeta) parseProtobuf(frame []byte, annotations bool) error {
	if len(frame) < 4 {
		return errNotWatchEvent
	}
	ev := frame[4:]
	typ, _, err := protoField(ev, fieldWatchEventType)
	if err != nil {
		return err
	}
	e.typ = string(typ)
	if e.typ == "ERROR" {
		return nil
	}
	obj, err := eventObject(ev)
	if err != nil {
		return err
	}
	meta, _, err := protoField(obj, fieldObjectMeta)
	if err != nil {
		return err
	}
	rv, _, err := protoField(meta, fieldResourceVersion)
	if err != nil {
		return err
	}
	e.rv = string(rv)
	name, _, err := protoField(meta, fieldName)
	if err != nil {
		return err
	}
	ns, _, err := protoField(meta, fieldNamespace)
	if err != nil {
		return err
	}
	e.key = eventKey{string(ns), string(name)}
	if annotations {
		e.initialEnd, err = protoMapHas(meta, fieldAnnotations, initialEventsEnd, "true")
	}
	return err
}

// eventObject returns the object of a protobuf metav1.WatchEvent ev: its object is "k8s\x00" and
// a runtime.Unknown (with no content encoding) holding the object's own encoding.
func eventObject(ev []byte) ([]byte, error) {
	ext, _, err := protoField(ev, fieldWatchEventObject)
	if err != nil {
		return nil, err
	}
	raw, _, err := protoField(ext, fieldRawExtensionRaw)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(raw, protobufMagic) {
		return nil, fmt.Errorf("%w: the object lacks the k8s protobuf magic", errNotWatchEvent)
	}
	unknown := raw[len(protobufMagic):]
	if enc, _, err := protoField(unknown, fieldUnknownEncoding); err != nil || len(enc) > 0 {
		return nil, fmt.Errorf("%w: the object has a content encoding %q (%v)", errNotWatchEvent, enc, err)
	}
	obj, _, err := protoField(unknown, fieldUnknownRaw)
	return obj, err
}

// protoField returns the last length-delimited field num of the message m (empty when absent).
func protoField(m []byte, num protowire.Number) ([]byte, bool, error) {
	var val []byte
	found := false
	for len(m) > 0 {
		n, typ, k := protowire.ConsumeTag(m)
		if k < 0 {
			return nil, false, fmt.Errorf("%w: %v", errNotWatchEvent, protowire.ParseError(k))
		}
		m = m[k:]
		if n == num && typ == protowire.BytesType {
			v, k := protowire.ConsumeBytes(m)
			if k < 0 {
				return nil, false, fmt.Errorf("%w: %v", errNotWatchEvent, protowire.ParseError(k))
			}
			val, found = v, true
			m = m[k:]
			continue
		}
		k = protowire.ConsumeFieldValue(n, typ, m)
		if k < 0 {
			return nil, false, fmt.Errorf("%w: %v", errNotWatchEvent, protowire.ParseError(k))
		}
		m = m[k:]
	}
	return val, found, nil
}

// protoMapHas reports whether the map<string,string> field num of m holds key: value.
func protoMapHas(m []byte, num protowire.Number, key, value string) (bool, error) {
	has := false
	for len(m) > 0 {
		n, typ, k := protowire.ConsumeTag(m)
		if k < 0 {
			return false, fmt.Errorf("%w: %v", errNotWatchEvent, protowire.ParseError(k))
		}
		m = m[k:]
		if n != num || typ != protowire.BytesType {
			if k = protowire.ConsumeFieldValue(n, typ, m); k < 0 {
				return false, fmt.Errorf("%w: %v", errNotWatchEvent, protowire.ParseError(k))
			}
			m = m[k:]
			continue
		}
		entry, k := protowire.ConsumeBytes(m)
		if k < 0 {
			return false, fmt.Errorf("%w: %v", errNotWatchEvent, protowire.ParseError(k))
		}
		m = m[k:]
		kb, _, err := protoField(entry, fieldMapKey)
		if err != nil {
			return false, err
		}
		if string(kb) == key {
			vb, _, err := protoField(entry, fieldMapValue)
			if err != nil {
				return false, err
			}
			has = string(vb) == value
		}
	}
	return has, nil
}
