package proxy

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"
)

// RequestHeaderNames are the headers the backend apiserver reads a forwarded identity from; they
// must match its --requestheader-*-headers flags.
type RequestHeaderNames struct {
	Username    []string
	Group       []string
	ExtraPrefix []string
	UID         []string
}

// first returns the first name of list: of each kind of header, the one the proxy sets.
func (n RequestHeaderNames) first(list []string) string {
	if len(list) == 0 {
		return ""
	}
	return list[0]
}

// stripNames are the identity headers a client must not send: names, matched whole, and
// prefixes, matched at the start; both case-insensitively, and each exactly as configured, as
// kube-apiserver matches them (a prefix given without a trailing "-" is a prefix without one:
// "X-Auth-Extra" makes "X-Auth-Extrascopes" an extra). The X-Remote- prefix is always included,
// whatever the configured names, and so is X-Real-Ip, which kube-apiserver takes as the
// client's address in audit logs.
type stripNames struct {
	names    []string
	prefixes []string
}

func (n RequestHeaderNames) stripList() stripNames {
	out := stripNames{names: []string{"X-Real-Ip"}, prefixes: []string{"X-Remote-"}}
	out.names = append(out.names, n.Username...)
	out.names = append(out.names, n.Group...)
	out.names = append(out.names, n.UID...)
	out.prefixes = append(out.prefixes, n.ExtraPrefix...)
	return out
}

// newClientAuthenticator turns a verified client certificate into a user with k8s.io/apiserver's
// x509 authenticator (CN → user, O → groups), the same mapping the apiserver uses, verifying
// against the client CA bundle current at each call.
func newClientAuthenticator(verifyOptions x509request.VerifyOptionFunc) authenticator.Request {
	return x509request.NewDynamic(verifyOptions, x509request.CommonNameUserConversion)
}

// connIdentity caches the authentication of one TLS connection: the certificate cannot change
// within a connection (Go's server does not renegotiate), but time passes and the CA bundle may
// be reloaded, so the result holds only while every certificate of the chain is valid and the
// bundle it was verified with is still the current one. A kubelet's HTTP/2 connection lives for
// days; its certificate's expiry is enforced on every request.
type connIdentity struct {
	mu        sync.Mutex
	roots     *x509.CertPool
	notBefore time.Time
	notAfter  time.Time
	resp      *authenticator.Response
	ok        bool
	err       error
}

type connIdentityKey struct{}

// connContext gives every accepted connection its identity cache, its count of held writes and
// its count of write-body bytes (its share of --max-buffered-write-bytes).
func connContext(ctx context.Context, _ net.Conn) context.Context {
	ctx = context.WithValue(ctx, connHoldsKey{}, new(atomic.Int32))
	ctx = context.WithValue(ctx, connBodyBytesKey{}, new(atomic.Int64))
	return context.WithValue(ctx, connIdentityKey{}, &connIdentity{})
}

// authenticate returns the connection's identity, verifying the certificate again when the
// cached result no longer holds.
func (ci *connIdentity) authenticate(r *http.Request, authn authenticator.Request, roots *x509.CertPool, now time.Time) (*authenticator.Response, bool, error) {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	if ci.roots != roots || ci.roots == nil || now.Before(ci.notBefore) || now.After(ci.notAfter) {
		ci.resp, ci.ok, ci.err = authn.AuthenticateRequest(r)
		ci.roots = roots
		ci.notBefore, ci.notAfter = validity(r.TLS.PeerCertificates, r.TLS.VerifiedChains)
	}
	return ci.resp, ci.ok, ci.err
}

// withAuthentication authenticates client certificates with authn (set with --client-ca-file),
// caching the result per connection while clientCA's bundle is the one it was verified with;
// other requests (bearer tokens, anonymous) pass untouched, for the apiserver to authenticate.
// Without authn the filter is switched off: it returns next itself.
func withAuthentication(next http.Handler, authn authenticator.Request, clientCA x509request.VerifyOptionFunc, log *slog.Logger) http.Handler {
	if authn == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		ci, _ := r.Context().Value(connIdentityKey{}).(*connIdentity)
		if ci == nil {
			ci = &connIdentity{}
		}
		opts, _ := clientCA()
		resp, ok, err := ci.authenticate(r, authn, opts.Roots, time.Now())
		if err != nil || !ok {
			why := "certificate has no common name"
			if err != nil {
				why = err.Error()
			}
			log.Info("client certificate refused", "why", why, "remote", r.RemoteAddr)
			reqStateFrom(r.Context()).answered = decisionUnauthenticated
			writeStatus(w, http.StatusUnauthorized, "Unauthorized", "kubefence: client certificate not accepted: "+why, 0)
			return
		}
		st := reqStateFrom(r.Context())
		st.identity = resp.User
		if st.attrs.Verb == "watch" { // only a watch is sent anew (resumed); no closure per request
			st.stillVerified = func() bool {
				opts, _ := clientCA()
				again, ok, err := ci.authenticate(r, authn, opts.Roots, time.Now())
				return err == nil && ok && again.User.GetName() == resp.User.GetName()
			}
		}
		st.attrs.User, st.attrs.Groups = resp.User.GetName(), resp.User.GetGroups()
		next.ServeHTTP(w, r)
	})
}

// setIdentityHeaders writes the forwarded identity into an outbound request's headers.
func (n RequestHeaderNames) setIdentityHeaders(h http.Header, u user.Info) {
	h.Set(n.first(n.Username), u.GetName())
	if g := n.first(n.Group); g != "" {
		for _, group := range u.GetGroups() {
			h.Add(g, group)
		}
	}
	if p := n.first(n.ExtraPrefix); p != "" {
		for k, vs := range u.GetExtra() {
			// The apiserver unescapes extra keys; they may hold characters not allowed in names.
			name := p + url.PathEscape(k)
			for _, v := range vs {
				h.Add(name, v)
			}
		}
	}
	if uidHeader := n.first(n.UID); uidHeader != "" && u.GetUID() != "" {
		h.Set(uidHeader, u.GetUID())
	}
}

var errNoFrontProxyCert = errors.New("--client-ca-file needs --upstream-client-cert-file and --upstream-client-key-file: " +
	"without a front-proxy certificate the apiserver cannot learn the client's identity")
