package proxy

import (
	"context"
	"net"
	"sync"
	"time"
)

// coalescingConn gathers small writes to a connection into one system call. It sits under the
// TLS layer of the proxy's client connections and of its HTTP/2 backend connections, where Go's
// HTTP stacks write each response, or each request, in several small flushes: net/http's 4 KB
// buffers write a 4 KB list in two, Go's HTTP/2 client flushes a write's HEADERS and then its
// DATA, and x/net's HTTP/2 server flushes every response of a connection on its own. Each flush
// was a TLS record and a write(2), about a third of the proxy's CPU per request. Here Write
// appends to a buffer and wakes the connection's flusher, which writes everything gathered in
// one call: the records of a whole response, or of the many requests and responses that became
// ready while its previous call ran. Alone, a write waits only for the flusher to be scheduled,
// which is as soon as the writing goroutine waits for something (the next request, an answer).
// Writes of directWrite bytes or more (a large list's records) are written at once, after what
// was gathered before them: copying them costs more than the call saved.
//
// A write error is the connection's: every later Write returns it, as TLS's would. A Write waits
// while it would not fit beside the bytes already waiting (maxCoalesced), so that a peer that
// reads nothing holds the writers (as its full socket buffer did) instead of the proxy's memory.
// What was written before a close, or before a write deadline already past (TLS's
// close_notify), is written out first, within closeFlushTimeout: an answer written just before
// a close still reaches the client.
type coalescingConn struct {
	net.Conn

	mu      sync.Mutex
	drained sync.Cond // the buffer was taken, or the connection failed or closed
	buf     []byte    // written, not yet taken (from coalesceBuffers)
	err     error     // the first failed write
	closed  bool
	kick    chan struct{} // cap 1: the buffer has bytes for the flusher
	done    chan struct{} // closed by Close: the flusher stops
	writing sync.Mutex    // held by whoever writes to Conn (the flusher, writeNow, flushWithin)
}

const (
	// maxCoalesced bounds the bytes waiting for the flusher of one connection, and is the
	// capacity of the buffers connections share (coalesceBuffers), which they hold only while
	// bytes wait.
	maxCoalesced = 64 << 10
	// directWrite: copying a write this large costs more than the system call it would save.
	directWrite = 8 << 10
	// closeFlushTimeout bounds the writing out of what was gathered before a close or a past
	// write deadline, to a peer that may read nothing.
	closeFlushTimeout = time.Second
)

// coalescingListener makes the connections it accepts coalescingConns.
type coalescingListener struct{ net.Listener }

func (l coalescingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newCoalescingConn(c), nil
}

// coalesced makes dial's connections coalescingConns.
func coalesced(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newCoalescingConn(c), nil
	}
}

// coalesceBuffers are the gathering buffers, shared: thousands of client connections keep none
// while idle, and a busy one does not allocate a buffer per call.
var coalesceBuffers = sync.Pool{New: func() any { b := make([]byte, 0, maxCoalesced); return &b }}

func newCoalescingConn(c net.Conn) *coalescingConn {
	cc := &coalescingConn{Conn: c, kick: make(chan struct{}, 1), done: make(chan struct{})}
	cc.drained.L = &cc.mu
	go cc.flushLoop()
	return cc
}

// Write appends p to what the flusher writes next, or writes a large p at once.
func (c *coalescingConn) Write(p []byte) (int, error) {
	if len(p) >= directWrite {
		return c.writeNow(p)
	}
	c.mu.Lock()
	for c.err == nil && !c.closed && len(c.buf) > 0 && len(c.buf)+len(p) > maxCoalesced {
		c.drained.Wait()
	}
	if err := c.errLocked(); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	if c.buf == nil {
		c.buf = *coalesceBuffers.Get().(*[]byte)
	}
	c.buf = append(c.buf, p...)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default: // the flusher is already due
	}
	return len(p), nil
}

// errLocked is what a write gets now: the connection's error, or net.ErrClosed. c.mu is held.
func (c *coalescingConn) errLocked() error {
	if c.err != nil {
		return c.err
	}
	if c.closed {
		return net.ErrClosed
	}
	return nil
}

