package cutover

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// rollbackPastItsSwitch is a rollback's runner (budgetPlan: blue etcd answers, green's does not)
// journaled, on disk too, through its switch: one proxy in memory, fenced on blue at the
// switch's generation.
func rollbackPastItsSwitch(t *testing.T) (*runner, *admin.Status) {
	t.Helper()
	p := budgetPlan(t, "blue")
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	main := &Journal{Version: 1, ID: "x", State: StateBaking, PlanHash: p.hash, Bake: &BakeRecord{Revision: 5}, GreenPIDs: map[string]int{}}
	if err := main.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	r, err := newRollbackRunner(Options{Plan: p}, main)
	if err != nil {
		t.Fatal(err)
	}
	r.j.Done = []StepRecord{{Step: StepFence}, {Step: StepDrain}, {Step: StepSwitch}}
	r.j.FencedAt, r.j.FenceGeneration = time.Now().UTC(), 2
	if err := r.saveJournal(); err != nil {
		t.Fatal(err)
	}
	var calls []string
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 3}
	r.adm = memProxy(st, &calls)
	return r, st
}

// TestRollbackJournalLostPastItsSwitchFinishes: a rollback whose journal cannot be written from
// its switch on (a full disk, EIO; here its journal dir replaced by a file: ENOTDIR, as root
// too) does not stop with every proxy fenced on blue, blue's apiserver gated: the window's last
// steps are safe to repeat, so it finishes, writes open on blue, and its report says loudly that
// the journal was not written and what to do. Once the dir is writable again, 'rollback
// --resume' on the journal as last written finishes the journal, the proxy left open on blue.
func TestRollbackJournalLostPastItsSwitchFinishes(t *testing.T) {
	for _, at := range []string{StepGateGreen, StepUnfence} {
		t.Run("from "+at, func(t *testing.T) {
			r, st := rollbackPastItsSwitch(t)
			var onDisk []byte
			breakDir := func() {
				if onDisk != nil {
					return
				}
				var err error
				if onDisk, err = os.ReadFile(journalPath(r.journalDir)); err != nil {
					t.Fatal(err)
				}
				if err := os.RemoveAll(r.journalDir); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(r.journalDir, []byte("not a dir"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if at == StepGateGreen {
				breakDir()
			}
			px := r.adm.(funcProxy)
			fence := px.fence
			px.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
				if !req.Fenced {
					breakDir()
				}
				return fence(ctx, req)
			}
			r.adm = px
			rep, err := r.rollBack(t.Context())
			if st.Fenced || sameURL(st.Backend) != sameURL(r.p.Blue.APIServer.URL) {
				t.Fatalf("rollback: %v; proxy %+v: want open on blue", err, *st)
			}
			if rep == nil || err == nil {
				t.Fatalf("report %+v, %v: want a report, and an error saying the journal was not written", rep, err)
			}
			said := rep.Error + " " + rep.Next
			for _, want := range []string{"journal", "not a directory", "writes are open on blue", "rollback --resume"} {
				if !strings.Contains(said, want) {
					t.Errorf("report %s: %q; want %q", rep.Result, said, want)
				}
			}
			if rep.Result != ResultRolledBack || rep.WriteUnavailability == 0 {
				t.Errorf("report %s, window %s: want rolled-back, the window measured", rep.Result, rep.WriteUnavailability)
			}
			resumeRollbackOnceWritable(t, r, onDisk)
		})
	}
}

// resumeRollbackOnceWritable does what the report of a rollback whose journal could not be
// written says: its dir fixed, its journal as last written (onDisk), 'rollback --resume'
// finishes it, the proxy left open on blue.
func resumeRollbackOnceWritable(t *testing.T, r *runner, onDisk []byte) {
	t.Helper()
	if err := os.Remove(r.journalDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(r.journalDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(journalPath(r.journalDir), onDisk, 0o600); err != nil {
		t.Fatal(err)
	}
	main, err := LoadJournal(r.p.StateDir)
	if err != nil || main.State != StateRollingBack {
		t.Fatalf("the cutover's journal %+v, %v: want it rolling back still", main, err)
	}
	again, err := newRollbackRunner(Options{Plan: r.p, Resume: true}, main)
	if err != nil {
		t.Fatal(err)
	}
	again.adm = r.adm
	rep, err := again.rollBack(t.Context())
	if err != nil || rep.Result != ResultRolledBack {
		t.Fatalf("rollback --resume once the dir is writable: %+v, %v", rep, err)
	}
	st, err := again.adm.Status(t.Context())
	if err != nil || st.Fenced || sameURL(st.Backend) != sameURL(r.p.Blue.APIServer.URL) {
		t.Errorf("proxy after the resume %+v, %v: want open on blue", st, err)
	}
	if j, err := LoadJournal(filepath.Join(r.p.StateDir, "rollback")); err != nil || j.State != StateDone {
		t.Errorf("rollback journal %+v, %v: want done", j, err)
	}
}
