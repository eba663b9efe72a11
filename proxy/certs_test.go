package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"testing"
	"time"
)

// h2Client returns a client that keeps one HTTP/2 connection, as a kubelet does, and reports
// whether each request reused it.
func (f *identityFixture) h2Client(cert *tls.Certificate) *http.Client {
	c := f.client(cert)
	c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	return c
}

func getReused(t *testing.T, c *http.Client, url string) (code int, reused bool) {
	t.Helper()
	code, reused, err := tryGetReused(c, url)
	if err != nil {
		t.Fatal(err)
	}
	return code, reused
}

// tryGetReused is getReused for polling: a failure is an error to retry on, not the test's end.
func tryGetReused(c *http.Client, url string) (code int, reused bool, err error) {
	if !strings.Contains(strings.TrimPrefix(url, "https://"), "/") {
		url += "/api/v1/namespaces" // a proxy's address: a read through it
	}
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, false, err
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
	resp, err := c.Do(req)
	if err != nil {
		return 0, false, err
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		return 0, false, fmt.Errorf("proto %s, want HTTP/2", resp.Proto)
	}
	return resp.StatusCode, reused, nil
}

// TestClientCertExpiryPerRequest: a client certificate that expires while its connection stays
// open is refused on the next request on that connection.
func TestClientCertExpiryPerRequest(t *testing.T) {
	f := newIdentityFixture(t)
	// A certificate stores NotAfter to the second, truncated: now+1.5 s could expire 0.5 s from
	// now, before the first request's handshake on a loaded machine under -race. A whole second
	// chosen here is the expiry the certificate carries; the first request has 3 to 4 s.
	notAfter := time.Now().Truncate(time.Second).Add(4 * time.Second)
	short, _, _ := f.clientCA.issueUntil(t, f.dir, "short", "short-lived", nil, x509.ExtKeyUsageClientAuth, notAfter)
	c := f.h2Client(&short)
	if code, _ := getReused(t, c, f.proxyURL); code != 200 {
		t.Fatalf("before expiry (%s left) = %d, want 200", time.Until(notAfter).Round(time.Millisecond), code)
	}
	time.Sleep(time.Until(notAfter) + 500*time.Millisecond)
	code, reused := getReused(t, c, f.proxyURL)
	if !reused {
		t.Fatal("the second request did not reuse the connection: the test proves nothing")
	}
	if code != http.StatusUnauthorized {
		t.Fatalf("after expiry on the same connection = %d, want 401", code)
	}
}

// TestClientCAReloaded: replacing --client-ca-file's content takes effect without a restart, on
// new connections and on open ones.
func TestClientCAReloaded(t *testing.T) {
	f := newIdentityFixture(t)
	alice, _, _ := f.clientCA.issue(t, f.dir, "alice", "alice", nil, x509.ExtKeyUsageClientAuth)
	bob, _, _ := f.otherCA.issue(t, f.dir, "bob", "bob", nil, x509.ExtKeyUsageClientAuth)
	ca := f.h2Client(&alice)
	if code, _ := getReused(t, ca, f.proxyURL); code != 200 {
		t.Fatalf("alice before the rotation = %d", code)
	}
	other, err := os.ReadFile(f.otherCA.pem)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.clientCA.pem, other, 0o644); err != nil {
		t.Fatal(err)
	}
	waitForT(t, 10*time.Second, "bob's CA accepted on a new connection", func() bool {
		// Until the reload, bob's handshake fails: retry, do not fail.
		code, _, err := tryGetReused(f.h2Client(&bob), f.proxyURL)
		return err == nil && code == 200
	})
	code, reused := getReused(t, ca, f.proxyURL)
	if !reused || code != http.StatusUnauthorized {
		t.Fatalf("alice on her open connection after her CA was removed = %d (reused %v), want 401 on the same connection", code, reused)
	}
}

// TestServingCertReloaded: a new serving certificate is served to new connections without a
// restart.
func TestServingCertReloaded(t *testing.T) {
	f := newIdentityFixture(t)
	servedCN := func() string {
		c, err := tls.Dial("tcp", f.p.Addr().String(), &tls.Config{RootCAs: f.serverCAs, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := servedCN(); cn != "proxy" {
		t.Fatalf("serving CN = %q", cn)
	}
	f.servingCA.issue(t, f.dir, "proxy", "proxy-rotated", nil, x509.ExtKeyUsageServerAuth) // rewrites proxy.crt/key
	waitForT(t, 10*time.Second, "the rotated serving certificate", func() bool { return servedCN() == "proxy-rotated" })
}

// TestFrontProxyCertReloaded: a renewed front-proxy client certificate (kubeadm certs renew
// rewrites front-proxy-client.crt/key) is presented on the backend connections dialled after it,
// without a restart: the expired one would get every certificate-authenticated client's request
// (kubelets, controllers) refused by the apiserver.
func TestFrontProxyCertReloaded(t *testing.T) {
	f := newIdentityFixture(t)
	alice, _, _ := f.clientCA.issue(t, f.dir, "alice", "alice", nil, x509.ExtKeyUsageClientAuth)
	c := f.client(&alice)
	frontSeen := func() string {
		resp, err := c.Get(f.proxyURL + "/api/v1/namespaces")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		seen := f.backend.requests()
		return seen[len(seen)-1].frontProxy
	}
	if cn := frontSeen(); cn != "front-proxy-client" {
		t.Fatalf("front-proxy CN = %q", cn)
	}
	f.frontCA.issue(t, f.dir, "front-proxy-client", "front-proxy-rotated", nil, x509.ExtKeyUsageClientAuth) // rewrites its files
	waitForT(t, 10*time.Second, "the renewed front-proxy certificate", func() bool {
		f.backend.CloseClientConnections() // the proxy dials again, and presents its certificate then
		return frontSeen() == "front-proxy-rotated"
	})
}

func waitForT(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBodyErrorKeepsTheHTTP2Connection: a write whose body does not arrive in time, or stops,
// gets its answer on its own stream; over HTTP/2 the client's connection, which carries its
// other requests and watches, stays open ("Connection: close" on an HTTP/2 answer makes Go's
// server retire the whole connection).
func TestBodyErrorKeepsTheHTTP2Connection(t *testing.T) {
	f := newIdentityFixture(t, func(o *Options, _ string) { o.WriteBodyTimeout = 200 * time.Millisecond })
	c := f.h2Client(nil)
	if code, _ := getReused(t, c, f.proxyURL); code != 200 {
		t.Fatal("warm-up read failed")
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequestWithContext(t.Context(), "POST", f.proxyURL+"/api/v1/namespaces/default/configmaps", pr)
	req.ContentLength = 100
	req.Header.Set("Content-Type", "application/json")
	go func() { _, _ = pw.Write([]byte(`{"kind":`)) }() // and no more
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a stalled body: %s, want 408", resp.Status)
	}
	if code, reused := getReused(t, c, f.proxyURL); code != 200 || !reused {
		t.Fatalf("the next read: %d, on the same connection: %v; want 200 on it", code, reused)
	}
}
