package cutover

import (
	"context"
	"fmt"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// fenceStep turns the proxy's fence on and waits for the writes admitted before it (the
// barrier); it journals the proxy's state generation, which the switch checks is unchanged.
type fenceStep struct{}

func (fenceStep) name() string       { return StepFence }
func (fenceStep) pastNoReturn() bool { return false }

// timeout leaves the barrier its whole wait, plus time to ask.
func (fenceStep) timeout(p *Plan) time.Duration { return p.Proxy.WaitTimeout.D() + 30*time.Second }

func (fenceStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("kubefence fence on --mode %s (wait up to %s for in-flight writes)", r.p.Proxy.FenceMode, r.p.Proxy.WaitTimeout.D())
}

func (fenceStep) run(ctx context.Context, r *runner) (string, error) {
	st, err := r.adm.Status(ctx)
	if err != nil {
		return "", err
	}
	reason := r.p.Proxy.Reason
	if reason == "" {
		reason = "kubefence cutover " + r.j.ID
	}
	if r.repl != nil && r.j.ReplicationAtFence == nil {
		prog := r.repl.rep.Progress()
		r.j.ReplicationAtFence = &prog
	}
	resp, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: reason, Mode: r.p.Proxy.FenceMode, WaitTimeout: admin.Duration(r.p.Proxy.WaitTimeout)})
	if err != nil {
		return "", err
	}
	if !resp.Barrier.Complete {
		return "", fmt.Errorf("%d write(s) admitted before the fence still running after %s", len(resp.Barrier.Remaining), r.p.Proxy.WaitTimeout.D())
	}
	if r.j.FencedAt.IsZero() {
		r.j.FencedAt = time.Now().UTC()
		r.j.RefusedAtFence = st.RefusedWrites
	}
	r.j.FenceGeneration = resp.Status.Generation
	what := "refused"
	if r.p.Proxy.FenceMode == admin.ModeHold {
		what = "held"
	}
	return fmt.Sprintf("writes %s from now; in-flight writes finished in %s", what, time.Duration(resp.Barrier.Waited).Round(time.Microsecond)), nil
}
