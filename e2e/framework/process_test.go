package framework

import (
	"net"
	"testing"
)

// The HA fixtures bind ports FreePorts gave on other loopback addresses (127.0.0.2-4, standing
// for hosts), so a port must be free on every address, not only on 127.0.0.1: a port blue's
// etcd holds on 127.0.0.4 handed out again for green's member there made the cutover's
// preflight refuse ("127.0.0.4:NNNN is in use").
func TestFreePortsFreeOnEveryAddress(t *testing.T) {
	const n = 2000
	held := map[int]bool{}
	for range n {
		l, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		held[l.Addr().(*net.TCPAddr).Port] = true
	}
	ports, err := FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	var taken []int
	for _, p := range ports {
		if held[p] {
			taken = append(taken, p)
		}
	}
	if len(taken) > 0 {
		t.Fatalf("FreePorts gave %d ports already listened on at 127.0.0.2, e.g. %d", len(taken), taken[0])
	}
}
