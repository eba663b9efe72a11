//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// TestCutoverReplicateResume: kill -9 of the cutover process during replication (green's
// apiserver starting), a write made straight to blue etcd while no replicator runs, then
// --resume: replication is picked up again from green's revision (checked to be blue's), the
// cutover finishes, and blue and green hold the same keys at the switch, the direct write
// among them; every write the client-go writer saw acknowledged is on green.
func TestCutoverReplicateResume(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	cs := f.replicatePlan(t)
	w := startWriter(t, cs, "repl")
	killAtStep(t, f, cutover.StepGreenAPIServer)
	blueCli, err := f.blue.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer blueCli.Close()
	if _, err := blueCli.Put(ctx, "/kubefence-test/while-dead", "no replicator ran"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	out, err := f.cutoverCmd(ctx, "--resume")
	t.Logf("kubefence cutover --resume:\n%s", out)
	if err != nil {
		t.Fatalf("resume after kill -9 during replication: %v", err)
	}
	time.Sleep(time.Second)
	acked, errs := w.finish()
	if len(errs) > 0 {
		t.Errorf("the writer saw %d errors; first: %v", len(errs), errs[0])
	}
	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != cutover.StateDone || j.SwitchRevision == 0 {
		t.Fatalf("journal after resume: %+v", j)
	}
	rec, _ := journalStep(j, cutover.StepGreenAPIServer)
	t.Logf("%s after the resume: %s", cutover.StepGreenAPIServer, rec.Detail)
	greenCli, err := datadir.NewClient(f.green.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer greenCli.Close()
	sameKeysAt(t, blueCli, greenCli, j.SwitchRevision)
	if resp, err := greenCli.Get(ctx, "/kubefence-test/while-dead"); err != nil || len(resp.Kvs) != 1 {
		t.Errorf("the write made straight to blue while no replicator ran, on green: %+v %v", resp, err)
	}
	checkAckedOnGreen(t, f, acked)
}

// TestCutoverReplicateCompaction: blue compacts the history replication still needs (between
// the snapshot and the start of replication): the cutover stops green, removes the data dirs
// it restored and starts again from a new snapshot, then finishes with blue and green at the
// same keys at the switch, the writes made before the compaction among them.
func TestCutoverReplicateCompaction(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	f.replicatePlan(t)
	blueCli, err := f.blue.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer blueCli.Close()
	out, err := f.cutoverWithHook(t, cutover.StepGreenEtcd, func() {
		var rev int64
		for i := range 5 {
			resp, err := blueCli.Put(ctx, fmt.Sprintf("/kubefence-test/before-compaction-%d", i), "x")
			if err != nil {
				t.Error(err)
				return
			}
			rev = resp.Header.Revision
		}
		if _, err := blueCli.Compact(ctx, rev); err != nil {
			t.Error(err)
		}
	})
	t.Logf("kubefence cutover:\n%s", out)
	if err != nil {
		t.Fatalf("cutover with a compaction on blue during replication: %v", err)
	}
	if !strings.Contains(out, "rebuilding green from a new snapshot (1 of at most") {
		t.Errorf("the cutover did not say it rebuilt green")
	}
	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != cutover.StateDone || j.Rebuilds != 1 || j.SwitchRevision == 0 {
		t.Fatalf("journal: state %s, rebuilds %d, switch revision %d", j.State, j.Rebuilds, j.SwitchRevision)
	}
	greenCli, err := datadir.NewClient(f.green.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer greenCli.Close()
	sameKeysAt(t, blueCli, greenCli, j.SwitchRevision)
	if resp, err := greenCli.Get(ctx, "/kubefence-test/before-compaction-", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 5 {
		t.Errorf("writes made before the compaction on green: %+v %v", resp, err)
	}
}

// TestCutoverReplicateAbort: Ctrl-C during replication (green's apiserver starting) aborts:
// replication stopped, green stopped, blue open on its own backend, and the writer through the
// proxy saw no error.
func TestCutoverReplicateAbort(t *testing.T) {
	f := newCutoverFixture(t)
	cs := f.replicatePlan(t)
	w := startWriter(t, cs, "repl")
	out, err := f.signalAtStep(t, cutover.StepGreenAPIServer, os.Interrupt)
	t.Logf("kubefence cutover:\n%s", out)
	if err == nil || !strings.Contains(out, "ABORT at "+cutover.StepGreenAPIServer) || !strings.Contains(out, ": aborted") {
		t.Fatalf("want a clean abort at %s (err %v)", cutover.StepGreenAPIServer, err)
	}
	f.checkAborted(t)
	time.Sleep(500 * time.Millisecond) // writes go on, on blue
	acked, errs := w.finish()
	if len(errs) > 0 || len(acked) == 0 {
		t.Errorf("the writer: %d acknowledged, %d errors (first: %v)", len(acked), len(errs), errs)
	}
}
