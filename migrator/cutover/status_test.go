package cutover

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStatusOfAnOpenWindow: a cutover killed inside its window leaves every proxy holding
// writes with no process running it; status says the window is open since when, and that no
// process runs the cutover, instead of a plain "running".
func TestStatusOfAnOpenWindow(t *testing.T) {
	p := replicatePlan(t)
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	fenced := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	j := &Journal{Version: 1, ID: "x", State: StateRunning, FencedAt: fenced, Rehearse: false,
		Done: []StepRecord{{Step: StepPreflight}, {Step: StepVerify}}}
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	// Journaled before it is sent: the fence step not done, the proxies may not hold it.
	if st, err := Status(t.Context(), p); err != nil || !st.WindowOpenSince.IsZero() || !st.FenceStartedAt.Equal(fenced) {
		t.Fatalf("status %+v, %v: want the fence as being turned on at %s, not a window open", st, err, fenced)
	}
	j.Done = append(j.Done, StepRecord{Step: StepFence})
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	st, err := Status(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	if !st.WindowOpenSince.Equal(fenced) || st.Runner != 0 {
		t.Fatalf("status %+v: want the window open since %s and no process running the cutover", st, fenced)
	}
	j.UnfencedAt = fenced.Add(time.Second)
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	if st, err := Status(t.Context(), p); err != nil || !st.WindowOpenSince.IsZero() {
		t.Fatalf("status %+v, %v: the window closed, want no open window", st, err)
	}
}

// TestStatusNamesOnlyItsOwnRollback: the rollback journal of an earlier cutover (rolled back,
// cleaned up, then a new cutover) is not this cutover's rollback: status names only the
// rollback this cutover's journal records.
func TestStatusNamesOnlyItsOwnRollback(t *testing.T) {
	p := replicatePlan(t)
	rdir := filepath.Join(p.StateDir, "rollback")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		t.Fatal(err)
	}
	old := &Journal{Version: 1, ID: "earlier-rollback", State: StateDone, Done: []StepRecord{{Step: StepUnfence}}}
	if err := old.save(rdir); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		bake *BakeRecord
		want string
	}{
		{"a new cutover, no bake", nil, ""},
		{"a new cutover baking", &BakeRecord{}, ""},
		{"this cutover's rollback", &BakeRecord{Rollback: "earlier-rollback"}, "earlier-rollback (done, last step unfence)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &Journal{Version: 1, ID: "new", State: StateDone, Bake: tc.bake}
			if err := j.save(p.StateDir); err != nil {
				t.Fatal(err)
			}
			st, err := Status(t.Context(), p)
			if err != nil {
				t.Fatal(err)
			}
			if st.Rollback != tc.want {
				t.Fatalf("status names rollback %q, want %q", st.Rollback, tc.want)
			}
		})
	}
}

// TestStatusOfARollbacksOpenWindow: a rollback fences through its own journal; killed inside its
// window, it leaves every proxy holding writes, and status says so from that journal as it does
// for a cutover's (it showed no open window at all).
func TestStatusOfARollbacksOpenWindow(t *testing.T) {
	p := replicatePlan(t)
	rdir := filepath.Join(p.StateDir, "rollback")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		t.Fatal(err)
	}
	fenced := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	main := &Journal{Version: 1, ID: "c1", State: StateRollingBack, Bake: &BakeRecord{Revision: 5, Rollback: "rb"}}
	if err := main.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	rb := &Journal{Version: 1, ID: "rb", State: StateRunning, FencedAt: fenced, Done: []StepRecord{{Step: StepFence}}}
	if err := rb.save(rdir); err != nil {
		t.Fatal(err)
	}
	st, err := Status(t.Context(), p)
	if err != nil || !st.WindowOpenSince.Equal(fenced) {
		t.Fatalf("status %+v, %v: want the rollback's window open since %s", st, err, fenced)
	}
}

// TestStatusOnceTheRollbackStoppedFollowing: past the rollback's stop-replication blue no longer
// follows green (it takes the writes once the rollback unfences): status says so instead of a
// lag, which went below zero as blue moved ahead.
func TestStatusOnceTheRollbackStoppedFollowing(t *testing.T) {
	p := replicatePlan(t)
	rdir := filepath.Join(p.StateDir, "rollback")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		t.Fatal(err)
	}
	main := &Journal{Version: 1, ID: "c1", State: StateRollingBack, Bake: &BakeRecord{Revision: 5, Rollback: "rb"}}
	if err := main.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		done    []StepRecord
		stopped bool
	}{
		{[]StepRecord{{Step: StepFence}, {Step: StepDrain}, {Step: StepSwitch}}, false},
		{[]StepRecord{{Step: StepFence}, {Step: StepDrain}, {Step: StepSwitch}, {Step: StepGateGreen}, {Step: StepStopReplication}}, true},
	} {
		rb := &Journal{Version: 1, ID: "rb", State: StateRunning, Done: tc.done}
		if err := rb.save(rdir); err != nil {
			t.Fatal(err)
		}
		st, err := Status(t.Context(), p)
		if err != nil || st.Bake == nil || st.Bake.FollowingStopped != tc.stopped {
			t.Fatalf("rollback done %v: status %+v, %v: want following stopped %v", tc.done, st.Bake, err, tc.stopped)
		}
	}
}
