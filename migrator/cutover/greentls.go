package cutover

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"

	"github.com/kubefence/kubefence/internal/tlsutil"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// GreenEtcdTLS is green etcd's TLS: the CA that signs every certificate, the members' serving
// and peer certificates, and the client certificate kubefence itself presents (health checks,
// verification). With PKIDir the files default to kubeadm's layout in it
// (/etc/kubernetes/pki/etcd: ca.crt, server.crt/.key, peer.crt/.key, healthcheck-client.crt/.key).
// Clients must present a certificate signed by the CA (--client-cert-auth), and so must peers
// (--peer-client-cert-auth).
type GreenEtcdTLS struct {
	PKIDir         string `yaml:"pkiDir" json:"pkiDir,omitempty"`
	CAFile         string `yaml:"caFile" json:"caFile"`
	ServerCertFile string `yaml:"serverCertFile" json:"serverCertFile"`
	ServerKeyFile  string `yaml:"serverKeyFile" json:"serverKeyFile"`
	PeerCertFile   string `yaml:"peerCertFile" json:"peerCertFile"`
	PeerKeyFile    string `yaml:"peerKeyFile" json:"peerKeyFile"`
	ClientCertFile string `yaml:"clientCertFile" json:"clientCertFile"`
	ClientKeyFile  string `yaml:"clientKeyFile" json:"clientKeyFile"`
}

// setDefaults fills the files PKIDir implies.
func (t *GreenEtcdTLS) setDefaults() {
	if t == nil || t.PKIDir == "" {
		return
	}
	def := func(f *string, name string) {
		if *f == "" {
			*f = filepath.Join(t.PKIDir, name)
		}
	}
	def(&t.CAFile, "ca.crt")
	def(&t.ServerCertFile, "server.crt")
	def(&t.ServerKeyFile, "server.key")
	def(&t.PeerCertFile, "peer.crt")
	def(&t.PeerKeyFile, "peer.key")
	def(&t.ClientCertFile, "healthcheck-client.crt")
	def(&t.ClientKeyFile, "healthcheck-client.key")
}

// files names every file with its plan field.
func (t *GreenEtcdTLS) files() []planPath {
	if t == nil {
		return nil
	}
	return []planPath{
		{"green.etcd.tls.caFile", t.CAFile, aFile},
		{"green.etcd.tls.serverCertFile", t.ServerCertFile, aFile},
		{"green.etcd.tls.serverKeyFile", t.ServerKeyFile, aFile},
		{"green.etcd.tls.peerCertFile", t.PeerCertFile, aFile},
		{"green.etcd.tls.peerKeyFile", t.PeerKeyFile, aFile},
		{"green.etcd.tls.clientCertFile", t.ClientCertFile, aFile},
		{"green.etcd.tls.clientKeyFile", t.ClientKeyFile, aFile},
	}
}

// validateGreenTLS refuses a green etcd that would serve in clear: after the cutover it is the
// production etcd, holding every Secret. Plain http:// URLs need insecure: true (tests, demos).
func (p *Plan) validateGreenTLS(ps *problems) {
	g := p.Green.Etcd
	wantScheme := "https"
	if g.Insecure {
		wantScheme = "http"
		if g.TLS != nil {
			ps.add("green.etcd: insecure: true and tls exclude each other")
		}
	} else if g.TLS == nil {
		ps.add("green.etcd.tls is required: green etcd becomes the production etcd and must serve TLS with client-certificate auth " +
			"(give tls.pkiDir for kubeadm's /etc/kubernetes/pki/etcd layout, or each file); insecure: true allows plain http:// (tests and demos only)")
	}
	for _, f := range g.TLS.files() {
		if f.path == "" {
			ps.add("%s is required (or tls.pkiDir)", f.field)
		}
	}
	for i, m := range g.Members {
		for _, f := range [][2]string{{"clientURL", m.ClientURL}, {"peerURL", m.PeerURL}} {
			if u, err := url.Parse(f[1]); err == nil && u.Scheme != "" && u.Scheme != wantScheme {
				ps.add("green.etcd.members[%d].%s %s: want %s:// (%s)", i, f[0], f[1], wantScheme, schemeWhy(g.Insecure))
			}
		}
	}
}

func schemeWhy(insecure bool) string {
	if insecure {
		return "insecure: true serves plain http"
	}
	return "green etcd serves TLS; insecure: true for plain http in tests"
}

