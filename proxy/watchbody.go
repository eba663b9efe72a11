package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"mime"
	"net/http"
	"sync"
)

// framing is how a watch stream separates its events.
type framing uint8

const (
	framingUnknown  framing = iota
	framingJSON             // one JSON object per line
	framingProtobuf         // 4-byte big-endian length, then the event
)

func watchFraming(contentType string) framing {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return framingUnknown
	}
	switch {
	case mt == "application/json":
		return framingJSON
	case mt == "application/vnd.kubernetes.protobuf" && params["stream"] == "watch":
		return framingProtobuf
	}
	return framingUnknown
}

// streamFraming is the framing of a watch answer with headers h: none in an encoded body (gzip:
// its bytes are not the events', a newline byte there is no boundary).
func streamFraming(h http.Header) framing {
	if h.Get("Content-Encoding") != "" {
		return framingUnknown
	}
	return watchFraming(h.Get("Content-Type"))
}

// watchBody wraps a watch response body so that a backend switch can end it cleanly between two
// events: the client sees a normal end of the watch (as when the apiserver's watch timeout fires)
// and re-establishes it, rather than a stream cut in the middle of an event. When the switch
// resumes watches (watchresume.go), the stream instead goes on, at an event boundary, with the
// body of the same watch re-issued to the new backend from the last resourceVersion delivered.
type watchBody struct {
	cancel context.CancelFunc
	fr     framing

	mu       sync.Mutex
	rc       io.ReadCloser // the current backend's body; replaced when the watch resumes
	draining bool
	// boundary is true when the bytes passed so far end exactly at an event boundary.
	boundary bool
	// for protobuf framing: bytes of the length prefix seen, and bytes of the event still due.
	hdr     [4]byte
	hdrSeen int
	due     uint32
	// ends is scratch space: the offsets just past each event that ends in the bytes read.
	ends []int

	// resume is how to re-issue the watch; nil when it cannot be resumed.
	resume *resumeInfo
	// rv tracks the resourceVersion delivered; nil when resume is.
	rv *rvTracker
	// resumeTo is the backend a resuming switch moves the watch to, at the next boundary.
	resumeTo *backend
	// asked is the resourceVersion the watch was last re-issued from (its delivered one, or the
	// one before when it moved in the middle of a revision's events: rvTracker.batch).
	asked string
	// interrupted is set when the switch closed rc to wake an idle Read: bytes of an event
	// that was cut by it are not passed on (the new backend sends that event again).
	interrupted bool
	// out: the last Read returned bytes, which the caller writes to the client before it
	// reads again.
	out bool
	// takenOff: a drain took the watch off the old backend itself (takeOff), to go on from
	// resourceVersion takenRV on takenTo: nothing more is read from the old body, and the
	// watch is counted pending on takenTo until resumeOn (or Close) consumes this.
	takenOff bool
	takenRV  string
	takenTo  *backend
	// takenPending: takeOff counted the watch pending on takenTo (not while its goroutine was
	// still writing to its client: resumeOn counts it then).
	takenPending bool
	// ended: Read returned an error before any drain asked the watch to move, or Close ran: a
	// drain does not take it off (takeOff).
	ended bool
}

func newWatchBody(rc io.ReadCloser, cancel context.CancelFunc, fr framing) *watchBody {
	return &watchBody{rc: rc, cancel: cancel, fr: fr, boundary: true}
}

// departure is how a watch asked to leave its backend goes.
type departure uint8

const (
	// departs: it leaves by itself, at its next event boundary; the drain waits for it.
	departs departure = iota
	// departParked: parked at a boundary, for the drain to wake by closing the backend's
	// watch connections (moveTo).
	departParked
	// departGone: it reads nothing more from the backend and need not be waited for: at a
	// boundary while its goroutine writes what it read last to its client (which may read
	// slowly, or not at all: a paused 'kubectl get -w | less'), its next Read ends it. The
	// caller takes it off the backend, unless moveTo did (takeOff).
	departGone
	// departCut: the framing is unknown, there is no boundary to wait for: the caller cuts it.
	departCut
)

