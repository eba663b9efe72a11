package admin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubefence/kubefence/internal/testnet"
)

// TestLargeWritesAnswer: the writes answer holds up to 65,536 entries, which with long names
// passes 16 MiB; the client decodes it whole instead of failing on a cut body.
func TestLargeWritesAnswer(t *testing.T) {
	const n = 65536
	var resp WritesResponse
	long := strings.Repeat("n", 253)
	for i := range n {
		resp.Writes = append(resp.Writes, ForwardedWrite{Verb: "update", Resource: "configmaps", Namespace: strings.Repeat("s", 63), Name: long + string(rune('a'+i%26))})
	}
	resp.Complete = true
	body, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) <= 16<<20 {
		t.Fatalf("answer of %d bytes: the test needs one past 16 MiB", len(body))
	}
	dir, err := os.MkdirTemp("", "kf-admin") // short: a socket path has ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	got, err := NewClient(sock).Writes(t.Context(), time.Now())
	if err != nil || len(got.Writes) != n || !got.Complete {
		t.Fatalf("writes answer of %d bytes: %d entries, complete %v, %v", len(body), len(got.Writes), got.Complete, err)
	}
}

// TestPermissionDeniedSaysWho: a socket the caller may not open (0600, another user's) is
// answered with what to do, not with "is the proxy running?".
func TestPermissionDeniedSaysWho(t *testing.T) {
	c := NewClient("/nonexistent.sock")
	c.hc.Transport = roundTrip(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.EACCES)}
	})
	_, err := c.Status(t.Context())
	if err == nil || !strings.Contains(err.Error(), "run this command as that user") || strings.Contains(err.Error(), "is 'kubefence proxy' running") {
		t.Fatalf("error %v, want one saying whose socket it is", err)
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestFailedHandshakeIsUnreachable: an admin address whose certificate does not verify (a wrong
// --admin-ca-file) was never sent the request: "cannot reach", not "gave no answer, may have
// acted" (whose advice, check with fence status, fails the same way); a proxy that took the
// request and closed the connection without an answer may have acted.
func TestFailedHandshakeIsUnreachable(t *testing.T) {
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{}`))
	}))
	defer untrusted.Close()
	hangUp := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	}))
	defer hangUp.Close()
	pool := x509.NewCertPool()
	pool.AddCert(hangUp.Certificate())
	cases := []struct {
		name string
		c    *Client
		want error
	}{
		{"certificate not verified", NewTLSClient(untrusted.URL, &tls.Config{RootCAs: x509.NewCertPool()}), ErrUnreachable},
		{"closed without an answer", NewTLSClient(hangUp.URL, &tls.Config{RootCAs: pool}), ErrNoAnswer},
	}
	for _, tc := range cases {
		_, err := tc.c.Fence(t.Context(), FenceRequest{Fenced: true})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestSilentHandshakeIsUnreachable: an admin address that takes the connection and never answers
// the TLS handshake (a host half up) fails within the handshake's bound, not the caller's
// deadline, and as "cannot reach": nothing was sent.
func TestSilentHandshakeIsUnreachable(t *testing.T) {
	defer func(d time.Duration) { handshakeTimeout = d }(handshakeTimeout)
	handshakeTimeout = 300 * time.Millisecond
	addr := testnet.Silent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	c := NewTLSClient("https://"+addr, &tls.Config{RootCAs: x509.NewCertPool()})
	_, err := c.Status(ctx)
	if !errors.Is(err, ErrUnreachable) || ctx.Err() != nil {
		t.Fatalf("status from an address that never answers its handshake: %v (caller's deadline passed: %v), want %v within the handshake's bound", err, ctx.Err() != nil, ErrUnreachable)
	}
}
