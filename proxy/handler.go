package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/kubefence/kubefence/policy"
)

// reqState is what the filters learn about one request; it rides in the request context.
type reqState struct {
	attrs   policy.Attributes
	backend *backend
	stream  *stream // for watches and upgrades
	writeID uint64  // the request's registration as an in-flight write, or 0
	refused bool
	// identity is the client-certificate user the proxy forwards, or nil.
	identity user.Info
}

type reqStateKey struct{}

func withReqState(ctx context.Context, st *reqState) context.Context {
	return context.WithValue(ctx, reqStateKey{}, st)
}

func reqStateFrom(ctx context.Context) *reqState {
	st, _ := ctx.Value(reqStateKey{}).(*reqState)
	return st
}

// buildHandler assembles the request path once, innermost first, so that reading it bottom-up
// is the order a request goes through.
func (s *Server) buildHandler() http.Handler {
	var h http.Handler = s.reverseProxy()
	h = s.withBackend(h)
	h = withIdentityHeaders(h, s.headerNames.stripList())
	h = s.withFence(h)
	h = s.withAccounting(h)
	h = s.withConfirmedBackend(h)
	h = s.withAuthentication(h)
	h = s.withAttributes(h)
	h = withChunkedRequestClose(h)
	h = s.withRecover(h)
	return h
}

// withChunkedRequestClose closes the client connection after answering a request framed by
// Transfer-Encoding. Go's server frames such a request by Transfer-Encoding alone and drops any
// Content-Length beside it (so the forwarded request is unambiguous), but keeps the connection:
// RFC 9112 §6.1 asks a server that saw both to close it, and once Go has dropped the
// Content-Length the two cases cannot be told apart. Kubernetes clients send bodies with a
// Content-Length, so this costs a reconnect only to the rare chunked uploader.
func withChunkedRequestClose(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 && r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// withRecover turns a panic in the request path into a 500 Status and a log line; the proxy
// keeps serving. http.ErrAbortHandler, the way to abort a response, passes through.
func (s *Server) withRecover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic serving request", "method", r.Method, "path", r.URL.Path, "panic", v)
				writeStatus(w, http.StatusInternalServerError, "InternalError", "kubefence: internal error serving this request", 0)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// withAttributes classifies the request from its line and headers.
func (s *Server) withAttributes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := &reqState{attrs: s.classifier.Classify(r)}
		next.ServeHTTP(w, r.WithContext(withReqState(r.Context(), st)))
	})
}

// withConfirmedBackend answers 503 + Retry-After to everything while the backend is unconfirmed
// (the state file was unreadable at start-up): failing closed means serving no reads either
// from a backend the proxy cannot know was the right one.
func (s *Server) withConfirmedBackend(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.unconfirmed.Load() {
			writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable",
				"kubefence: the proxy's state file was unreadable at start-up, so it does not know which apiserver to use; "+
					"an operator must run 'kubefence backend set URL'", s.cfg.opts.RetryAfter)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withAccounting counts every request by class, decision and status code.
func (s *Server) withAccounting(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := reqStateFrom(r.Context())
		rw := &statusWriter{ResponseWriter: w, buffered: !streaming(&st.attrs, r)}
		watch := st.attrs.Verb == "watch"
		if watch {
			s.openWatches.Add(1)
		}
		defer func() {
			if watch {
				s.openWatches.Add(-1)
			}
			decision := "forwarded"
			if st.refused {
				decision = "refused"
			}
			code := rw.code
			if code == 0 {
				code = http.StatusOK
			}
			s.metrics.requests.WithLabelValues(st.attrs.Class().String(), decision, statusText(code)).Inc()
		}()
		next.ServeHTTP(rw, r)
	})
}

