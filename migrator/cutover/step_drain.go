package cutover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// windowContext bounds ctx by the fence budget: timeouts.window from the fence on. A drain or
// check not done by then fails its step, and the cutover aborts to blue, unfenced (invariant
// window-budget). In the process that fenced, the budget runs on the monotonic clock (a wall
// clock stepped meanwhile, by NTP or a VM's migration, would end it early or stretch it); a
// resumed run has only the journal's wall time.
func (r *runner) windowContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(ctx, r.windowEnd())
}

// windowEnd is when the window's budget is spent: timeouts.window from the fence, on the
// monotonic clock in the process that fenced.
func (r *runner) windowEnd() time.Time {
	from := r.j.FencedAt
	if !r.fencedMono.IsZero() && !from.IsZero() {
		from = r.fencedMono
	}
	return from.Add(r.p.Timeouts.Window.D())
}

// windowOpen says whether this run's window is open: its fence is journaled and its unfence is
// not (a bake's journal holds the window it baked after, long closed), and the fence step is
// done or the proxies hold a fence. The fence is journaled before it is sent: a run that died
// before sending it, or one someone lifted by hand, has no window open, and the fence step
// starts one afresh. Proxies that cannot be asked count as fenced.
func (r *runner) windowOpen(ctx context.Context) bool {
	if r.j.FencedAt.IsZero() || !r.j.UnfencedAt.IsZero() {
		return false
	}
	if r.j.done(StepFence) {
		return true
	}
	st, err := r.adm.Status(ctx)
	return err != nil || st.Fenced
}

// drainStep (mode replicate, fenced) waits until green has applied blue's current revision
// (caughtUp).
type drainStep struct{}

func (drainStep) name() string                  { return StepDrain }
func (drainStep) timeout(p *Plan) time.Duration { return p.Timeouts.Window.D() + 5*time.Second }
func (drainStep) pastNoReturn() bool            { return false }

func (drainStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("read %[1]s's revision (linearizable), wait until %[2]s applied it (and %[2]s's revision is one replication made); within timeouts.window (%[3]s) from the fence, else unfence %[1]s and abort", r.from.name, r.to.name, r.p.Timeouts.Window.D())
}

func (drainStep) run(ctx context.Context, r *runner) (string, error) {
	wctx, cancel := r.windowContext(ctx)
	defer cancel()
	start, before := time.Now(), r.progress()
	rev, err := r.caughtUp(wctx)
	if err != nil {
		return "", fmt.Errorf("drain within the window (timeouts.window %s from the fence): %w", r.p.Timeouts.Window.D(), r.withStall(err, before))
	}
	r.j.DrainRevision = rev
	return fmt.Sprintf("%s at %s's revision %d after %s", r.to.name, r.from.name, rev, time.Since(start).Round(time.Microsecond)), nil
}

// withStall adds to a wait for replication that ran out of time (err) why: green applied
// revisions during the wait (before is where replication stood when it began), so the lag was
// more than the window drains; or it stood still, and which side stalled (stalledError), so
// that the drain's error (and the abort's advice) does not read as green's fault when nothing
// came from blue. err as it is for another error, or a replicator not running here.
func (r *runner) withStall(err error, before replicate.Progress) error {
	if !errors.Is(err, context.DeadlineExceeded) || r.repl == nil {
		return err
	}
	now := r.repl.rep.Progress()
	if now.Applied > before.Applied {
		return fmt.Errorf("%w; %s applied revisions %d-%d meanwhile: replication runs, and the lag was more than the window drains (run the cutover once the lag before the fence is smaller, or raise timeouts.window; --rehearse predicts the window)",
			err, r.to.name, before.Applied+1, now.Applied)
	}
	return fmt.Errorf("%w; %w", err, stalledError(now, r.from, r.to))
}

// progress is where the replication run here stands; zero when none runs here.
func (r *runner) progress() replicate.Progress {
	if r.repl == nil {
		return replicate.Progress{}
	}
	return r.repl.rep.Progress()
}

// replicaSwitchStep (mode replicate) checks once more that green has blue's revision, within
// the window, and points the proxy at green with the open watches resumed there (the same
// revisions mean the same resourceVersions).
type replicaSwitchStep struct {
	// pickUp: replication that is not running in this process is picked up again (the
	// rollback's switch), once the switch is known not to have happened already; the forward
	// switch aborts instead.
	pickUp bool
}

func (replicaSwitchStep) name() string                  { return StepSwitch }
func (replicaSwitchStep) timeout(p *Plan) time.Duration { return p.Timeouts.Switch.D() }
func (replicaSwitchStep) pastNoReturn() bool            { return true }

func (replicaSwitchStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("check %s has %s's revision of now, applied, and (in a cutover) that every change since the full verify is the same in both etcds' histories (within timeouts.window), then %s", r.to.name, r.from.name, strings.Join(r.p.proxyCommands("backend set --resume-watches", r.to.api.URL), "; "))
}

