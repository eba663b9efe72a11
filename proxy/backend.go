package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubefence/kubefence/policy"
	"github.com/kubefence/kubefence/proxy/admin"

	"github.com/kubefence/kubefence/internal/tlsutil"
	"github.com/kubefence/kubefence/proxy/backendurl"
)

// backend is one upstream apiserver: its URL, its connection pools, and the long-running
// requests (watches, upgraded streams) open on it, which a switch drains.
type backend struct {
	url    *url.URL
	caFile string
	// plain carries requests with the client's own credentials (bearer tokens) or none;
	// identity presents the proxy's front-proxy client certificate and carries requests whose
	// client-certificate identity the proxy forwards in X-Remote-* headers. It is nil when no
	// front-proxy certificate is configured.
	plain, identity *pool

	mu       sync.Mutex
	draining bool
	streams  map[*stream]struct{}
	idle     chan struct{}   // closed when streams becomes empty while draining
	resumed  int             // watches handed off to the next backend while draining
	drained  chan struct{}   // closed when the drain has ended; nil before it starts
	lifted   <-chan struct{} // closed when the fence lifts after the drain (watchresume.go)
	leaving  chan struct{}   // closed when the drain starts
	// resumedThenEnded counts watches a switch moved to this backend that it then ended at
	// once: it refused the re-issued watch, or answered it with an ERROR event (a
	// resourceVersion older than its watch cache: 410 Expired).
	resumedThenEnded atomic.Int64
	// resumedPastExpiry counts watches it answered so (410) that the proxy resumed from where
	// its watch cache begins, their collection the same there (watchexpired.go).
	resumedPastExpiry atomic.Int64
	// deliveredBefore is the newest revision an event from the previous backend carried, of
	// the watches a switch moved to this one (watchexpired.go).
	deliveredBefore atomic.Uint64
	// resumesPending counts watches moved to this backend that wait for its answer.
	resumesPending atomic.Int64
	// resumeSlots bounds the moved watches asking this backend at once (resumeConcurrency).
	resumeSlots chan struct{}
	// checkSlots bounds the collections listed at once to resume past its expiry
	// (pastExpiryChecks).
	checkSlots chan struct{}
}

// TransportOptions shape the connection pools to every backend.
type TransportOptions struct {
	// FrontProxyCert is presented to the backend on requests that carry a forwarded identity.
	FrontProxyCert *tls.Certificate
	// MaxIdleConnsPerHost bounds each keep-alive pool.
	MaxIdleConnsPerHost int
	DialTimeout         time.Duration
	// HTTP1Only keeps every request on HTTP/1.1 connections, as before HTTP/2 to the backend.
	HTTP1Only bool
}

// pool is the connections to one backend for one identity, chosen by measurement
// (docs/benchmarks.md). Reads and upgrades go over h1, one HTTP/1.1 connection per concurrent
// request: upgrades need HTTP/1.1, and Go's HTTP/2 client writes a WINDOW_UPDATE frame (a TLS
// record and a system call) for every 4 KB it reads, which made a 1 MB list cost the proxy ~40%
// more CPU than over HTTP/1.1. Watches, whose events are small, cost a third less CPU per event
// multiplexed on HTTP/2 than one HTTP/1.1 connection each. Writes have small answers and come in
// bursts (held writes released at fence off): over HTTP/2 they share one warm connection instead
// of opening one per concurrent write. writes and watches are HTTP/2 when the backend offers it
// (kube-apiserver does), separate so that long-lived watches never fill the connection writes
// use; with HTTP1Only both are h1.
type pool struct{ h1, writes, watches *http.Transport }

func newPool(tlsConfig *tls.Config, topts TransportOptions) *pool {
	p := &pool{h1: newTransport(tlsConfig, topts, false)}
	p.writes, p.watches = p.h1, p.h1
	if !topts.HTTP1Only {
		p.writes = newTransport(tlsConfig, topts, true)
		p.watches = newTransport(tlsConfig, topts, true)
	}
	return p
}

