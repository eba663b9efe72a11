package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/kubefence/kubefence/proxy/backendurl"
)

// ErrBackendNotAllowed is returned by a switch to a URL the operator did not allow.
var ErrBackendNotAllowed = errors.New("backend not allowed")

// checkAllowed refuses a backend that is neither --upstream nor matched by --allowed-backends:
// the proxy forwards clients' bearer tokens, so it must never be pointed at an arbitrary server.
func (s *Server) checkAllowed(u *url.URL) error {
	if backendurl.Allowed(s.cfg.opts.Upstream, s.cfg.opts.AllowedBackends, u) {
		return s.checkNotSelf(u)
	}
	return fmt.Errorf("%w: %s is not --upstream and matches no --allowed-backends %v; restart the proxy with --allowed-backends=%s to allow it",
		ErrBackendNotAllowed, u, s.cfg.opts.AllowedBackends, u)
}

// checkNotSelf refuses u when it is this proxy's own API listener, by address (an allow-list
// of any port on the node's address, where the apiserver was, matches it): requests sent there
// would come back to the proxy. A listener on every address is matched by any of the host's.
func (s *Server) checkNotSelf(u *url.URL) error {
	if s.apiLn == nil {
		return nil
	}
	host, port, err := net.SplitHostPort(s.apiLn.Addr().String())
	if err != nil || backendurl.EffectivePort(u) != port {
		return nil
	}
	ln, b := net.ParseIP(host), net.ParseIP(u.Hostname())
	self := u.Hostname() == host || (ln != nil && b != nil && ln.Equal(b))
	if ln != nil && ln.IsUnspecified() {
		self = self || u.Hostname() == "localhost" || (b != nil && (b.IsUnspecified() || isLocal(b)))
	}
	if self {
		return fmt.Errorf("backend %s is this proxy's own --listen address %s: its requests would come back to the proxy; give the apiserver's address", u, s.apiLn.Addr())
	}
	return nil
}

// isLocal says whether ip is one of this host's addresses: a route to it is through the local
// table, with ip itself as the source (a UDP socket "connected" to it: no packet is sent, and no
// netlink socket, which a hardened unit may not allow, is needed). Not whether it can be bound:
// with net.ipv4.ip_nonlocal_bind, set on keepalived and HAProxy hosts, any address can be.
func isLocal(ip net.IP) bool {
	c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: ip, Port: 9})
	if err != nil {
		return false
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.Equal(ip)
}

// probeTLS checks that an https backend answers a TLS handshake whose certificate verifies with
// the backend's CA (caFile is checked against the server, not just read) before any request is
// sent there. A plain http backend (tests only) is checked for a TCP answer.
func probeTLS(ctx context.Context, b *backend) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	hostPort := net.JoinHostPort(b.url.Hostname(), backendurl.EffectivePort(b.url))
	if b.url.Scheme != "https" {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", hostPort)
		if err != nil {
			return fmt.Errorf("backend %s does not answer: %w", b.url, err)
		}
		return c.Close()
	}
	cfg := b.plain.h1.TLSClientConfig.Clone()
	cfg.ServerName = b.url.Hostname()
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", hostPort)
	if err != nil {
		why := "its CA file " + b.caFile
		if b.caFile == "" {
			why = "the system roots"
		}
		return fmt.Errorf("backend %s: TLS handshake verified with %s failed: %w", b.url, why, err)
	}
	return c.Close()
}