func (s replicaSwitchStep) run(ctx context.Context, r *runner) (string, error) {
	switched, err := r.checkFenceHeld(ctx)
	if err != nil {
		return "", err
	}
	if switched {
		return fmt.Sprintf("the proxy was switched to %s before the process that ran the window stopped", r.to.name), nil
	}
	if err := r.resumedRollbackReady(ctx); err != nil {
		return "", err
	}
	picked := ""
	if s.pickUp {
		if picked, err = r.ensureReplication(ctx); err != nil {
			return "", err
		}
	}
	wctx, cancel := r.windowContext(ctx)
	before := r.progress()
	rev, err := r.caughtUp(wctx)
	cancel()
	if err != nil {
		return "", fmt.Errorf("%s at %s's revision within the window (timeouts.window %s from the fence): %w", r.to.name, r.from.name, r.p.Timeouts.Window.D(), r.withStall(err, before))
	}
	checked := ""
	if !s.pickUp { // a rollback has no full verify of its direction to compare from
		wctx, cancel := r.windowContext(ctx)
		checked, err = r.deltaChecked(wctx, rev)
		cancel()
		if err != nil {
			return "", err
		}
		checked = "; " + checked
	}
	resp, lost, err := r.sendSwitch(ctx, admin.BackendRequest{URL: r.to.api.URL, CAFile: r.to.api.CAFile, ResumeWatches: true, ExpectGeneration: r.j.FenceGeneration})
	if err != nil {
		return "", err
	}
	r.j.SwitchRevision = rev // only a switch that happened has one
	if lost != "" {
		return withNote(picked, fmt.Sprintf("%s at %s's revision %d%s; %s", r.to.name, r.from.name, rev, checked, lost)), nil
	}
	d := resp.Drain
	over := ""
	if resp.Prepared {
		over = " over connections opened before the fence"
	}
	return withNote(picked, fmt.Sprintf("%s at %s's revision %d%s; proxy backend %s; of %d watch(es) and stream(s) on %s, %d moved to %s%s, %d ended, off %s in %s%s", r.to.name, r.from.name, rev, checked, resp.Status.Backend, d.Streams, r.from.name, d.Resumed, r.to.name, over, d.Ended, r.from.name, time.Duration(d.Duration).Round(time.Microsecond), awaitedWrites(d, r.from.name))), nil
}

// awaitedWrites says which writes the fence's policy let through the switch waited for (they
// may make revisions on from after the drain's; stop-replication brings them over).
func awaitedWrites(d admin.Drain, from string) string {
	switch {
	case d.Writes == 0:
		return ""
	case d.UnansweredWrites == 0:
		return fmt.Sprintf("; %d write(s) the fence policy let through were answered by %s first", d.Writes, from)
	}
	return fmt.Sprintf("; of %d write(s) the fence policy let through, %d were not answered by %s within the proxy's --drain-timeout (%s may still commit them after replication stopped)", d.Writes, d.UnansweredWrites, from, from)
}

// resumedRollbackReady looks at blue's apiserver again in a resumed rollback, before its fence
// (the first step it runs: needsReplication) or, when the run that stopped had fenced, before its
// switch: the check before a new rollback (blueServesForRollback) skips a resume, which may be
// past its switch, and blue may have stopped serving since the run that stopped. Not ready, the
// step fails and the rollback goes back to green, rather than open writes on a blue that does
// not serve. With a window open (writes held now) the window's budget bounds the look.
func (r *runner) resumedRollbackReady(ctx context.Context) error {
	if r.main == nil || !r.o.Resume || r.blueReady {
		return nil
	}
	budget := ""
	if r.windowOpen(ctx) { // writes held now: not one held by the journal only (lifted since)
		budget = fmt.Sprintf("the window's budget (timeouts.window %s from the fence at %s)", r.p.Timeouts.Window.D(), r.j.FencedAt.Format(time.RFC3339))
		if !time.Now().Before(r.windowEnd()) {
			// A look on the spent budget would end at once and blame blue's apiserver.
			return fmt.Errorf("%s is spent: writes have been held since the fence; the rollback does not switch past it (%s's apiserver was not asked)", budget, r.to.name)
		}
		var cancel context.CancelFunc
		ctx, cancel = r.windowContext(ctx)
		defer cancel()
	}
	err := waitReady(ctx, r.to.api.Kubeconfig)
	switch {
	case err == nil:
		r.blueReady = true
		return nil
	case budget != "" && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s's apiserver (blue.apiserver.kubeconfig) did not answer /readyz within what was left of %s: %w; the rollback switches the proxies to it only once it is ready", r.to.name, budget, err)
	}
	return fmt.Errorf("%s's apiserver (blue.apiserver.kubeconfig) is not ready: %w; the rollback switches the proxies to it only once it is", r.to.name, err)
}
