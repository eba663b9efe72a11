package cutover

import (
	"context"
	"fmt"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// replicateStep starts replicating blue into green (mode replicate) from the snapshot's
// revision, in this process, and waits until green has caught up with blue once. Replication
// goes on through the next steps until stopReplicationStep, or the abort.
type replicateStep struct{}

func (replicateStep) name() string                  { return StepReplicate }
func (replicateStep) timeout(p *Plan) time.Duration { return p.Timeouts.Replicate.D() }
func (replicateStep) pastNoReturn() bool            { return false }

func (replicateStep) describe(r *runner, _ bool) string {
	return "replicate blue into green from the snapshot's revision, each blue revision one txn on green (green's revision checked after each), in this process until the switch; wait until green has caught up with blue"
}

func (replicateStep) run(ctx context.Context, r *runner) (string, error) {
	picked, err := r.ensureReplication(ctx)
	if err != nil {
		return "", err
	}
	start := time.Now()
	// Where both stood at the start, for the rates (none when blue cannot be read now: the
	// wait below says why).
	from, srcFrom := r.repl.rep.Progress().Applied, int64(0)
	if rev, err := replicate.Revision(ctx, r.repl.src); err == nil {
		srcFrom = rev
	}
	rev, err := r.caughtUp(ctx)
	if err != nil {
		return "", err
	}
	took := time.Since(start)
	return withNote(picked, fmt.Sprintf("caught up with blue at revision %d after %s%s: %s", rev, took.Round(time.Millisecond),
		catchUpRates(from, srcFrom, rev, took, r.from.name, r.to.name), r.progressLine(r.repl.rep.Progress()))), nil
}

// withNote puts note (if any) before detail.
func withNote(note, detail string) string {
	if note == "" {
		return detail
	}
	return note + "; " + detail
}

// needsReplication is a step of mode replicate that relies on the replicator running in this
// process: after a --resume it is picked up again from green's revision (ensureReplication), or
// the step fails and the cutover aborts to blue.
type needsReplication struct{ step }

func (s needsReplication) run(ctx context.Context, r *runner) (string, error) {
	if err := r.resumedRollbackReady(ctx); err != nil {
		return "", err
	}
	picked, err := r.ensureReplication(ctx)
	if err != nil {
		return "", err
	}
	detail, err := s.step.run(ctx, r)
	return withNote(picked, detail), err
}

// stopReplicationStep stops the replicator after the switch, before green's apiserver may
// write: from here green's revisions are green's own. It first lets the replicator apply what
// blue holds once the switch has moved every watch off it: blue's apiserver may have written
// (its own leases) after the drain and sent that revision on a watch the switch moved to green
// from there; green's own first write must not take its number.
type stopReplicationStep struct{}

// lastRevisionPatience bounds the wait for blue's last revisions at the stop: the replicator
// is caught up to within milliseconds here, so a longer wait means it is failing.
const lastRevisionPatience = time.Second

func (stopReplicationStep) name() string                  { return StepStopReplication }
func (stopReplicationStep) timeout(p *Plan) time.Duration { return p.Timeouts.Switch.D() }
func (stopReplicationStep) pastNoReturn() bool            { return true }
func (stopReplicationStep) describe(*runner, bool) string {
	return "stop replicating blue into green (before green's apiserver may write)"
}

func (stopReplicationStep) run(ctx context.Context, r *runner) (string, error) {
	picked, ok := r.pickUpAfterSwitch(ctx)
	if !ok {
		return picked, nil
	}
	return withNote(picked, r.stoppedAfterSwitch(r.applyBlueLast(ctx))), nil
}

// stoppedAfterSwitch stops replication past the switch (last: applyBlueLast's say), journals
// how far it got (replication.atStop) and says how it ended; an error is said, not returned:
// past the switch nothing can be undone.
func (r *runner) stoppedAfterSwitch(last string) string {
	prog, err := r.stopReplication()
	r.j.ReplicationAtStop = &prog
	if err != nil {
		// The switch happened with green at blue's revision; what the replicator did after is
		// blue's apiserver's own writes (leases), which green's apiserver writes again itself.
		return fmt.Sprintf("stopped (it had failed after the switch: %v)%s: %s", err, last, r.progressLine(prog))
	}
	return "stopped" + last + ": " + r.progressLine(prog)
}

// pickUpAfterSwitch picks replication up when the process that replicated died after the
// switch (green's apiserver may not write yet, so green is still blue change for change unless
// it expired a lease by itself), to bring over blue's last revisions as the run that did not die
// does. It returns a note of what it did ("" when replication runs in this process) and false,
// with why, when it could not.
func (r *runner) pickUpAfterSwitch(ctx context.Context) (string, bool) {
	if r.repl != nil {
		return "", true
	}
	wctx, cancel := r.bakeContext(ctx)
	defer cancel()
	picked, err := r.ensureReplication(wctx)
	if err != nil {
		return fmt.Sprintf("replication was not running in this process (it stopped with the cutover process before) and could not be picked up again (%v): blue's revisions after the drain, if any, are not on green: its apiserver's own writes (its leases), and any write the fence's policy let through right at the switch (each proxy logs them: \"write let through: fence is on\", naming the object); a watch the switch moved from one of them may miss green's events there", err), false
	}
	return picked, true
}

// applyBlueLast waits, up to lastRevisionPatience, for the replicator to apply blue's revision
// as read now, and says how that went. Past the switch nothing can be undone: a failure is
// reported, not returned (a watch moved from a later revision may miss green's events there).
func (r *runner) applyBlueLast(ctx context.Context) string {
	if r.repl == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, lastRevisionPatience)
	defer cancel()
	rev, err := replicate.Revision(ctx, r.repl.src)
	if err == nil {
		err = r.repl.rep.WaitFor(ctx, rev)
	}
	if err != nil {
		return fmt.Sprintf(" without %s's last revisions (%v: a watch the switch moved from one of them may miss %s's events there)", r.from.name, err, r.to.name)
	}
	return fmt.Sprintf(" at %s's revision %d, read after the switch", r.from.name, rev)
}