// greenConn is how kubefence connects to green etcd: its client URLs, with its client
// certificate when green serves TLS.
func (p *Plan) greenConn() datadir.ConnSpec {
	spec := datadir.ConnSpec{}
	for _, m := range p.Green.Etcd.Members {
		spec.Endpoints = append(spec.Endpoints, m.ClientURL)
	}
	if t := p.Green.Etcd.TLS; t != nil {
		spec.CAFile, spec.CertFile, spec.KeyFile = t.CAFile, t.ClientCertFile, t.ClientKeyFile
	}
	return spec
}

// tlsArgs are etcd's flags for green's TLS: clients and peers must present certificates.
func (t *GreenEtcdTLS) tlsArgs() []string {
	if t == nil {
		return nil
	}
	return []string{
		"--trusted-ca-file", t.CAFile, "--cert-file", t.ServerCertFile, "--key-file", t.ServerKeyFile, "--client-cert-auth",
		"--peer-trusted-ca-file", t.CAFile, "--peer-cert-file", t.PeerCertFile, "--peer-key-file", t.PeerKeyFile, "--peer-client-cert-auth",
	}
}

// checkGreenTLS loads green etcd's TLS files and checks what etcd and the cutover need of
// them: each certificate goes with its key and is signed by the CA for its use (serving:
// server auth; peer: server and client auth; kubefence's own: client auth); the serving and
// peer certificates cover this host's members' URLs; and kubefence's certificate's CN, its
// etcd user once auth is on (mode replicate), is not the green apiserver's.
func checkGreenTLS(p *Plan) error {
	t := p.Green.Etcd.TLS
	if t == nil {
		return nil
	}
	roots, err := tlsutil.LoadCAPool(t.CAFile)
	if err != nil {
		return fmt.Errorf("green.etcd.tls.caFile: %w", err)
	}
	var errs []error
	load := func(what, cert, key string, usages ...x509.ExtKeyUsage) *x509.Certificate {
		c, err := loadSignedPair(roots, cert, key, usages)
		if err != nil {
			errs = append(errs, fmt.Errorf("green.etcd.tls.%sCertFile and %sKeyFile: %w", what, what, err))
		}
		return c
	}
	server := load("server", t.ServerCertFile, t.ServerKeyFile, x509.ExtKeyUsageServerAuth)
	peer := load("peer", t.PeerCertFile, t.PeerKeyFile, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	self := load("client", t.ClientCertFile, t.ClientKeyFile, x509.ExtKeyUsageClientAuth)
	for _, m := range p.Green.Etcd.Members {
		if m.External {
			continue // its host's certificates
		}
		errs = append(errs, covers(server, "serverCertFile", m.ClientURL), covers(peer, "peerCertFile", m.PeerURL))
	}
	if self != nil && p.Replicating() {
		switch cn := self.Subject.CommonName; cn {
		case "":
			errs = append(errs, fmt.Errorf("green.etcd.tls.clientCertFile %s has no CN: etcd auth takes it as kubefence's user name", t.ClientCertFile))
		case p.Green.APIServer.EtcdUser:
			errs = append(errs, fmt.Errorf("green.etcd.tls.clientCertFile %s has CN %q, the same as the green apiserver's etcd user: give kubefence a certificate of its own (kubeadm's healthcheck-client)", t.ClientCertFile, cn))
		}
	}
	return errors.Join(errs...)
}

// loadSignedPair loads a certificate with its key and verifies it against roots for each of
// usages.
func loadSignedPair(roots *x509.CertPool, cert, key string, usages []x509.ExtKeyUsage) (*x509.Certificate, error) {
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	inter := x509.NewCertPool() // the chain the file carries after its certificate, as etcd sends it
	for _, der := range kp.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cert, err)
		}
		inter.AddCert(c)
	}
	for _, u := range usages {
		if _, err := kp.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return nil, fmt.Errorf("%s is not signed by green.etcd.tls.caFile for %s: %w", cert, usageName(u), err)
		}
	}
	return kp.Leaf, nil
}

func usageName(u x509.ExtKeyUsage) string {
	if u == x509.ExtKeyUsageServerAuth {
		return "serving"
	}
	return "client use"
}

// covers says whether c (nil: already refused) is valid for u's host.
func covers(c *x509.Certificate, field, u string) error {
	pu, err := url.Parse(u)
	if c == nil || err != nil {
		return nil
	}
	if err := c.VerifyHostname(pu.Hostname()); err != nil {
		return fmt.Errorf("green.etcd.tls.%s does not cover %s (%s): %w", field, pu.Hostname(), u, err)
	}
	return nil
}
