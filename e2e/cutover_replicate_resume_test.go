//go:build e2e

package e2e

import (
	"testing"
	"time"

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
	w := startWriter(cs, "repl")
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
