package proxy

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefence/kubefence/policy"
)

// The filters of the request path other than the fence (fencefilter.go) and authentication
// (authn.go), outermost first. Each is withX(next, deps…) and reads nothing but its parameters
// and the request; buildHandler (chain.go) puts them in order.

// withRecover turns a panic in the request path into a 500 Status and a log line; the proxy
// keeps serving. http.ErrAbortHandler, the way to abort a response, passes through.
func withRecover(next http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.Error("panic serving request", "method", r.Method, "path", r.URL.Path, "panic", v)
				writeStatus(w, http.StatusInternalServerError, "InternalError", "kubefence: internal error serving this request", 0)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// withChunkedRequestClose closes the client connection after answering a request framed by
// Transfer-Encoding. Go's server frames such a request by Transfer-Encoding alone and drops any
// Content-Length beside it (so the forwarded request is unambiguous), but keeps the connection:
// RFC 9112 §6.1 asks a server that saw both to close it, and once Go has dropped the
// Content-Length the two cases cannot be told apart. Kubernetes clients send bodies with a
// Content-Length, so this costs a reconnect only to the rare chunked uploader.
func withChunkedRequestClose(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 {
			closeHTTP1(w, r)
		}
		next.ServeHTTP(w, r)
	})
}

// withAttributes classifies the request from its line and headers, and starts its reqState.
func withAttributes(next http.Handler, classifier *policy.Classifier) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := &reqState{attrs: classifier.Classify(r)}
		next.ServeHTTP(w, r.WithContext(withReqState(r.Context(), st)))
	})
}

// withConfirmedBackend answers 503 + Retry-After to everything while unconfirmed is set (the
// state file was unusable at start-up): failing closed means serving no reads either from a
// backend the proxy cannot know was the right one (invariant persist-then-ack).
func withConfirmedBackend(next http.Handler, unconfirmed *atomic.Bool, retryAfter int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if unconfirmed.Load() {
			reqStateFrom(r.Context()).answered = decisionUnavailable
			writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable",
				"kubefence: the proxy's state file was unusable at start-up, so it does not know which apiserver to use; "+
					"an operator must run 'kubefence backend set URL'", retryAfter)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withAccounting counts every request in requests by class, decision and status code, and
// the open watches in openWatches.
func withAccounting(next http.Handler, requests *prometheus.CounterVec, openWatches *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := reqStateFrom(r.Context())
		rw := &statusWriter{ResponseWriter: w, buffered: !streaming(&st.attrs, r)}
		watch := st.attrs.Verb == "watch"
		if watch {
			openWatches.Add(1)
		}
		defer func() {
			if watch {
				openWatches.Add(-1)
			}
			decision := cmp.Or(st.answered, decisionForwarded)
			code := rw.code
			if code == 0 {
				code = http.StatusOK
			}
			requests.WithLabelValues(st.attrs.Class().String(), decision, statusText(code)).Inc()
		}()
		next.ServeHTTP(rw, r)
	})
}

// withIdentityHeaders removes client-supplied identity headers, matching names and prefixes
// case-insensitively. The apiserver trusts them only from its front proxy; a client must never
// choose them, with or without a certificate.
func withIdentityHeaders(next http.Handler, strip stripNames) http.Handler {
	exact := map[string]bool{}
	for _, n := range strip.names {
		exact[http.CanonicalHeaderKey(n)] = true // the server canonicalizes what clients send
	}
	var prefixes []string
	for _, p := range strip.prefixes {
		if p != "" {
			prefixes = append(prefixes, p)
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
func withBackend(next http.Handler, active *atomic.Pointer[backend]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := reqStateFrom(r.Context())
		switch {
		case st.letThrough:
			// A write the policy let through is a write whatever its headers: Upgrade ones on
			// a stored object make no session (sessions take another way through withFence, and
			// are never marked so). Counted on its backend until answered (a switch waits).
			st.backend = trackWrite(active)
			st.answeredBy = sync.OnceFunc(st.backend.untrackWrite)
			defer st.answeredBy()
			next.ServeHTTP(w, r)
			return
		case st.attrs.Verb != "watch" && !st.attrs.Upgrade:
			st.backend = active.Load()
			next.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		st.stream = &stream{cancel: func() { cancel(errSwitchedAway) }}
		for {
			b := active.Load()
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

var statusTexts = func() map[int]string {
	m := map[int]string{}
	for c := 100; c < 600; c++ {
		m[c] = strconv.Itoa(c)
	}
	return m
}()

// statusText is the code label of kubefence_requests_total, without an allocation for the
// codes a proxy answers.
func statusText(code int) string {
	if s, ok := statusTexts[code]; ok {
		return s
	}
	return strconv.Itoa(code)
}
