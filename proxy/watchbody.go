package proxy

import (
	"context"
	"encoding/binary"
	"io"
	"mime"
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

// watchBody wraps a watch response body so that a backend switch can end it cleanly between two
// events: the client sees a normal end of the watch (as when the apiserver's watch timeout fires)
// and re-establishes it, rather than a stream cut in the middle of an event.
type watchBody struct {
	rc     io.ReadCloser
	cancel context.CancelFunc
	fr     framing

	mu       sync.Mutex
	draining bool
	// boundary is true when the bytes passed so far end exactly at an event boundary.
	boundary bool
	// for protobuf framing: bytes of the length prefix seen, and bytes of the event still due.
	hdr     [4]byte
	hdrSeen int
	due     uint32
}

func newWatchBody(rc io.ReadCloser, cancel context.CancelFunc, fr framing) *watchBody {
	return &watchBody{rc: rc, cancel: cancel, fr: fr, boundary: true}
}

// endAtBoundary asks the stream to end at the next event boundary. It returns false when the
// framing is unknown, so the caller must cut the stream instead.
func (w *watchBody) endAtBoundary() bool {
	if w.fr == framingUnknown {
		return false
	}
	w.mu.Lock()
	w.draining = true
	at := w.boundary
	w.mu.Unlock()
	if at {
		// Interrupt a Read blocked on an idle watch; Read turns the error into a clean EOF.
		w.cancel()
	}
	return true
}

func (w *watchBody) Read(p []byte) (int, error) {
	w.mu.Lock()
	if w.draining && w.boundary {
		w.mu.Unlock()
		w.cancel()
		return 0, io.EOF
	}
	w.mu.Unlock()
	n, err := w.rc.Read(p)
	w.mu.Lock()
	w.advance(p[:n])
	clean := w.draining && w.boundary
	w.mu.Unlock()
	if err != nil && clean {
		return n, io.EOF
	}
	return n, err
}

func (w *watchBody) Close() error { return w.rc.Close() }

// advance updates boundary after the bytes b passed through.
func (w *watchBody) advance(b []byte) {
	if len(b) == 0 {
		return
	}
	switch w.fr {
	case framingJSON:
		w.boundary = b[len(b)-1] == '\n'
	case framingProtobuf:
		for len(b) > 0 {
			if w.due > 0 {
				k := min(uint32(len(b)), w.due)
				w.due -= k
				b = b[k:]
				continue
			}
			k := copy(w.hdr[w.hdrSeen:], b)
			w.hdrSeen += k
			b = b[k:]
			if w.hdrSeen == 4 {
				w.due = binary.BigEndian.Uint32(w.hdr[:])
				w.hdrSeen = 0
			}
		}
		w.boundary = w.due == 0 && w.hdrSeen == 0
	default:
		w.boundary = false
	}
}
