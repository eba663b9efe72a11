package cutover

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
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

// apiserverConfigs are the client configs of blue's and green's apiservers, read directly.
func (r *runner) apiserverConfigs() (blue, green *rest.Config, err error) {
	if blue, err = restConfig(r.p.Blue.APIServer.Kubeconfig); err != nil {
		return nil, nil, err
	}
	if green, err = restConfig(r.p.Green.APIServer.Kubeconfig); err != nil {
		return nil, nil, err
	}
	return blue, green, nil
}

func (verifyStep) run(ctx context.Context, r *runner) (string, error) {
	blue, green, err := r.apiserverConfigs()
	if err != nil {
		return "", err
	}
	rep, err := verifyObjects(ctx, blue, green, r.j.SnapshotRevision)
	r.j.Verified = rep
	if err != nil {
		return "", err
	}
	msg := fmt.Sprintf("%d objects of %d resource types identical; %d differences explained (the apiservers' own objects, expired events)", rep.Objects, rep.ResourceTypes, rep.Explained)
	if len(r.j.V2Prefixes) > 0 {
		m, err := r.checkV2Keys(ctx)
		if err != nil {
			return "", err
		}
		msg += "; " + m
	}
	return msg, nil
}