func (p *pool) closeIdle() {
	p.h1.CloseIdleConnections()
	p.writes.CloseIdleConnections()
	p.watches.CloseIdleConnections()
}

func newBackend(rawURL, caFile string, topts TransportOptions) (*backend, error) {
	u, err := backendurl.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := tlsutil.LoadCAPool(caFile)
		if err != nil {
			return nil, fmt.Errorf("backend CA: %w", err)
		}
		tlsConfig.RootCAs = pool
	}
	b := &backend{url: u, caFile: caFile, streams: map[*stream]struct{}{}, resumeSlots: make(chan struct{}, resumeConcurrency), checkSlots: make(chan struct{}, pastExpiryChecks), leaving: make(chan struct{})}
	b.plain = newPool(tlsConfig, topts)
	if topts.FrontProxyCert != nil {
		idConfig := tlsConfig.Clone()
		cert := topts.FrontProxyCert
		idConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		b.identity = newPool(idConfig, topts)
	}
	return b, nil
}

// upstreamStreamWindow bounds what the proxy buffers per HTTP/2 stream from the backend; at a
// loopback or LAN round trip it still carries hundreds of MB/s per stream.
const upstreamStreamWindow = 256 << 10

func newTransport(tlsConfig *tls.Config, topts TransportOptions, http2 bool) *http.Transport {
	dialTimeout := topts.DialTimeout
	if dialTimeout == 0 {
		dialTimeout = 10 * time.Second
	}
	idle := topts.MaxIdleConnsPerHost
	if idle == 0 {
		idle = 512
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(http2)
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsConfig.Clone(),
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConnsPerHost:   idle,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		Protocols:             &protocols,
		// A backend that stops answering on a multiplexed connection is noticed by a ping,
		// as client-go does, instead of stalling every request on it. A stream's receive
		// window is what the proxy buffers for a client slower than the backend (a big list, a
		// watch): Go's default of 4 MiB per stream would be 4 GiB for 1,000 slow watches.
		HTTP2: &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second,
			MaxReceiveBufferPerStream: upstreamStreamWindow},
		DisableCompression: true, // pass the client's Accept-Encoding and the backend's encoding through
	}
}

// transportFor picks the connections for a request: identity-forwarding requests must carry
// the front-proxy certificate, and no other request may; then watches, writes (not upgrades)
// and everything else each have their transport (see pool).
func (b *backend) transportFor(forwardsIdentity bool, a *policy.Attributes) *http.Transport {
	p := b.plain
	if forwardsIdentity {
		p = b.identity
	}
	switch {
	case a.Upgrade:
		return p.h1
	case a.Verb == "watch":
		return p.watches
	case a.Class() == policy.Write:
		return p.writes
	}
	return p.h1
}

// warm opens connections ahead of the requests that will need them, and returns how many
// requests it sent to open them that were answered. Held writes, released at once when the fence
// lifts, and watches a switch moves, all at once, would otherwise each find no connection open
// and dial their own, paying a TLS handshake apiece in the middle of it. On each pool (plain, and
// identity) it sends GET /livez (a read: nothing is written) over the writes transport, once, and
// when the backend answered over HTTP/1.1 n-1 more at once, so that n connections are open; with
// watches, once more over the watches transport (HTTP/2: every watch moved shares it).
func (b *backend) warm(ctx context.Context, n int, watches bool, log *slog.Logger) int {
	pools := []*pool{b.plain}
	if b.identity != nil {
		pools = append(pools, b.identity)
	}
	var opened atomic.Int64
	ping := func(p *pool, tr *http.Transport) int {
		proto, err := p.ping(ctx, tr, b.url)
		if err != nil {
			log.Debug("warming backend connections", "backend", b.url.String(), "err", err)
			return 0
		}
		opened.Add(1)
		return proto
	}
	for _, p := range pools {
		if watches && p.watches != p.writes {
			ping(p, p.watches)
		}
		if proto := ping(p, p.writes); proto != 1 {
			continue
		}
		var wg sync.WaitGroup
		for range n - 1 {
			wg.Go(func() { ping(p, p.writes) })
		}
		wg.Wait()
	}
	return int(opened.Load())
}

