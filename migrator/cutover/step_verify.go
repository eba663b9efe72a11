package cutover

import (
	"context"
	"fmt"
	"time"
)

// verifyStep compares blue and green object by object through their apiservers (verify.go),
// and green etcd's migrated v2 keys (v2.go).
type verifyStep struct{}

func (verifyStep) name() string                  { return StepVerify }
func (verifyStep) timeout(p *Plan) time.Duration { return p.Timeouts.Verify.D() }
func (verifyStep) pastNoReturn() bool            { return false }

func (verifyStep) describe(*runner, bool) string {
	return "compare every listable resource type on blue and green (UID and content)"
}

func (verifyStep) run(ctx context.Context, r *runner) (string, error) {
	blue, err := restConfig(r.p.Blue.APIServer.Kubeconfig)
	if err != nil {
		return "", err
	}
	green, err := restConfig(r.p.Green.APIServer.Kubeconfig)
	if err != nil {
		return "", err
	}
	rep, err := verifyObjects(ctx, blue, green, r.j.SnapshotRevision)
	r.j.Verified = rep
	if err != nil {
		return "", err
	}
	msg := fmt.Sprintf("%d objects of %d resource types identical; %d differences explained (the apiservers' own objects, expired events)", rep.Objects, rep.ResourceTypes, len(rep.ChangedAfterCopy))
	if len(r.j.V2Prefixes) > 0 {
		m, err := r.checkV2Keys(ctx)
		if err != nil {
			return "", err
		}
		msg += "; " + m
	}
	return msg, nil
}
