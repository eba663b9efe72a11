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
	detail := fmt.Sprintf("writes open on %s; write-unavailability window %s", r.to.name, r.j.UnfencedAt.Sub(r.j.FencedAt).Round(time.Millisecond))
	if n := resp.Status.ResumedThenEnded; n > 0 {
		// The switch counts a watch resumed once the target answers 200; kube-apiserver then
		// sends one ERROR event (410) when the watch's resourceVersion is older than its watch
		// cache, which starts when its apiserver started (docs/proxy.md).
		detail += fmt.Sprintf("; %d watch(es) resumed on %s were then ended by it (their resourceVersion older than its apiserver's watch cache: those clients relist)", n, r.to.name)
	}
	return detail, nil
}
