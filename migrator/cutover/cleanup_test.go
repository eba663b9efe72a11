package cutover

import (
	"cmp"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestCleanup: cleanup stops what an aborted cutover or a rehearsal left, removes only the data
// dirs that cutover restored, and refuses a cutover in progress, done, baking (green serves) or
// rolling back; after a rollback green is blue's no more and may go.
func TestCleanup(t *testing.T) {
	cases := []struct {
		name, state, marker string
		remove              bool
		wantErr             string
		wantStopped         []int
		wantDirGone         bool
		hostStarted         bool // green.apiservers holds one its host starts: named, not stopped
		survivor            int  // a pid that is still running after its stop
		planHash            string
		gone                bool // the data dir was removed before (by hand, an earlier cleanup)
	}{
		{name: "in progress", state: StateRunning, wantErr: "in progress"},
		{name: "done", state: StateDone, wantErr: "green serves the cluster"},
		{name: "baking", state: StateBaking, wantErr: "green serves the cluster"},
		{name: "rolling back", state: StateRollingBack, wantErr: "rollback --resume"},
		{name: "rolled back", state: StateRolledBack, marker: "x", remove: true, wantStopped: []int{101, 102}, wantDirGone: true},
		{name: "aborted", state: StateAborted, marker: "x", wantStopped: []int{101, 102}},
		{name: "aborted, an apiserver its host started", state: StateAborted, marker: "x", wantStopped: []int{101, 102}, hostStarted: true},
		{name: "rehearsed, data removed", state: StateRehearsed, marker: "x", remove: true, wantStopped: []int{101, 102}, wantDirGone: true},
		{name: "data dirs gone already", state: StateAborted, remove: true, gone: true, wantStopped: []int{101, 102}, wantDirGone: true},
		// Processes are found by the command lines the plan gives: an edited plan finds none,
		// and would remove the data dirs of etcds still running.
		{name: "the plan changed", state: StateAborted, marker: "x", remove: true, planHash: "other-plan", wantErr: "the plan changed"},
		{name: "an etcd that outlives its stop", state: StateAborted, marker: "x", remove: true, survivor: 101, wantStopped: []int{101, 102}, wantErr: "still running"},
		{name: "someone else's data dir", state: StateAborted, marker: "other-run", remove: true, wantStopped: []int{101, 102}, wantErr: "not restored by cutover x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			dir := p.Green.Etcd.Members[0].DataDir
			if !tc.gone {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, restoreMarker), []byte(tc.marker), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if tc.hostStarted {
				p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://host2:6443"}}}
			}
			var stopped []int
			j := &Journal{ID: "x", State: tc.state, GreenPIDs: map[string]int{"g0": 101, "apiserver": 102}, PlanHash: cmp.Or(tc.planHash, p.hash)}
			running := map[int]bool{101: true, 102: true}
			procs := fakeProcesses(running, &stopped)
			if stop := procs.stop; tc.survivor != 0 {
				procs.stop = func(pid int, argv []string, grace time.Duration) {
					stop(pid, argv, grace)
					running[tc.survivor] = true
				}
			}
			r := (&runner{p: p, j: j, procs: procs}).forward()
			// Blue's snapshot (its Secrets too) goes with green's data dirs.
			if err := os.MkdirAll(filepath.Dir(r.snapshotPath()), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(r.snapshotPath(), []byte("blue"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(r.memberCopyPath(), "member"), 0o700); err != nil { // a v2 source's member copy
				t.Fatal(err)
			}
			// What an interrupted snapshot, member copy and restore leave: blue's data, Secrets
			// too, and up to its db's size each.
			partial := []string{r.snapshotPath() + ".part", r.memberCopyPath() + ".kubefence-part", dir + ".kubefence-part"}
			if err := os.WriteFile(partial[0], []byte("blue, half"), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, d := range partial[1:] {
				if err := os.MkdirAll(filepath.Join(d, "member"), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			rep, err := r.cleanup(tc.remove)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("cleanup = %v, want %q", err, tc.wantErr)
				}
			} else if err != nil || len(rep.Stopped) != len(tc.wantStopped) {
				t.Fatalf("cleanup = %+v, %v", rep, err)
			}
			if tc.wantErr == "" && rep.RemovedDataDirs != (tc.remove && !tc.gone) {
				t.Errorf("report says data dirs removed: %v; want %v (none was there)", rep.RemovedDataDirs, tc.remove && !tc.gone)
			}
			if tc.wantErr == "" && tc.hostStarted != slices.Equal(rep.LeftOnHosts, []string{"green apiserver https://host2:6443"}) {
				t.Errorf("left on hosts %q; want host2's apiserver named: %v", rep.LeftOnHosts, tc.hostStarted)
			}
			slices.Sort(stopped)
			if !slices.Equal(stopped, tc.wantStopped) {
				t.Errorf("stopped %v, want %v", stopped, tc.wantStopped)
			}
			if _, err := os.Stat(dir); os.IsNotExist(err) != tc.wantDirGone {
				t.Errorf("data dir gone: %v, want %v", os.IsNotExist(err), tc.wantDirGone)
			}
			for _, c := range partial {
				removed := tc.wantErr == "" && tc.remove
				if _, err := os.Stat(c); os.IsNotExist(err) != removed {
					t.Errorf("partial copy %s gone: %v, want %v", c, os.IsNotExist(err), removed)
				}
				if removed && !slices.Contains(rep.RemovedDirs, c) {
					t.Errorf("the report's removed %v does not name the partial copy %s", rep.RemovedDirs, c)
				}
			}
			for _, c := range r.blueCopies() {
				if _, err := os.Stat(c); os.IsNotExist(err) != (tc.wantErr == "" && tc.remove) {
					t.Errorf("blue's copy %s gone: %v, want %v", c, os.IsNotExist(err), tc.wantErr == "" && tc.remove)
				}
			}
		})
	}
}

// TestRehearseNeedsReplication: a plan that does not replicate has nothing to rehearse without
// fencing; --rehearse with --resume is refused too.
func TestRehearseNeedsReplication(t *testing.T) {
	p, _ := validPlan(t)
	if _, err := newRunner(Options{Plan: p, Rehearse: true}, nil); err == nil || !strings.Contains(err.Error(), "needs a replicating plan") {
		t.Errorf("rehearse a fenced-copy plan: %v", err)
	}
	rp := replicatePlan(t)
	if _, err := newRunner(Options{Plan: rp, Rehearse: true, Resume: true}, nil); err == nil || !strings.Contains(err.Error(), "do not go together") {
		t.Errorf("rehearse with resume: %v", err)
	}
	r, err := newRunner(Options{Plan: rp, Rehearse: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	last := r.steps[len(r.steps)-1]
	for _, s := range r.steps {
		if s.name() == StepFence || s.name() == StepSwitch {
			t.Errorf("a rehearsal runs step %s", s.name())
		}
	}
	if last.name() != StepRehearseDrain {
		t.Errorf("a rehearsal ends with %s", last.name())
	}
}

// TestAdoptsOnlyWhatItStarted: a green process found by its command line is adopted (stopped by
// cleanup or abort, taken over by a resume) only when this cutover journaled that it was
// starting it. Another run of the same plan in another state dir (a preflight that failed on
// the ports that run's green holds) must not stop that green, which may serve.
func TestAdoptsOnlyWhatItStarted(t *testing.T) {
	cases := []struct {
		name        string
		pids        map[string]int
		writeAhead  bool
		wantStopped []int
	}{
		{"never started here: someone else's", map[string]int{}, true, nil},
		{"g0 starting, its pid not journaled yet: adopted", map[string]int{"g0": 0}, true, []int{555}},
		// A kubefence before the write-ahead journaled a pid only once started: a process of
		// one killed in between is found by its command line, as it was then.
		{"a journal of a kubefence before: adopted", map[string]int{}, false, []int{555}},
		// g0 was started and journaled, and has ended (stopped by an abort): a process with
		// its command line is another run's green (the same plan from another state dir).
		{"g0 journaled and gone: another's is left alone", map[string]int{"g0": 101}, true, nil},
		// Before the write-ahead, a restarted process's new pid was journaled only once started:
		// one killed in between left the old pid, and the orphan is found as it was then.
		{"g0 journaled and gone, a journal of a kubefence before: adopted", map[string]int{"g0": 101}, false, []int{555}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			var stopped []int
			procs := fakeProcesses(map[int]bool{555: true}, &stopped)
			procs.find = func(argv []string) int {
				if procs.alive(555, argv) {
					return 555
				}
				return 0
			}
			j := &Journal{ID: "x", State: StateAborted, GreenPIDs: tc.pids, PlanHash: p.hash, PIDsWriteAhead: tc.writeAhead}
			r := (&runner{p: p, j: j, procs: procs}).forward()
			if _, err := r.cleanup(false); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(stopped, tc.wantStopped) {
				t.Errorf("stopped %v, want %v", stopped, tc.wantStopped)
			}
		})
	}
}

// TestFailedPreflightKeepsTheOldJournal: a new run in the state dir of a rolled-back (or
// aborted) cutover, whose green still runs, fails its preflight on what that green holds
// (ports, data dirs). The preflight changed nothing, so the state dir's journal is the old
// cutover's again: 'cutover cleanup' then stops the old green's processes and removes its data
// dirs, instead of finding nothing in the new run's journal. The failed run's journal is kept
// beside it.
func TestFailedPreflightKeepsTheOldJournal(t *testing.T) {
	p, _ := validPlan(t)
	p.hash = "plan-hash"
	dir := p.Green.Etcd.Members[0].DataDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, restoreMarker), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	old := &Journal{Version: 1, ID: "old", State: StateRolledBack, PlanHash: p.hash, PIDsWriteAhead: true, GreenPIDs: map[string]int{"g0": 101, "apiserver": 102}}
	if err := old.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	var stopped []int
	procs := fakeProcesses(map[int]bool{101: true, 102: true}, &stopped)
	var calls []string
	r := (&runner{o: Options{Plan: p}, p: p, procs: procs, adm: memProxy(&admin.Status{Backend: p.Blue.APIServer.URL}, &calls)}).forward()
	if err := r.openJournal(); err != nil {
		t.Fatal(err)
	}
	failed := r.j.ID
	rep, _ := r.failPreflight(errors.New("green etcd g0: port in use; data dir must be absent or empty"))
	if !strings.Contains(rep.Next, "cutover old") || !strings.Contains(rep.Next, "cleanup") || strings.Contains(rep.Next, "the plan it ran with") {
		t.Errorf("next %q: want it to say the state dir is the old cutover's again, and how to clean it up", rep.Next)
	}
	r.kept.PlanHash = "the plan before an edit"
	if next := r.keptCleanupAdvice(); !strings.Contains(next, "the plan it ran with") {
		t.Errorf("next %q, the plan edited since the old cutover: want cleanup with the plan it ran with (cleanup refuses another)", next)
	}
	j, err := LoadJournal(p.StateDir)
	if err != nil || j.ID != "old" {
		t.Fatalf("journal %+v, %v: want the old cutover's back", j, err)
	}
	var kept Journal
	data, err := os.ReadFile(filepath.Join(p.StateDir, "journal-"+failed+".json"))
	if err == nil {
		err = json.Unmarshal(data, &kept)
	}
	if err != nil || kept.State != StateAborted || !strings.Contains(kept.AbortReason, "preflight failed") {
		t.Errorf("the failed run's journal %+v, %v: want it kept beside, aborted by its preflight", kept, err)
	}
	c := (&runner{p: p, j: j, procs: procs}).forward()
	if _, err := c.cleanup(true); err != nil || len(stopped) != 2 {
		t.Errorf("cleanup: %v, stopped %v; want the old green's 101 and 102", err, stopped)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the old green's data dir: %v, want it removed", err)
	}
}

// TestRestartWritesAheadAgain: a green process journaled and ended since is started again with
// its pid journaled as 0 first, so that a run killed between that start and journaling the new
// pid adopts the new process by its command line (greenPID does not look for one behind a
// journaled pid that has ended: that is another run's).
func TestRestartWritesAheadAgain(t *testing.T) {
	p, _ := validPlan(t)
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	j := &Journal{ID: "x", State: StateRunning, GreenPIDs: map[string]int{"g0": 101}, PlanHash: p.hash, PIDsWriteAhead: true}
	r := (&runner{p: p, j: j, procs: fakeProcesses(map[int]bool{}, new([]int))}).forward()
	journaled := -1
	r.procs.start = func([]string, string) (int, error) {
		on, err := LoadJournal(p.StateDir)
		if err != nil {
			return 0, err
		}
		journaled = on.GreenPIDs["g0"]
		return 202, nil
	}
	if err := r.startGreenProcess(t.Context(), greenEtcdProcess(p, p.Green.Etcd.Members[0])); err != nil {
		t.Fatal(err)
	}
	if journaled != 0 || r.j.GreenPIDs["g0"] != 202 {
		t.Fatalf("journaled %d when it started, %d after; want 0, then 202", journaled, r.j.GreenPIDs["g0"])
	}
}

// TestCleanupOfAStoppedRehearsal: a rehearsal that stopped partway is never resumed; cleanup
// says what stops it ('cutover abort'), not --resume, which refuses it.
func TestCleanupOfAStoppedRehearsal(t *testing.T) {
	p, _ := validPlan(t)
	j := &Journal{ID: "r1", State: StateRunning, Rehearse: true, GreenPIDs: map[string]int{}, PlanHash: p.hash}
	r := (&runner{p: p, j: j, procs: fakeProcesses(map[int]bool{}, new([]int))}).forward()
	_, err := r.cleanup(false)
	if err == nil || strings.Contains(err.Error(), "--resume") || !strings.Contains(err.Error(), "cutover abort") {
		t.Fatalf("cleanup of a stopped rehearsal: %v, want it to name 'cutover abort', not --resume", err)
	}
}

// TestRunKilledInItsPreflightKeepsTheOldJournal: a new run over an ended cutover whose green
// still runs, killed during its preflight (kill -9: no failPreflight to put anything back),
// leaves the state dir's journal the old cutover's, so 'cutover cleanup' still finds the old
// green's processes and a --resume says there is nothing to resume; the old journal is moved
// aside only when the new run first saves its own, once its preflight has passed.
func TestRunKilledInItsPreflightKeepsTheOldJournal(t *testing.T) {
	p, _ := validPlan(t)
	p.hash = "plan-hash"
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	old := &Journal{Version: 1, ID: "old", State: StateAborted, PlanHash: p.hash, PIDsWriteAhead: true, GreenPIDs: map[string]int{"g0": 101, "apiserver": 102}}
	if err := old.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	var stopped []int
	procs := fakeProcesses(map[int]bool{101: true, 102: true}, &stopped)
	killed := (&runner{o: Options{Plan: p}, p: p, procs: procs, adm: memProxy(&admin.Status{Backend: p.Blue.APIServer.URL}, new([]string))}).forward()
	if err := killed.openJournal(); err != nil {
		t.Fatal(err)
	}
	// Killed now, during its preflight.
	resumed := (&runner{o: Options{Plan: p, Resume: true}, p: p, procs: procs}).forward()
	if err := resumed.openJournal(); err == nil || !strings.Contains(err.Error(), "cutover old is aborted") {
		t.Errorf("--resume after the run killed in its preflight: %v; want nothing to resume, cutover old aborted", err)
	}
	j, err := LoadJournal(p.StateDir)
	if err != nil || j.ID != "old" {
		t.Fatalf("journal %+v, %v: want the old cutover's", j, err)
	}
	if _, err := (&runner{p: p, j: j, procs: procs}).forward().cleanup(false); err != nil {
		t.Fatal(err)
	}
	if slices.Sort(stopped); !slices.Equal(stopped, []int{101, 102}) {
		t.Errorf("cleanup stopped %v; want the old cutover's green, 101 and 102", stopped)
	}
	// A run whose preflight passed keeps the old journal beside its own at its first save.
	again := (&runner{o: Options{Plan: p}, p: p, procs: procs}).forward()
	if err := again.openJournal(); err != nil {
		t.Fatal(err)
	}
	if err := again.saveJournal(); err != nil {
		t.Fatal(err)
	}
	if j, err := LoadJournal(p.StateDir); err != nil || j.ID != again.j.ID {
		t.Errorf("journal %+v, %v after the new run's first save: want the new run's", j, err)
	}
	if _, err := os.Stat(keptJournalPath(p.StateDir, "old")); err != nil {
		t.Errorf("the old journal is not kept beside: %v", err)
	}
}
