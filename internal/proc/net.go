package proc

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"syscall"
)

// HostPort returns the host:port of a URL (with the scheme's default port), or "" for a URL
// that does not parse.
func HostPort(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// PortFree reports whether the host:port of each URL can be listened on here, now.
func PortFree(rawURLs ...string) error {
	for _, raw := range rawURLs {
		hp := HostPort(raw)
		if hp == "" {
			return fmt.Errorf("%q is not a URL", raw)
		}
		ln, err := net.Listen("tcp", hp)
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			return fmt.Errorf("%s is in use (%v)", hp, err)
		case errors.Is(err, syscall.EADDRNOTAVAIL):
			return fmt.Errorf("%s cannot be listened on: not an address of this host (%v)", hp, err)
		case err != nil:
			return fmt.Errorf("%s cannot be listened on (%v)", hp, err)
		}
		ln.Close()
	}
	return nil
}

// FreePort returns a loopback TCP port no one listens on now.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
