package proxy

import (
	"net"
	"testing"
)

// TestIsLocal: an address is the host's own when routing to it stays on the host, whatever
// may be bound (a keepalived or HAProxy host sets net.ipv4.ip_nonlocal_bind, with which any
// address can be bound, and every backend at the proxy's port would have been refused as the
// proxy itself).
func TestIsLocal(t *testing.T) {
	own := []net.IP{net.ParseIP("127.0.0.1")}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
				own = append(own, n.IP)
			}
		}
	}
	for _, ip := range own {
		if !isLocal(ip) {
			t.Errorf("isLocal(%s) = false; it is this host's", ip)
		}
	}
	for _, s := range []string{"192.0.2.99", "198.51.100.7", "203.0.113.1"} { // documentation ranges
		ip := net.ParseIP(s)
		if isLocal(ip) && !contains(own, ip) {
			t.Errorf("isLocal(%s) = true; it is not this host's", ip)
		}
	}
}

func contains(ips []net.IP, ip net.IP) bool {
	for _, x := range ips {
		if x.Equal(ip) {
			return true
		}
	}
	return false
}
