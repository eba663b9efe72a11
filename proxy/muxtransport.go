package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

// muxTransport carries a backend's writes, or its watches, over HTTP/2, many to a connection,
// and dials a new connection only when the open ones are full, one at a time
// (http.Transport.MaxConnsPerHost of 1: for HTTP/2 it bounds the connections being dialled,
// not those open). Without that bound, every request that found no connection with room
// dialled its own and, once the first was up, closed it again after its TLS handshake: 5,000
// watches moved by a switch made ~780 handshakes with the new apiserver, when it has most to
// do, for the 50 connections kept (kube-apiserver takes 100 streams a connection by default).
//
// Over HTTP/1.1 the bound would make requests wait for one another, a watch for as long as it
// runs: to a backend without TLS (HTTP/2 is negotiated in the TLS handshake), or one that does
// not negotiate HTTP/2, requests go over h1, a transport of HTTP/1.1 connections. The first
// dial that finds out that a backend does not negotiate it fails (its handshake ends with a
// bad_certificate alert, which the backend may log or count; nothing was sent), and the
// requests that got that error are sent over h1.
type muxTransport struct {
	h2, h1 *http.Transport
	noH2   atomic.Bool                 // the backend did not negotiate HTTP/2: every request goes over h1
	failed atomic.Pointer[dialFailure] // h2's last failed dial
}

type dialFailure struct {
	at  time.Time
	err error
}

// failedDialShare: a dial of h2 started this soon after one failed fails at once with its error.
// Dialling one at a time, each request queued behind a dial to a backend that does not answer
// would otherwise wait for the ones before it to time out, one after the other.
const failedDialShare = time.Second

// errNoHTTP2 fails a dial of muxTransport.h2 to a backend that did not negotiate HTTP/2.
var errNoHTTP2 = errors.New("the backend did not negotiate HTTP/2")

// newMuxTransport makes a muxTransport of h2 (an HTTP/2 transport, changed here) and h1.
func newMuxTransport(h2, h1 *http.Transport) *muxTransport {
	m := &muxTransport{h2: h2, h1: h1}
	h2.MaxConnsPerHost = 1
	// net/http counts the HTTP/2 connection it keeps in its idle list against MaxConnsPerHost,
	// and drops that entry from the list once it is older than IdleConnTimeout (counted from its
	// dial, however busy the connection): racing a request that found the connection full, the
	// entry can leave the list without its count, and no new connection is ever dialled again.
	// Without the timeout nothing drops it but a request that finds no room (which lowers the
	// count, and dials) or closing the transport's idle connections (backend.closeIdle, on a
	// backend the proxy no longer uses).
	h2.IdleConnTimeout = 0
	// The handshake is part of the dial here, so that a backend that takes connections but
	// never finishes a handshake fails the dials queued behind it at once too.
	h2.DialTLSContext = m.dialer(m.handshaker(coalesced(h2.DialContext)))
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

// handshaker dials with dial and makes the TLS handshake with h2's configuration (which
// net/http gives HTTP/2's protocol names on first use), within h2's TLSHandshakeTimeout; a
// failed handshake is a dial's error (upstreamError then tells the client to retry).
func (m *muxTransport) handshaker(dial dialFunc) dialFunc {
	return tlsutil.HandshakeDialer(dial, func() *tls.Config { return m.h2.TLSClientConfig }, m.h2.TLSHandshakeTimeout)
}

// dialer wraps h2's dial (with its handshake): the dials queued behind the one that found
// HTTP/2 not negotiated, or behind one that failed just now, fail at once.
func (m *muxTransport) dialer(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if m.noH2.Load() {
			return nil, errNoHTTP2
		}
		if f := m.failed.Load(); f != nil && time.Since(f.at) < failedDialShare {
			return nil, f.err
		}
		c, err := dial(ctx, network, addr)
		if err != nil && ctx.Err() == nil { // not a dial net/http called off (CloseIdleConnections)
			m.failed.Store(&dialFailure{at: time.Now(), err: err})
		}
		return c, err
	}
}

func (m *muxTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" || m.noH2.Load() {
		return m.h1.RoundTrip(req)
	}
	out, hasBody := req, req.Body != nil && req.Body != http.NoBody
	if hasBody && req.GetBody == nil {
		out = req.Clone(req.Context())
		out.Body = &heldBody{ReadCloser: req.Body}
	}
	resp, err := m.h2.RoundTrip(out)
	if !errors.Is(err, errNoHTTP2) {
		return resp, err
	}
	if hasBody && req.GetBody != nil {
		// The failed attempt closed the body; nothing of it was sent.
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, errors.Join(err, gerr)
		}
		req = req.Clone(req.Context())
		req.Body = body
	}
	return m.h1.RoundTrip(req)
}

// heldBody is a request body that only a read makes closable: an HTTP/2 attempt that fails at
// its dial closes the body it was given without reading it, and the body must still go over
// HTTP/1.1 whole. Once read from, closing it closes the body, which is what unblocks an attempt
// waiting on a client that stalls in the middle of its body.
type heldBody struct {
	io.ReadCloser
	read atomic.Bool
}

func (b *heldBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.ReadCloser.Read(p)
}

func (b *heldBody) Close() error {
	if !b.read.Load() {
		return nil
	}
	return b.ReadCloser.Close()
}

func (m *muxTransport) CloseIdleConnections() {
	m.h2.CloseIdleConnections()
	m.h1.CloseIdleConnections()
}
