//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/proxy/admin"
)

// TestCutoverReplicate: migration.mode replicate under a client-go writer through the proxy
// (fence mode hold). Green is restored at blue's revision, replicated live, verified at a
// common revision before the fence; the window is fence → drain → switch. A write made straight
// to blue etcd during replication is on green; at the switch both are at the same revision with
// the same keys; every acknowledged write is on green; the writer saw no error.
func TestCutoverReplicate(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	cs := f.replicatePlan(t)
	// An informer through the proxy: its watch is moved to green at the switch (same revisions).
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace("repl"))
	cmInf := factory.Core().V1().ConfigMaps().Informer()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), cmInf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	kw := startKubectlWatch(t, f.px.Kubeconfig, "repl", true) // kubectl's default output
	w := startWriter(t, cs, "repl")
	time.Sleep(time.Second)

	cut := startCutover(t, f)
	blueCli, err := f.blue.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer blueCli.Close()
	directRev, putErr := putWhenReplicating(t, f, blueCli, cut.ended)
	<-cut.ended
	t.Logf("kubefence cutover:\n%s", cut.out)
	if cut.err != nil {
		t.Fatalf("cutover failed: %v", cut.err)
	}
	if putErr != nil {
		t.Fatal(putErr)
	}
	time.Sleep(2 * time.Second) // writes go on, on green
	acked, errs := w.finish()

	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != cutover.StateDone || j.SwitchRevision == 0 || j.UnfencedAt.Sub(j.FencedAt) <= 0 {
		t.Fatalf("journal: %+v", j)
	}
	t.Logf("write window (fence on → off) %s; snapshot revision %d, direct write at %d, drain %d, switch at revision %d; writer: %d acknowledged, %d errors",
		j.UnfencedAt.Sub(j.FencedAt), j.SnapshotRevision, directRev, j.DrainRevision, j.SwitchRevision, len(acked), len(errs))
	for _, rec := range j.Done {
		t.Logf("step %s %s: %s", rec.Step, rec.Duration.Round(time.Millisecond), rec.Detail)
	}
	if len(errs) > 0 {
		t.Errorf("the writer saw %d errors; first: %v", len(errs), errs[0])
	}
	st, err := f.px.Admin.Status(ctx)
	if err != nil || st.Backend != f.green.GreenURL || st.Fenced {
		t.Fatalf("proxy after cutover: %+v %v", st, err)
	}
	greenCli, err := datadir.NewClient(f.green.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer greenCli.Close()
	sameKeysAt(t, blueCli, greenCli, j.SwitchRevision)
	if resp, err := greenCli.Get(ctx, "/kubefence-test/direct"); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "straight to blue" {
		t.Errorf("the write made straight to blue etcd during replication, on green: %+v %v", resp, err)
	}
	checkAckedOnGreen(t, f, acked)
	informerHas(t, cmInf.GetStore(), acked)
	kw.check(t, acked)
}

// kubectlWatch is `kubectl get configmaps -w` through the proxy, with -o name or, table, its
// default output: a table, for which kubectl asks kube-apiserver for Tables
// (application/json;as=Table), each event's object a Table with the configmap in its row.
type kubectlWatch struct {
	out   *syncBuffer
	done  chan error
	table bool
}

func startKubectlWatch(t *testing.T, kubeconfig, ns string, table bool) *kubectlWatch {
	t.Helper()
	bin, err := framework.Bin("kubectl", framework.Kube136)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--kubeconfig", kubeconfig, "-n", ns, "get", "configmaps", "-w"}
	if !table {
		args = append(args, "-o", "name")
	}
	cmd := framework.DiesWithParent(exec.Command(bin, args...))
	kw := &kubectlWatch{out: &syncBuffer{}, done: make(chan error, 1), table: table}
	cmd.Stdout, cmd.Stderr = kw.out, kw.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { kw.done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return kw
}

// check: kubectl get -w kept running across the cutover (its watch resumed on green) and
// printed every acknowledged configmap exactly once.
func (kw *kubectlWatch) check(t *testing.T, acked []string) {
	t.Helper()
	lines := kw.byName
	var missing string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		missing = ""
		got := lines()
		for _, name := range acked {
			if got[name] == 0 {
				missing = name
				break
			}
		}
		if missing == "" {
			break
		}
	}
	select {
	case err := <-kw.done:
		t.Fatalf("kubectl get -w exited (%v) during the cutover:\n%s", err, kw.out.String())
	default:
	}
	if missing != "" {
		t.Fatalf("kubectl get -w never printed configmap/%s", missing)
	}
	for _, name := range acked {
		if n := lines()[name]; n != 1 {
			t.Errorf("kubectl get -w printed configmap/%s %d times, want once:\n%s", name, n, kw.out.String())
		}
	}
}

