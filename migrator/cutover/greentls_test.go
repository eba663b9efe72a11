package cutover

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestGreenEtcdTLS: green etcd becomes the production etcd, so a plan must give it TLS with
// client-certificate auth, or say insecure: true for plain http.
func TestGreenEtcdTLS(t *testing.T) {
	https := func(p *Plan) {
		p.Green.Etcd.Insecure = false
		p.Green.Etcd.Members[0].ClientURL, p.Green.Etcd.Members[0].PeerURL = "https://127.0.0.1:2479", "https://127.0.0.1:2480"
		p.Green.Etcd.TLS = &GreenEtcdTLS{PKIDir: "/etc/kubernetes/pki/etcd"}
	}
	cases := []struct {
		name   string
		mutate func(*Plan)
		want   []string // empty: accepted
	}{
		{"insecure http", func(*Plan) {}, nil},
		{"tls with kubeadm's pki dir", https, nil},
		{"neither tls nor insecure", func(p *Plan) { p.Green.Etcd.Insecure = false }, []string{"green.etcd.tls is required", "clientURL http://127.0.0.1:2479: want https://"}},
		{"tls with http urls", func(p *Plan) { https(p); p.Green.Etcd.Members[0].PeerURL = "http://127.0.0.1:2480" }, []string{"peerURL http://127.0.0.1:2480: want https://"}},
		{"insecure with https urls", func(p *Plan) { p.Green.Etcd.Members[0].ClientURL = "https://127.0.0.1:2479" }, []string{"clientURL https://127.0.0.1:2479: want http://"}},
		{"insecure and tls", func(p *Plan) { https(p); p.Green.Etcd.Insecure = true }, []string{"exclude each other"}},
		{"tls without files", func(p *Plan) { https(p); p.Green.Etcd.TLS = &GreenEtcdTLS{CAFile: "/ca.crt"} }, []string{"green.etcd.tls.serverCertFile is required", "green.etcd.tls.clientKeyFile is required"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			tc.mutate(p)
			data, err := yaml.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ParsePlan(data)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v lacks %q", err, w)
				}
			}
		})
	}
}

func TestGreenEtcdTLSCommandAndConn(t *testing.T) {
	p, _ := validPlan(t)
	p.Green.Etcd.Insecure = false
	p.Green.Etcd.TLS = &GreenEtcdTLS{PKIDir: "/pki"}
	p.Green.Etcd.TLS.setDefaults()
	cmd := strings.Join(etcdCommand(p, p.Green.Etcd.Members[0]), " ")
	for _, want := range []string{"--client-cert-auth", "--peer-client-cert-auth", "--cert-file /pki/server.crt", "--peer-key-file /pki/peer.key", "--trusted-ca-file /pki/ca.crt"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("etcd command %q lacks %q", cmd, want)
		}
	}
	if c := p.greenConn(); c.CertFile != "/pki/healthcheck-client.crt" || c.CAFile != "/pki/ca.crt" || len(c.Endpoints) != 1 {
		t.Errorf("green connection %+v", c)
	}
}
