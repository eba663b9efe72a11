//go:build e2e

package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
)

// TestCutoverRehearse: --rehearse does everything before the fence and tears green down: the
// proxy is never fenced nor switched, no green process is left, the data dirs it restored are
// gone, and the journal says what it predicted. The real cutover then runs from the same plan
// and state dir. A rehearsal killed mid-way leaves green running: `cutover abort` stops it
// (cleanup refuses a cutover in progress; TestCutoverCleanup).
func TestCutoverRehearse(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	cs := f.replicatePlan(t)
	w := startWriter(t, cs, "repl")
	before, err := f.px.Admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := f.cutoverCmd(ctx, "--rehearse")
	t.Logf("kubefence cutover --rehearse:\n%s", out)
	if err != nil {
		t.Fatalf("rehearsal: %v", err)
	}
	st, err := f.px.Admin.Status(ctx)
	if err != nil || st.Fenced || st.Backend != f.blue.api.URL || st.Generation != before.Generation {
		t.Fatalf("proxy after the rehearsal: %+v %v; want never fenced nor switched (generation %d)", st, err, before.Generation)
	}
	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != cutover.StateRehearsed || j.Rehearsal == nil || j.Rehearsal.PredictedWindow <= 0 {
		t.Fatalf("journal after the rehearsal: state %s, rehearsal %+v", j.State, j.Rehearsal)
	}
	checkGreenGone(t, f, j, "the rehearsal")
	predicted := j.Rehearsal.PredictedWindow
	out, err = f.cutoverCmd(ctx)
	t.Logf("kubefence cutover:\n%s", out)
	if err != nil {
		t.Fatalf("cutover after the rehearsal: %v", err)
	}
	acked, errs := w.finish()
	if len(errs) > 0 {
		t.Errorf("the writer saw %d errors; first: %v", len(errs), errs[0])
	}
	checkAckedOnGreen(t, f, acked)
	if j, err = cutover.LoadJournal(f.green.Plan.StateDir); err == nil {
		t.Logf("predicted window %s, window %s", predicted, j.UnfencedAt.Sub(j.FencedAt))
	}
}

// TestCutoverCleanup: a rehearsal killed after green started is a cutover in progress: cleanup
// refuses it; after the abort (which stops green and leaves its data dirs for inspection),
// cleanup --remove-data-dirs removes the data dirs that cutover restored.
func TestCutoverCleanup(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	f.replicatePlan(t)
	killAtStep(t, f, cutover.StepVerify, "--rehearse")
	cleanup := func() (string, error) {
		return runKubefence(ctx, "cutover", "cleanup", "--plan", f.green.PlanPath, "--remove-data-dirs")
	}
	if out, err := cleanup(); err == nil || !strings.Contains(out, "in progress") {
		t.Fatalf("cleanup of a cutover in progress: %v\n%s", err, out)
	}
	if out, err := runKubefence(ctx, "cutover", "abort", "--plan", f.green.PlanPath); err != nil {
		t.Fatalf("abort: %v\n%s", err, out)
	}
	out, err := cleanup()
	t.Logf("kubefence cutover cleanup:\n%s", out)
	if err != nil || !strings.Contains(out, "removed") {
		t.Fatalf("cleanup: %v", err)
	}
	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	checkGreenGone(t, f, j, "abort and cleanup")
}

// checkGreenGone checks that no green process of journal j runs and no green data dir is left.
func checkGreenGone(t *testing.T, f *cutoverFixture, j *cutover.Journal, after string) {
	t.Helper()
	for name, pid := range j.GreenPIDs {
		if framework.Running(pid) {
			t.Errorf("green %s (pid %d) still runs after %s", name, pid, after)
		}
	}
	for _, m := range f.green.Plan.Green.Etcd.Members {
		if _, err := os.Stat(m.DataDir); !os.IsNotExist(err) {
			t.Errorf("green data dir %s left after %s: %v", m.DataDir, after, err)
		}
	}
}
