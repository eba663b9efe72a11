package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// backend is one upstream apiserver: its URL, its connection pool, and the long-running
// requests (watches, upgraded streams) open on it, which a switch drains.
type backend struct {
	url       *url.URL
	caFile    string
	transport *http.Transport

	mu       sync.Mutex
	draining bool
	streams  map[*stream]struct{}
	idle     chan struct{} // closed when streams becomes empty while draining
}

// TransportOptions shape the connection pool to every backend.
type TransportOptions struct {
	// ClientCert is presented to the backend (front-proxy identity, when configured).
	ClientCert *tls.Certificate
	// MaxIdleConnsPerHost bounds the keep-alive pool.
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
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read backend CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("backend CA file %s holds no PEM certificate", caFile)
		}
		tlsConfig.RootCAs = pool
	}
	if topts.ClientCert != nil {
		cert := topts.ClientCert
		tlsConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
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
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   idle,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     false,
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableCompression:    true, // pass the client's Accept-Encoding and the backend's encoding through
	}
	return &backend{url: u, caFile: caFile, transport: t, streams: map[*stream]struct{}{}}, nil
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
	delete(b.streams, s)
	if len(b.streams) == 0 && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
}

// drain ends every long-running request on b: a watch ends cleanly at its next event boundary
// (clients see a normal end of watch and reconnect, to the new backend); an upgraded stream, or
// a watch still open at the timeout, is cut.
func (b *backend) drain(timeout time.Duration) admin.Drain {
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
		if body == nil || !body.endAtBoundary() {
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
	b.transport.CloseIdleConnections()
	res.Duration = admin.Duration(time.Since(start))
	return res
}

func (b *backend) openStreams() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.streams)
}
