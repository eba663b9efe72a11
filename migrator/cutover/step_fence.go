package cutover

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// fenceStep turns the proxy's fence on and waits for the writes admitted before it (the
// barrier); it journals the proxy's state generation, which the switch checks is unchanged.
type fenceStep struct{}

func (fenceStep) name() string       { return StepFence }
func (fenceStep) pastNoReturn() bool { return false }

// timeout leaves what comes before the fence request its bound and the barrier its whole wait,
// plus time to ask.
func (fenceStep) timeout(p *Plan) time.Duration {
	return beforeFence + p.Proxy.WaitTimeout.D() + 30*time.Second
}

func (fenceStep) describe(r *runner, _ bool) string {
	fence := fmt.Sprintf("kubefence fence on --mode %s (wait up to %s for in-flight writes)", r.p.Proxy.FenceMode, r.p.barrierWait())
	if !r.p.Replicating() {
		return fence
	}
	return fmt.Sprintf("first connect to the etcd the window's auth steps change and let %s catch up with %s while it gains on it (up to %s); then %s", r.to.name, r.from.name, preFenceCatchUp, fence)
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
	if !r.j.FencedAt.IsZero() && !st.Fenced {
		// A run before this one journaled the fence, but no proxy holds it (it died before
		// sending it, or someone lifted it by hand): no window is open; this run opens its own.
		r.j.FencedAt, r.j.RefusedAtFence, r.resumedFenced = time.Time{}, 0, false
	}
	reason := r.p.Proxy.Reason
	if reason == "" {
		reason = "kubefence cutover " + r.j.ID
	}
	caughtUp := ""
	if r.repl != nil && r.j.FencedAt.IsZero() {
		// Connected before the catch-up, whose rounds let the handshake's work settle.
		if err := r.warmAuthClients(ctx); err != nil {
			return "", err
		}
		rounds, err := r.catchUpBeforeFence(ctx)
		if err != nil {
			return "", err
		}
		caughtUp = rounds.String() + "; "
		prog := r.repl.rep.Progress()
		r.j.ReplicationAtFence = &prog
	}
	first := r.j.FencedAt.IsZero()
	prepared := ""
	if first && r.p.Replicating() {
		prepared = r.prepareSwitch(ctx)
	}
	if first && r.repl != nil {
		// Checked when the step began; the catch-up and the prepare took time since, and a
		// replication or delta check that failed meanwhile is better found with writes open
		// (a compaction rebuilds green before the fence) than by the drain, in the window.
		if err := r.replicationAlive(); err != nil {
			return "", fmt.Errorf("before the fence: %w; nothing is fenced", err)
		}
	}
	if first {
		// Journaled before the request (write-ahead): a run killed after the proxies fenced
		// must resume inside the window, its budget counted from here, and never as a run
		// before the fence (which may take minutes, e.g. rebuilding green).
		r.j.FencedAt = time.Now().UTC()
		r.j.RefusedAtFence = st.RefusedWrites
		if err := r.saveJournal(); err != nil {
			return "", err
		}
	}
	resp, sentMono, err := r.sendFence(ctx, reason)
	if err != nil {
		return "", err
	}
	if first {
		r.j.FencedAt, r.fencedMono = sentMono.UTC(), sentMono
		r.j.FenceBarrier = time.Duration(resp.Barrier.Waited)
	}
	r.j.FenceGeneration = resp.Status.Generation
	what := "refused"
	if r.p.Proxy.FenceMode == admin.ModeHold {
		what = "held"
	}
	return fmt.Sprintf("%s%swrites %s from now; in-flight writes finished in %s", caughtUp, prepared, what, time.Duration(resp.Barrier.Waited).Round(time.Microsecond)), nil
}

// sendFence sends the fence to the proxies and says when (the window starts when the request
// is sent, not when the proxies have answered: the barrier, waiting for writes admitted before
// the flip, is part of it); a barrier left incomplete is an error naming the writes. In mode
// replicate the call is bounded by the window's budget (the barrier's wait is: barrierWait) and
// a moment for the answer (fenceAnswerSlack), not by each proxy's barrier wait and
// proxyAnswerTimeout more: a proxy that does not answer fails the step while the others hold
// or refuse writes, and the cutover goes back to blue.
func (r *runner) sendFence(ctx context.Context, reason string) (admin.FenceResponse, time.Time, error) {
	if r.p.Replicating() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, r.windowEnd().Add(fenceAnswerSlack))
		defer cancel()
	}
	sent := time.Now()
	resp, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: reason, Mode: r.p.Proxy.FenceMode, WaitTimeout: admin.Duration(r.p.barrierWait())})
	switch {
	case err != nil && r.p.Replicating() && ctx.Err() != nil:
		err = fmt.Errorf("%w (the fence is part of the window: timeouts.window %s from the fence, and %s for the answer)", err, r.p.Timeouts.Window.D(), fenceAnswerSlack)
	case err == nil && !resp.Barrier.Complete:
		err = barrierError(resp.Barrier, r.p.barrierWait())
	}
	return resp, sent, err
}

// barrierError names each write the barrier b still waited for after wait, with its proxy.
func barrierError(b *admin.Barrier, wait time.Duration) error {
	var running []string
	for _, w := range b.Remaining {
		running = append(running, w.Describe())
	}
	return fmt.Errorf("%d write(s) admitted before the fence still running after %s: %s", len(b.Remaining), wait, strings.Join(running, "; "))
}

// fenceAnswerSlack is how long after the window's budget is spent a replicating fence still waits
// for the proxies' answer (fenceStep): a barrier that used all of its wait (timeouts.window)
// answers a moment after it, naming the writes still running.
const fenceAnswerSlack = time.Second

// prepareTimeout bounds the proxies' prepare: a dial and a few requests.
const prepareTimeout = 10 * time.Second

// prepareSwitch asks the proxies to open their connections to the apiserver the switch goes to
// (admin.PrepareRequest), just before the fence: the watches the switch moves and the writes
// the unfence releases then find them open, instead of each dialling and handshaking inside
// the window. A proxy that cannot (older than the request, or the apiserver not answering it)
// switches as before; the returned note says which it was.
func (r *runner) prepareSwitch(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, prepareTimeout)
	defer cancel()
	resp, err := prepareBackend(ctx, r.adm, admin.PrepareRequest{URL: r.to.api.URL, CAFile: r.to.api.CAFile})
	switch {
	case err != nil && resp.Connections > 0:
		return fmt.Sprintf("connections to %s's apiserver opened ahead of the switch by some proxies (%d); not by others (%v): those open them at the switch; ", r.to.name, resp.Connections, err)
	case err != nil:
		return fmt.Sprintf("connections to %s's apiserver not opened ahead of the switch (%v): the switch opens them; ", r.to.name, err)
	}
	return fmt.Sprintf("connections to %s's apiserver opened ahead of the switch (%d, in %s); ", r.to.name, resp.Connections, time.Duration(resp.Took).Round(time.Microsecond))
}

// barrierWait is how long the fence waits for the writes admitted before it: proxy.waitTimeout,
// and in mode replicate at most timeouts.window, which the barrier is part of (a longer wait
// would keep writes fenced past the budget, only for the drain to find it spent).
func (p *Plan) barrierWait() time.Duration {
	if p.Replicating() {
		return min(p.Proxy.WaitTimeout.D(), p.Timeouts.Window.D())
	}
	return p.Proxy.WaitTimeout.D()
}
