package cutover

import (
	"context"
	"crypto/x509"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/apimachinery/pkg/util/wait"
)

// startTLSGreen starts a single-member in-process etcd serving TLS with client-certificate
// auth, as green etcd runs in mode replicate, and returns a replicating plan whose green it
// is (kubefence's client certificate has CN kubefence) and a client of it over that
// certificate; both end with the test.
func startTLSGreen(t *testing.T) (*Plan, *clientv3.Client) {
	t.Helper()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	srvCert, srvKey := ca.issue(t, dir, "server", "etcd", []string{"127.0.0.1"}, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	cliCert, cliKey := ca.issue(t, dir, "client", "kubefence", nil, x509.ExtKeyUsageClientAuth)
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "g0", filepath.Join(dir, "g0")
	cfg.Logger, cfg.LogLevel = "zap", "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	c, p := url.URL{Scheme: "https", Host: "127.0.0.1:0"}, url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{c}, []url.URL{c}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{p}, []url.URL{p}
	cfg.InitialCluster = "g0=" + p.String()
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: ca.file, ClientCertAuth: true}
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready in 30 s")
	}
	plan := replicatePlan(t)
	plan.Green.Etcd.TLS = &GreenEtcdTLS{CAFile: ca.file, ClientCertFile: cliCert, ClientKeyFile: cliKey}
	plan.Green.Etcd.Members[0].ClientURL = "https://" + e.Clients[0].Addr().String()
	plan.Green.APIServer.EtcdUser = DefaultGreenEtcdUser
	cli, err := newEtcdClient(plan.greenConn())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return plan, cli
}

// leasedKey puts key on a lease of ttl seconds and returns the revision after it.
func leasedKey(t *testing.T, cli *clientv3.Client, key string, ttl int64) int64 {
	t.Helper()
	l, err := cli.Grant(t.Context(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(t.Context(), key, "10.0.0.2", clientv3.WithLease(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// keyGoneWithin polls until key is gone, up to d; it says whether it went.
func keyGoneWithin(t *testing.T, cli *clientv3.Client, key string, d time.Duration) bool {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, d, true, func(ctx context.Context) (bool, error) {
		resp, err := cli.Get(ctx, key)
		return err == nil && len(resp.Kvs) == 0, nil
	})
	return err == nil
}

// tableStep is the step named name in table.
func tableStep(t *testing.T, table []step, name string) step {
	t.Helper()
	for _, s := range table {
		if s.name() == name {
			return s
		}
	}
	t.Fatalf("no step %s", name)
	return nil
}

// TestAuthStepsHoldGreensLeases: every step between green's start and replication's holds
// green's restored leases when it runs (a --resume starting there), in every table.
func TestAuthStepsHoldGreensLeases(t *testing.T) {
	for name, table := range map[string][]step{"replicate": replicateSteps, "bake": bakeSteps} {
		between := false
		for _, s := range table {
			switch s.name() {
			case StepGreenEtcd:
				between = true
				continue
			case StepReplicate:
				between = false
			}
			if _, holds := s.(holdsGreenLeases); between && !holds {
				t.Errorf("%s: step %s runs without holding green's leases", name, s.name())
			}
		}
	}
}

// resumedAtGreenAuth is a runner of a cutover resumed after its green-etcd step (green started
// at the snapshot's revision rev by the process that died).
func resumedAtGreenAuth(p *Plan, rev int64) *runner {
	j := &Journal{ID: "x", State: StateRunning, GreenPIDs: map[string]int{}, SnapshotRevision: rev}
	for _, s := range []string{StepPreflight, StepCopy, StepMigrate, StepGreenEtcd} {
		j.Done = append(j.Done, StepRecord{Step: s})
	}
	return (&runner{o: Options{Plan: p, Resume: true}, p: p, j: j, steps: replicateSteps}).forward()
}

// TestResumedGreenAuthHoldsGreensLeases: the first run keeps green's copies of blue's leases
// alive from green's start until replication takes them over; a run resumed at the green-auth
// step holds them too, or a lease that ran out on green meanwhile (kube-apiserver's master
// leases live 15 s) is a revision of green's own, and the cutover aborts.
func TestResumedGreenAuthHoldsGreensLeases(t *testing.T) {
	p, cli := startTLSGreen(t)
	const ttl = 2
	rev := leasedKey(t, cli, "/registry/masterleases/10.0.0.2", ttl)
	r := resumedAtGreenAuth(p, rev)
	defer r.releaseGreenHold()
	if _, err := tableStep(t, replicateSteps, StepGreenAuth).run(t.Context(), r); err != nil {
		t.Fatalf("resumed green-auth step: %v", err)
	}
	// Until the replicate step takes the hold over.
	if keyGoneWithin(t, cli, "/registry/masterleases/10.0.0.2", 3*ttl*time.Second) {
		t.Fatal("the lease ran out on green after the resumed green-auth step: nothing kept it alive")
	}
	if got, err := r.readRevision(t.Context(), cli); err != nil || got != rev {
		t.Errorf("green at revision %d (%v), want the snapshot's %d", got, err, rev)
	}
}

// TestGreenAuthSaysWhatMovedGreen: green past the snapshot's revision at the green-auth step is
// refused, saying what moved it: a lease green let run out while no process kept it alive (the
// cutover process stopped for longer than its TTL before --resume), or a write.
func TestGreenAuthSaysWhatMovedGreen(t *testing.T) {
	const lease = "/registry/masterleases/10.0.0.3"
	for _, tc := range []struct {
		name string
		// move moves green past the snapshot's revision; the snapshot holds lease's key.
		move      func(t *testing.T, cli *clientv3.Client)
		want, not []string
	}{
		{"a lease ran out", func(t *testing.T, cli *clientv3.Client) {
			if !keyGoneWithin(t, cli, lease, 30*time.Second) {
				t.Fatal("the lease did not run out")
			}
		}, []string{"lease", "ran out", lease, "nothing kept", "run the cutover again"}, []string{"something wrote"}},
		{"a write", func(t *testing.T, cli *clientv3.Client) {
			if _, err := cli.Put(t.Context(), "/registry/configmaps/default/x", "v"); err != nil {
				t.Fatal(err)
			}
		}, []string{"something wrote to green", "/registry/configmaps/default/x"}, []string{"ran out"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, cli := startTLSGreen(t)
			rev := leasedKey(t, cli, lease, 2)
			tc.move(t, cli)
			r := resumedAtGreenAuth(p, rev)
			defer r.releaseGreenHold()
			_, err := tableStep(t, replicateSteps, StepGreenAuth).run(t.Context(), r)
			if err == nil {
				t.Fatal("green past the snapshot's revision was not refused")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: lacks %q", err, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(err.Error(), n) {
					t.Errorf("%v: says %q", err, n)
				}
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%v: timed out", err)
			}
		})
	}
}
