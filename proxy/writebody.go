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
// hold at once is bounded (bodyBudget, --max-buffered-write-bytes): a body's buffer is reserved
// as it grows, and it grows only once a byte arrives that it has no room for (from
// initialWriteBuffer, by at most maxWriteChunk, never past the announced length), so that
// announcing a Content-Length costs the budget nothing the client has not sent, and a body holds
// at most maxWriteChunk more than it received; the reservation is released when the write ends,
// or when hold mode holds it (a held body counts against --max-held-bytes instead, hold.go).
// Beyond the budget a write gets 429 + Retry-After at once, and is never forwarded: without it,
// anonymous clients opening many HTTP/2 streams, each sending all but the last byte of a body
// near --max-write-body-bytes, would make the proxy hold gigabytes for --write-body-timeout.
// Reserving the announced length instead would let streams that send no byte at all fill the
// budget, and then every write, a kubelet's lease renewal as well, would get 429. One client
// connection may hold at most a share of the budget (connBudgetShare), so that one HTTP/2
// connection's streams, sending bytes or not, cannot take it all from the others. Many
// connections could, and anyone who reaches the proxy can open them; so writes from clients
// whose certificate the proxy did not verify may hold only part of the budget, and the rest
// (verifiedBudgetShare) is always there for the clients it verified: kubelets and the control
// plane's components keep renewing their leases whatever unauthenticated clients send.

// errBodyTooLarge, errBodyTimeout and errBodyBudget say why a write's body was not read.
var (
	errBodyTooLarge = errors.New("write body too large")
	errBodyTimeout  = errors.New("write body not received in time")
	errBodyBudget   = errors.New("too many write body bytes being received at once")
	errConnBudget   = fmt.Errorf("%w on this connection", errBodyBudget)
	// errUnverifiedBudget: beyond what writes from clients the proxy did not verify may hold.
	errUnverifiedBudget = fmt.Errorf("%w by clients without a verified certificate", errBodyBudget)
)

// initialWriteBuffer is the buffer a write's body is read into before its first byte arrives,
// reserved like the rest: what a stream that sends no body byte holds of the budget.
const initialWriteBuffer = 512

// bodyLimits bound a write's body: --max-write-body-bytes and --write-body-timeout, and the
// bytes of all write bodies at once (--max-buffered-write-bytes), refused with --retry-after.
type bodyLimits struct {
	max        int64
	timeout    time.Duration
	budget     *bodyBudget
	retryAfter int
}

// connBudgetShare: one client connection may hold at most 1/connBudgetShare of the budget, or
// one body of --max-write-body-bytes if that is more.
const connBudgetShare = 4

// verifiedBudgetShare: writes from clients whose certificate the proxy verified have
// 1/verifiedBudgetShare of the budget that other clients' writes may not take (unless that would
// leave them less than one body of --max-write-body-bytes). Hold mode's waiting room keeps the
// same share of its writes and bytes (hold.go).
const verifiedBudgetShare = 4

// unverifiedShare is what writes from clients the proxy did not verify may hold of total: all
// but 1/verifiedBudgetShare of it, and at least least (one largest body, one write), if total
// has that much.
func unverifiedShare(total, least int64) int64 {
	return max(total-total/verifiedBudgetShare, min(least, total))
}

// bodyBudget counts the write-body bytes reserved now, against max, and at most perConn of them
// for the bodies of one client connection, and at most unverifiedMax of them (unverified) for
// writes from clients whose certificate the proxy did not verify.
type bodyBudget struct {
	max     int64
	perConn int64
	// unverifiedMax bounds the unverified writes' bytes when split (the proxy verifies client
	// certificates); otherwise every write is unverified and only max counts.
	split         bool
	unverifiedMax int64
	used          atomic.Int64
	unverified    atomic.Int64
	full          atomic.Uint64 // writes refused because it (or their connection's share) was full
}

// newBodyBudget is the budget of total bytes for bodies of at most maxBody bytes each. When the
// proxy verifies client certificates (verifies), the writes of the clients it verified have a
// share of it that the others cannot take.
func newBodyBudget(total, maxBody int64, verifies bool) *bodyBudget {
	b := &bodyBudget{max: total, perConn: max(total/connBudgetShare, maxBody), split: verifies}
	if verifies {
		b.unverifiedMax = unverifiedShare(total, maxBody)
	}
	return b
}

// connBodyBytesKey keys the write-body bytes reserved by one client connection (an
// *atomic.Int64, set by connContext).
type connBodyBytesKey struct{}

