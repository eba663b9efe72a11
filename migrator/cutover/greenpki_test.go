package cutover

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA signs certificates for the tests' green etcd PKI.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

var testSerial int64

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	ca := &testCA{file: filepath.Join(dir, name+".crt")}
	ca.cert, ca.key = issueTestCert(t, nil, &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, ca.file, "")
	return ca
}

// issue writes name.crt and name.key into dir: a certificate for cn, valid for ips, with usages.
func (ca *testCA) issue(t *testing.T, dir, name, cn string, ips []string, usages ...x509.ExtKeyUsage) (string, string) {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: cn}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	c, k := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	issueTestCert(t, ca, tmpl, c, k)
	return c, k
}

func issueTestCert(t *testing.T, ca *testCA, tmpl *x509.Certificate, certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	testSerial++
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = big.NewInt(testSerial), time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if keyFile != "" {
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

// TestGreenTLSMaterial: the preflight loads green etcd's certificates and keys and checks what
// etcd and the cutover will need of them, so that a wrong file is found before anything runs,
// not at the start of green etcd (in snapshot mode with writes fenced).
func TestGreenTLSMaterial(t *testing.T) {
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	client := x509.ExtKeyUsageClientAuth
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, dir string, ca *testCA, tls *GreenEtcdTLS)
		want string // "" for none
	}{
		{"kubeadm's layout", func(*testing.T, string, *testCA, *GreenEtcdTLS) {}, ""},
		{"a server certificate for another host", func(t *testing.T, dir string, ca *testCA, tls *GreenEtcdTLS) {
			tls.ServerCertFile, tls.ServerKeyFile = ca.issue(t, dir, "other", "etcd-server", []string{"10.9.9.9"}, both...)
		}, "green.etcd.tls.serverCertFile does not cover 127.0.0.1"},
		{"another CA", func(t *testing.T, dir string, _ *testCA, tls *GreenEtcdTLS) {
			tls.CAFile = newTestCA(t, dir, "other-ca").file
		}, "not signed by green.etcd.tls.caFile"},
		{"a key of another certificate", func(_ *testing.T, _ string, _ *testCA, tls *GreenEtcdTLS) {
			tls.PeerKeyFile = tls.ServerKeyFile
		}, "green.etcd.tls.peerCertFile and peerKeyFile"},
		{"a serving certificate an intermediate CA signed, the chain in its file", func(t *testing.T, dir string, ca *testCA, tls *GreenEtcdTLS) {
			inter := &testCA{file: filepath.Join(dir, "intermediate.crt")}
			inter.cert, inter.key = issueTestCert(t, ca, &x509.Certificate{Subject: pkix.Name{CommonName: "etcd-intermediate"}, IsCA: true,
				BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, inter.file, "")
			tls.ServerCertFile, tls.ServerKeyFile = inter.issue(t, dir, "chained", "etcd-server", []string{"127.0.0.1"}, both...)
			leaf, err := os.ReadFile(tls.ServerCertFile)
			if err != nil {
				t.Fatal(err)
			}
			chain, err := os.ReadFile(inter.file)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(tls.ServerCertFile, append(leaf, chain...), 0o644); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"kubefence's client certificate is the apiserver's", func(t *testing.T, dir string, ca *testCA, tls *GreenEtcdTLS) {
			tls.ClientCertFile, tls.ClientKeyFile = ca.issue(t, dir, "apiserver-etcd-client", DefaultGreenEtcdUser, nil, client)
		}, "the same as the green apiserver's etcd user"},
		{"a client certificate that is no client's", func(t *testing.T, dir string, ca *testCA, tls *GreenEtcdTLS) {
			tls.ClientCertFile, tls.ClientKeyFile = ca.issue(t, dir, "serving-only", "kube-etcd-healthcheck-client", nil, x509.ExtKeyUsageServerAuth)
		}, "green.etcd.tls.clientCertFile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := replicatePlan(t)
			p.Green.APIServer.EtcdUser = DefaultGreenEtcdUser // as parsing sets it
			dir := t.TempDir()
			ca := newTestCA(t, dir, "ca")
			tls := &GreenEtcdTLS{CAFile: ca.file}
			tls.ServerCertFile, tls.ServerKeyFile = ca.issue(t, dir, "server", "etcd-server", []string{"127.0.0.1"}, both...)
			tls.PeerCertFile, tls.PeerKeyFile = ca.issue(t, dir, "peer", "etcd-peer", []string{"127.0.0.1"}, both...)
			tls.ClientCertFile, tls.ClientKeyFile = ca.issue(t, dir, "healthcheck-client", "kube-etcd-healthcheck-client", nil, client)
			tc.edit(t, dir, ca, tls)
			p.Green.Etcd.TLS = tls
			err := checkGreenTLS(p)
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkGreenTLS = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestGreenAPIServerEtcdIdentity: the preflight reads the CN of the etcd client certificate a
// green apiserver this host starts gives (--etcd-certfile): the write gate makes
// green.apiserver.etcdUser read-only until the switch, so an apiserver that is another user
// either writes freely (kubefence's own, root: replication stops on a mismatch) or is no user
// at all (never ready: the cutover aborts after timeouts.greenAPIServer). Found before anything
// runs instead.
func TestGreenAPIServerEtcdIdentity(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "etcd-ca")
	gated, _ := ca.issue(t, dir, "apiserver-etcd-client", DefaultGreenEtcdUser, nil, x509.ExtKeyUsageClientAuth)
	root, _ := ca.issue(t, dir, "healthcheck-client", "kube-etcd-healthcheck-client", nil, x509.ExtKeyUsageClientAuth)
	for _, tc := range []struct {
		name, certFile string
		want           string // "" for none
	}{
		{"the gated user", gated, ""},
		{"kubefence's own certificate", root, `CN "kube-etcd-healthcheck-client", not green.apiserver.etcdUser "kube-apiserver-etcd-client"`},
		{"a file that is not there", filepath.Join(dir, "missing.crt"), "missing.crt"},
		{"none given", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := replicatePlan(t)
			p.Green.APIServer.EtcdUser = DefaultGreenEtcdUser // as parsing the plan gives it
			if tc.certFile != "" {
				p.Green.APIServer.Command = append(p.Green.APIServer.Command, "--etcd-certfile="+tc.certFile)
			}
			_, err := checkGreenEtcdIdentity(p)
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkGreenEtcdIdentity = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestGreenAPIServerEtcdIdentityInAPod: a static pod's --etcd-certfile is a path inside the
// pod; not found on this host (mounted from elsewhere), it is not refused, and the preflight's
// result says its CN was not checked.
func TestGreenAPIServerEtcdIdentityInAPod(t *testing.T) {
	p := replicatePlan(t)
	p.Green.APIServer.EtcdUser = DefaultGreenEtcdUser
	p.Green.APIServer.Command, p.Green.APIServer.StaticPod = nil, apiserverPod(t, "--etcd-certfile=/in/the/pod/apiserver-etcd-client.crt")
	note, err := checkGreenEtcdIdentity(p)
	if err != nil || !strings.Contains(note, "/in/the/pod/apiserver-etcd-client.crt") || !strings.Contains(note, "not checked") {
		t.Fatalf("checkGreenEtcdIdentity = %q, %v; want no refusal and a note that the CN was not checked", note, err)
	}
}
