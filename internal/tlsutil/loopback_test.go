package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"os"
	"testing"
)

// TestLoopback: a server with the Loopback's files, requiring a client certificate of its CA,
// accepts the Loopback's client and sees its common name; a client that trusts only the
// system roots refuses the server; Close removes the files.
func TestLoopback(t *testing.T) {
	l, err := NewLoopback("root")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{l.CAFile, l.CertFile, l.KeyFile} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want 0600", f, err, fi.Mode())
		}
	}
	cert, err := tls.LoadX509KeyPair(l.CertFile, l.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	cas, err := LoadCAPool(l.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: cas, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cn := make(chan string, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if tc.Handshake() == nil {
				cn <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
				_, _ = io.WriteString(tc, "ok")
			}
			tc.Close()
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), l.Client)
	if err != nil {
		t.Fatalf("the Loopback's client: %v", err)
	}
	if b, err := io.ReadAll(c); err != nil || string(b) != "ok" {
		t.Fatalf("read %q, %v", b, err)
	}
	c.Close()
	if got := <-cn; got != "root" {
		t.Fatalf("the server saw common name %q, want root", got)
	}
	roots, _ := x509.SystemCertPool()
	if c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, Certificates: l.Client.Certificates}); err == nil {
		c.Close()
		t.Fatal("a client that trusts only the system roots accepted the Loopback's server")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.Dir); !os.IsNotExist(err) {
		t.Fatalf("after Close %s: %v", l.Dir, err)
	}
}