// byName counts the lines kubectl printed by the configmap they name: "configmap/NAME" with -o
// name, a row beginning with NAME in a table (its header left out).
func (kw *kubectlWatch) byName() map[string]int {
	n := map[string]int{}
	for l := range strings.SplitSeq(kw.out.String(), "\n") {
		name, ok := strings.CutPrefix(strings.TrimSpace(l), "configmap/")
		if kw.table {
			f := strings.Fields(l)
			name, ok = "", len(f) > 0 && f[0] != "NAME"
			if ok {
				name = f[0]
			}
		}
		if ok {
			n[name]++
		}
	}
	return n
}

// informerHas waits until the informer's store holds every acknowledged configmap.
func informerHas(t *testing.T, store cache.Store, acked []string) {
	t.Helper()
	missing := ""
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		missing = ""
		for _, name := range acked {
			if _, ok, _ := store.GetByKey("repl/" + name); !ok {
				missing = name
				break
			}
		}
		if missing == "" {
			return
		}
	}
	t.Errorf("the informer through the proxy never saw configmap repl/%s", missing)
}

// replicatePlan turns the fixture's plan into mode replicate with fence mode hold, and creates
// namespace repl with 100 configmaps of 2 KB; it returns a client of the proxy.
func (f *cutoverFixture) replicatePlan(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	f.replicateSettings(t)
	cs := f.proxyClient(t, 1000)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "repl"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pre-%03d", i)}, Data: map[string]string{"v": strings.Repeat("x", 2000)}}
		if _, err := cs.CoreV1().ConfigMaps("repl").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return cs
}

// replicateSettings turns the fixture's plan into mode replicate with fence mode hold.
func (f *cutoverFixture) replicateSettings(t *testing.T) {
	t.Helper()
	f.green.Plan.Migration.Mode = cutover.ModeReplicate
	f.green.Plan.Proxy.FenceMode = admin.ModeHold
	f.green.Plan.Green.APIServer.EtcdUser = "kube-apiserver-etcd-client" // the CN of the PKI's apiserver-etcd-client
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
}

// backgroundCutover is `kubefence cutover` run in the background; out and err are set once
// ended is closed.
type backgroundCutover struct {
	ended chan struct{}
	out   string
	err   error
}

// startCutover starts `kubefence cutover` for the rest of t. It ends within cmdBound (a hung
// cutover is killed, and says so) and not at the end of t's context, so that the test's own
// failures do not cut it mid-step; at t's cleanup, registered after the fixture's so that it
// runs first, a cutover still running is killed and waited for before green's processes are
// stopped, instead of outliving the test.
func startCutover(t *testing.T, f *cutoverFixture) *backgroundCutover {
	t.Helper()
	ctx, kill := context.WithCancel(context.WithoutCancel(t.Context()))
	c := &backgroundCutover{ended: make(chan struct{})}
	go func() {
		defer close(c.ended)
		c.out, c.err = f.cutoverCmd(ctx)
	}()
	t.Cleanup(func() {
		kill()
		<-c.ended // bounded: the command's WaitDelay
	})
	return c
}