// reserve takes n bytes of the budget, or none: errUnverifiedBudget beyond what writes from
// clients the proxy did not verify may hold, errBodyBudget beyond the budget.
func (b *bodyBudget) reserve(n int64, verified bool) error {
	counted := !verified && b.split
	if counted && !addWithin(&b.unverified, n, b.unverifiedMax) {
		b.full.Add(1)
		return errUnverifiedBudget
	}
	if !addWithin(&b.used, n, b.max) {
		if counted {
			b.unverified.Add(-n)
		}
		b.full.Add(1)
		return errBodyBudget
	}
	return nil
}

// addWithin adds n to v unless that would take it past limit.
func addWithin(v *atomic.Int64, n, limit int64) bool {
	for {
		old := v.Load()
		if old+n > limit {
			return false
		}
		if v.CompareAndSwap(old, old+n) {
			return true
		}
	}
}

// release gives back n reserved bytes.
func (b *bodyBudget) release(n int64, verified bool) {
	if !verified && b.split {
		b.unverified.Add(-n)
	}
	b.used.Add(-n)
}

// reservation is what one write's body holds of the budget, and of its connection's share
// (conn; nil: not counted). verified says the write is from a client whose certificate the
// proxy verified. The zero value holds nothing.
type reservation struct {
	budget   *bodyBudget
	conn     *atomic.Int64
	verified bool
	n        int64
}

// take reserves n more bytes, or none: errConnBudget beyond the connection's share,
// errUnverifiedBudget or errBodyBudget beyond the budget (bodyBudget.reserve).
func (res *reservation) take(n int64) error {
	if res.conn != nil && res.conn.Add(n) > res.budget.perConn {
		res.conn.Add(-n)
		res.budget.full.Add(1)
		return errConnBudget
	}
	if err := res.budget.reserve(n, res.verified); err != nil {
		if res.conn != nil {
			res.conn.Add(-n)
		}
		return err
	}
	res.n += n
	return nil
}

// shrink gives back what the reservation holds beyond n bytes.
func (res *reservation) shrink(n int64) {
	if extra := res.n - n; extra > 0 {
		res.budget.release(extra, res.verified)
		if res.conn != nil {
			res.conn.Add(-extra)
		}
		res.n = n
	}
}

// release gives back all the reservation holds; then it holds nothing.
func (res *reservation) release() {
	if res.n == 0 {
		return
	}
	res.budget.release(res.n, res.verified)
	if res.conn != nil {
		res.conn.Add(-res.n)
	}
	res.n = 0
}

// maxWriteChunk is the most a body's buffer grows by at once: what a body may hold of the budget
// beyond the bytes it has received.
const maxWriteChunk = 64 << 10

// bodyBuffer reads a body into chunks, each allocated only once a byte arrives for it (but the
// first, initialWriteBuffer) and reserved before it is allocated: a body holds what it has
// received, and at most maxWriteChunk more. Chunks double from initialWriteBuffer up to
// maxWriteChunk, never past limit; bytes joins them once the body is whole.
type bodyBuffer struct {
	chunks [][]byte // all full but the last
	n      int      // the bytes read
	limit  int      // the announced length, or the most a body of unknown length may have
	res    reservation
}

