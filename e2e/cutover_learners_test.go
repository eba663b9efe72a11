//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// TestCutoverLearners: green is three members (TLS) of which only the first is restored from
// the snapshot; the second joins as a learner that kubefence starts, the third as an external
// learner that "its host" starts (this test, with the command the cutover prints). Each is
// promoted once it has caught up. The replicating cutover then finishes with a writer through
// the proxy: three voting members, all at one revision, every acknowledged write on green.
func TestCutoverLearners(t *testing.T) {
	f := newCutoverFixture(t)
	env := f.env
	var err error
	if f.green, err = env.WriteCutoverPlan("green3", f.pki, f.px, f.blue.api, f.blue.etcd, framework.Etcd36, 3); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = framework.StopCutoverProcesses(f.green.Plan.StateDir) })
	cs := f.replicatePlan(t)
	m := f.green.Plan.Green.Etcd.Members
	m[1].Learner = true
	m[2].Learner, m[2].External = true, true
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	// A writer at 50 writes/s: three TLS members on two shared cores replicate far fewer
	// revisions per second than one, and an unbounded writer would outrun them.
	_ = cs
	w := startWriter(t, f.proxyClient(t, 50), "repl")
	const startIt = "start it on its host (empty data dir) with: "
	out, err := runScanning(t.Context(), t, []string{"cutover", "--plan", f.green.PlanPath}, func(line string, _ *os.Process) bool {
		if _, argv, ok := strings.Cut(line, startIt); ok { // the external member's host
			args := strings.Fields(argv)
			if _, err := env.Start("external-"+m[2].Name, args[0], args[1:]); err != nil {
				t.Error(err)
			}
		}
		return true
	})
	acked, errs := w.finish()
	t.Logf("kubefence cutover:\n%s", out)
	if err != nil {
		t.Fatalf("cutover with learners: %v", err)
	}
	if !strings.Contains(out, "joined as learners and promoted: "+m[1].Name+", "+m[2].Name) {
		t.Error("the green etcd step does not say both learners joined and were promoted")
	}
	checkGreenVoters(t, f.green, 3)
	if len(errs) > 0 {
		t.Errorf("the writer saw %d errors; first: %v", len(errs), errs[0])
	}
	checkAckedOnGreen(t, f, acked)
	if j, err := cutover.LoadJournal(f.green.Plan.StateDir); err != nil || j.State != cutover.StateDone {
		t.Fatalf("journal: %+v %v", j, err)
	}
}

// checkGreenVoters: green is n voting members (no learner left), none behind the others.
func checkGreenVoters(t *testing.T, g *framework.GreenSetup, n int) {
	t.Helper()
	cli, err := datadir.NewClient(g.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	list, err := cli.MemberList(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, mem := range list.Members {
		if mem.IsLearner {
			t.Errorf("green member %s is still a learner", mem.Name)
		}
	}
	if len(list.Members) != n {
		t.Errorf("green has %d members, want %d", len(list.Members), n)
	}
	// Under writes (a bake, writers through every proxy) the members' revisions, read one after
	// another, differ by what arrived in between, and may never be equal at one read: every
	// member must reach the highest revision the first look saw, so none lags behind.
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	var target int64
	var last string
	err = framework.WaitUntil(ctx, 100*time.Millisecond, "green members at one revision", func(ctx context.Context) (bool, error) {
		sts, err := datadir.ClusterStatus(ctx, cli, g.GreenEtcd)
		if err != nil {
			return false, err
		}
		if target == 0 {
			for _, st := range sts {
				target = max(target, st.Revision)
			}
		}
		last = ""
		for _, st := range sts {
			if st.Revision < target {
				last = fmt.Sprintf("%s at revision %d, below %d", st.Endpoint, st.Revision, target)
			}
		}
		return last == "", nil
	})
	if err != nil {
		t.Errorf("green members not all at revision %d within 15s (last: %s): %v", target, last, err)
	}
}
