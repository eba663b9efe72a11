package cutover

import (
	"context"
	"fmt"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// fenceStep turns the proxy's fence on and waits for the writes admitted before it (the
// barrier); it journals the proxy's state generation, which the switch checks is unchanged.
type fenceStep struct{}

func (fenceStep) name() string       { return StepFence }
func (fenceStep) pastNoReturn() bool { return false }

// timeout leaves the catch-up before the fence its bound and the barrier its whole wait, plus
// time to ask.
func (fenceStep) timeout(p *Plan) time.Duration {
	return preFenceCatchUp + p.Proxy.WaitTimeout.D() + 30*time.Second
}

func (fenceStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("when replicating, first let green catch up with blue while it gains on it (up to %s); then kubefence fence on --mode %s (wait up to %s for in-flight writes)", preFenceCatchUp, r.p.Proxy.FenceMode, r.p.Proxy.WaitTimeout.D())
}

func (fenceStep) run(ctx context.Context, r *runner) (string, error) {
	st, err := r.adm.Status(ctx)
	if err != nil {
		return "", err
	}
	if err := checkAPILevel(st); err != nil {
		if st.Fenced {
			// A run before this one fenced them and stopped before it journaled it.
			return "", fmt.Errorf("%w. The proxies are fenced already: after the abort, check 'kubefence fence status'; an older proxy refuses the abort's checked unfence, so reopen writes on blue with 'kubefence fence off' on it", err)
		}
		return "", err
	}
	reason := r.p.Proxy.Reason
	if reason == "" {
		reason = "kubefence cutover " + r.j.ID
	}
	if r.repl != nil && r.j.FencedAt.IsZero() {
		if err := r.catchUpBeforeFence(ctx); err != nil {
			return "", err
		}
		prog := r.repl.rep.Progress()
		r.j.ReplicationAtFence = &prog
	}
	// The window starts when the fence request is sent, not when the proxies have answered:
	// the barrier (waiting for writes admitted before the flip) is part of it.
	sent := time.Now().UTC()
	resp, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: reason, Mode: r.p.Proxy.FenceMode, WaitTimeout: admin.Duration(r.p.Proxy.WaitTimeout)})
	if err != nil {
		return "", err
	}
	if !resp.Barrier.Complete {
		return "", fmt.Errorf("%d write(s) admitted before the fence still running after %s", len(resp.Barrier.Remaining), r.p.Proxy.WaitTimeout.D())
	}
	if r.j.FencedAt.IsZero() {
		r.j.FencedAt = sent
		r.j.RefusedAtFence = st.RefusedWrites
		r.j.FenceBarrier = time.Duration(resp.Barrier.Waited)
	}
	r.j.FenceGeneration = resp.Status.Generation
	what := "refused"
	if r.p.Proxy.FenceMode == admin.ModeHold {
		what = "held"
	}
	return fmt.Sprintf("writes %s from now; in-flight writes finished in %s", what, time.Duration(resp.Barrier.Waited).Round(time.Microsecond)), nil
}

// preFenceCatchUp bounds catching up with blue right before the fence (mode replicate). After
// a full verify of a large cluster green can be thousands of revisions behind; each round
// shortens the lag by the ratio of blue's write rate to green's apply rate, so the bound is
// generous and a green that stops gaining ends the wait much sooner (catchUpRounds).
const preFenceCatchUp = 2 * time.Minute

// catchUpRound is how short a catch-up round must be for green to count as caught up.
const catchUpRound = 50 * time.Millisecond

// catchUpRounds decides, round after round, whether catching up before the fence goes on: a
// round waits until green applied blue's revision read at its start, so it lasts as long as
// green needs for the lag it began with. While green gains on blue the rounds get shorter;
// two rounds in a row no shorter than the shortest so far mean green only keeps pace (or
// falls behind), and waiting longer would not shrink the drain.
type catchUpRounds struct {
	shortest time.Duration
	stalls   int
}

// next takes a round's duration and says whether green is caught up and whether to go on.
func (c *catchUpRounds) next(took time.Duration) (caughtUp, goOn bool) {
	if took <= catchUpRound {
		return true, false
	}
	if c.shortest > 0 && took >= c.shortest {
		c.stalls++
		return false, c.stalls < 2
	}
	c.shortest, c.stalls = took, 0
	return false, true
}

// catchUpBeforeFence lets green catch up with blue right before the fence, so that the window
// drains only what blue takes between this and the fence's barrier, not whatever lag
// replication had at that moment (catchUpRounds). Under a writer as fast as green, or after
// preFenceCatchUp, the fence goes on anyway and the drain is bounded by timeouts.window as
// always. A blue that cannot be read, or a replicator that stopped, fails the step before
// anything is fenced.
func (r *runner) catchUpBeforeFence(ctx context.Context) error {
	d := preFenceCatchUp
	if r.preFence > 0 {
		d = r.preFence
	}
	deadline := time.Now().Add(d)
	var rounds catchUpRounds
	for time.Now().Before(deadline) {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		start := time.Now()
		target, err := replicate.Revision(rctx, r.repl.src)
		if err == nil {
			err = r.repl.rep.WaitFor(rctx, target)
		}
		cancel()
		switch {
		case err == nil:
			if _, goOn := rounds.next(time.Since(start)); !goOn {
				return nil
			}
		case r.replicationAlive() != nil:
			return r.replicationAlive()
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().Before(deadline):
			return fmt.Errorf("catching up with blue before the fence: %w", err)
		}
	}
	return nil
}
