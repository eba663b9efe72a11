package cutover

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestBakeKeptWhenItsJournalCannotBeWritten: a bake plan whose state dir cannot be written from
// gate-blue on (a full disk at the switch; here the dir replaced by a file) does not give the
// way back up for it: past the switch a failed save is kept (saveWindow), so the hand-over's
// record of the bake is too. Blue follows green in this process, whose report says that the
// journal lacks the bake, not that blue cannot follow; once the dir is writable again, the
// process's stop writes the bake into the journal, which a --resume picks up.
func TestBakeKeptWhenItsJournalCannotBeWritten(t *testing.T) {
	p, _ := bothSidesPlan(t, false)
	j := journalThrough(p, bakeSteps, StepGateBlue, time.Now().UTC())
	var calls []string
	st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
	r := (&runner{o: Options{Plan: p}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: bakeSteps}).forward()
	if err := os.RemoveAll(p.StateDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.StateDir, []byte("not a dir"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var said []string
	var first *Report
	r.o.Emit = func(e Event) {
		said = append(said, e.Detail)
		if e.Type != EventReport || first != nil {
			return
		}
		first = e.Report
		said = append(said, e.Report.Error, e.Report.Next)
		// The operator frees the disk, then stops the baking process.
		if err := os.Remove(p.StateDir); err != nil {
			t.Error(err)
		}
		if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
			t.Error(err)
		}
		cancel()
	}
	rep, err := r.run(ctx)
	all := strings.Join(said, "\n")
	if strings.Contains(all, "blue cannot follow") || strings.Contains(all, "NO WAY BACK") {
		t.Errorf("the bake was given up for the journal:\n%s", all)
	}
	if st.Fenced || r.j.Bake == nil || r.j.NoBake != "" {
		t.Fatalf("proxy %+v, bake %+v, noBake %q: want writes open and the bake kept", *st, r.j.Bake, r.j.NoBake)
	}
	if first == nil || first.Result != ResultBaking || !strings.Contains(first.Error+first.Next, "journal") || !strings.Contains(first.Next, "--resume") {
		t.Fatalf("first report %+v: want baking, saying the journal lacks the bake and what to do", first)
	}
	if err != nil || rep.Result != ResultBaking {
		t.Errorf("stopped: %+v, %v; want baking", rep, err)
	}
	disk, err := LoadJournal(p.StateDir)
	if err != nil || disk.Bake == nil || disk.State != StateBaking || !disk.done(StepUnfence) {
		t.Errorf("journal on disk once writable %+v, %v: want the bake, baking, through the unfence", disk, err)
	}
}
