package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// tcpPair is a connected loopback TCP pair.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestCoalescingConnKeepsEveryWriteWholeAndInOrder: writers on many goroutines, small writes
// (gathered) and large ones (written at once) mixed, and a Close right after the last: the peer
// reads every write whole, each goroutine's in the order it wrote them.
func TestCoalescingConnKeepsEveryWriteWholeAndInOrder(t *testing.T) {
	raw, peer := tcpPair(t)
	c := newCoalescingConn(raw)
	const writers, perWriter = 8, 300
	sizes := []int{1, 40, 700, 4200, directWrite, 3 * directWrite}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		got <- b
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for seq := range perWriter {
				n := sizes[(w+seq)%len(sizes)]
				msg := make([]byte, 12+n)
				binary.BigEndian.PutUint32(msg[0:], uint32(w))
				binary.BigEndian.PutUint32(msg[4:], uint32(seq))
				binary.BigEndian.PutUint32(msg[8:], uint32(n))
				for i := range n {
					msg[12+i] = byte(w*31 + seq + i)
				}
				if _, err := c.Write(msg); err != nil {
					t.Errorf("writer %d, write %d: %v", w, seq, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	b := <-got
	next := make([]int, writers)
	for len(b) > 0 {
		if len(b) < 12 {
			t.Fatalf("%d bytes left over, not a whole write", len(b))
		}
		w, seq, n := int(binary.BigEndian.Uint32(b[0:])), int(binary.BigEndian.Uint32(b[4:])), int(binary.BigEndian.Uint32(b[8:]))
		if w >= writers || seq != next[w] || 12+n > len(b) {
			t.Fatalf("writer %d's write %d (%d bytes) arrived where its write %d was due", w, seq, n, next[w])
		}
		for i := range n {
			if b[12+i] != byte(w*31+seq+i) {
				t.Fatalf("writer %d's write %d: byte %d interleaved with another write", w, seq, i)
			}
		}
		next[w]++
		b = b[12+n:]
	}
	for w, n := range next {
		if n != perWriter {
			t.Errorf("writer %d: %d of its %d writes arrived", w, n, perWriter)
		}
	}
}

// TestCoalescingConnGathersWritesIntoOneCall: while the flusher's call is under way (a net.Pipe
// write waits for its reader), the writes made meanwhile go out in the next call, together.
func TestCoalescingConnGathersWritesIntoOneCall(t *testing.T) {
	raw, peer := net.Pipe()
	defer peer.Close()
	c := newCoalescingConn(raw)
	defer c.Close()
	want := []byte("a")
	if _, err := c.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	for range 99 {
		if _, err := c.Write([]byte("b")); err != nil {
			t.Fatal(err)
		}
		want = append(want, 'b')
	}
	var got []byte
	calls := 0
	buf := make([]byte, 1024)
	for len(got) < len(want) {
		n, err := peer.Read(buf) // a pipe read returns at most one write's bytes
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		calls++
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("peer read %q, want %q", got, want)
	}
	if calls > 2 {
		t.Errorf("100 writes made while the first was under way reached the connection in %d calls, want at most 2", calls)
	}
}

// TestCoalescingConnCloseWritesWhatIsGathered: an answer written just before Close reaches the
// peer (net/http writes a last response and closes).
func TestCoalescingConnCloseWritesWhatIsGathered(t *testing.T) {
	for i := range 50 {
		raw, peer := tcpPair(t)
		c := newCoalescingConn(raw)
		got := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(peer)
			got <- b
		}()
		msg := bytes.Repeat([]byte{byte(i)}, 100+i)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if b := <-got; !bytes.Equal(b, msg) {
			t.Fatalf("round %d: the peer read %d bytes of the %d written before Close", i, len(b), len(msg))
		}
		if _, err := c.Write(msg); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a write after Close: %v, want net.ErrClosed", err)
		}
	}
}

// TestCoalescingConnCloseIsBoundedOnAPeerThatReadsNothing: with the socket buffers full, Close
// returns within closeFlushTimeout or so, and the writers waiting for room get an error.
func TestCoalescingConnCloseIsBoundedOnAPeerThatReadsNothing(t *testing.T) {
	raw, _ := tcpPair(t) // the peer never reads
	c := newCoalescingConn(raw)
	writersDone := make(chan error, 2)
	for _, size := range []int{100, directWrite} {
		go func() {
			chunk := make([]byte, size)
			for {
				if _, err := c.Write(chunk); err != nil {
					writersDone <- err
					return
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the socket buffers fill, then maxCoalesced
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > closeFlushTimeout+2*time.Second {
		t.Errorf("Close took %s on a peer that reads nothing, want about %s at most", took, closeFlushTimeout)
	}
	for range 2 {
		select {
		case err := <-writersDone:
			if err == nil {
				t.Error("a writer ended without an error")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a writer waiting for room was still waiting 5s after Close")
		}
	}
}

// failingConn's writes fail.
type failingConn struct{ net.Conn }

var errWriteFailed = errors.New("write failed")

func (failingConn) Write([]byte) (int, error) { return 0, errWriteFailed }
func (failingConn) Close() error              { return nil }
func (failingConn) SetWriteDeadline(time.Time) error {
	return nil
}

// TestCoalescingConnWriteErrorIsTheConnections: once the flusher's write failed, every write
// returns its error, gathered or direct.
func TestCoalescingConnWriteErrorIsTheConnections(t *testing.T) {
	c := newCoalescingConn(failingConn{})
	defer c.Close()
	if _, err := c.Write([]byte("gathered")); err != nil {
		t.Fatalf("the first write, gathered: %v", err)
	}
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		_, last = c.Write([]byte("x"))
		return last != nil, nil
	})
	if err != nil || !errors.Is(last, errWriteFailed) {
		t.Fatalf("writes after the flusher's failed: %v, want %v", last, errWriteFailed)
	}
	if _, err := c.Write(make([]byte, directWrite)); !errors.Is(err, errWriteFailed) {
		t.Fatalf("a direct write after the failure: %v, want %v", err, errWriteFailed)
	}
}

// tlsOverCoalescing is a TLS server connection over a coalescingConn and its client, handshaken.
func tlsOverCoalescing(t *testing.T) (server *tls.Conn, inner *coalescingConn, client *tls.Conn) {
	t.Helper()
	raw, peer := tcpPair(t)
	ca := newTestCA(t, t.TempDir(), "ca")
	cert, _, _ := ca.issue(t, t.TempDir(), "server", "127.0.0.1", nil, x509.ExtKeyUsageServerAuth)
	inner = newCoalescingConn(raw)
	server = tls.Server(inner, &tls.Config{Certificates: []tls.Certificate{cert}})
	client = tls.Client(peer, &tls.Config{InsecureSkipVerify: true})
	errc := make(chan error, 1)
	go func() { errc <- client.Handshake() }()
	if err := server.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return server, inner, client
}

// TestCoalescingConnTLSCloseWriteSendsWhatWasWritten: crypto/tls ends its close_notify by
// setting a write deadline of now ("any later write fails"), net/http half-closes so before it
// answers a body it did not read (a 413, a fence's 429), the reverse proxy so at the end of an
// exec: what was written before must still reach the client. With one P the flusher cannot run
// between the write and the half-close.
func TestCoalescingConnTLSCloseWriteSendsWhatWasWritten(t *testing.T) {
	server, _, client := tlsOverCoalescing(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	if _, err := server.Write([]byte("the last answer")); err != nil {
		t.Fatal(err)
	}
	if err := server.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(client)
	if string(got) != "the last answer" || err != nil {
		t.Fatalf("the client read %q (%v), want the answer written before the half-close, then its close_notify", got, err)
	}
}

// TestCoalescingConnCloseDoesNotWaitForAStuckWrite: http.Server.Close closes its connections one
// after another, and a write stuck on a client that reads nothing must not hold each up: Close
// returns at once, and a read blocked on the connection ends with it.
func TestCoalescingConnCloseDoesNotWaitForAStuckWrite(t *testing.T) {
	raw, _ := tcpPair(t) // the peer never reads
	c := newCoalescingConn(raw)
	readDone := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 1)); readDone <- err }()
	go func() {
		chunk := make([]byte, directWrite)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	time.Sleep(500 * time.Millisecond) // the socket buffers fill: the writer is stuck
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > closeFlushTimeout/2 {
		t.Errorf("Close took %s behind a stuck write", took)
	}
	select {
	case err := <-readDone:
		if err == nil {
			t.Error("a read blocked on the connection ended without an error")
		}
	case <-time.After(closeFlushTimeout / 2):
		t.Error("a read blocked on the connection still waited after Close")
	}
}

// TestCoalescingConnGathersAtMostItsBound: with a client that reads nothing, what waits for the
// flusher stays within maxCoalesced, in its pooled buffer (one that outgrew it would be
// dropped, and a connection would hold more than docs/proxy.md says).
func TestCoalescingConnGathersAtMostItsBound(t *testing.T) {
	raw, _ := tcpPair(t) // the peer never reads
	c := newCoalescingConn(raw)
	defer c.Close()
	const record = 4118 // a TLS record of a 4 KB write
	go func() {
		chunk := make([]byte, record)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	full := func(context.Context) (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.buf)+record > maxCoalesced, nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, full); err != nil {
		t.Fatal("the gathered bytes never reached the bound")
	}
	time.Sleep(100 * time.Millisecond) // a writer past the bound would append once more
	c.mu.Lock()
	n, capacity := len(c.buf), cap(c.buf)
	c.mu.Unlock()
	if n > maxCoalesced || capacity != maxCoalesced {
		t.Errorf("%d bytes gathered in a buffer of %d, want at most %d in one of %d", n, capacity, maxCoalesced, maxCoalesced)
	}
}

// TestTLSClientGetsTheAnswerToABodyNotRead: over TLS, a write whose announced body is past
// --max-write-body-bytes is answered 413 without reading it, and net/http then half-closes the
// connection (more than 256 KB unread): the client must read the 413, not an EOF (client-go does
// not retry a write on EOF). The proxy's client connections gather writes under TLS
// (coalesce.go), whose close_notify ends with a write deadline of now.
func TestTLSClientGetsTheAnswerToABodyNotRead(t *testing.T) {
	api := newFakeAPI(t, "blue")
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	_, certFile, keyFile := ca.issue(t, dir, "proxy", "127.0.0.1", nil, x509.ExtKeyUsageServerAuth)
	p := startProxy(t, api.URL, func(o *Options) {
		o.InsecureListen = false
		o.TLSCertFile, o.TLSKeyFile = certFile, keyFile
	})
	for round := range 20 {
		c, err := tls.Dial("tcp", p.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		announced := p.opts.MaxWriteBodyBytes + 1<<20
		fmt.Fprintf(c, "PUT /api/v1/namespaces/d/configmaps/c HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", announced)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			t.Fatalf("round %d: reading the answer: %v, want a 413", round, err)
		}
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("round %d: %s, want 413", round, resp.Status)
		}
	}
}
