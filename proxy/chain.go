package proxy

import (
	"context"
	"net/http"
	"sync/atomic"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/kubefence/kubefence/policy"
)

// buildHandler assembles the request path once, innermost first, so that reading it bottom-up
// is the order a request goes through. Each filter takes what it needs as parameters; a
// switched-off filter is next itself.
func (s *Server) buildHandler() http.Handler {
	o := s.cfg.opts
	var h http.Handler = newReverseProxy(s.headerNames, s.metrics.upstreamDuration, s.log)
	h = withBackend(h, &s.active)
	h = withWriteLog(h, s.writes)
	h = withIdentityHeaders(h, s.headerNames.stripList())
	h = withFence(h, &s.gate, s.policy, bodyLimits{max: o.MaxWriteBodyBytes, timeout: o.WriteBodyTimeout, budget: s.bodyBudget, retryAfter: o.RetryAfter}, s.refusals, s.holder, s.log)
	h = withConfirmedBackend(h, &s.unconfirmed, o.RetryAfter)
	h = withAuthentication(h, s.authn, s.clientCA, s.log)
	h = withAccounting(h, s.metrics.requests, &s.openWatches)
	h = withAttributes(h, s.classifier)
	h = withChunkedRequestClose(h)
	h = withRecover(h, s.log)
	return h
}

// reqState is what the filters learn about one request; it rides in the request context.
type reqState struct {
	attrs   policy.Attributes
	backend *backend
	stream  *stream // for watches and upgrades
	// answeredBy ends the write's registration as in flight once the backend answered
	// (committed) it: a client slow to read the answer must not hold the barrier or the switch.
	answeredBy func()
	// letThrough marks a write the fence's policy let through while fenced (leader election,
	// heartbeats): no barrier waits for it, so its backend counts it until it is answered, and
	// a switch away from that backend waits for it (backend.trackWrite).
	letThrough bool
	// answered says why the proxy answered the request itself (decision* below); "" is
	// forwarded.
	answered string
	// identity is the client-certificate user the proxy forwards, or nil.
	identity user.Info
	// stillVerified checks the client's certificate again, as of now, when the request is sent
	// anew later (a watch a switch resumes on another backend); set with identity, for watches.
	stillVerified func() bool
	// bodyTimedOut: a read's body did not all arrive within --write-body-timeout (boundReadBody).
	bodyTimedOut atomic.Bool
}

// What kubefence_requests_total's decision label says of a request the proxy answered itself.
const (
	decisionForwarded       = "forwarded"
	decisionRefused         = "refused"         // a write the fence refused (429)
	decisionAbandoned       = "abandoned"       // a held write whose client went away
	decisionRejected        = "rejected"        // a write whose body was not read (413, 408, 400, 429 when --max-buffered-write-bytes is full)
	decisionUnavailable     = "unavailable"     // the backend is unconfirmed (503)
	decisionUnauthenticated = "unauthenticated" // a client certificate refused (401)
	decisionBackendFailed   = "backend-failed"  // the proxy's own answer for a backend that failed it (502, 504, 503 at a switch)
)

type reqStateKey struct{}

func withReqState(ctx context.Context, st *reqState) context.Context {
	return context.WithValue(ctx, reqStateKey{}, st)
}

func reqStateFrom(ctx context.Context) *reqState {
	st, _ := ctx.Value(reqStateKey{}).(*reqState)
	return st
}
