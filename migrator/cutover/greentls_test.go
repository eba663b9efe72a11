package cutover

import (
	"fmt"
	"os"
	"slices"
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

// TestLearnerMembers: learners are not restored; each starts with the restored members, the
// learners before it and itself as its initial cluster, in state existing; the plan refuses an
// external member that is not a learner and a learner first.
func TestLearnerMembers(t *testing.T) {
	threeMembers := func(p *Plan) {
		g0 := p.Green.Etcd.Members[0]
		for i := 1; i <= 2; i++ {
			gi := g0
			gi.Name, gi.DataDir = fmt.Sprintf("g%d", i), g0.DataDir+fmt.Sprint(i)
			gi.ClientURL, gi.PeerURL = fmt.Sprintf("http://127.0.0.1:%d", 2579+10*i), fmt.Sprintf("http://127.0.0.1:%d", 2580+10*i)
			p.Green.Etcd.Members = append(p.Green.Etcd.Members, gi)
		}
	}
	p, _ := validPlan(t)
	threeMembers(p)
	p.setDefaults()
	p.Green.Etcd.Members[1].Learner = true
	p.Green.Etcd.Members[2].Learner, p.Green.Etcd.Members[2].External = true, true
	m := p.Green.Etcd.Members
	if got := p.seeds(); len(got) != 1 || got[0].Name != m[0].Name {
		t.Errorf("seeds %v, want only %s", got, m[0].Name)
	}
	cases := []struct {
		member       GreenMember
		wantCluster  string
		wantExisting bool
	}{
		{m[0], m[0].Name + "=" + m[0].PeerURL, false},
		{m[1], m[0].Name + "=" + m[0].PeerURL + "," + m[1].Name + "=" + m[1].PeerURL, true},
		{m[2], m[0].Name + "=" + m[0].PeerURL + "," + m[1].Name + "=" + m[1].PeerURL + "," + m[2].Name + "=" + m[2].PeerURL, true},
	}
	for _, tc := range cases {
		cmd := strings.Join(etcdCommand(p, tc.member), " ")
		if !strings.Contains(cmd, "--initial-cluster "+tc.wantCluster+" ") || strings.Contains(cmd, "--initial-cluster-state existing") != tc.wantExisting {
			t.Errorf("%s: %s", tc.member.Name, cmd)
		}
	}
	bad := []struct {
		change func(*Plan)
		want   string
	}{
		{func(p *Plan) { p.Green.Etcd.Members[1].External = true }, "external needs learner: true"},
		{func(p *Plan) { p.Green.Etcd.Members[0].Learner = true }, "the first member is restored from the snapshot"},
		// A learner's initial cluster is the members before it: a restored one after it is
		// left out, and etcd refuses to start the learner ("member count is unequal").
		{func(p *Plan) { p.Green.Etcd.Members[1].Learner = true }, "restored members come before the learners"},
		// One port, written two ways: the plan must see it, not green's start in the window.
		{func(p *Plan) {
			p.Green.Etcd.Members[1].PeerURL = strings.Replace(p.Green.Etcd.Members[0].ClientURL, "127.0.0.1", "localhost", 1)
		}, "the same address as green.etcd.members[0].clientURL"},
		{func(p *Plan) { p.Green.Etcd.Members[2].MetricsURL = p.Green.Etcd.Members[1].ClientURL + "/" }, "the same address as green.etcd.members[1].clientURL"},
		{func(p *Plan) {
			p.Green.Etcd.Members[2].PeerURL = strings.Replace(p.Green.APIServer.URL, "https:", "http:", 1)
		}, "the same address as green.apiserver.url"},
	}
	for _, b := range bad {
		q, _ := validPlan(t)
		threeMembers(q)
		b.change(q)
		if errs := q.validate(); !strings.Contains(fmt.Sprint(errs), b.want) {
			t.Errorf("errors %v, want %q", errs, b.want)
		}
	}
}

// TestStartedLearnersStartAgain: a resume after green's processes died (a reboot) starts again
// the learners a run before started, with the restored members and before waiting for them:
// a promoted learner votes, and the restored members alone may have no quorum. A learner never
// started here, or started by its own host, is left to the join.
func TestStartedLearnersStartAgain(t *testing.T) {
	p, _ := validPlan(t)
	g0 := p.Green.Etcd.Members[0]
	for i, ext := range []bool{false, false, true} {
		m := g0
		m.Name, m.DataDir, m.Learner, m.External = fmt.Sprintf("l%d", i), g0.DataDir+fmt.Sprint(i), true, ext
		m.ClientURL, m.PeerURL = fmt.Sprintf("http://127.0.0.1:%d", 2589+10*i), fmt.Sprintf("http://127.0.0.1:%d", 2590+10*i)
		p.Green.Etcd.Members = append(p.Green.Etcd.Members, m)
	}
	var started []string
	procs := fakeProcesses(map[int]bool{}, new([]int))
	procs.start = func(argv []string, _ string) (int, error) {
		started = append(started, argv[slices.Index(argv, "--name")+1])
		return 200 + len(started), nil
	}
	// l0 was started (and maybe promoted) before; l1 never was; l2 is started by its host.
	j := &Journal{ID: "x", GreenPIDs: map[string]int{"l0": 123, "l2": 0}}
	r := (&runner{p: p, j: j, procs: procs, o: Options{Plan: p}}).forward()
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	gps, err := r.restartLearners(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(started, []string{"l0"}) || len(gps) != 1 || j.GreenPIDs["l0"] != 201 {
		t.Fatalf("started %v (watching %d), journal %v; want l0 started again", started, len(gps), j.GreenPIDs)
	}
}