// withFence refuses what the policy refuses while the fence is on, and registers the writes it
// admits while open so that 'fence on' can wait for them. It decides before forwarding: a
// refused request is never sent anywhere (invariant refused-never-forwarded, docs/invariants.md). A write's body is read whole first
// (see writebody.go).
func (s *Server) withFence(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := reqStateFrom(r.Context())
		a := &st.attrs
		if a.Class() != policy.Write {
			if !s.gate.fenced.Load() {
				next.ServeHTTP(w, r)
				return
			}
			s.decide(w, r, st, next)
			return
		}
		if sessionWrite(a) {
			if s.gate.admitSession() {
				next.ServeHTTP(w, r)
				return
			}
			s.decide(w, r, st, next)
			return
		}
		body, err := readWriteBody(w, r, s.cfg.opts.MaxWriteBodyBytes, s.cfg.opts.WriteBodyTimeout)
		if err != nil {
			s.answerBodyError(w, r, err)
			return
		}
		if a.BodyDecidesDryRun() {
			a.DryRun = policy.DeleteOptionsDryRun(r.Header.Get("Content-Type"), body)
		}
		id, ok := s.gate.admitWrite(inflightWrite{attrs: a, userAgent: r.UserAgent(), start: time.Now()})
		if !ok {
			s.decide(w, r, st, next)
			return
		}
		st.writeID = id
		defer s.gate.inflight.remove(id)
		// From here the write's fate on the backend does not depend on the client: a client that
		// goes away must not end the registration before the backend has answered (invariant barrier).
		next.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
	})
}

// decide applies the policy to a request that arrived while fenced.
func (s *Server) decide(w http.ResponseWriter, r *http.Request, st *reqState, next http.Handler) {
	d := s.policy.Decide(&st.attrs)
	if !d.Allow {
		s.refuse(w, r, st, d)
		return
	}
	next.ServeHTTP(w, r)
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, st *reqState, d policy.Decision) {
	st.refused = true
	s.metrics.refusedWrites.Inc()
	s.refusedTotal.Add(1)
	a := &st.attrs
	s.log.Info("refused write: fence is on", "verb", a.Verb, "resource", resourceString(a), "namespace", a.Namespace,
		"name", a.Name, "user", a.User, "userAgent", r.UserAgent(), "why", d.Reason)
	body := *s.refusal.Load()
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Retry-After"] = []string{s.retryAfterValue}
	h["Cache-Control"] = []string{"no-store"}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
}

