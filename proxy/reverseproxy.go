package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

// newReverseProxy is the innermost handler: it forwards to the backend withBackend chose, with
// the identity withAuthentication found (as names' headers), and observes each round trip's
// time in upstreamDuration. Every backend failure is answered by upstreamError.
func newReverseProxy(names RequestHeaderNames, upstreamDuration prometheus.Observer, log *slog.Logger) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			st := reqStateFrom(pr.In.Context())
			pr.SetURL(st.backend.url)
			pr.SetXForwarded()
			if st.identity != nil {
				names.setIdentityHeaders(pr.Out.Header, st.identity)
			}
			// Go's HTTP/1.1 transport takes a request with either header (and a GetBody, which
			// writes have) for idempotent and sends it again when a reused connection closes
			// after the backend read it: a write could be applied twice. kube-apiserver
			// ignores both.
			delete(pr.Out.Header, "Idempotency-Key")
			delete(pr.Out.Header, "X-Idempotency-Key")
			// An upgrade's backend connection is never used again (pool.upgrades), without
			// marking the request to close: net/http would send "Connection: close" ahead of
			// its "Connection: Upgrade".
		},
		Transport: roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			start := time.Now()
			st := reqStateFrom(req.Context())
			resp, err := st.backend.transportFor(st.identity != nil, &st.attrs).RoundTrip(req)
			upstreamDuration.Observe(time.Since(start).Seconds())
			return resp, err
		}),
		ModifyResponse: modifyResponse(log),
		ErrorHandler:   upstreamError(log),
		BufferPool:     bufferPool{},
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// modifyResponse ends a write's in-flight registration once the backend answered it, closes the
// client connection after a refused upgrade, and wraps the body of a watch so that a backend
// switch can end it at an event boundary, or resume it on the new backend (watchresume.go).
func modifyResponse(log *slog.Logger) func(*http.Response) error {
	return func(resp *http.Response) error {
		st := reqStateFrom(resp.Request.Context())
		if st.answeredBy != nil {
			st.answeredBy() // the backend answered the write: it is done there, whoever reads it
		}
		switch {
		case st.attrs.Upgrade && resp.StatusCode != http.StatusSwitchingProtocols:
			// A refused upgrade: answer it, then close the client connection too.
			resp.Header.Set("Connection", "close")
		case st.stream != nil && st.attrs.Verb == "watch" && resp.StatusCode == http.StatusOK:
			wb := newWatchBody(resp.Body, st.stream.cancel, streamFraming(resp.Header))
			if wb.fr != framingUnknown {
				wb.enableResume(&resumeInfo{req: resp.Request, identity: st.identity != nil, verified: st.stillVerified, contentType: resp.Header.Get("Content-Type"), started: time.Now(), s: st.stream, on: st.backend, log: log})
			}
			st.stream.mu.Lock()
			st.stream.body = wb
			st.stream.mu.Unlock()
			resp.Body = wb
		}
		return nil
	}
}

// upstreamError turns every backend failure into a Kubernetes Status in one place: 499 when the
// client went away, 504 on a timeout, 502 otherwise. A request that never left (the dial failed)
// carries Retry-After, so client-go retries it; one that may have reached the backend does not,
// so a write is never applied twice by our doing. Clients, unauthenticated ones included, are
// told what happened, not where: the backend's address and the transport's error (green's
// internal address, certificate details) go to the log, with the path but not the query.
func upstreamError(log *slog.Logger) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		st := reqStateFrom(r.Context())
		st.answered = decisionBackendFailed
		backendURL := st.backend.url.String()
		if errors.Is(context.Cause(r.Context()), errSwitchedAway) {
			// A watch or upgrade the switch cut before its backend answered: nothing to resume
			// from, and its client is still there.
			writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "kubefence: the proxy switched backends before the backend apiserver answered; send the request again", 1)
			return
		}
		if st.bodyTimedOut.Load() {
			// A read whose client stopped sending its body (boundReadBody): the proxy ended it.
			st.answered = decisionRejected
			closeHTTP1(w, r)
			writeStatus(w, http.StatusRequestTimeout, "Timeout", "kubefence: the request body did not arrive within --write-body-timeout", 0)
			return
		}
		if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
			log.Debug("client went away before the backend answered", "path", r.URL.Path, "backend", backendURL)
			st.answered = decisionForwarded // it reached the backend, which may have acted on it
			w.WriteHeader(499)
			return
		}
		unsent := tlsutil.NotSent(err, false) // a backend connection carries many requests
		var ne net.Error
		if !unsent && (errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())) {
			log.Warn("backend timed out", "backend", backendURL, "path", r.URL.Path, "err", err)
			writeStatus(w, http.StatusGatewayTimeout, "Timeout", "kubefence: the backend apiserver timed out", 0)
			return
		}
		retry := 0
		if unsent {
			retry = 1
		}
		log.Warn("backend unreachable", "backend", backendURL, "path", r.URL.Path, "err", err)
		writeStatus(w, http.StatusBadGateway, "ServiceUnavailable", "kubefence: the backend apiserver is unreachable (the proxy's log says why)", retry)
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// bufferPool recycles ReverseProxy's copy buffers (32 KB each) instead of allocating one per
// response.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
