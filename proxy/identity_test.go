package proxy

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// testCA issues certificates for identity tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string // path of the CA certificate
}

func newTestCA(t testing.TB, dir, name string) *testCA {
	t.Helper()
	ca := signedCA(t, name, nil)
	ca.pem = filepath.Join(dir, name+".crt")
	if err := os.WriteFile(ca.pem, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return ca
}

// intermediate is a CA ca signs; its certificates carry it in their chain (chained).
func (ca *testCA) intermediate(t testing.TB, name string) *testCA { return signedCA(t, name, ca) }

// signedCA is a CA certificate parent signs (itself when nil), valid for an hour.
func signedCA(t testing.TB, name string, parent *testCA) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	issuer, signer := tmpl, key
	if parent != nil {
		tmpl.SerialNumber = big.NewInt(2)
		issuer, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}
}

// chained is c with the intermediate that signed it after it, as a client sends its chain.
func (ca *testCA) chained(c tls.Certificate) tls.Certificate {
	c.Certificate = append(c.Certificate, ca.cert.Raw)
	return c
}

var serialMu sync.Mutex
var nextSerial int64 = 100

// issue returns a certificate valid for an hour and writes cert and key files named
// name.crt/name.key into dir.
func (ca *testCA) issue(t testing.TB, dir, name, cn string, orgs []string, usage x509.ExtKeyUsage) (tls.Certificate, string, string) {
	t.Helper()
	return ca.issueUntil(t, dir, name, cn, orgs, usage, time.Now().Add(time.Hour))
}

// issueUntil is issue with the certificate's NotAfter.
func (ca *testCA) issueUntil(t testing.TB, dir, name, cn string, orgs []string, usage x509.ExtKeyUsage, notAfter time.Time) (tls.Certificate, string, string) {
	t.Helper()
	serialMu.Lock()
	nextSerial++
	serial := nextSerial
	serialMu.Unlock()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	cp, kp := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(cp, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kp, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair, cp, kp
}

// seenRequest is what the TLS backend recorded of one request.
type seenRequest struct {
	header     http.Header
	frontProxy string // CN of the client certificate presented to the backend, if any
	protoMajor int    // the HTTP version the request reached the backend over
}

type tlsBackend struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

func (b *tlsBackend) requests() []seenRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seenRequest(nil), b.seen...)
}

// identityFixture is a TLS proxy with --client-ca-file in front of a TLS backend that asks for
// the front-proxy certificate, as kube-apiserver does.
type identityFixture struct {
	p                 *testProxy
	backend           *tlsBackend
	clientCA, otherCA *testCA
	servingCA         *testCA
	proxyURL          string
	serverCAs         *x509.CertPool
	logs              *syncBuf
	dir               string
	backendCert       tls.Certificate
	frontPool         *x509.CertPool
	frontCA           *testCA
}