// withIdentityHeaders removes client-supplied identity headers, matching names case-insensitively
// (a name ending in "-" is a prefix). The apiserver trusts them only from its front proxy; a
// client must never choose them, with or without a certificate.
func withIdentityHeaders(next http.Handler, names []string) http.Handler {
	exact := map[string]bool{}
	var prefixes []string
	for _, n := range names {
		c := http.CanonicalHeaderKey(n)
		if strings.HasSuffix(n, "-") {
			prefixes = append(prefixes, strings.ToLower(n))
		} else {
			exact[c] = true
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k := range r.Header {
			if exact[k] {
				delete(r.Header, k)
				continue
			}
			for _, p := range prefixes {
				if len(k) >= len(p) && strings.EqualFold(k[:len(p)], p) {
					delete(r.Header, k)
					break
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// withBackend picks the active backend for the request and, for a watch or an upgrade,
// registers it so that a backend switch can end it.
func (s *Server) withBackend(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := reqStateFrom(r.Context())
		if st.attrs.Verb != "watch" && !st.attrs.Upgrade {
			st.backend = s.active.Load()
			next.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		st.stream = &stream{cancel: cancel}
		for {
			b := s.active.Load()
			if err := b.track(st.stream); err != nil {
				continue // switched away just now: the next load sees the new backend
			}
			st.backend = b
			defer b.untrack(st.stream)
			break
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func (s *Server) reverseProxy() http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			st := reqStateFrom(pr.In.Context())
			pr.SetURL(st.backend.url)
			pr.SetXForwarded()
			if st.identity != nil {
				s.headerNames.setIdentityHeaders(pr.Out.Header, st.identity)
			}
			if st.attrs.Upgrade {
				// Never reuse a backend connection that was asked to upgrade: if the answer is not
				// 101, nothing of it may carry another request (CVE-2018-1002105).
				pr.Out.Close = true
			}
		},
		Transport: roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			start := time.Now()
			st := reqStateFrom(req.Context())
			resp, err := st.backend.transportFor(st.identity != nil).RoundTrip(req)
			s.metrics.upstreamDuration.Observe(time.Since(start).Seconds())
			return resp, err
		}),
		ModifyResponse: func(resp *http.Response) error {
			st := reqStateFrom(resp.Request.Context())
			switch {
			case st.attrs.Upgrade && resp.StatusCode != http.StatusSwitchingProtocols:
				// A refused upgrade: answer it, then close the client connection too.
				resp.Header.Set("Connection", "close")
			case st.stream != nil && st.attrs.Verb == "watch" && resp.StatusCode == http.StatusOK:
				wb := newWatchBody(resp.Body, st.stream.cancel, watchFraming(resp.Header.Get("Content-Type")))
				st.stream.mu.Lock()
				st.stream.body = wb
				st.stream.mu.Unlock()
				resp.Body = wb
			}
			return nil
		},
		ErrorHandler: s.upstreamError,
		BufferPool:   bufferPool{},
		ErrorLog:     slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// upstreamError turns every backend failure into a Kubernetes Status in one place: 499 when the
// client went away, 504 on a timeout, 502 otherwise. A request that never left (the dial failed)
// carries Retry-After, so client-go retries it; one that may have reached the backend does not,
// so a write is never applied twice by our doing.
func (s *Server) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	st := reqStateFrom(r.Context())
	backendURL := st.backend.url.String()
	if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
		s.log.Debug("client went away before the backend answered", "path", r.URL.Path, "backend", backendURL)
		w.WriteHeader(499)
		return
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		s.log.Warn("backend timed out", "backend", backendURL, "path", r.URL.Path, "err", err)
		writeStatus(w, http.StatusGatewayTimeout, "Timeout", "kubefence: the backend apiserver "+backendURL+" timed out", 0)
		return
	}
	retry := 0
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		retry = 1
	}
	s.log.Warn("backend unreachable", "backend", backendURL, "path", r.URL.Path, "err", err)
	writeStatus(w, http.StatusBadGateway, "ServiceUnavailable", "kubefence: the backend apiserver "+backendURL+" is unreachable: "+err.Error(), retry)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// statusWriter records the status code; Unwrap lets http.ResponseController reach Flush and
// Hijack on the underlying writer (watches and upgrades need both).
type statusWriter struct {
	http.ResponseWriter
	code int
	// buffered responses skip ReverseProxy's per-write flushes (it flushes every write of a
	// response without Content-Length, which is most apiserver lists): the server's buffer is
	// written when full and at the end, saving a syscall and a TLS record per 4 KB.
	buffered bool
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// FlushError flushes streaming responses (watches, logs, upgrades) at once and defers the
// flushes of buffered ones to the end of the response.
func (w *statusWriter) FlushError() error {
	if w.buffered {
		return nil
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for callers that look for http.Flusher.
func (w *statusWriter) Flush() { _ = w.FlushError() }

// streaming reports requests whose response must reach the client as it is produced.
func streaming(a *policy.Attributes, r *http.Request) bool {
	if a.Verb == "watch" || a.Upgrade || a.Unknown != "" {
		return true
	}
	switch a.Subresource {
	case "log", "proxy", "exec", "attach", "portforward":
		return true
	}
	if !a.IsResourceRequest || (a.Verb != "get" && a.Verb != "list") {
		// Non-resource paths and writes are rare and short; keep the proxy's default behaviour.
		return true
	}
	return r.URL.RawQuery != "" && strings.Contains(r.URL.RawQuery, "watch")
}

func resourceString(a *policy.Attributes) string {
	if !a.IsResourceRequest {
		return a.Path
	}
	r := a.Resource
	if a.APIGroup != "" {
		r += "." + a.APIGroup
	}
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	return r
}

var statusTexts = func() map[int]string {
	m := map[int]string{}
	for c := 100; c < 600; c++ {
		m[c] = strconv.Itoa(c)
	}
	return m
}()

func statusText(code int) string {
	if s, ok := statusTexts[code]; ok {
		return s
	}
	return strconv.Itoa(code)
}

// bufferPool recycles ReverseProxy's copy buffers (32 KB each) instead of allocating one per
// response.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
