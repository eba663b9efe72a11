package cutover

import (
	"net/url"
	"path/filepath"

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
