package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefence/kubefence/internal/logging"
	"github.com/kubefence/kubefence/policy"
)

// withFence lets no write pol refuses reach a backend while the gate is fenced (invariant
// fenced-no-writes), and registers with the gate the writes it admits while open so that 'fence
// on' can wait for them (invariant barrier). It decides before forwarding: a refused request is
// never sent anywhere (invariant refused-never-forwarded). A write's body is read whole first,
// within limits (see writebody.go), unless the fence is on in refuse mode and the body cannot
// change the decision: then the write is refused from its headers. In hold mode a write the
// defaults would refuse is held instead (see hold.go); one a `refuse` rule matches is refused.
func withFence(next http.Handler, g *gate, pol *policy.Policy, limits bodyLimits, rf *refusals, hd *holder, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := reqStateFrom(r.Context())
		a := &st.attrs
		if a.Class() != policy.Write {
			if a.HasBody {
				boundReadBody(w, r, limits.timeout)
			}
			if !g.fenced() {
				next.ServeHTTP(w, r)
				return
			}
			decide(w, r, st, next, pol, rf)
			return
		}
		if a.Session() {
			if g.admitSession() {
				next.ServeHTTP(w, r)
				return
			}
			decide(w, r, st, next, pol, rf)
			return
		}
		if g.fence() == fenceRefusing && !a.BodyDecidesDryRun() {
			// Fenced in refuse mode, and the body cannot change the decision: decide now,
			// without buffering a body that would only be refused.
			if d := pol.Decide(a); !d.Allow {
				rf.refuse(w, r, st, d)
				return
			}
		}
		body, res, err := readWriteBody(w, r, limits, st.identity != nil)
		if err != nil {
			answerBodyError(w, r, err, limits, log)
			return
		}
		defer res.release() // the body is kept until the request ends (or until it is held)
		if a.BodyDecidesDryRun() {
			a.SetDryRunFromBody(r.Header.Get("Content-Type"), body, r.URL.RawQuery)
		}
		if a.StoresNothing() {
			// A review or a dry run stores nothing: neither the barrier nor a switch waits for
			// one, and none is counted among the writes a policy let through.
			if !g.fenced() {
				next.ServeHTTP(w, r)
				return
			}
			decide(w, r, st, next, pol, rf)
			return
		}
		id, fence := g.admitWrite(inflightWrite{attrs: a, userAgent: r.UserAgent(), start: time.Now()})
		if fence != fenceIsOpen {
			switch d := pol.Decide(a); {
			case d.Allow:
				// As an admitted write, it is waited for on the backend whatever the client does;
				// logged, as refused and held ones are: a snapshot cutover's switch warns of such
				// writes in flight on blue, and this is where their objects are named.
				rf.log.Info("write let through: fence is on", fencedWriteLogArgs(a, r.UserAgent(), "why", d.Reason)...)
				st.letThrough = true
				next.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
			case fence == fenceHolding && holdable(a) && !d.ByRule:
				hd.hold(w, r, st, next, g, rf, int64(len(body)), &res)
			default:
				rf.refuse(w, r, st, d)
			}
			return
		}
		st.answeredBy = func() { g.inflight.remove(id) }
		defer g.inflight.remove(id) // no answer at all: the backend failed, or the proxy did
		// From here the write's fate on the backend does not depend on the client: a client that
		// goes away must not end the registration before the backend has answered (invariant barrier).
		next.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
	})
}

// holdable says whether hold mode holds a write the policy refuses: not one that asks for a
// protocol upgrade, nor one to a path the proxy could not parse (either may be a session
// kube-apiserver routes once the path is decoded: those are refused, as sessions are).
func holdable(a *policy.Attributes) bool {
	return !a.Upgrade && a.Unknown == ""
}

// decide applies the policy to a request that arrived while fenced.
func decide(w http.ResponseWriter, r *http.Request, st *reqState, next http.Handler, pol *policy.Policy, rf *refusals) {
	d := pol.Decide(&st.attrs)
	if !d.Allow {
		rf.refuse(w, r, st, d)
		return
	}
	next.ServeHTTP(w, r)
}

// boundReadBody bounds a body a read carries (kube-apiserver reads none, and the proxy streams
// it on as it comes): its client has timeout (--write-body-timeout) from the request's start to
// send it all. Otherwise one that stops in the middle held the forward, and the connection, for
// ever: the backend's answer does not end a body's copy. Once it has all come, the deadline
// holds nothing up: net/http lifts it at the body's end (HTTP/1.1: its background read), and an
// HTTP/2 stream whose body ended ignores it. (Lifting it here would be from the transport's
// goroutine, maybe after the handler returned, when the ResponseWriter must not be used.)
func boundReadBody(w http.ResponseWriter, r *http.Request, timeout time.Duration) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	if http.NewResponseController(w).SetReadDeadline(time.Now().Add(timeout)) != nil {
		return
	}
	r.Body = &boundedBody{ReadCloser: r.Body, timedOut: &reqStateFrom(r.Context()).bodyTimedOut}
}