// readFrom reads src to its end: errBodyTooLarge past limit, errBodyBudget when a chunk cannot
// be reserved.
func (b *bodyBuffer) readFrom(src io.Reader) error {
	if err := b.grow(0); err != nil {
		return err
	}
	for {
		last := &b.chunks[len(b.chunks)-1]
		var err error
		if len(*last) == cap(*last) {
			err = b.next(src)
		} else {
			var n int
			n, err = src.Read((*last)[len(*last):cap(*last)])
			*last = (*last)[:len(*last)+n]
			b.n += n
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// next waits for the body's next byte before it grows the full buffer for it.
func (b *bodyBuffer) next(src io.Reader) error {
	var one [1]byte
	n, err := src.Read(one[:])
	if n == 0 {
		return err
	}
	if b.n == b.limit {
		return errBodyTooLarge
	}
	if growErr := b.grow(one[0]); growErr != nil {
		return growErr
	}
	return err // io.EOF with the last byte: the body is whole
}

// grow adds a chunk holding first, once it has reserved it: twice the last chunk, at least
// initialWriteBuffer, at most maxWriteChunk and never past limit. The first chunk (none yet)
// starts empty.
func (b *bodyBuffer) grow(first byte) error {
	size := initialWriteBuffer
	if k := len(b.chunks); k > 0 {
		size = min(2*cap(b.chunks[k-1]), maxWriteChunk)
	}
	size = min(size, b.limit-b.n)
	if err := b.res.take(int64(size)); err != nil {
		return err
	}
	c := make([]byte, 0, size)
	if len(b.chunks) > 0 {
		c = append(c, first)
		b.n++
	}
	b.chunks = append(b.chunks, c)
	return nil
}

// bytes joins the chunks into the body, and keeps reserved only what it holds.
func (b *bodyBuffer) bytes() []byte {
	if len(b.chunks) == 1 {
		return b.chunks[0]
	}
	body := make([]byte, 0, b.n)
	for _, c := range b.chunks {
		body = append(body, c...)
	}
	b.chunks = [][]byte{body}
	b.res.shrink(int64(b.n))
	return body
}

// readWriteBody reads r's body whole, within limits, and replaces it by the bytes read. It
// returns what the body holds of limits.budget, which the caller releases when the request
// ends; on an error it has released it. A request with no body is left alone.
func readWriteBody(w http.ResponseWriter, r *http.Request, limits bodyLimits, verified bool) (body []byte, res reservation, err error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, reservation{}, nil
	}
	if r.ContentLength > limits.max {
		return nil, reservation{}, errBodyTooLarge
	}
	// The announced length only bounds the buffer: nothing is reserved or allocated for bytes
	// that have not arrived.
	conn, _ := r.Context().Value(connBodyBytesKey{}).(*atomic.Int64)
	b := &bodyBuffer{limit: int(limits.max), res: reservation{budget: limits.budget, conn: conn, verified: verified}}
	if r.ContentLength > 0 {
		b.limit = int(r.ContentLength)
	}
	if err := readBody(w, r.Body, b, limits.timeout); err != nil {
		b.res.release()
		return nil, reservation{}, err
	}
	body = b.bytes()
	replaceBody(r, body)
	return body, b.res, nil
}

// readBody reads src whole into b, within timeout.
func readBody(w http.ResponseWriter, src io.Reader, b *bodyBuffer, timeout time.Duration) error {
	rc := http.NewResponseController(w)
	deadlineSet := rc.SetReadDeadline(time.Now().Add(timeout)) == nil
	err := b.readFrom(src)
	if deadlineSet {
		_ = rc.SetReadDeadline(time.Time{})
	}
	switch {
	case errors.Is(err, errBodyBudget), errors.Is(err, errBodyTooLarge):
		return err
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errBodyTimeout
	case err != nil:
		return fmt.Errorf("read write body: %w", err)
	}
	return nil
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
		closeHTTP1(w, r) // answer at once: the body's bytes still to come are never read
		what := fmt.Sprintf("more than --max-buffered-write-bytes, %d bytes", limits.budget.max)
		switch {
		case errors.Is(err, errConnBudget):
			what = fmt.Sprintf("on this connection: more than its share of --max-buffered-write-bytes, %d bytes", limits.budget.perConn)
		case errors.Is(err, errUnverifiedBudget):
			what = fmt.Sprintf("from clients without a certificate the proxy verified: more than their share of --max-buffered-write-bytes, %d bytes", limits.budget.unverifiedMax)
		}
		writeStatus(w, http.StatusTooManyRequests, "TooManyRequests",
			fmt.Sprintf("kubefence: too many write bodies are being received at once (%s); retry in %ds (client-go retries by itself)",
				what, limits.retryAfter), limits.retryAfter)
	case errors.Is(err, errBodyTimeout):
		closeHTTP1(w, r)
		writeStatus(w, http.StatusRequestTimeout, "Timeout",
			fmt.Sprintf("kubefence: the request body did not arrive within --write-body-timeout (%s)", limits.timeout), 0)
	default:
		log.Debug("client went away while sending a write body", "path", r.URL.Path, "err", err)
		closeHTTP1(w, r)
		writeStatus(w, http.StatusBadRequest, "BadRequest", "kubefence: "+err.Error(), 0)
	}
}

// closeHTTP1 closes an HTTP/1.1 connection after the answer: the rest of the body is not read,
// and nothing else can be read off the connection. Over HTTP/2 the stream alone is reset when
// the handler returns; "Connection: close" there would make Go's server retire the client's
// whole connection, with its other requests and watches.
func closeHTTP1(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}