// ping sends GET /livez over tr and returns the HTTP major version it went over (0 on error).
func (p *pool) ping(ctx context.Context, tr *http.Transport, u *url.URL) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String()+"/livez", nil)
	if err != nil {
		return 0, err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.ProtoMajor, nil
}

func (b *backend) closeIdle() {
	b.plain.closeIdle()
	if b.identity != nil {
		b.identity.closeIdle()
	}
}

// errSwitchedAway is why a stream's context ends when a switch cuts it (drain): its client did
// not go away.
var errSwitchedAway = errors.New("the proxy switched backends")

// errDraining tells the caller to pick the active backend again: this one is being switched away.
var errDraining = errors.New("backend is draining")

// stream is a long-running request (a watch or an upgraded connection) open on a backend.
type stream struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	body   *watchBody // set once the backend answered a watch; nil for upgrades
}

// track registers a long-running request.
func (b *backend) track(s *stream) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.draining {
		return errDraining
	}
	b.streams[s] = struct{}{}
	return nil
}

func (b *backend) untrack(s *stream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.remove(s)
}

// handOff takes off b a watch that leaves it for the next backend (which may not have answered
// the re-issued watch yet: the switch does not wait for that).
func (b *backend) handOff(s *stream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.streams[s]; ok {
		b.resumed++
	}
	b.remove(s)
}

func (b *backend) remove(s *stream) {
	delete(b.streams, s)
	if len(b.streams) == 0 && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
}

// drain ends every long-running request on b: a watch ends cleanly at its next event boundary
// (clients see a normal end of watch and reconnect, to the new backend), or, when resumeOn is
// given, goes on at its next event boundary as the same watch re-issued to resumeOn from the
// last resourceVersion it delivered (watchresume.go: drain returns once it has left b; it asks
// resumeOn once lifted, the fence's next opening, is closed); an upgraded stream, or a watch
// still open at the timeout, is cut.
func (b *backend) drain(timeout time.Duration, resumeOn *backend, lifted <-chan struct{}) admin.Drain {
	start := time.Now()
	b.mu.Lock()
	if !b.draining { // a backend is drained once, when a switch leaves it; a second is a no-op here
		close(b.leaving)
	}
	b.draining = true
	b.drained = make(chan struct{})
	b.lifted = lifted
	defer close(b.drained)
	all := make([]*stream, 0, len(b.streams))
	for s := range b.streams {
		all = append(all, s)
	}
	var idle chan struct{}
	if len(b.streams) > 0 {
		idle = make(chan struct{})
		b.idle = idle
	}
	b.mu.Unlock()
	res := admin.Drain{Streams: len(all)}
	for _, s := range all {
		s.mu.Lock()
		body := s.body
		s.mu.Unlock()
		switch {
		case body == nil:
			s.cancel()
		case resumeOn != nil:
			if !body.moveTo(resumeOn) {
				s.cancel()
			}
		case !body.endAtBoundary():
			s.cancel()
		}
	}
	if idle != nil {
		select {
		case <-idle:
		case <-time.After(timeout):
			b.mu.Lock()
			for s := range b.streams {
				res.Forced++
				s.cancel()
			}
			b.mu.Unlock()
		}
	}
	b.closeIdle()
	b.mu.Lock()
	res.Resumed = b.resumed
	b.mu.Unlock()
	res.Ended = res.Streams - res.Resumed
	res.Duration = admin.Duration(time.Since(start))
	return res
}

// leavingCh is closed when a switch away from b starts to drain it.
func (b *backend) leavingCh() <-chan struct{} { return b.leaving }

// drainGates are closed when b's drain has ended and when the fence lifted after it (both nil
// before the drain started).
func (b *backend) drainGates() (drained, lifted <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.drained, b.lifted
}

func (b *backend) openStreams() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.streams)
}