// newBackend starts a TLS backend that asks for the front-proxy certificate, as kube-apiserver
// does, and records what it sees. It answers {} to everything but a watch (?watch=true), which
// gets one ADDED event of resourceVersion 5 and stays open.
func (f *identityFixture) newBackend(t *testing.T) *tlsBackend {
	b := &tlsBackend{}
	b.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sr := seenRequest{header: r.Header.Clone(), protoMajor: r.ProtoMajor}
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			sr.frontProxy = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		b.mu.Lock()
		b.seen = append(b.seen, sr)
		b.mu.Unlock()
		if r.URL.Query().Get("watch") != "true" {
			_, _ = w.Write([]byte(`{}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"default","resourceVersion":"5"}}}` + "\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	b.TLS = &tls.Config{Certificates: []tls.Certificate{f.backendCert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: f.frontPool}
	b.EnableHTTP2 = true // as kube-apiserver
	b.StartTLS()
	t.Cleanup(b.Close)
	return b
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func newIdentityFixture(t *testing.T, mutate ...func(o *Options, dir string)) *identityFixture {
	dir := t.TempDir()
	f := &identityFixture{dir: dir, logs: &syncBuf{}}
	serving := newTestCA(t, dir, "serving-ca")
	f.servingCA = serving
	f.clientCA = newTestCA(t, dir, "client-ca")
	f.otherCA = newTestCA(t, dir, "other-ca")
	frontCA := newTestCA(t, dir, "front-proxy-ca")
	_, fpCert, fpKey := frontCA.issue(t, dir, "front-proxy-client", "front-proxy-client", nil, x509.ExtKeyUsageClientAuth)
	backendCert, _, _ := serving.issue(t, dir, "backend", "backend", nil, x509.ExtKeyUsageServerAuth)
	_, proxyCert, proxyKey := serving.issue(t, dir, "proxy", "proxy", nil, x509.ExtKeyUsageServerAuth)
	f.serverCAs = x509.NewCertPool()
	f.serverCAs.AddCert(serving.cert)
	frontPool := x509.NewCertPool()
	frontPool.AddCert(frontCA.cert)

	f.backendCert, f.frontPool, f.frontCA = backendCert, frontPool, frontCA
	f.backend = f.newBackend(t)

	o := NewOptions()
	o.Listen, o.MetricsListen = "127.0.0.1:0", ""
	o.TLSCertFile, o.TLSKeyFile = proxyCert, proxyKey
	o.Upstream, o.UpstreamCAFile = f.backend.URL, serving.pem
	o.ClientCAFile = f.clientCA.pem
	o.UpstreamClientCertFile, o.UpstreamClientKeyFile = fpCert, fpKey
	o.AdminSocket, o.StateFile = filepath.Join(dir, "admin.sock"), filepath.Join(dir, "state.json")
	for _, m := range mutate {
		m(o, dir)
	}
	f.p = startProxyWith(t, o, f.logs)
	f.proxyURL = f.p.url
	return f
}

func (f *identityFixture) client(cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: f.serverCAs}
	if cert != nil {
		// Always present it, even when the server's list of acceptable CAs does not name its
		// issuer (Go's client would otherwise stay silent).
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
}

func TestClientCertificateIdentityForwarded(t *testing.T) {
	f := newIdentityFixture(t)
	alice, _, _ := f.clientCA.issue(t, f.dir, "alice", "alice", []string{"dev", "ops"}, x509.ExtKeyUsageClientAuth)
	mallory, _, _ := f.otherCA.issue(t, f.dir, "mallory", "system:admin", []string{"system:masters"}, x509.ExtKeyUsageClientAuth)
	get := func(c *http.Client, hdr ...string) (int, error) {
		req, _ := http.NewRequest("GET", f.proxyURL+"/api/v1/namespaces", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Add(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	cases := []struct {
		name       string
		client     *http.Client
		hdr        []string
		wantUser   string
		wantGroups []string
		wantFront  string
		wantAuthz  string
		handshake  bool // the TLS handshake must fail
	}{
		{"cert", f.client(&alice), nil, "alice", []string{"dev", "ops"}, "front-proxy-client", "", false},
		{"cert with spoofed headers", f.client(&alice), []string{"X-Remote-User", "root", "x-remote-group", "system:masters", "X-Remote-Extra-Scopes", "*"},
			"alice", []string{"dev", "ops"}, "front-proxy-client", "", false},
		{"token with spoofed headers", f.client(nil), []string{"Authorization", "Bearer secret-token-123", "X-REMOTE-USER", "system:admin", "X-Remote-Uid", "0"},
			"", nil, "", "Bearer secret-token-123", false},
		{"anonymous", f.client(nil), nil, "", nil, "", "", false},
		{"cert from another CA", f.client(&mallory), nil, "", nil, "", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(f.backend.requests())
			code, err := get(tc.client, tc.hdr...)
			if tc.handshake {
				if err == nil {
					t.Fatalf("a certificate from an unknown CA was accepted (%d)", code)
				}
				if len(f.backend.requests()) != before {
					t.Fatal("the backend saw a request from a rejected certificate")
				}
				return
			}
			if err != nil || code != 200 {
				t.Fatalf("GET = %d, %v", code, err)
			}
			reqs := f.backend.requests()
			if len(reqs) != before+1 {
				t.Fatalf("backend saw %d requests", len(reqs)-before)
			}
			got := reqs[len(reqs)-1]
			if u := got.header.Get("X-Remote-User"); u != tc.wantUser {
				t.Errorf("X-Remote-User = %q, want %q", u, tc.wantUser)
			}
			if g := got.header.Values("X-Remote-Group"); strings.Join(g, ",") != strings.Join(tc.wantGroups, ",") {
				t.Errorf("X-Remote-Group = %v, want %v", g, tc.wantGroups)
			}
			if got.frontProxy != tc.wantFront {
				t.Errorf("front-proxy certificate presented = %q, want %q", got.frontProxy, tc.wantFront)
			}
			if a := got.header.Get("Authorization"); a != tc.wantAuthz {
				t.Errorf("Authorization = %q, want %q", a, tc.wantAuthz)
			}
			for k := range got.header {
				lk := strings.ToLower(k)
				if strings.HasPrefix(lk, "x-remote-") && tc.wantUser == "" {
					t.Errorf("client-sent %s reached the backend", k)
				}
				if strings.HasPrefix(lk, "x-remote-extra-") && !strings.HasPrefix(lk, "x-remote-extra-authentication.kubernetes.io%2fcredential-id") {
					t.Errorf("unexpected extra %s: %v", k, got.header[k])
				}
			}
		})
	}
	// Refusals name the authenticated user; logs never hold a token.
	if _, err := f.p.FenceOn(t.Context(), "identity test", "", time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*http.Client{f.client(&alice), f.client(nil)} {
		req, _ := http.NewRequest("POST", f.proxyURL+"/api/v1/namespaces/a/configmaps", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer secret-token-123")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 429 {
			t.Fatalf("fenced write = %d", resp.StatusCode)
		}
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "user=alice") {
		t.Errorf("refusal log does not name the certificate user:\n%s", logs)
	}
	if strings.Contains(logs, "secret-token-123") {
		t.Errorf("a bearer token reached the logs:\n%s", logs)
	}
}

func TestAdminOverMutualTLS(t *testing.T) {
	var adminCA *testCA
	f := newIdentityFixture(t, func(o *Options, dir string) {
		adminCA = newTestCA(t, dir, "admin-ca")
		o.AdminListen, o.AdminClientCAFile = "127.0.0.1:0", adminCA.pem
	})
	operator, _, _ := adminCA.issue(t, f.dir, "operator", "operator", nil, x509.ExtKeyUsageClientAuth)
	alice, _, _ := f.clientCA.issue(t, f.dir, "alice2", "alice", nil, x509.ExtKeyUsageClientAuth)
	inter := adminCA.intermediate(t, "admin-intermediate")
	viaInter, _, _ := inter.issue(t, f.dir, "operator2", "operator2", nil, x509.ExtKeyUsageClientAuth)
	viaInter = inter.chained(viaInter)
	sansOnly, _, _ := adminCA.issue(t, f.dir, "operator3", "", nil, x509.ExtKeyUsageClientAuth) // cert-manager without commonName
	addr := "https://" + f.p.AdminAddr().String()
	cases := []struct {
		name string
		cert *tls.Certificate
		ok   bool
	}{
		{"admin client certificate", &operator, true},
		// The handshake accepts the chain it is sent; the per-request check refused it (401).
		{"admin client certificate from an intermediate CA, chain sent", &viaInter, true},
		// The admin check needs the chain only; the CN was asked for, and its absence was a 401.
		{"admin client certificate without a common name, SANs only", &sansOnly, true},
		{"no certificate", nil, false},
		{"API client certificate from another CA", &alice, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &tls.Config{RootCAs: f.serverCAs}
			if tc.cert != nil {
				cert := tc.cert
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
			}
			c := admin.NewTLSClient(addr, cfg)
			_, err := c.Fence(t.Context(), admin.FenceRequest{Fenced: true, Reason: "over mTLS"})
			if (err == nil) != tc.ok {
				t.Fatalf("fence on over mTLS: %v, want ok=%v", err, tc.ok)
			}
		})
	}
	if st := f.p.Status(); !st.Fenced || st.Reason != "over mTLS" {
		t.Fatalf("status = %+v", st)
	}
}

// TestAdminClientCertExpiryPerRequest: the admin API over mTLS checks the client certificate on
// every request, not once per connection: a keep-alive connection whose certificate expired
// may not fence the cluster.
func TestAdminClientCertExpiryPerRequest(t *testing.T) {
	var adminCA *testCA
	f := newIdentityFixture(t, func(o *Options, dir string) {
		adminCA = newTestCA(t, dir, "admin-ca")
		o.AdminListen, o.AdminClientCAFile = "127.0.0.1:0", adminCA.pem
	})
	short, _, _ := adminCA.issueUntil(t, f.dir, "short-op", "operator", nil, x509.ExtKeyUsageClientAuth, time.Now().Truncate(time.Second).Add(4*time.Second)) // NotAfter is in whole seconds: 3-4 s from now
	hc := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: f.serverCAs,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &short, nil }}}}
	defer hc.CloseIdleConnections()
	status := "https://" + f.p.AdminAddr().String() + "/v1/status"
	get := func() (int, bool) { return getReused(t, hc, status) }
	if code, _ := get(); code != http.StatusOK {
		t.Fatalf("status with a valid admin certificate: %d", code)
	}
	time.Sleep(time.Until(short.Leaf.NotAfter) + 200*time.Millisecond)
	code, reused := get()
	if !reused {
		t.Fatal("the second request did not reuse the connection: the test shows nothing")
	}
	if code != http.StatusUnauthorized {
		t.Fatalf("status on a kept connection after the certificate expired: %d, want 401", code)
	}
}

// TestResumedWatchChecksTheCertificateAgain: a resuming switch re-issues a watch on the new
// backend with the identity the proxy verified when the watch began. A certificate that has
// expired since (or whose CA is no longer in --client-ca-file) gets no new watch: the watch
// ends, as a new request from that client would get 401. One still valid is resumed as itself.
func TestResumedWatchChecksTheCertificateAgain(t *testing.T) {
	f := newIdentityFixture(t, func(o *Options, _ string) { o.AllowedBackends = []string{"https://127.0.0.1:*"} })
	green := f.newBackend(t)
	alice, _, _ := f.clientCA.issueUntil(t, f.dir, "alice", "alice", nil, x509.ExtKeyUsageClientAuth, time.Now().Truncate(time.Second).Add(4*time.Second)) // 3-4 s from now
	bob, _, _ := f.clientCA.issue(t, f.dir, "bob", "bob", nil, x509.ExtKeyUsageClientAuth)
	f.openWatches(t, &alice, &bob)
	time.Sleep(time.Until(alice.Leaf.NotAfter) + 100*time.Millisecond)
	switchTo(t, f.p, green.URL, true)
	// The switch returns once both left blue; then alice's watch ends and bob's goes on on green.
	waitFor(t, func() bool { st := f.p.Status(); return st.OpenWatches == 1 && st.OpenStreams == 1 })
	var users []string
	for _, r := range green.requests() {
		users = append(users, r.header.Get("X-Remote-User"))
	}
	if !slices.Equal(users, []string{"bob"}) {
		t.Fatalf("the new backend got watches as %q; want bob's only: alice's certificate expired before the switch", users)
	}
}

// TestResumedWatchChecksTheCertificateWhenItAsks: a moved watch asks the new backend only once
// the fence lifts; a client certificate that expired between the switch and then is not sent
// on (the watch ends), though it still verified at the switch.
func TestResumedWatchChecksTheCertificateWhenItAsks(t *testing.T) {
	defer func(d time.Duration) { resumeDeferral = d }(resumeDeferral)
	resumeDeferral = time.Hour // they wait for the fence
	f := newIdentityFixture(t, func(o *Options, _ string) { o.AllowedBackends = []string{"https://127.0.0.1:*"} })
	green := f.newBackend(t)
	alice, _, _ := f.clientCA.issueUntil(t, f.dir, "alice", "alice", nil, x509.ExtKeyUsageClientAuth, time.Now().Truncate(time.Second).Add(5*time.Second)) // NotAfter is in whole seconds: 4-5 s from now
	bob, _, _ := f.clientCA.issue(t, f.dir, "bob", "bob", nil, x509.ExtKeyUsageClientAuth)
	f.openWatches(t, &alice, &bob)
	switchTo(t, f.p, green.URL, true) // the fence stays on: the watches wait to ask green
	if time.Now().After(alice.Leaf.NotAfter) {
		t.Fatal("alice's certificate expired before the switch returned: the test needs a faster machine or a longer certificate")
	}
	time.Sleep(time.Until(alice.Leaf.NotAfter) + 100*time.Millisecond)
	if _, err := f.p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { st := f.p.Status(); return st.OpenWatches == 1 && st.OpenStreams == 1 })
	var users []string
	for _, r := range green.requests() {
		users = append(users, r.header.Get("X-Remote-User"))
	}
	if !slices.Equal(users, []string{"bob"}) {
		t.Fatalf("the new backend got watches as %q; want bob's only: alice's certificate expired before the watch asked it", users)
	}
}

// openWatches opens a watch through the proxy as each of certs, open until the test ends, and
// reads its first event.
func (f *identityFixture) openWatches(t *testing.T, certs ...*tls.Certificate) {
	t.Helper()
	for _, cert := range certs {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", f.proxyURL+"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1", nil)
		resp, err := f.client(cert).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.Contains(line, `"resourceVersion":"5"`) {
			t.Fatalf("first event %q, %v", line, err)
		}
	}
}

// TestIdentityHeadersStrippedByPrefixAsConfigured: kube-apiserver matches
// --requestheader-extra-headers-prefix as configured, without adding a dash; a prefix given
// without one must be stripped from clients the same way, or a client sends extras of its own.
func TestIdentityHeadersStrippedByPrefixAsConfigured(t *testing.T) {
	f := newIdentityFixture(t, func(o *Options, _ string) {
		o.RequestHeaderUsername, o.RequestHeaderGroup = []string{"X-Auth-User"}, []string{"X-Auth-Group"}
		o.RequestHeaderExtraPrefix = []string{"X-Auth-Extra"}
	})
	alice, _, _ := f.clientCA.issue(t, f.dir, "alice", "alice", []string{"dev"}, x509.ExtKeyUsageClientAuth)
	cases := []struct{ name, header string }{
		{"extra without a dash", "X-Auth-Extrascopes"},
		{"extra with a dash", "X-Auth-Extra-Scopes"},
		{"extra in another case", "x-auth-extrafoo"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", f.proxyURL+"/api/v1/namespaces", nil)
			req.Header.Set(tc.header, "*")
			req.Header.Set("X-Auth-User", "root")
			resp, err := f.client(&alice).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			reqs := f.backend.requests()
			if resp.StatusCode != 200 || len(reqs) == 0 {
				t.Fatalf("GET = %d, backend saw %d requests", resp.StatusCode, len(reqs))
			}
			got := reqs[len(reqs)-1].header
			if v := got.Values(tc.header); len(v) != 0 {
				t.Errorf("client-sent %s reached the backend: %v", tc.header, v)
			}
			if u := got.Values("X-Auth-User"); strings.Join(u, ",") != "alice" {
				t.Errorf("X-Auth-User = %v, want [alice]", u)
			}
		})
	}
}
