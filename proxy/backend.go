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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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
	// writes counts the writes the fence's policy let through to b that it has not answered
	// yet (trackWrite); writesDone, when not nil, is closed when it falls to 0.
	writes     int
	writesDone chan struct{}
	// waiting are the streams a drain waits to leave (awaitLeft); waitDone is closed when the
	// last of them has.
	waiting  map[*stream]struct{}
	waitDone chan struct{}
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
	// readAhead, while not 0 (the number of the prepare that set it), has the watches on this
	// backend read each event's resourceVersion as it passes: a switch away is expected soon
	// (prepare.go).
	readAhead atomic.Uint64
	// tookOff counts the watches a drain took off this backend itself (parked and taken off:
	// takeOff), woken those it parked and woke by closing its watch connections.
	tookOff, woken atomic.Int64
}

// TransportOptions shape the connection pools to every backend.
type TransportOptions struct {
	// FrontProxyCert is presented to the backend on requests that carry a forwarded identity
	// (the current pair of its files: on each connection dialled).
	FrontProxyCert *keyPairFile
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
// (kube-apiserver does), each dialling a new connection only when its open ones are full, one
// at a time (muxTransport), and separate so that long-lived watches never fill the connection
// writes use; with HTTP1Only both are h1.
type pool struct {
	h1 *http.Transport
	// upgrades carries protocol upgrades (exec, attach, port-forward) over a connection of its
	// own that is never used again: if the backend does not answer 101, nothing of it may
	// carry another request (CVE-2018-1002105). Its keep-alives off, net/http adds no
	// "Connection: close" to an upgrade, whose Connection header must say Upgrade alone: the
	// upgraders behind kube-apiserver read its first value only.
	upgrades        *http.Transport
	writes, watches roundTripCloser
	// watchConns is what watches dialled, when it carries nothing else (not HTTP1Only): a
	// switch away closes them at once (drain).
	watchConns *connSet
}

// roundTripCloser is a transport whose idle connections can be closed.
type roundTripCloser interface {
	http.RoundTripper
	CloseIdleConnections()
}

func newPool(tlsConfig *tls.Config, topts TransportOptions) *pool {
	p := &pool{h1: newTransport(tlsConfig, topts, false, nil), upgrades: newUpgradeTransport(tlsConfig, topts)}
	p.writes, p.watches = p.h1, p.h1
	if !topts.HTTP1Only {
		p.writes = newMuxTransport(newTransport(tlsConfig, topts, true, nil), p.h1)
		p.watchConns = newConnSet()
		p.watches = newMuxTransport(newTransport(tlsConfig, topts, true, p.watchConns), newTransport(tlsConfig, topts, false, p.watchConns))
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
		idConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert.get(), nil }
		b.identity = newPool(idConfig, topts)
	}
	return b, nil
}

// upstreamStreamWindow bounds what the proxy buffers per HTTP/2 stream from the backend; at a
// loopback or LAN round trip it still carries hundreds of MB/s per stream.
const upstreamStreamWindow = 256 << 10

// newTransport is a transport to one backend; with conns, the connections it dials are kept in
// it.
func newTransport(tlsConfig *tls.Config, topts TransportOptions, http2 bool, conns *connSet) *http.Transport {
	idle := topts.MaxIdleConnsPerHost
	if idle == 0 {
		idle = 512
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(http2)
	dial := dialFunc(backendDialer(topts.dialTimeout(), true).DialContext)
	if conns != nil {
		dial = conns.dialer(dial)
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dial,
		TLSClientConfig:       tlsConfig.Clone(),
		TLSHandshakeTimeout:   upstreamHandshakeTimeout,
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
	if !http2 {
		handshakeInDial(tr, dial)
	}
	return tr
}

// handshakeInDial makes the TLS handshake of an HTTP/1.1 transport part of its dial, so that its
// failure says nothing was sent (an HTTP/2 transport's is muxTransport.handshaker's).
func handshakeInDial(tr *http.Transport, dial dialFunc) {
	tr.DialContext = dial
	tr.DialTLSContext = tlsutil.HandshakeDialer(dial, func() *tls.Config { return tr.TLSClientConfig }, upstreamHandshakeTimeout)
}

// newUpgradeTransport is the transport of protocol upgrades (pool.upgrades): one connection
// each, never used again, without backendUserTimeout.
func newUpgradeTransport(tlsConfig *tls.Config, topts TransportOptions) *http.Transport {
	tr := newTransport(tlsConfig, topts, false, nil)
	tr.DisableKeepAlives = true
	handshakeInDial(tr, dialFunc(backendDialer(topts.dialTimeout(), false).DialContext))
	return tr
}

func (o TransportOptions) dialTimeout() time.Duration {
	if o.DialTimeout == 0 {
		return 10 * time.Second
	}
	return o.DialTimeout
}

// A backend whose machine powers off, or that a partition cuts off, sends no RST: a request in
// flight to it waited until the kernel gave up, ~3 minutes of keepalive probes (30 s idle, 9
// probes 15 s apart) or, with the request not yet acknowledged, ~15 minutes of retransmissions.
// HTTP/2 pings (above) notice it on multiplexed connections; nothing pings an HTTP/1.1 read.
// Probes after 15 s idle, 5 s apart, and a bound on data left unacknowledged (TCP_USER_TIMEOUT,
// which also ends a connection whose probes go unanswered) fail such requests in about 30 s;
// a backend that is slow but alive acknowledges both and is never cut.
var backendKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

const backendUserTimeout = 30 * time.Second

// backendDialer dials a backend with backendKeepAlive, and with userTimeout also
// backendUserTimeout. The bound also ends a connection whose peer, alive, reads nothing of it for
// that long (a zero window): upgraded sessions go without it, as an exec's stdin may rightly wait
// longer for the program in the container to read it.
func backendDialer(timeout time.Duration, userTimeout bool) *net.Dialer {
	d := &net.Dialer{Timeout: timeout, KeepAliveConfig: backendKeepAlive}
	if userTimeout {
		d.Control = func(network, _ string, c syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(backendUserTimeout.Milliseconds()))
			})
			return errors.Join(err, serr)
		}
	}
	return d
}

