package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// A write's body is read whole before the fence admits the write (readWriteBody), so that:
//   - a client trickling its body is not an admitted write: it cannot hold 'fence on''s barrier
//     hostage, and if the fence comes on meanwhile the write is refused, never forwarded;
//   - a DELETE's DeleteOptions can be read to tell a real dry run from a delete (the apiserver
//     ignores ?dryRun=All when a DELETE has a body);
//   - once admitted and forwarded, the write's outcome on the backend no longer depends on the
//     client: the barrier waits for the backend's answer even if the client went away.
//
// Bodies are read before any authentication (and before the backend's), so what all of them may
// hold at once is bounded (bodyBudget, --max-buffered-write-bytes): a write reserves its
// Content-Length before its first byte is read (a body of unknown length, its bytes as they
// arrive) and releases it when it ends. Beyond the budget a write gets 429 + Retry-After at once,
// and is never forwarded: without it, anonymous clients opening many HTTP/2 streams, each
// sending all but the last byte of a body near --max-write-body-bytes, would make the proxy hold
// gigabytes for --write-body-timeout.

// errBodyTooLarge, errBodyTimeout and errBodyBudget say why a write's body was not read.
var (
	errBodyTooLarge = errors.New("write body too large")
	errBodyTimeout  = errors.New("write body not received in time")
	errBodyBudget   = errors.New("too many write body bytes being received at once")
)

// preallocWriteBody is how much of a write's announced length is allocated before its bytes
// arrive (most objects are a few KB; a ConfigMap at its 1 MiB limit takes 5 doublings more).
const preallocWriteBody = 64 << 10

// bodyLimits bound a write's body: --max-write-body-bytes and --write-body-timeout, and the
// bytes of all write bodies at once (--max-buffered-write-bytes), refused with --retry-after.
type bodyLimits struct {
	max        int64
	timeout    time.Duration
	budget     *bodyBudget
	retryAfter int
}

// bodyBudget counts the write-body bytes reserved now, against max.
type bodyBudget struct {
	max  int64
	used atomic.Int64
	full atomic.Uint64 // writes refused because it was full
}

// reserve takes n bytes of the budget, or none if that would exceed it.
func (b *bodyBudget) reserve(n int64) bool {
	for {
		used := b.used.Load()
		if used+n > b.max {
			b.full.Add(1)
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// release gives back n reserved bytes.
func (b *bodyBudget) release(n int64) { b.used.Add(-n) }

// budgetedReader reserves a body of unknown length's bytes as they arrive.
type budgetedReader struct {
	r        io.Reader
	budget   *bodyBudget
	reserved int64
}

func (br *budgetedReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	if n > 0 {
		if !br.budget.reserve(int64(n)) {
			return 0, errBodyBudget
		}
		br.reserved += int64(n)
	}
	return n, err
}

// readWriteBody reads r's body whole, within limits, and replaces it by the bytes read. It
// returns the bytes it reserved of limits.budget, which the caller releases when the request
// ends; on an error it has released them. A request with no body is left alone.
func readWriteBody(w http.ResponseWriter, r *http.Request, limits bodyLimits) (body []byte, reserved int64, err error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, 0, nil
	}
	if r.ContentLength > limits.max {
		return nil, 0, errBodyTooLarge
	}
	var src io.Reader = r.Body
	var br *budgetedReader
	if r.ContentLength > 0 {
		if !limits.budget.reserve(r.ContentLength) {
			return nil, 0, errBodyBudget
		}
		reserved = r.ContentLength
	} else {
		br = &budgetedReader{r: r.Body, budget: limits.budget}
		src = br
	}
	body, err = readBody(w, r.ContentLength, src, limits)
	if br != nil {
		reserved = br.reserved
	}
	if err != nil {
		limits.budget.release(reserved)
		return nil, 0, err
	}
	replaceBody(r, body)
	return body, reserved, nil
}

// readBody reads src whole, within limits; contentLength is the announced length or -1.
func readBody(w http.ResponseWriter, contentLength int64, src io.Reader, limits bodyLimits) ([]byte, error) {
	rc := http.NewResponseController(w)
	deadlineSet := rc.SetReadDeadline(time.Now().Add(limits.timeout)) == nil
	var buf bytes.Buffer
	if contentLength > 0 {
		// Only what most writes need ahead: a larger body grows the buffer as its bytes come, so
		// that announcing a size costs the client as much as it costs the proxy.
		buf.Grow(int(min(contentLength, preallocWriteBody)))
	}
	_, err := buf.ReadFrom(io.LimitReader(src, limits.max+1))
	if deadlineSet {
		_ = rc.SetReadDeadline(time.Time{})
	}
	switch {
	case errors.Is(err, errBodyBudget):
		return nil, err
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, errBodyTimeout
	case err != nil:
		return nil, fmt.Errorf("read write body: %w", err)
	case int64(buf.Len()) > limits.max:
		return nil, errBodyTooLarge
	}
	return buf.Bytes(), nil
}

// replaceBody makes body r's body, to be sent again if need be.
func replaceBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	// GetBody lets the HTTP/2 transport send the write again on a new connection when the
	// backend refused its stream unprocessed (a graceful GOAWAY from an apiserver shutting down,
	// REFUSED_STREAM): the write still reaches the backend's handler at most once. The HTTP/1.1
	// transport resends a POST, PUT, PATCH or DELETE only with an Idempotency-Key header, which
	// the proxy does not forward (reverseproxy.go).
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
}

// answerBodyError answers a write whose body could not be read; nothing was forwarded.
func answerBodyError(w http.ResponseWriter, r *http.Request, err error, limits bodyLimits, log *slog.Logger) {
	reqStateFrom(r.Context()).answered = decisionRejected
	switch {
	case errors.Is(err, errBodyTooLarge):
		writeStatus(w, http.StatusRequestEntityTooLarge, "RequestEntityTooLarge",
			fmt.Sprintf("kubefence: the request body is larger than --max-write-body-bytes (%d)", limits.max), 0)
	case errors.Is(err, errBodyBudget):
		if r.ProtoMajor == 1 {
			// Answer at once: the body's bytes still to come are never read.
			w.Header().Set("Connection", "close")
		}
		writeStatus(w, http.StatusTooManyRequests, "TooManyRequests",
			fmt.Sprintf("kubefence: too many write bodies are being received at once (more than --max-buffered-write-bytes, %d bytes); "+
				"retry in %ds (client-go retries by itself)", limits.budget.max, limits.retryAfter), limits.retryAfter)
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
