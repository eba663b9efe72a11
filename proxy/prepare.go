package proxy

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/kubefence/kubefence/internal/tlsutil"
	"github.com/kubefence/kubefence/proxy/admin"
	"github.com/kubefence/kubefence/proxy/backendurl"
)

// A prepared backend (admin.PrepareRequest) is one a switch is expected to go to soon: checked
// and with connections open before the fence, so that the watches a switch moves and the writes
// the unfence releases find them open rather than each dialling and handshaking inside the
// window (Go's transport dials a connection for every request that finds none open, even on
// HTTP/2, where they would all have shared one).

// preparedSlot holds the one prepared backend.
type preparedSlot struct {
	mu sync.Mutex
	p  *preparedBackend
}

type preparedBackend struct {
	b     *backend
	caPEM []byte // the CA file as it was when prepared: a changed file is loaded afresh
	at    time.Time
}

// PrepareBackend makes a backend ready for a switch to come (admin.PrepareRequest): nothing
// changes for the requests served meanwhile.
func (s *Server) PrepareBackend(ctx context.Context, req admin.PrepareRequest) (admin.PrepareResponse, error) {
	start := time.Now()
	caFile := s.caFileOr(req.CAFile)
	if _, err := s.allowedURL(req.URL); err != nil {
		return admin.PrepareResponse{}, err
	}
	// Read before the backend loads it: a file changed in between then differs from what a
	// switch reads, and the switch loads it afresh.
	caPEM, err := readCAFile(caFile)
	if err != nil {
		return admin.PrepareResponse{}, err
	}
	nb, err := s.checkedBackend(ctx, req.URL, caFile)
	if err != nil {
		return admin.PrepareResponse{}, err
	}
	opened := nb.warm(ctx, s.cfg.opts.HoldReleaseConcurrency, true, s.log)
	if opened == 0 || ctx.Err() != nil {
		nb.closeIdle()
		return admin.PrepareResponse{}, fmt.Errorf("backend %s: no connection opened to it (GET /livez failed on every one; the proxy's log at debug level says why), or the request ended first: %v", nb.url, ctx.Err())
	}
	s.prepared.put(&preparedBackend{b: nb, caPEM: caPEM, at: time.Now()})
	ahead := s.active.Load().readWatchesAhead(s.prepares.Add(1), readAheadFor)
	took := time.Since(start)
	s.log.Info("backend prepared for a switch", "backend", nb.url.String(), "connections", opened, "watchesReadAhead", ahead, "took", took)
	return admin.PrepareResponse{Backend: nb.url.String(), Connections: opened, Took: admin.Duration(took)}, nil
}

// readCAFile is the CA bundle's bytes, read as the backend reads it: a regular file of bounded
// size (its path may come over the admin API).
func readCAFile(caFile string) ([]byte, error) {
	if caFile == "" {
		return nil, nil
	}
	return tlsutil.ReadCABundle(caFile)
}

// put keeps p, closing the connections of the one it replaces.
func (ps *preparedSlot) put(p *preparedBackend) {
	ps.mu.Lock()
	old := ps.p
	ps.p = p
	ps.mu.Unlock()
	if old != nil {
		old.b.closeIdle()
	}
}

// take empties the slot and returns its backend if a switch to rawURL with caFile may use it:
// the same URL and CA file (unchanged), prepared within admin.PreparedFor. A prepared backend
// a switch does not use is closed.
func (ps *preparedSlot) take(rawURL, caFile string) *backend {
	ps.mu.Lock()
	p := ps.p
	ps.p = nil
	ps.mu.Unlock()
	if p == nil {
		return nil
	}
	u, err := backendurl.Parse(rawURL)
	if err == nil && u.String() == p.b.url.String() && caFile == p.b.caFile && time.Since(p.at) < admin.PreparedFor {
		if caPEM, err := readCAFile(caFile); err == nil && bytes.Equal(caPEM, p.caPEM) {
			return p.b
		}
	}
	p.b.closeIdle()
	return nil
}

// backendFor is the backend a switch to rawURL goes to: the prepared one when it fits (checked
// when it was prepared, and allowed now), else a new one checked now.
func (s *Server) backendFor(ctx context.Context, rawURL, caFile string) (nb *backend, prepared bool, err error) {
	caFile = s.caFileOr(caFile)
	if nb := s.prepared.take(rawURL, caFile); nb != nil {
		if err := s.checkAllowed(nb.url); err != nil {
			nb.closeIdle()
			return nil, false, err
		}
		// Still there: one round trip over the connection the prepare opened (no handshake),
		// where an unprepared switch checks a TLS handshake.
		if _, err := nb.plain.ping(ctx, nb.plain.watches, nb.url); err == nil {
			return nb, true, nil
		}
		nb.closeIdle()
	}
	nb, err = s.checkedBackend(ctx, rawURL, caFile)
	return nb, false, err
}

// caFileOr is caFile, or the active backend's when empty: a prepare or switch that names none
// keeps the current one.
func (s *Server) caFileOr(caFile string) string {
	if caFile == "" {
		return s.active.Load().caFile
	}
	return caFile
}

// allowedURL parses rawURL and checks it against the allow-list: done first, so that nothing a
// request names (its CA file) is read for a backend that is not allowed.
func (s *Server) allowedURL(rawURL string) (*url.URL, error) {
	u, err := backendurl.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	return u, s.checkAllowed(u)
}

// checkedBackend is a new backend for rawURL, verified with caFile (callers apply caFileOr):
// allowed, and its TLS handshake verified, as every switch requires.
func (s *Server) checkedBackend(ctx context.Context, rawURL, caFile string) (*backend, error) {
	if _, err := s.allowedURL(rawURL); err != nil {
		return nil, err
	}
	nb, err := newBackend(rawURL, caFile, s.cfg.backend)
	if err != nil {
		return nil, err
	}
	if err := probeTLS(ctx, nb); err != nil {
		return nil, err
	}
	return nb, nil
}

// readAheadFor is how long a prepare has the active backend's watches read ahead: as long as the
// prepared backend stays usable.
var readAheadFor = admin.PreparedFor

// readWatchesAhead has every watch on b read the resourceVersion of its last event now, and of
// each event as it passes for the next d (until a newer prepare's d, or the switch moves the
// watch off b), so that a switch moving them finds it read: otherwise each parses its last
// event when the switch asks, and the switch waits for all of them, inside the write window.
// It returns how many watches it read ahead.
func (b *backend) readWatchesAhead(seq uint64, d time.Duration) int {
	b.readAhead.Store(seq) // before the walk: what the walk does not see passes after it
	time.AfterFunc(d, func() { b.readAhead.CompareAndSwap(seq, 0) })
	n := 0
	for _, s := range b.list() {
		s.mu.Lock()
		body := s.body
		s.mu.Unlock()
		if body != nil && body.readAhead() {
			n++
		}
	}
	return n
}

// readAhead parses the last event the watch delivered, if it kept it unparsed; false for a watch
// that cannot be resumed.
func (w *watchBody) readAhead() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.rv.resumable() {
		return false
	}
	w.rv.settle()
	return true
}
