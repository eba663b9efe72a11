package proxy

import (
	"context"
	"net"
	"sync"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

// connSet is the connections one transport dialled and has not closed yet. A resuming switch
// closes those of the old backend's watches at once (backend.drain): every watch idle on them
// wakes, where closing each watch's body would write a stream reset (a frame, a TLS record and a
// system call) per watch, one after the other, inside the write window.
type connSet struct {
	mu    sync.Mutex
	conns map[*setConn]struct{}
}

type setConn struct {
	net.Conn
	set *connSet
}

func newConnSet() *connSet { return &connSet{conns: map[*setConn]struct{}{}} }

func (c *setConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.conns, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}

type dialFunc = tlsutil.DialFunc

// dialer wraps dial: every connection it makes is in s until it is closed.
func (s *connSet) dialer(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc := &setConn{Conn: c, set: s}
		s.mu.Lock()
		s.conns[sc] = struct{}{}
		s.mu.Unlock()
		return sc, nil
	}
}

// closeAll closes every connection in s, in the background. Closing one waits for the goroutine
// reading it to let go, which on a busy machine is a wait for the scheduler: the caller need not
// wait for any of it.
func (s *connSet) closeAll() {
	s.mu.Lock()
	all := make([]*setConn, 0, len(s.conns))
	for c := range s.conns {
		all = append(all, c)
	}
	s.mu.Unlock()
	go func() {
		for _, c := range all {
			_ = c.Close()
		}
	}()
}