// endAtBoundary asks the stream to end at the next event boundary.
func (w *watchBody) endAtBoundary() departure {
	if w.fr == framingUnknown {
		return departCut
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.draining = true
	if !w.boundary {
		return departs
	}
	return w.endHere()
}

// endHere ends a draining stream at the boundary it is at: a Read blocked in the body is
// interrupted (Read turns the error into a clean EOF; if it returns the head of a new event
// before it sees the cancel, that is cut back to its last whole event, as after a close), and
// the next Read reads nothing more. Called with w.mu held.
func (w *watchBody) endHere() departure {
	w.interrupted = true
	w.cancel()
	if w.out {
		return departGone
	}
	return departs
}

func (w *watchBody) Read(p []byte) (int, error) {
	for {
		w.mu.Lock()
		if w.draining && w.boundary {
			to := w.resumeTo
			w.resumeTo = nil
			w.mu.Unlock()
			if to != nil && w.resumeOn(to) {
				continue // the same watch, now on the new backend
			}
			w.cancel()
			return 0, io.EOF
		}
		rc := w.rc
		w.out = false // the caller wrote what the last Read returned
		w.mu.Unlock()
		n, err := rc.Read(p)
		w.mu.Lock()
		if w.takenOff {
			w.mu.Unlock()
			continue // nothing more of the old backend: the loop's top moves the watch
		}
		if exp, ok := err.(*expiredError); ok {
			w.mu.Unlock()
			if w.resumePastExpiry(exp) {
				continue
			}
			return 0, io.EOF
		}
		n = w.advance(p[:n])
		w.out = n > 0
		at := w.draining && w.boundary
		resuming := w.resumeTo != nil
		w.ended = w.ended || !at && err != nil
		w.mu.Unlock()
		if !at {
			return n, err
		}
		switch {
		case n > 0 && resuming:
			return n, nil // deliver these events; the next Read moves the watch
		case n > 0 && err != nil:
			return n, io.EOF
		case n > 0:
			return n, nil
		}
		// Nothing to deliver and at a boundary: loop to end or resume.
	}
}

// Close closes the current backend's body and takes the stream off the backend it moved to.
func (w *watchBody) Close() error {
	w.mu.Lock()
	rc := w.rc
	w.ended = true
	if w.takenOff && w.takenPending { // taken off by a drain, never resumed (its client left)
		w.takenTo.resumesPending.Add(-1)
	}
	w.takenOff, w.takenPending = false, false
	w.mu.Unlock()
	if w.resume != nil {
		w.resume.untrack()
	}
	return rc.Close()
}

// advance updates boundary after the bytes b passed through, and the resourceVersion tracker
// with the events they complete. It returns how many of them to pass on: all, except while
// draining (cut back to the last whole event, so that a busy watch, whose reads need never end
// at an event boundary, can still end or move there: what follows comes again from the new
// backend or the client's re-watch) and after the switch interrupted the stream in the middle of
// an event (its bytes are dropped).
func (w *watchBody) advance(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	ends := w.ends[:0]
	switch w.fr {
	case framingJSON:
		for off := 0; w.rv != nil || w.draining; { // untracked, the last byte says all
			i := bytes.IndexByte(b[off:], '\n')
			if i < 0 {
				break
			}
			off += i + 1
			ends = append(ends, off)
		}
		w.boundary = b[len(b)-1] == '\n'
	case framingProtobuf:
		for off := 0; off < len(b); {
			if w.due > 0 {
				k := min(uint32(len(b)-off), w.due)
				w.due -= k
				off += int(k)
				if w.due == 0 {
					ends = append(ends, off)
				}
				continue
			}
			k := copy(w.hdr[w.hdrSeen:], b[off:])
			w.hdrSeen += k
			off += k
			if w.hdrSeen == 4 {
				w.due = binary.BigEndian.Uint32(w.hdr[:])
				w.hdrSeen = 0
				if w.due == 0 {
					ends = append(ends, off)
				}
			}
		}
		w.boundary = w.due == 0 && w.hdrSeen == 0
	default:
		w.boundary = false
		return len(b)
	}
	w.ends = ends
	n := len(b)
	if !w.boundary && (w.interrupted || w.draining && len(ends) > 0) {
		// The read raced the switch's close, or a drain waits for a boundary: cut back to the
		// last whole event. (Draining in the middle of the first event, its head already passed
		// on, the read goes through whole.)
		n = 0
		if len(ends) > 0 {
			n = ends[len(ends)-1]
		}
		w.boundary, w.hdrSeen, w.due = true, 0, 0
	}
	if w.rv != nil {
		w.rv.observe(b[:n], ends)
	}
	return n
}
