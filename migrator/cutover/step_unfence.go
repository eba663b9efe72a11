package cutover

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// unfenceStep opens writes again, on green.
type unfenceStep struct{}

func (unfenceStep) name() string                  { return StepUnfence }
func (unfenceStep) timeout(p *Plan) time.Duration { return p.Timeouts.Unfence.D() }
func (unfenceStep) pastNoReturn() bool            { return true }
func (unfenceStep) describe(r *runner, _ bool) string {
	return strings.Join(r.p.proxyCommands("fence off --expect-backend", r.to.api.URL), "; ")
}

func (unfenceStep) run(ctx context.Context, r *runner) (string, error) {
	resp, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: false, ExpectBackend: r.to.api.URL})
	if err != nil {
		return "", err
	}
	r.j.UnfencedAt = time.Now().UTC()
	r.j.RefusedAtUnfence = resp.Status.RefusedWrites
	return fmt.Sprintf("writes open on %s; write-unavailability window %s", r.to.name, r.j.UnfencedAt.Sub(r.j.FencedAt).Round(time.Millisecond)), nil
}
