package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/e2e/framework"
)

// leaders are kube-controller-manager and kube-scheduler behind the proxy, with their Leases
// as they were before the cutover.
type leaders []leader

type leader struct {
	c      *framework.ControlPlaneComponent
	before framework.LeaseState
}

// startLeaders starts both components against the proxy and waits until each leads and has
// renewed its Lease once.
func startLeaders(ctx context.Context, env *framework.Env, px *framework.Proxy, pki *framework.PKI, cs kubernetes.Interface) (leaders, error) {
	cfg := framework.ControlPlaneConfig{Server: px.URL, PKI: pki}
	kcm, err := env.StartControllerManager(cfg)
	if err != nil {
		return nil, err
	}
	sched, err := env.StartScheduler(cfg)
	if err != nil {
		return nil, err
	}
	var ls leaders
	for _, c := range []*framework.ControlPlaneComponent{kcm, sched} {
		acquired, err := c.WaitLeader(ctx, cs, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		before, err := c.WaitRenewedAfter(ctx, cs, acquired.RenewTime, framework.LeaseDuration)
		if err != nil {
			return nil, err
		}
		ls = append(ls, leader{c: c, before: before})
	}
	return ls, nil
}

func (ls leaders) String() string {
	var parts []string
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%s leads (transitions %d)", l.c.Name, l.before.Transitions))
	}
	return strings.Join(parts, ", ")
}

// check reads each Lease on green (gcs) until it was renewed after the unfence and says how
// each leader fared; a new holder, a new transition or a restart is an error.
func (ls leaders) check(ctx context.Context, gcs kubernetes.Interface, unfenced time.Time) ([]string, error) {
	var out []string
	for _, l := range ls {
		after, err := l.c.WaitRenewedAfter(ctx, gcs, unfenced, framework.LeaseDuration)
		if err != nil {
			return out, err
		}
		if after.Holder != l.before.Holder || after.Transitions != l.before.Transitions {
			return out, fmt.Errorf("%s lost its lease: before %s, after %s", l.c.Name, l.before, after)
		}
		if err := l.c.Restarted(); err != nil {
			return out, err
		}
		out = append(out, fmt.Sprintf("%s kept its lease (transitions %d), renewed on green %s after the unfence",
			l.c.Name, after.Transitions, after.RenewTime.Sub(unfenced).Round(time.Millisecond)))
	}
	return out, nil
}

// cutoverCmd runs `kubefence cutover --plan plan args...`, its output indented under the step.
func cutoverCmd(ctx context.Context, bin string, out io.Writer, env *framework.Env, plan string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, append([]string{"cutover", "--plan", plan}, args...)...)
	cmd.Stdout = &indent{w: out, prefix: "            | "}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kubefence cutover %s: %w (logs in %s)", strings.Join(args, " "), err, env.LogDir)
	}
	return nil
}

func rateWord(rate int) string {
	switch {
	case rate < 0:
		return "as fast as the API lets it"
	case rate == 0:
		return "off"
	}
	return fmt.Sprintf("at %d writes/s", rate)
}
