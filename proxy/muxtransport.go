package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
)

// muxTransport carries a backend's writes, or its watches, over HTTP/2, many to a connection,
// and dials a new connection only when the open ones are full, one at a time
// (http.Transport.MaxConnsPerHost of 1: for HTTP/2 it bounds the connections being dialled,
// not those open). Without that bound, every request that found no connection with room
// dialled its own and, once the first was up, closed it again after its TLS handshake: 5,000
// watches moved by a switch made ~780 handshakes with the new apiserver, when it has most to
// do, for ~20 connections kept.
//
// Over HTTP/1.1 the bound would make requests wait for one another, a watch for as long as it
// runs: to a backend without TLS (HTTP/2 is negotiated in the TLS handshake), or one that does
// not negotiate HTTP/2, requests go over h1, a transport of HTTP/1.1 connections. The first
// dial that finds out that a backend does not negotiate it fails (its handshake ends with a
// bad_certificate alert, which the backend may log or count; nothing was sent), and the
// requests that got that error are sent over h1.
type muxTransport struct {
	h2, h1 *http.Transport
	noH2   atomic.Bool // the backend did not negotiate HTTP/2: every request goes over h1
}

// errNoHTTP2 fails a dial of muxTransport.h2 to a backend that did not negotiate HTTP/2.
var errNoHTTP2 = errors.New("the backend did not negotiate HTTP/2")

// newMuxTransport makes a muxTransport of h2 (an HTTP/2 transport, changed here) and h1.
func newMuxTransport(h2, h1 *http.Transport) *muxTransport {
	m := &muxTransport{h2: h2, h1: h1}
	h2.MaxConnsPerHost = 1
	dial := h2.DialContext
	h2.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if m.noH2.Load() {
			return nil, errNoHTTP2 // the dials queued behind the one that found out
		}
		return dial(ctx, network, addr)
	}
	verify := h2.TLSClientConfig.VerifyConnection
	h2.TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		if cs.NegotiatedProtocol != "h2" {
			m.noH2.Store(true)
			return errNoHTTP2
		}
		return nil
	}
	return m
}

func (m *muxTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" || m.noH2.Load() {
		return m.h1.RoundTrip(req)
	}
	resp, err := m.h2.RoundTrip(req)
	if !errors.Is(err, errNoHTTP2) {
		return resp, err
	}
	if req.Body != nil && req.Body != http.NoBody {
		// The failed attempt closed the body; nothing of it was sent.
		if req.GetBody == nil {
			return nil, fmt.Errorf("request with a body not sent: %w", err)
		}
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, errors.Join(err, gerr)
		}
		req = req.Clone(req.Context())
		req.Body = body
	}
	return m.h1.RoundTrip(req)
}

func (m *muxTransport) CloseIdleConnections() {
	m.h2.CloseIdleConnections()
	m.h1.CloseIdleConnections()
}
