package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"
)

// A write's body is read whole before the fence admits the write (readWriteBody), so that:
//   - a client trickling its body is not an admitted write: it cannot hold 'fence on''s barrier
//     hostage, and if the fence comes on meanwhile the write is refused, never forwarded;
//   - a DELETE's DeleteOptions can be read to tell a real dry run from a delete (the apiserver
//     ignores ?dryRun=All when a DELETE has a body);
//   - once admitted and forwarded, the write's outcome on the backend no longer depends on the
//     client: the barrier waits for the backend's answer even if the client went away.

// errBodyTooLarge and errBodyTimeout say why a write's body was not read.
var (
	errBodyTooLarge = errors.New("write body too large")
	errBodyTimeout  = errors.New("write body not received in time")
)

// preallocWriteBody is how much of a write's announced length is allocated before its bytes
// arrive (most objects are a few KB; a ConfigMap at its 1 MiB limit takes 5 doublings more).
const preallocWriteBody = 64 << 10

// bodyLimits bound a write's body: --max-write-body-bytes and --write-body-timeout.
type bodyLimits struct {
	max     int64
	timeout time.Duration
}

// readWriteBody reads r's body whole, within limits, and replaces it by the bytes read. A
// request with no body is left alone.
func readWriteBody(w http.ResponseWriter, r *http.Request, limits bodyLimits) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	if r.ContentLength > limits.max {
		return nil, errBodyTooLarge
	}
	rc := http.NewResponseController(w)
	deadlineSet := rc.SetReadDeadline(time.Now().Add(limits.timeout)) == nil
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// Only what most writes need ahead: a larger body grows the buffer as its bytes come, so
		// that announcing a size costs the client as much as it costs the proxy.
		buf.Grow(int(min(r.ContentLength, preallocWriteBody)))
	}
	_, err := buf.ReadFrom(io.LimitReader(r.Body, limits.max+1))
	if deadlineSet {
		_ = rc.SetReadDeadline(time.Time{})
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, errBodyTimeout
	case err != nil:
		return nil, fmt.Errorf("read write body: %w", err)
	case int64(buf.Len()) > limits.max:
		return nil, errBodyTooLarge
	}
	body := buf.Bytes()
	r.Body = io.NopCloser(bytes.NewReader(body))
	// GetBody lets the HTTP/2 transport send the write again on a new connection when the
	// backend refused its stream unprocessed (a graceful GOAWAY from an apiserver shutting down,
	// REFUSED_STREAM): the write still reaches the backend's handler at most once. The HTTP/1.1
	// transport resends a POST, PUT, PATCH or DELETE only with an Idempotency-Key header, which
	// the proxy does not forward (reverseproxy.go).
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	return body, nil
}

// answerBodyError answers a write whose body could not be read; nothing was forwarded.
func answerBodyError(w http.ResponseWriter, r *http.Request, err error, limits bodyLimits, log *slog.Logger) {
	reqStateFrom(r.Context()).answered = decisionRejected
	switch {
	case errors.Is(err, errBodyTooLarge):
		writeStatus(w, http.StatusRequestEntityTooLarge, "RequestEntityTooLarge",
			fmt.Sprintf("kubefence: the request body is larger than --max-write-body-bytes (%d)", limits.max), 0)
	case errors.Is(err, errBodyTimeout):
		w.Header().Set("Connection", "close")
		writeStatus(w, http.StatusRequestTimeout, "Timeout",
			fmt.Sprintf("kubefence: the request body did not arrive within --write-body-timeout (%s)", limits.timeout), 0)
	default:
		log.Debug("client went away while sending a write body", "path", r.URL.Path, "err", err)
		w.Header().Set("Connection", "close")
		writeStatus(w, http.StatusBadRequest, "BadRequest", "kubefence: "+err.Error(), 0)
	}
}
