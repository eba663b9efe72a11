package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/e2e/framework"
)

// leaders are kube-controller-manager and kube-scheduler behind the proxy, with their Leases
// as they were before the cutover.
type leaders []framework.Leader

// startLeaders starts both components against the proxy and waits until each leads steadily.
func startLeaders(ctx context.Context, env *framework.Env, px *framework.Proxy, pki *framework.PKI, cs kubernetes.Interface) (leaders, error) {
	return env.StartLeaders(ctx, framework.ControlPlaneConfig{Server: px.URL, PKI: pki}, cs)
}

func (ls leaders) String() string {
	var parts []string
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%s leads (transitions %d)", l.C.Name, l.Before.Transitions))
	}
	return strings.Join(parts, ", ")
}

// check reads each Lease on side (cs) until it was renewed after the unfence and says how each
// leader fared; a new holder, a new transition or a restart is an error.
func (ls leaders) check(ctx context.Context, cs kubernetes.Interface, unfenced time.Time, side string) ([]string, error) {
	var out []string
	for _, l := range ls {
		after, err := l.C.WaitRenewedAfter(ctx, cs, unfenced, framework.LeaseDuration)
		if err != nil {
			return out, err
		}
		if after.Holder != l.Before.Holder || after.Transitions != l.Before.Transitions {
			return out, fmt.Errorf("%s lost its lease: before %s, after %s", l.C.Name, l.Before, after)
		}
		if err := l.C.Restarted(); err != nil {
			return out, err
		}
		out = append(out, fmt.Sprintf("%s kept its lease (transitions %d), renewed on %s %s after the unfence",
			l.C.Name, after.Transitions, side, after.RenewTime.Sub(unfenced).Round(time.Millisecond)))
	}
	return out, nil
}
