package cutover

import (
	"context"
	"errors"
	"fmt"

	"github.com/kubefence/kubefence/migrator/datadir"
)

// CleanupReport is what `kubefence cutover cleanup` did.
type CleanupReport struct {
	ID    string `json:"id"`
	State string `json:"state"`
	// Stopped are the green processes stopped (and a static pod manifest removed).
	Stopped []string `json:"stopped"`
	// RemovedDataDirs says whether green data dirs this cutover restored were removed (false
	// when none was there); RemovedDirs names them, and the copy of a v2 source's member files
	// and the partial copies an interrupted snapshot, copy or restore left (partialCopies).
	RemovedDataDirs bool     `json:"removedDataDirs"`
	RemovedDirs     []string `json:"removedDirs,omitempty"`
	// RemovedSnapshot is blue's snapshot in the state dir, removed with the data dirs.
	RemovedSnapshot string `json:"removedSnapshot,omitempty"`
	// LeftOnHosts names the green processes other hosts started, which cleanup does not stop.
	LeftOnHosts []string `json:"leftOnHosts,omitempty"`
}

// Cleanup stops the green processes that an aborted cutover, a rehearsal or a rollback left
// running (found by the pids in the journal, checked against their command lines, or in the
// process table) and, with removeDataDirs, removes the green data dirs that cutover restored. A
// cutover in progress, done, baking or rolling back is refused: its green is in use.
func Cleanup(ctx context.Context, o Options, removeDataDirs bool) (*CleanupReport, error) {
	var rep *CleanupReport
	err := withJournal(Options{Plan: o.Plan, Log: o.Log}, "nothing to clean up", func(r *runner) (err error) {
		rep, err = r.cleanup(removeDataDirs)
		return err
	})
	return rep, err
}

// cleanup is Cleanup on the journal r holds.
func (r *runner) cleanup(removeDataDirs bool) (*CleanupReport, error) {
	j := r.j
	switch j.State {
	case StateRunning:
		if j.aborting() {
			return nil, fmt.Errorf("cutover %s's abort did not finish: 'kubefence cutover abort' first", j.ID)
		}
		return nil, fmt.Errorf("cutover %s is in progress: %s; clean up after that", j.ID, j.wayOn())
	case StateDone:
		return nil, fmt.Errorf("cutover %s is done: green serves the cluster, there is nothing to clean up", j.ID)
	case StateBaking:
		return nil, fmt.Errorf("cutover %s is baking: green serves the cluster; 'kubefence cutover rollback' goes back first", j.ID)
	case StateRollingBack:
		return nil, fmt.Errorf("cutover %s is rolling back: finish it with 'kubefence cutover rollback --resume' first", j.ID)
	}
	if j.PlanHash != r.p.hash {
		// Green's processes are found by the command lines the plan gives: an edited plan
		// finds none of them, and their data dirs would go while they run.
		return nil, fmt.Errorf("the plan changed since cutover %s started (plan hash %s, journal %s): clean up with the plan it ran with", j.ID, r.p.hash, j.PlanHash)
	}
	rep := &CleanupReport{ID: j.ID, State: j.State, LeftOnHosts: r.p.startedByHosts()}
	var err error
	if rep.Stopped, err = r.stopGreen(); err != nil {
		return rep, err
	}
	if removeDataDirs {
		if rep.RemovedDirs, err = r.removeRestored(); err != nil {
			return rep, err
		}
		rep.RemovedDataDirs = len(rep.RemovedDirs) > 0
		// Blue's snapshot, its Secrets too, goes with the data dirs restored from it (a
		// rehearsal or a run that stopped before its end left it), and so does the copy of a
		// v2 source's member files.
		switch gone, err := removeIfThere(r.snapshotPath()); {
		case err != nil:
			return rep, fmt.Errorf("removing blue's snapshot: %w", err)
		case gone:
			rep.RemovedSnapshot = r.snapshotPath()
		}
		switch gone, err := removeIfThere(r.memberCopyPath()); {
		case err != nil:
			return rep, fmt.Errorf("removing the copy of blue's member files: %w", err)
		case gone:
			rep.RemovedDirs = append(rep.RemovedDirs, r.memberCopyPath())
		}
		partial, err := r.removePartialCopies()
		rep.RemovedDirs = append(rep.RemovedDirs, partial...)
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// partialCopies are where the copies of blue a cutover makes are built (datadir.PartPaths of
// blue's snapshot, of the copy of a v2 source's member files and of each green data dir this
// host restores): a run stopped during its copy or migrate, or a restore it abandoned, leaves
// them, with blue's data (Secrets included) and up to its db's size each, which the next
// preflight's space check counts against it.
func (r *runner) partialCopies() []string {
	out := append(datadir.PartPaths(r.snapshotPath()), datadir.PartPaths(r.memberCopyPath())...)
	for _, m := range r.p.Green.Etcd.Members {
		if !m.External {
			out = append(out, datadir.PartPaths(m.DataDir)...)
		}
	}
	return out
}

// removePartialCopies removes the partialCopies there are and names them.
func (r *runner) removePartialCopies() ([]string, error) {
	var removed []string
	var errs []error
	for _, c := range r.partialCopies() {
		switch gone, err := removeIfThere(c); {
		case err != nil:
			errs = append(errs, fmt.Errorf("removing the partial copy %s: %w", c, err))
		case gone:
			removed = append(removed, c)
		}
	}
	return removed, errors.Join(errs...)
}