// boundedBody notes a read of the body that hit boundReadBody's deadline.
type boundedBody struct {
	io.ReadCloser
	timedOut *atomic.Bool // the request's reqState.bodyTimedOut
}

func (b *boundedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		b.timedOut.Store(true)
	}
	return n, err
}

// refusals answers the requests the fence refuses (429 + Retry-After + the current fence's
// Status), counts and logs them.
type refusals struct {
	body            atomic.Pointer[[]byte] // the current fence's 429 body: built once per fence change, not per request
	retryAfter      int                    // --retry-after
	reason          atomic.Pointer[string] // the current fence's reason
	retryAfterValue string                 // the Retry-After header, formatted once
	bodyTimeout     time.Duration          // --write-body-timeout
	total           atomic.Uint64
	counter         prometheus.Counter // kubefence_refused_writes_total
	log             *slog.Logger
}

func newRefusals(retryAfter int, bodyTimeout time.Duration, counter prometheus.Counter, log *slog.Logger) *refusals {
	return &refusals{retryAfter: retryAfter, retryAfterValue: strconv.Itoa(retryAfter), bodyTimeout: bodyTimeout, counter: counter, log: log}
}

// setReason builds the 429 body for a fence put on for reason.
func (rf *refusals) setReason(reason string) {
	body := refusalBody(reason, rf.retryAfter)
	rf.body.Store(&body)
	rf.reason.Store(&reason)
}

// refuse answers 429. A body not read yet is not: over HTTP/1.1 the server discards up to
// 256 KiB of it before it answers (so that the connection can carry the client's retry) and
// closes the connection after the answer when more is left; the read deadline bounds how long a
// client trickling it keeps the connection, as when a write's body is read. Over HTTP/2 the
// stream is reset after the answer.
func (rf *refusals) refuse(w http.ResponseWriter, r *http.Request, st *reqState, d policy.Decision) {
	if st.attrs.HasBody {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(rf.bodyTimeout))
	}
	body, msg := *rf.body.Load(), "refused write: fence is on"
	if d.ByRule { // the fence's body says reads work and writes only wait: name the rule instead
		body = ruleRefusalBody(*rf.reason.Load(), d.Reason, rf.retryAfter)
	}
	if d.Class == policy.Read {
		msg = "refused read: fence is on"
	}
	rf.answer(w, r, st, d, msg, body)
}

// refuseHold answers 429 for a write hold mode would hold but cannot, or no longer (its body is
// in): why names the bound of the waiting room it is past (errHoldFull), or its hold timeout.
func (rf *refusals) refuseHold(w http.ResponseWriter, r *http.Request, st *reqState, why error) {
	rf.answer(w, r, st, policy.Decision{Class: policy.Write, Reason: why.Error()}, "refused write: fence is on",
		holdFullBody(*rf.reason.Load(), why, rf.retryAfter))
}

// answer counts, logs (msg) and answers a refusal with its 429 body.
func (rf *refusals) answer(w http.ResponseWriter, r *http.Request, st *reqState, d policy.Decision, msg string, body []byte) {
	st.answered = decisionRefused
	rf.counter.Inc()
	rf.total.Add(1)
	rf.log.Info(msg, fencedWriteLogArgs(&st.attrs, r.UserAgent(), "why", d.Reason)...)
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Retry-After"] = []string{rf.retryAfterValue}
	h["Cache-Control"] = []string{"no-store"}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
}

// maxLoggedField is the most of one client-chosen string a log line carries.
const maxLoggedField = 256

// fencedWriteLogArgs are the attributes logged for a write the fence refuses or holds, then
// more. The client chooses their strings (a User-Agent of hundreds of KiB, a name as long as the
// request line), and a fenced proxy may log many writes a second under the logger's lock, so
// each is cut to maxLoggedField bytes.
func fencedWriteLogArgs(a *policy.Attributes, userAgent string, more ...any) []any {
	args := []any{"verb", clipField(a.Verb), "resource", clipField(resourceString(a)), "namespace", clipField(a.Namespace),
		"name", clipField(a.Name), "user", clipField(a.User), "userAgent", clipField(userAgent)}
	return append(args, more...)
}

// clipField cuts s to maxLoggedField bytes (logging.Clip).
func clipField(s string) string { return logging.Clip(s, maxLoggedField) }

// resourceString names a request's target for logs and the barrier's report:
// resource.group/subresource, or the path of a non-resource request.
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
