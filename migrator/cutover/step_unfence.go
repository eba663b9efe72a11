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
	if extra := r.changesByHand(resp.Status.Generation); extra > 0 {
		detail += fmt.Sprintf("; WARNING: the proxies' state changed %d more time(s) since the fence than by this cutover's switch and unfence: a fence or backend command run by hand during the window? Writes may have reopened before this step (check each proxy's log for \"fence off\"); the window reported ends here", extra)
	}
	if n := resp.Status.ResumedThenEnded; n > 0 {
		// The switch counts a watch resumed once the target answers 200; kube-apiserver then
		// sends one ERROR event (410) when the watch's resourceVersion is older than its watch
		// cache, which starts when its apiserver started (docs/proxy.md).
		detail += fmt.Sprintf("; %d watch(es) resumed on %s were then ended by it (their resourceVersion older than its apiserver's watch cache: those clients relist)", n, r.to.name)
	}
	return detail, nil
}

// changesByHand counts the changes of the proxies' state since the fence beyond this cutover's
// own switch and unfence (one each per proxy), given the generation after the unfence. The
// switch refuses a change made before it (its expected generation); one after it, such as a
// fence off by hand, reopened writes before green's apiserver could write. A resumed run may
// repeat a change itself: it counts none.
func (r *runner) changesByHand(after uint64) int64 {
	if r.o.Resume || r.j.FenceGeneration == 0 {
		return 0
	}
	return int64(after) - int64(r.j.FenceGeneration) - 2*int64(len(r.p.proxyRefs()))
}
