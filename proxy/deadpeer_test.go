package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBackendConnectionsNoticeADeadPeer: a backend whose machine powers off, or that a partition
// cuts off, sends no RST. A request in flight on a connection to it, a read over HTTP/1.1 above
// all (nothing pings it), waited until the kernel gave up: with the request unacknowledged, ~15
// minutes of retransmissions; with it acknowledged and no answer, keepalive's 30 s idle then 9
// probes 15 s apart, ~3 minutes. Every connection to a backend now has keepalive probes after 15 s
// idle, 5 s apart, and a 30 s bound on data left unacknowledged (TCP_USER_TIMEOUT, which also
// ends a connection whose probes go unanswered): a dead peer fails its requests in about 30 s,
// as HTTP/2 pings (30 s + 15 s) fail those on multiplexed connections. A backend that is slow but
// alive acknowledges both and is never cut.
func TestBackendConnectionsNoticeADeadPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	want := map[string][2]int{ // option: level, value
		"SO_KEEPALIVE":     {unix.SOL_SOCKET, 1},
		"TCP_KEEPIDLE":     {unix.IPPROTO_TCP, 15},
		"TCP_KEEPINTVL":    {unix.IPPROTO_TCP, 5},
		"TCP_KEEPCNT":      {unix.IPPROTO_TCP, 3},
		"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, 30000},
	}
	opts := map[string]int{"SO_KEEPALIVE": unix.SO_KEEPALIVE, "TCP_KEEPIDLE": unix.TCP_KEEPIDLE,
		"TCP_KEEPINTVL": unix.TCP_KEEPINTVL, "TCP_KEEPCNT": unix.TCP_KEEPCNT, "TCP_USER_TIMEOUT": unix.TCP_USER_TIMEOUT}
	topts := TransportOptions{}
	for _, tc := range []struct {
		name        string
		tr          *http.Transport
		userTimeout int
	}{
		{"HTTP/1.1 (reads)", newTransport(&tls.Config{}, topts, false, nil), 30000},
		{"HTTP/2 (writes)", newTransport(&tls.Config{}, topts, true, nil), 30000},
		{"HTTP/2 (watches, kept in a set)", newTransport(&tls.Config{}, topts, true, newConnSet()), 30000},
		// An exec's stdin may wait longer than that for the program in the container to read it
		// (a zero window, which TCP_USER_TIMEOUT would end): keepalive alone.
		{"upgrades", newUpgradeTransport(&tls.Config{}, topts), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want["TCP_USER_TIMEOUT"] = [2]int{unix.IPPROTO_TCP, tc.userTimeout}
			c, err := tc.tr.DialContext(context.Background(), "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if sc, ok := c.(*setConn); ok {
				c = sc.Conn
			}
			raw, err := c.(syscall.Conn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			for name, lv := range want {
				var got int
				var gerr error
				if err := raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), lv[0], opts[name]) }); err != nil || gerr != nil {
					t.Fatalf("%s: %v %v", name, err, gerr)
				}
				if got != lv[1] {
					t.Errorf("%s = %d, want %d", name, got, lv[1])
				}
			}
		})
	}
}
