package proc

import (
	"net"
	"strconv"
	"testing"
)

// A port picked from the kernel's ephemeral range can be taken between the pick and the bind by
// any outgoing connection on the host (an apiserver dialling etcd, a test's client): CI saw
// green etcd's preflight refuse "127.0.0.1:44475 is in use" for a port the e2e harness had just
// been given. Ports outside that range are never handed to outgoing connections.
func TestFreePortsOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := ephemeralRange()
	seen := map[int]bool{}
	for round := range 3 {
		ports, err := FreePorts(100)
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) != 100 {
			t.Fatalf("round %d: %d ports, want 100", round, len(ports))
		}
		for _, p := range ports {
			if p >= lo && p <= hi {
				t.Errorf("round %d: port %d is in the ephemeral range %d-%d", round, p, lo, hi)
			}
			if p >= nodePortFirst && p <= nodePortLast {
				t.Errorf("round %d: port %d is in Kubernetes' NodePort range", round, p)
			}
			if seen[p] {
				t.Errorf("round %d: port %d given twice", round, p)
			}
			seen[p] = true
		}
	}
	for p := range seen {
		// Free on every address: the wildcard conflicts with a listener on any one of them.
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		l.Close()
	}
}

// A port someone listens on, on any address, is not handed out: the HA fixtures bind ports on
// other loopback addresses (127.0.0.2-4, standing for hosts), and a port blue's etcd held on
// 127.0.0.4, handed out again for green's member there, made the cutover's preflight refuse.
func TestFreePortsSkipsPortsInUse(t *testing.T) {
	var held []net.Listener
	t.Cleanup(func() {
		for _, l := range held {
			l.Close()
		}
	})
	lo, hi := ephemeralRange()
	busy := map[int]bool{}
	for p := range candidates(lo, hi) {
		if len(busy) == 2000 { // FreePorts ignoring them would hand out ~160 of them
			break
		}
		l, err := net.Listen("tcp", "127.0.0.2:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		held = append(held, l)
		busy[p] = true
	}
	ports, err := FreePorts(len(busy))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if busy[p] {
			t.Errorf("port %d is listened on at 127.0.0.2, yet handed out", p)
		}
	}
}
