//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
)

// TestCutoverReplicateLeaders: real kube-controller-manager and kube-scheduler, with kubeadm's
// client certificates and leader election at the defaults (15 s lease, 10 s renew deadline, 2 s
// retry), talk to blue through the proxy. The replication cutover (fence mode hold, default
// policy: their Lease updates are writes and are held while fenced) moves them to green, and
// neither loses its lease: same holder, leaseTransitions unchanged, no exit and no "leaderelection
// lost", the Lease renewed on green after the unfence, and both still do their work on green.
func TestCutoverReplicateLeaders(t *testing.T) {
	framework.RequireBins(t, framework.ControlPlaneBins...)
	f := newCutoverFixture(t)
	ctx := t.Context()
	f.replicateSettings(t)
	cs := f.proxyClient(t, 100)
	leaders := startLeaders(t, f, cs)
	deploymentScheduled(t, cs, "before")

	start := time.Now()
	out, err := f.cutoverCmd(context.WithoutCancel(ctx))
	t.Logf("kubefence cutover (%s):\n%s", time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("cutover failed: %v", err)
	}
	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != cutover.StateDone {
		t.Fatalf("journal: %+v", j)
	}
	st, err := f.px.Admin.Status(ctx)
	if err != nil || st.Backend != f.green.GreenURL || st.Fenced {
		t.Fatalf("proxy after cutover: %+v %v; want open on green %s", st, err, f.green.GreenURL)
	}
	t.Logf("write window (fence on → off) %s; Lease renewals held by the proxy meanwhile: %s",
		j.UnfencedAt.Sub(j.FencedAt), heldLeaseWrites(t, f.px.Proc.LogPath))

	// Read green directly: the Leases renewed there after the unfence are the leaders' own.
	gcs, _, err := framework.ClientsetFor(f.green.GreenKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leaders {
		checkKeptLease(t, gcs, "green", l, j.UnfencedAt)
	}
	deploymentScheduled(t, cs, "after")
	for _, l := range leaders {
		if err := l.C.Restarted(); err != nil {
			t.Errorf("after the cutover: %v", err)
		}
	}
}

// heldLeaseWrites lists the leader Lease writes the proxy logged as held while fenced. A renewal
// lands in the window only sometimes (every 2 s, the window is tens of milliseconds); when it
// does, green answered it.
func heldLeaseWrites(t *testing.T, proxyLog string) string {
	t.Helper()
	b, err := os.ReadFile(proxyLog)
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(line, "held write") && strings.Contains(line, "resource=leases.coordination.k8s.io") && strings.Contains(line, "namespace=kube-system") {
			held = append(held, line)
		}
	}
	if len(held) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d\n%s", len(held), strings.Join(held, "\n"))
}

// startLeaders starts kube-controller-manager and kube-scheduler behind the proxy and waits
// until each leads steadily.
func startLeaders(t *testing.T, f *cutoverFixture, cs kubernetes.Interface) []framework.Leader {
	t.Helper()
	start := time.Now()
	leaders, err := f.env.StartLeaders(t.Context(), framework.ControlPlaneConfig{Server: f.px.URL, PKI: f.pki}, cs)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leaders {
		t.Logf("%s leads (%s after the start): %s", l.C.Name, time.Since(start).Round(time.Millisecond), l.Before)
	}
	return leaders
}

// checkKeptLease checks l still holds its Lease on the side cs reads (named side): renewed after
// unfenced, by the same holder, with no new transition, and the process neither exited nor lost
// the election.
func checkKeptLease(t *testing.T, cs kubernetes.Interface, side string, l framework.Leader, unfenced time.Time) {
	t.Helper()
	after, err := l.C.WaitRenewedAfter(t.Context(), cs, unfenced, framework.RenewDeadline)
	if err != nil {
		t.Errorf("the leader did not keep renewing on %s: %v", side, err)
		return
	}
	t.Logf("%s on %s: %s (renewed %s after the unfence)", l.C.Name, side, after, after.RenewTime.Sub(unfenced).Round(time.Millisecond))
	if after.Holder != l.Before.Holder {
		t.Errorf("%s lease holder changed across the cutover: %q, was %q", l.C.Name, after.Holder, l.Before.Holder)
	}
	if after.Transitions != l.Before.Transitions {
		t.Errorf("%s leaseTransitions changed across the cutover: %d, was %d", l.C.Name, after.Transitions, l.Before.Transitions)
	}
	if !after.AcquireTime.Equal(l.Before.AcquireTime) {
		t.Errorf("%s lease re-acquired across the cutover at %s, first at %s", l.C.Name, after.AcquireTime, l.Before.AcquireTime)
	}
	if err := l.C.Restarted(); err != nil {
		t.Errorf("across the cutover: %v", err)
	}
}

// deploymentScheduled creates a one-replica Deployment through the proxy and waits until
// kube-controller-manager made its pod (deployment and replicaset controllers, the namespace's
// default ServiceAccount) and kube-scheduler tried to place it: with no nodes it marks the pod
// Unschedulable. Both components work, not only hold their leases.
func deploymentScheduled(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	ctx := t.Context()
	ns := "leaders-" + name
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": name}
	one := int32(1)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var seen string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) == 0 {
			seen = fmt.Sprintf("no pod yet (%v)", err)
			return false, nil
		}
		seen = fmt.Sprintf("pod %s conditions %+v", pods.Items[0].Name, pods.Items[0].Status.Conditions)
		for _, c := range pods.Items[0].Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("deployment %s/%s: kube-controller-manager and kube-scheduler did not act within a minute: %v; last: %s", ns, name, err, seen)
	}
	t.Logf("deployment %s/%s: pod made and found unschedulable in %s", ns, name, time.Since(start).Round(time.Millisecond))
}
