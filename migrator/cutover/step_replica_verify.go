package cutover

import (
	"context"
	"fmt"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// replicaVerifyStep (mode replicate, before the fence) compares every object on blue and green
// at one revision both hold: blue's current one, once the replicator has applied it. The same
// history at the same revision: any difference fails. From there on, the delta check compares
// each revision's changes on both sides (startDeltaCheck), which the switch waits for.
type replicaVerifyStep struct{}

func (replicaVerifyStep) name() string                  { return StepVerify }
func (replicaVerifyStep) timeout(p *Plan) time.Duration { return p.Timeouts.Verify.D() }
func (replicaVerifyStep) pastNoReturn() bool            { return false }

func (replicaVerifyStep) describe(*runner, bool) string {
	return "wait until green applied blue's current revision R, then list every listable resource type on blue and green at exactly resourceVersion R and compare each object (UID and content); any difference fails. From R on, compare each revision's changes in both etcds' histories until the switch"
}

func (replicaVerifyStep) run(ctx context.Context, r *runner) (string, error) {
	blue, green, err := r.apiserverConfigs()
	if err != nil {
		return "", err
	}
	rev, err := replicate.Revision(ctx, r.repl.src)
	if err != nil {
		return "", fmt.Errorf("blue's revision: %w", err)
	}
	if err := r.repl.rep.WaitFor(ctx, rev); err != nil {
		return "", err
	}
	// Started now, its watches are current (etcd delivers a watch that starts in the past only
	// as its sync loop gets to it, up to 100 ms at a time) before the verify ends, which may
	// be well under a second before the fence.
	r.startDeltaCheck(rev)
	rep, err := verifyAt(ctx, blue, green, rev)
	if rep != nil {
		rep.Revision = rev
	}
	r.j.Verified = rep
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d objects of %d resource types identical at revision %d; %s", rep.Objects, rep.ResourceTypes, rev, r.progressLine(r.repl.rep.Progress())), nil
}