// writeNow writes what was gathered, then p, in one call where the connection can (writev).
func (c *coalescingConn) writeNow(p []byte) (int, error) {
	c.writing.Lock()
	defer c.writing.Unlock()
	c.mu.Lock()
	err := c.errLocked()
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	b := c.take()
	bufs := net.Buffers{b, p}
	if _, err := bufs.WriteTo(c.Conn); err != nil {
		return 0, c.fail(err)
	}
	giveBack(b)
	return len(p), nil
}

// flushLoop writes what Write gathered, one call per wake-up, until Close.
func (c *coalescingConn) flushLoop() {
	for {
		select {
		case <-c.kick:
		case <-c.done:
			return
		}
		c.writing.Lock()
		c.writeOut()
		c.writing.Unlock()
	}
}

// writeOut writes what is gathered, unless the connection failed; c.writing is held.
func (c *coalescingConn) writeOut() {
	c.mu.Lock()
	failed := c.err != nil
	c.mu.Unlock()
	b := c.take()
	if len(b) > 0 && !failed {
		if _, err := c.Conn.Write(b); err != nil {
			c.fail(err)
		}
	}
	giveBack(b)
}

// take hands the gathered bytes to the caller, which holds c.writing, and lets the writers
// waiting for room go on.
func (c *coalescingConn) take() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buf
	c.buf = nil
	c.drained.Broadcast()
	return b
}

// giveBack returns b, written out, to coalesceBuffers (one that grew past its size is dropped).
func giveBack(b []byte) {
	if cap(b) == maxCoalesced {
		b = b[:0]
		coalesceBuffers.Put(&b)
	}
}

// fail makes err the connection's error, for every later Write, and returns it.
func (c *coalescingConn) fail(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
	c.drained.Broadcast()
	return c.err
}

// SetWriteDeadline applies t to the connection's writes. A deadline already past (crypto/tls
// sets one once its close_notify is written: "any later write fails") applies after what was
// written before it, gathered here, is written out, within closeFlushTimeout.
func (c *coalescingConn) SetWriteDeadline(t time.Time) error {
	c.flushBeforePast(t)
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline is SetWriteDeadline for both directions.
func (c *coalescingConn) SetDeadline(t time.Time) error {
	c.flushBeforePast(t)
	return c.Conn.SetDeadline(t)
}

// flushBeforePast writes out what is gathered when t is a write deadline already past.
func (c *coalescingConn) flushBeforePast(t time.Time) {
	if !t.IsZero() && !t.After(time.Now()) {
		c.flushWithin(closeFlushTimeout)
	}
}

// flushWithin writes out what is gathered, with a write deadline d from now (which also bounds
// a write of the flusher's under way).
func (c *coalescingConn) flushWithin(d time.Duration) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(d))
	c.writing.Lock()
	defer c.writing.Unlock()
	c.writeOut()
}

// longAgo is a deadline that has passed: reads blocked on a closing connection end at once.
var longAgo = time.Unix(1, 0)

// Close closes the connection. With nothing gathered and no write under way it closes at once;
// otherwise reads end now, and what is gathered is written out in the background, within
// closeFlushTimeout, before the connection closes: an answer written just before a close still
// reaches the client, and a write stuck on a client that reads nothing holds up neither the
// caller (http.Server.Close closes its connections one after another) nor the proxy for long.
func (c *coalescingConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.Conn.Close()
	}
	c.closed = true // no write is gathered or started from now on
	close(c.done)
	c.drained.Broadcast()
	pending := len(c.buf) > 0 && c.err == nil
	c.mu.Unlock()
	if !pending && c.writing.TryLock() {
		c.writing.Unlock()
		return c.Conn.Close()
	}
	_ = c.Conn.SetReadDeadline(longAgo)
	go func() {
		c.flushWithin(closeFlushTimeout)
		_ = c.Conn.Close()
	}()
	return nil
}
