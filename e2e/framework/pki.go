package framework

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is a cluster PKI laid out the way kubeadm lays out /etc/kubernetes/pki, plus an admin
// client certificate, a bearer token and a serving certificate for the kubefence proxy.
type PKI struct {
	Dir string

	CACert, CAKey                     string // ca.crt, ca.key: cluster CA (serving and client certs)
	APIServerCert, APIServerKey       string // apiserver.crt/key
	FrontProxyCACert                  string // front-proxy-ca.crt: --requestheader-client-ca-file
	FrontProxyClientCert              string // front-proxy-client.crt/key: CN front-proxy-client
	FrontProxyClientKey               string
	SAKey, SAPub                      string // sa.key, sa.pub
	AdminCert, AdminKey               string // admin.crt/key: CN kubernetes-admin, O system:masters
	ProxyServingCert, ProxyServingKey string // kubefence-proxy.crt/key
	TokenFile                         string // static tokens for --token-auth-file
	AdminToken                        string // bearer token of user "token-admin" in system:masters
	// EtcdDir holds green etcd's PKI in kubeadm's layout (etcd/ca.crt, server, peer,
	// healthcheck-client); APIServerEtcdClientCert/Key is the apiserver's client certificate.
	EtcdDir                                         string
	EtcdCACert                                      string
	APIServerEtcdClientCert, APIServerEtcdClientKey string

	ca, frontCA *issuer
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewPKI writes a fresh PKI into dir; the serving certificates cover 127.0.0.1, the
// kubernetes Service's names and IP, and extraIPs (nodes' addresses; etcd's certificates too).
func NewPKI(dir string, extraIPs ...net.IP) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir}
	var err error
	if p.ca, err = p.newCA("kubernetes", "ca"); err != nil {
		return nil, err
	}
	if p.frontCA, err = p.newCA("front-proxy-ca", "front-proxy-ca"); err != nil {
		return nil, err
	}
	p.CACert, p.CAKey = p.path("ca.crt"), p.path("ca.key")
	p.FrontProxyCACert = p.path("front-proxy-ca.crt")
	serverIPs := append([]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")}, extraIPs...)
	serverNames := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	if p.APIServerCert, p.APIServerKey, err = p.issue(p.ca, "apiserver", "kube-apiserver", nil, serverNames, serverIPs, x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	if p.ProxyServingCert, p.ProxyServingKey, err = p.issue(p.ca, "kubefence-proxy", "kubefence-proxy", nil, serverNames, serverIPs, x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	if p.FrontProxyClientCert, p.FrontProxyClientKey, err = p.issue(p.frontCA, "front-proxy-client", "front-proxy-client", nil, nil, nil, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, err
	}
	if p.AdminCert, p.AdminKey, err = p.issue(p.ca, "admin", "kubernetes-admin", []string{"system:masters"}, nil, nil, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	p.SAKey, p.SAPub = p.path("sa.key"), p.path("sa.pub")
	if err := writeKey(p.SAKey, saKey); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.SAPub, "PUBLIC KEY", pub, 0o644); err != nil {
		return nil, err
	}
	if err := p.etcdPKI(extraIPs); err != nil {
		return nil, err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	p.AdminToken = hex.EncodeToString(tok)
	p.TokenFile = p.path("tokens.csv")
	if err := os.WriteFile(p.TokenFile, []byte(p.AdminToken+",token-admin,token-admin-uid,\"system:masters\"\n"), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

// IssueClient writes a client certificate for user (CN) in groups (O) signed by the cluster CA.
func (p *PKI) IssueClient(name, user string, groups ...string) (cert, key string, err error) {
	return p.issue(p.ca, name, user, groups, nil, nil, x509.ExtKeyUsageClientAuth)
}

func (p *PKI) path(name string) string { return filepath.Join(p.Dir, name) }

func (p *PKI) newCA(cn, file string) (*issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path(file+".crt"), "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	if err := writeKey(p.path(file+".key"), key); err != nil {
		return nil, err
	}
	return &issuer{cert: cert, key: key}, nil
}

// etcdPKI writes an etcd CA and certificates in kubeadm's layout under Dir/etcd, and the
// apiserver's etcd client certificate.
func (p *PKI) etcdPKI(extraIPs []net.IP) error {
	p.EtcdDir = p.path("etcd")
	if err := os.MkdirAll(p.EtcdDir, 0o700); err != nil {
		return err
	}
	ca, err := p.newCA("etcd-ca", "etcd/ca")
	if err != nil {
		return err
	}
	p.EtcdCACert = p.path("etcd/ca.crt")
	ips := append([]net.IP{net.ParseIP("127.0.0.1")}, extraIPs...)
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, c := range []struct {
		file, cn string
		usages   []x509.ExtKeyUsage
	}{
		{"etcd/server", "etcd-server", both},
		{"etcd/peer", "etcd-peer", both},
		{"etcd/healthcheck-client", "kube-etcd-healthcheck-client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
	} {
		if _, _, err := p.issue(ca, c.file, c.cn, nil, []string{"localhost"}, ips, c.usages...); err != nil {
			return err
		}
	}
	p.APIServerEtcdClientCert, p.APIServerEtcdClientKey, err = p.issue(ca, "apiserver-etcd-client", "kube-apiserver-etcd-client", nil, nil, nil, x509.ExtKeyUsageClientAuth)
	return err
}

func (p *PKI) issue(ca *issuer, file, cn string, orgs, dns []string, ips []net.IP, usages ...x509.ExtKeyUsage) (string, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usages,
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", err
	}
	certPath, keyPath := p.path(file+".crt"), p.path(file+".key")
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return "", "", err
	}
	if err := writeKey(keyPath, key); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
