// Package backendurl is what a proxy backend's URL may be, and which backends a proxy allows
// ('kubefence backend set'): the proxy enforces it, a cutover's preflight checks a plan against
// what each proxy reports.
package backendurl

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Parse parses a backend's URL: a scheme and a host (with a port) only, both in lower case. A user name or
// password is refused (the proxy forwards clients' own credentials, and the URL is saved in the
// state file, shown by status and logged), and so are a path, a query and a fragment.
func Parse(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, password included
		}
		return nil, fmt.Errorf("backend URL %q does not parse: %w", Redact(raw), err)
	}
	shown := u.Redacted()
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, fmt.Errorf("backend URL %q: scheme must be https (or http for tests)", shown)
	case u.Host == "":
		return nil, fmt.Errorf("backend URL %q has no host", shown)
	case u.User != nil:
		return nil, fmt.Errorf("backend URL %q carries a user name or password: give scheme and host only (the proxy forwards each client's own credentials, and the URL is saved and shown)", shown)
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.ForceQuery:
		return nil, fmt.Errorf("backend URL %q: give scheme and host only, no path or query", shown)
	case strings.Contains(raw, "#"):
		return nil, fmt.Errorf("backend URL %q: give scheme and host only, no fragment", shown)
	}
	u.Path = ""
	// Host names are case-insensitive (as IPv6 hex is; an IPv6 zone, an interface's name,
	// is not): one spelling, so that a backend is the same URL in the state file, the status,
	// --allowed-backends and a cutover's plan.
	host, zone, hasZone := strings.Cut(u.Host, "%") // u.Host is decoded: the zone's "%25" is "%"
	u.Host = strings.ToLower(host)
	if hasZone {
		u.Host += "%" + zone
	}
	return u, nil
}

// Same reports whether a and b are one backend's URL, however spelled (case of the scheme and
// host, a trailing slash); a URL that does not parse is the same only as itself.
func Same(a, b string) bool {
	if a == b {
		return true
	}
	ua, erra := Parse(a)
	ub, errb := Parse(b)
	return erra == nil && errb == nil && ua.String() == ub.String()
}

// Redact hides what may be a password in a URL that does not parse.
func Redact(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return raw
	}
	scheme := ""
	if i := strings.Index(raw, "://"); i >= 0 && i < at {
		scheme = raw[:i+3]
	}
	return scheme + "xxxxx" + raw[at:]
}

// Pattern is one --allowed-backends entry: a scheme and host, with a port or "*".
type Pattern struct {
	scheme, host, port string
}

// ParsePattern parses an --allowed-backends entry.
func ParsePattern(raw string) (Pattern, error) {
	// url.Parse refuses a "*" port: parse with a placeholder and put the star back.
	star := strings.HasSuffix(raw, ":*")
	probe := raw
	if star {
		probe = strings.TrimSuffix(raw, "*") + "1"
	}
	u, err := Parse(probe)
	if err != nil {
		return Pattern{}, fmt.Errorf("%q: %w", Redact(raw), err)
	}
	bp := Pattern{scheme: u.Scheme, host: u.Hostname(), port: EffectivePort(u)} // no port: the scheme's
	if star {
		bp.port = "*"
	}
	return bp, nil
}

// Matches reports whether u is allowed by the pattern.
func (bp Pattern) Matches(u *url.URL) bool {
	return u.Scheme == bp.scheme && strings.EqualFold(u.Hostname(), bp.host) && (bp.port == "*" || bp.port == EffectivePort(u))
}

// EffectivePort is u's port, or its scheme's default.
func EffectivePort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

// Allowed reports whether a proxy started with --upstream upstream and --allowed-backends
// patterns lets 'backend set' switch to u (parsed with Parse).
func Allowed(upstream string, patterns []string, u *url.URL) bool {
	if upstream != "" {
		if Same(upstream, u.String()) {
			return true
		}
	}
	for _, raw := range patterns {
		if bp, err := ParsePattern(raw); err == nil && bp.Matches(u) {
			return true
		}
	}
	return false
}
