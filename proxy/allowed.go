package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// backendPattern is one --allowed-backends entry: a scheme and host, with a port or "*".
type backendPattern struct {
	scheme, host, port string
}

func parseBackendPattern(raw string) (backendPattern, error) {
	// url.Parse refuses a "*" port: parse with a placeholder and put the star back.
	star := strings.HasSuffix(raw, ":*")
	probe := raw
	if star {
		probe = strings.TrimSuffix(raw, "*") + "1"
	}
	u, err := parseBackendURL(probe)
	if err != nil {
		return backendPattern{}, fmt.Errorf("%q: %w", redactURL(raw), err)
	}
	bp := backendPattern{scheme: u.Scheme, host: u.Hostname(), port: u.Port()}
	if star {
		bp.port = "*"
	}
	return bp, nil
}

func (bp backendPattern) matches(u *url.URL) bool {
	return u.Scheme == bp.scheme && strings.EqualFold(u.Hostname(), bp.host) && (bp.port == "*" || bp.port == effectivePort(u))
}

func effectivePort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

// ErrBackendNotAllowed is returned by a switch to a URL the operator did not allow.
var ErrBackendNotAllowed = errors.New("backend not allowed")

// checkAllowed refuses a backend that is neither --upstream nor matched by --allowed-backends:
// the proxy forwards clients' bearer tokens, so it must never be pointed at an arbitrary server.
func (s *Server) checkAllowed(u *url.URL) error {
	if up := s.cfg.opts.Upstream; up != "" {
		if pu, err := parseBackendURL(up); err == nil && pu.String() == u.String() {
			return nil
		}
	}
	for _, raw := range s.cfg.opts.AllowedBackends {
		if bp, err := parseBackendPattern(raw); err == nil && bp.matches(u) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is not --upstream and matches no --allowed-backends %v; restart the proxy with --allowed-backends=%s to allow it",
		ErrBackendNotAllowed, u, s.cfg.opts.AllowedBackends, u)
}

// probeTLS checks that an https backend answers a TLS handshake whose certificate verifies with
// the backend's CA (caFile is checked against the server, not just read) before any request is
// sent there. A plain http backend (tests only) is checked for a TCP answer.
func probeTLS(ctx context.Context, b *backend) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	hostPort := net.JoinHostPort(b.url.Hostname(), effectivePort(b.url))
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
