package proc

import (
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
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

// FreePort returns a TCP port no one listens on now, on any address (see FreePorts).
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct TCP ports no one listens on now, on any address of this host
// (the wildcard conflicts with a listener on any one address), for processes started soon
// after to listen on. They come from outside the kernel's ephemeral range, the ports it gives
// outgoing connections: a port from that range (what listening on port 0 gives) can be taken by
// any connection the host opens between the pick and the bind. No port is handed out twice by
// one process. Only if too few ports are free outside that range does the kernel pick the rest.
func FreePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	given.Lock()
	defer given.Unlock()
	ports := make([]int, 0, n)
	for p := range candidates(ephemeralRange()) {
		if len(ports) == n {
			break
		}
		if given.ports[p] {
			continue
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		lns = append(lns, l)
		ports = append(ports, p)
	}
	for len(ports) < n {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, p := range ports {
		given.ports[p] = true
	}
	return ports, nil
}

// given holds the ports FreePorts handed out in this process, never handed out again.
var given = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// lowestPort is where FreePorts starts: below it are the ports services conventionally use.
// Kubernetes' default NodePort range is left out too: on a node whose kube-proxy redirects its
// NodePorts on every address, a connection to one reaches a Service, which no listen check sees.
const (
	lowestPort                  = 10000
	nodePortFirst, nodePortLast = 30000, 32767
)

// ephemeralRange is the kernel's range of ports for outgoing connections, or Linux's default
// where it cannot be read.
func ephemeralRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if _, err := fmt.Sscan(string(b), &lo, &hi); err == nil && lo <= hi {
			return lo, hi
		}
	}
	return 32768, 60999
}

// candidates yields, in a random order, the ports from lowestPort up that are outside lo-hi
// and outside the NodePort range.
func candidates(lo, hi int) iter.Seq[int] {
	var pool []int
	for p := lowestPort; p <= 65535; p++ {
		if (p < lo || p > hi) && (p < nodePortFirst || p > nodePortLast) {
			pool = append(pool, p)
		}
	}
	rand.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	return slices.Values(pool)
}