// putWhenReplicating waits until the cutover's journal shows the replicate step done, then
// writes straight to blue etcd (around the proxy) and returns that write's revision. It gives up
// when the cutover ends (cutoverEnded closed) first, or after 5 minutes.
func putWhenReplicating(t *testing.T, f *cutoverFixture, blue *clientv3.Client, cutoverEnded <-chan struct{}) (int64, error) {
	t.Helper()
	var rev int64
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-cutoverEnded:
			return false, errors.New("the cutover ended before the journal showed its replicate step done")
		default:
		}
		j, err := cutover.LoadJournal(f.green.Plan.StateDir)
		if err == nil {
			if _, ok := journalStep(j, cutover.StepReplicate); ok {
				resp, err := blue.Put(ctx, "/kubefence-test/direct", "straight to blue")
				if err != nil {
					return false, fmt.Errorf("the write straight to blue etcd: %w", err)
				}
				rev = resp.Header.Revision
				return true, nil
			}
			if j.State != cutover.StateRunning {
				return false, fmt.Errorf("cutover %s before the replicate step: %s", j.State, j.AbortReason)
			}
		}
		return false, nil
	})
	if wait.Interrupted(err) {
		return 0, fmt.Errorf("the replicate step did not finish in 5 minutes: %w", err)
	}
	return rev, err
}

func journalStep(j *cutover.Journal, name string) (cutover.StepRecord, bool) {
	for _, r := range j.Done {
		if r.Step == name {
			return r, true
		}
	}
	return cutover.StepRecord{}, false
}

// sameKeysAt checks blue and green etcd hold the same keys at revision rev: values, create and
// mod revisions, versions and leases (green's history up to the switch is blue's).
func sameKeysAt(t *testing.T, blue, green *clientv3.Client, rev int64) {
	t.Helper()
	get := func(c *clientv3.Client) *clientv3.GetResponse {
		resp, err := c.Get(t.Context(), "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatalf("get at revision %d: %v", rev, err)
		}
		return resp
	}
	b, g := get(blue), get(green)
	if len(b.Kvs) != len(g.Kvs) {
		t.Fatalf("at revision %d blue holds %d keys, green %d", rev, len(b.Kvs), len(g.Kvs))
	}
	for i, bk := range b.Kvs {
		gk := g.Kvs[i]
		if !bytes.Equal(bk.Key, gk.Key) || !bytes.Equal(bk.Value, gk.Value) || bk.CreateRevision != gk.CreateRevision || bk.ModRevision != gk.ModRevision || bk.Version != gk.Version || bk.Lease != gk.Lease {
			t.Errorf("at revision %d key %q differs: blue %s rev %d/%d v%d lease %x, green %q rev %d/%d v%d lease %x", rev, bk.Key, bk.Key, bk.CreateRevision, bk.ModRevision, bk.Version, bk.Lease, gk.Key, gk.CreateRevision, gk.ModRevision, gk.Version, gk.Lease)
		}
	}
	t.Logf("blue and green hold the same %d keys at revision %d", len(b.Kvs), rev)
}

// checkAckedOnGreen checks every configmap the writer saw acknowledged is on green.
func checkAckedOnGreen(t *testing.T, f *cutoverFixture, acked []string) {
	t.Helper()
	gcs, _, err := framework.ClientsetFor(f.green.GreenKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	checkAckedOn(t, gcs, acked, "green")
}

// checkAckedOn checks every configmap in acked is in namespace repl of cs (side names it).
func checkAckedOn(t *testing.T, cs kubernetes.Interface, acked []string, side string) {
	t.Helper()
	checkAckedIn(t, cs, "repl", acked, side)
}

// checkAckedIn checks every configmap in acked is in namespace ns of cs (side names it).
func checkAckedIn(t *testing.T, cs kubernetes.Interface, ns string, acked []string, side string) {
	t.Helper()
	list, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, cm := range list.Items {
		have[cm.Name] = true
	}
	missing := 0
	for _, name := range acked {
		if !have[name] {
			missing++
			if missing <= 10 {
				t.Errorf("acknowledged configmap %s/%s is not on %s", ns, name, side)
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d acknowledged configmaps missing on %s", missing, len(acked), side)
	}
	t.Logf("all %d acknowledged configmaps are on %s (%d configmaps in %s)", len(acked), side, len(list.Items), ns)
}
