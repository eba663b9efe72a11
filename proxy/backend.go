package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"

	"github.com/kubefence/kubefence/internal/tlsutil"
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
	plain, identity *http.Transport

	mu       sync.Mutex
	draining bool
	streams  map[*stream]struct{}
	idle     chan struct{} // closed when streams becomes empty while draining
	resumed  int           // watches handed off to the next backend while draining
}

// TransportOptions shape the connection pools to every backend.
type TransportOptions struct {
	// FrontProxyCert is presented to the backend on requests that carry a forwarded identity.
	FrontProxyCert *tls.Certificate
	// MaxIdleConnsPerHost bounds each keep-alive pool.
	MaxIdleConnsPerHost int
	DialTimeout         time.Duration
}

func newBackend(rawURL, caFile string, topts TransportOptions) (*backend, error) {
	u, err := parseBackendURL(rawURL)
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
	b := &backend{url: u, caFile: caFile, streams: map[*stream]struct{}{}}
	b.plain = newTransport(tlsConfig, topts)
	if topts.FrontProxyCert != nil {
		idConfig := tlsConfig.Clone()
		cert := topts.FrontProxyCert
		idConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		b.identity = newTransport(idConfig, topts)
	}
	return b, nil
}

func newTransport(tlsConfig *tls.Config, topts TransportOptions) *http.Transport {
	dialTimeout := topts.DialTimeout
	if dialTimeout == 0 {
		dialTimeout = 10 * time.Second
	}
	idle := topts.MaxIdleConnsPerHost
	if idle == 0 {
		idle = 512
	}
	// HTTP/1.1 keep-alive pools: upgrades (SPDY, WebSocket) need HTTP/1.1 anyway, and one TCP
	// connection per concurrent request spreads load better than one multiplexed HTTP/2 connection.
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConnsPerHost:   idle,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableCompression:    true, // pass the client's Accept-Encoding and the backend's encoding through
	}
}

// transportFor picks the pool for a request: identity-forwarding requests must carry the
// front-proxy certificate, and no other request may.
func (b *backend) transportFor(forwardsIdentity bool) *http.Transport {
	if forwardsIdentity {
		return b.identity
	}
	return b.plain
}

func (b *backend) closeIdle() {
	b.plain.CloseIdleConnections()
	if b.identity != nil {
		b.identity.CloseIdleConnections()
	}
}

func parseBackendURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("backend URL %q: %w", raw, err)
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return nil, fmt.Errorf("backend URL %q: scheme must be https (or http for tests)", raw)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("backend URL %q has no host", raw)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" {
		return nil, fmt.Errorf("backend URL %q: give scheme and host only, no path or query", raw)
	}
	u.Path = ""
	return u, nil
}

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

// handOff takes off b a watch that now streams from the next backend.
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
// last resourceVersion it delivered (watchresume.go); an upgraded stream, or a watch still open
// at the timeout, is cut.
func (b *backend) drain(timeout time.Duration, resumeOn *backend) admin.Drain {
	start := time.Now()
	b.mu.Lock()
	b.draining = true
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

func (b *backend) openStreams() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.streams)
}