// upstreamHandshakeTimeout bounds a TLS handshake with a backend. A variable for the tests.
var upstreamHandshakeTimeout = 10 * time.Second

// transportFor picks the connections for a request: identity-forwarding requests must carry
// the front-proxy certificate, and no other request may; then upgrades, watches, writes and
// everything else each have their transport (see pool).
func (b *backend) transportFor(forwardsIdentity bool, a *policy.Attributes) http.RoundTripper {
	p := b.plain
	if forwardsIdentity {
		p = b.identity
	}
	switch {
	case a.Upgrade:
		return p.upgrades
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
	ping := func(p *pool, tr http.RoundTripper) int {
		proto, err := p.ping(ctx, tr, b.url)
		if err != nil {
			log.Debug("warming backend connections", "backend", b.url.String(), "err", err)
			return 0
		}
		opened.Add(1)
		return proto
	}
	for _, p := range pools {
		if watches && p.watchConns != nil {
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
func (p *pool) ping(ctx context.Context, tr http.RoundTripper, u *url.URL) (int, error) {
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

// trackWrite counts a write the fence's policy let through on the active backend, and returns
// that backend; one a switch is leaving counts no more (the write goes to the new one).
func trackWrite(active *atomic.Pointer[backend]) *backend {
	for {
		b := active.Load()
		b.mu.Lock()
		ok := !b.draining
		if ok {
			b.writes++
		}
		b.mu.Unlock()
		if ok {
			return b
		}
	}
}

// untrackWrite ends what trackWrite counted, once the backend answered the write or the
// request ended.
func (b *backend) untrackWrite() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.writes--; b.writes == 0 && b.writesDone != nil {
		close(b.writesDone)
		b.writesDone = nil
	}
}

// awaitWrites waits until b answered the writes trackWrite counted (a drain has begun: no new
// one counts), or ctx ends; it returns how many it waited for, and how many were left.
func (b *backend) awaitWrites(ctx context.Context) (awaited, left int) {
	b.mu.Lock()
	awaited = b.writes
	if awaited == 0 {
		b.mu.Unlock()
		return 0, 0
	}
	if b.writesDone == nil {
		b.writesDone = make(chan struct{})
	}
	done := b.writesDone
	b.mu.Unlock()
	select {
	case <-done:
		return awaited, 0
	case <-ctx.Done():
		b.mu.Lock()
		defer b.mu.Unlock()
		return awaited, b.writes
	}
}

// handOff takes off b a watch that leaves it for the next backend (which may not have answered
// the re-issued watch yet: the switch does not wait for that), and says whether it was on b.
func (b *backend) handOff(s *stream) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.streams[s]
	if ok {
		b.resumed++
	}
	b.remove(s)
	return ok
}

func (b *backend) remove(s *stream) {
	delete(b.streams, s)
	if b.waiting != nil {
		delete(b.waiting, s)
		if len(b.waiting) == 0 {
			close(b.waitDone)
			b.waiting, b.waitDone = nil, nil
		}
	}
}

// drain ends every long-running request on b: a watch ends cleanly at its next event boundary
// (clients see a normal end of watch and reconnect, to the new backend), or, when resumeOn is
// given, goes on at its next event boundary as the same watch re-issued to resumeOn from the
// last resourceVersion it delivered (watchresume.go: drain returns once it has left b; it asks
// resumeOn once lifted, the fence's next opening, is closed); an upgraded stream, or a watch
// still open at the timeout, is cut.
//
// Moving watches, those idle at a boundary (most) are parked, taken off b by the drain itself
// when they can be (takeOff: the drain then need not wait for them), and woken all at once by
// closing b's watch connections, once the others have left b: one in the middle of an event
// finishes it first (its head reached the client; the connection must not be cut under it).
func (b *backend) drain(timeout time.Duration, resumeOn *backend, lifted <-chan struct{}) admin.Drain {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	all, drained := b.beginDrain(lifted)
	defer close(drained)
	// A write the policy let through and b not yet answered could be acknowledged by b after
	// the switch; what the caller does next (a cutover reads blue's last revision) must come
	// after it. Waited for beside the streams, on a timeout of its own.
	var res admin.Drain
	writesAwaited := make(chan struct{})
	go func() {
		wctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		res.Writes, res.UnansweredWrites = b.awaitWrites(wctx)
		close(writesAwaited)
	}()
	park := resumeOn != nil && b.plain.watchConns != nil
	var parked, others []*stream
	for _, s := range all {
		if b.ask(s, resumeOn, park) {
			parked = append(parked, s)
		} else {
			others = append(others, s)
		}
	}
	res.Streams = len(all)
	last := all
	if len(parked) > 0 {
		res.Forced += b.awaitLeft(ctx, others) // those it cut are not waited for again
		b.woken.Add(int64(b.closeWatchConns(parked)))
		last = parked
		if ctx.Err() != nil {
			// A watch that used the timeout up is no reason to cut the parked ones: woken,
			// they need only leave.
			var cancelNew context.CancelFunc
			ctx, cancelNew = context.WithTimeout(context.Background(), min(timeout, parkedGrace))
			defer cancelNew()
		}
	}
	res.Forced += b.awaitLeft(ctx, last)
	b.closeIdle()
	b.mu.Lock()
	res.Resumed = b.resumed
	b.mu.Unlock()
	res.Ended = res.Streams - res.Resumed
	<-writesAwaited
	res.Duration = admin.Duration(time.Since(start))
	return res
}

// parkedGrace is how long the watches a drain parked have to leave once woken, when the watches
// it waited for first used the drain's timeout up.
const parkedGrace = 5 * time.Second

// beginDrain marks b as being switched away from and returns the streams open on it, and the
// channel to close when the drain has ended.
func (b *backend) beginDrain(lifted <-chan struct{}) ([]*stream, chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.draining { // a backend is drained once, when a switch leaves it; a second is a no-op here
		close(b.leaving)
	}
	b.draining = true
	b.drained = make(chan struct{})
	b.lifted = lifted
	return b.listLocked(), b.drained
}

// listLocked is the streams open on b, with b.mu held.
func (b *backend) listLocked() []*stream {
	all := make([]*stream, 0, len(b.streams))
	for s := range b.streams {
		all = append(all, s)
	}
	return all
}

// list is the streams open on b; the caller may then take each one's locks (never b.mu after
// them: the proxy takes a watch's lock before its backend's).
func (b *backend) list() []*stream {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.listLocked()
}

// ask asks one stream to leave b (see drain), and returns true when it parked.
func (b *backend) ask(s *stream, resumeOn *backend, park bool) bool {
	s.mu.Lock()
	body := s.body
	s.mu.Unlock()
	if body == nil {
		s.cancel()
		return false
	}
	var d departure
	if resumeOn != nil {
		d = body.moveTo(resumeOn, park)
	} else {
		d = body.endAtBoundary()
	}
	switch d {
	case departCut:
		s.cancel()
	case departGone:
		b.untrack(s) // a no-op when moveTo took it off (takeOff), counted resumed
	}
	return d == departParked
}

// awaitLeft waits until none of ss is open on b any more. When ctx ends first, it cuts those
// still open and returns how many.
func (b *backend) awaitLeft(ctx context.Context, ss []*stream) int {
	b.mu.Lock()
	waiting := map[*stream]struct{}{}
	for _, s := range ss {
		if _, ok := b.streams[s]; ok {
			waiting[s] = struct{}{}
		}
	}
	if len(waiting) == 0 {
		b.mu.Unlock()
		return 0
	}
	done := make(chan struct{})
	b.waiting, b.waitDone = waiting, done
	b.mu.Unlock()
	select {
	case <-done:
		return 0
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	forced := len(b.waiting)
	for s := range b.waiting {
		s.cancel()
	}
	b.waiting, b.waitDone = nil, nil
	return forced
}

// closeWatchConns closes b's watch connections, and returns how many of parked were still open
// on b then (woken by it).
func (b *backend) closeWatchConns(parked []*stream) int {
	b.mu.Lock()
	n := 0
	for _, s := range parked {
		if _, ok := b.streams[s]; ok {
			n++
		}
	}
	b.mu.Unlock()
	for _, p := range []*pool{b.plain, b.identity} {
		if p != nil && p.watchConns != nil {
			p.watchConns.closeAll()
		}
	}
	return n
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
