package cutover

import (
	"context"
	"os"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestAbortRefusedWhenTheJournalLostTheSwitch: a run whose journal could not be written from its
// switch on finishes the window all the same (saveWindow): green's apiserver may write, the
// proxies are open on green and take writes. The journal on disk still says fenced, drained, no
// switch. An operator's abort then found the proxies "open on green (a fence off by hand?)",
// took green's apiserver for still gated, fenced them again, put them back on blue and opened
// blue: every write green had taken since was gone. It is refused: green's apiserver may write
// green etcd, so writes may have reached green; --resume records the switch and the unfence.
func TestAbortRefusedWhenTheJournalLostTheSwitch(t *testing.T) {
	var stateDir string
	var broken bool
	r, st := switchWorld(t, func(inner funcProxy, ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
		if broken { // once: at the run's switch
			return inner.setBackend(ctx, req)
		}
		broken = true
		if err := os.RemoveAll(stateDir); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(stateDir, []byte("not a dir"), 0o600); err != nil {
			t.Fatal(err)
		}
		return inner.setBackend(ctx, req)
	})
	stateDir = r.p.StateDir
	if _, err := r.run(t.Context()); err == nil || st.Fenced || st.Backend != r.p.Green.APIServer.URL {
		t.Fatalf("run: %v; proxy %+v: want open on green, and an error saying the journal was not written", err, *st)
	}
	// The state dir fixed, its journal as the run last wrote it: through the drain.
	p := r.p
	if err := os.Remove(p.StateDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	j := journalThrough(p, replicateSteps, StepDrain, r.j.FencedAt)
	j.FenceGeneration, j.Verified, j.SnapshotRevision = r.j.FenceGeneration, r.j.Verified, r.j.SnapshotRevision
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	j, err := LoadJournal(p.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	op := (&runner{o: Options{Plan: p, wayBack: true}, p: p, j: j, adm: r.adm, procs: r.procs, steps: replicateSteps}).forward()
	_, err = op.abortByOperator(t.Context())
	if err == nil || !strings.Contains(err.Error(), "--resume") || !strings.Contains(err.Error(), "may write") {
		t.Errorf("abort: %v; want it refused, saying green's apiserver may write and to run --resume", err)
	}
	if st.Fenced || st.Backend != p.Green.APIServer.URL {
		t.Errorf("proxy after the abort %+v: want it left open on green", *st)
	}
}

// gatedGreen gives r a green etcd whose apiserver user holds the read-only role alone, as the
// green-etcd-auth step leaves it until the ungate past the switch: an abort may go back through
// proxies opened by hand on green (nothing reached green through them).
func gatedGreen(t *testing.T, r *runner) {
	t.Helper()
	cli := startTestEtcd(t)
	r.p.Green.APIServer.EtcdUser = "kube-apiserver-etcd-client"
	r.to.api.EtcdUser = r.p.Green.APIServer.EtcdUser // the runner's copy of the plan's green
	if _, err := cli.RoleAdd(t.Context(), readOnlyRole); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserAddWithOptions(t.Context(), r.p.Green.APIServer.EtcdUser, "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(t.Context(), r.p.Green.APIServer.EtcdUser, readOnlyRole); err != nil {
		t.Fatal(err)
	}
	r.authClients = map[string]*clientv3.Client{"green": cli}
}
