//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/replicate"
)

// TestCutoverRollback: blue is etcd 3.4 with TLS client certificates; kube-controller-manager,
// kube-scheduler and a client-go writer talk to it through the proxy. A forward cutover to etcd
// 3.6 with bake.enabled ends baking: green serves, blue follows green. Writes go on during the
// bake, and one revision of 300 deletes is made straight on green etcd (blue runs with etcd's
// default --max-txn-ops, 128: it takes the revision nested); the baking process is killed with SIGKILL and picked up again with --resume;
// `cutover rollback` (which stops that process) is killed with SIGKILL after its switch and
// finished with --resume. Then: blue serves, unfenced; blue and green hold the same keys at the
// rollback's switch; every write the writer saw acknowledged is on blue; the leaders kept their
// Leases through both switches; the watches open at each switch were resumed, not ended. Forward
// again: green's data dirs cleaned up, a new cutover, finished with `cutover finish`.
func TestCutoverRollback(t *testing.T) {
	framework.RequireBins(t, framework.ControlPlaneBins...)
	f, cs := bakeFixture(t)
	ctx := t.Context()
	leaders := startLeaders(t, f, cs)
	w := startWriter(t, cs, "repl")

	baker := f.startBaker(t)
	j := loadJournal(t, f)
	fwd := j.UnfencedAt.Sub(j.FencedAt)
	t.Logf("forward window %s; baking from revision %d", fwd, j.Bake.Revision)
	if rec, _ := journalStep(j, cutover.StepSwitch); !strings.Contains(rec.Detail, " 0 ended") {
		t.Errorf("the cutover's switch ended watches instead of resuming them on green: %s", rec.Detail)
	}
	if n := w.count(); n == 0 {
		t.Fatal("the writer wrote nothing")
	}
	time.Sleep(2 * time.Second) // writes on green, followed by blue
	manyOpsOnGreen(t, f)
	f.checkBlueFollows(t, baker, w)
	t.Logf("kubefence cutover status:\n%s", f.cutoverSub(t, "status"))

	_ = baker.cmd.Process.Kill()
	baker.wait(t, "SIGKILL")
	baker = f.startBaker(t, "--resume")
	time.Sleep(2 * time.Second)
	f.checkBlueFollows(t, baker, w)

	killAt(t, cutover.StepGateGreen, "cutover", "rollback", "--plan", f.green.PlanPath)
	baker.wait(t, "the rollback stopped it")
	t.Logf("the baker's output:\n%s", baker.output())
	out, err := runKubefence(ctx, "cutover", "rollback", "--resume", "--plan", f.green.PlanPath)
	t.Logf("kubefence cutover rollback --resume:\n%s", out)
	if err != nil {
		t.Fatalf("rollback --resume: %v", err)
	}
	time.Sleep(time.Second)
	acked, errs := w.finish()
	if len(errs) > 0 {
		t.Errorf("the writer saw %d errors; first: %v", len(errs), errs[0])
	}
	f.checkRolledBack(t, acked, leaders)

	// Forward again: a new cutover once green's data dirs are gone; finish its bake.
	t.Logf("kubefence cutover cleanup:\n%s", f.cutoverSub(t, "cleanup", "--remove-data-dirs"))
	baker = f.startBaker(t)
	t.Logf("kubefence cutover finish:\n%s", f.cutoverSub(t, "finish"))
	baker.wait(t, "cutover finish stopped it")
	if j := loadJournal(t, f); j.State != cutover.StateDone {
		t.Fatalf("after finish the cutover is %s", j.State)
	}
	if st, err := f.px.Admin.Status(ctx); err != nil || st.Backend != f.green.GreenURL || st.Fenced {
		t.Fatalf("proxy after forward again: %+v %v", st, err)
	}
	checkAckedOnGreen(t, f, acked)
	for _, l := range leaders {
		if err := l.C.Restarted(); err != nil {
			t.Errorf("after forward again: %v", err)
		}
	}
}

// bakeFixture is blue etcd 3.4 with TLS client certificates (and the request size a bake
// needs; its --max-txn-ops is etcd's default) behind the proxy, and a replicating plan with
// bake.enabled; it returns a client of the proxy.
func bakeFixture(t *testing.T) (*cutoverFixture, *kubernetes.Clientset) {
	t.Helper()
	f := newCutoverFixtureWith(t, framework.EtcdConfig{Version: framework.Etcd34, TLS: true,
		ExtraArgs: []string{"--max-request-bytes", "10485760"}})
	cs := f.replicatePlan(t)
	f.green.Plan.Bake.Enabled = true
	f.green.Plan.Blue.APIServer.EtcdUser = "kube-apiserver-etcd-client"
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	return f, cs
}

// manyOpsOnGreen makes, straight on green etcd during a bake, one revision of more operations
// than etcd's default --max-txn-ops (a delete of 300 keys, as a lease expiry makes), which
// blue (run with the default) must take as one revision: checkRolledBack compares every key.
func manyOpsOnGreen(t *testing.T, f *cutoverFixture) {
	t.Helper()
	green, err := datadir.NewClient(f.green.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer green.Close()
	for i := range 300 {
		if _, err := green.Put(t.Context(), fmt.Sprintf("/kubefence-test/many/%03d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	del, err := green.Delete(t.Context(), "/kubefence-test/many/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if del.Deleted != 300 {
		t.Fatalf("one delete on green took %d keys, want 300", del.Deleted)
	}
	t.Logf("green's revision %d deletes 300 keys", del.Header.Revision)
}

// TestCutoverBakeAbort: a baking cutover turns blue etcd's auth on before the fence; aborted
// before the switch (killed, then 'cutover abort'), blue is as it was: auth off again, its
// apiserver ready, the proxy open on blue.
func TestCutoverBakeAbort(t *testing.T) {
	f, _ := bakeFixture(t)
	killAtStep(t, f, cutover.StepVerify)
	out, err := runKubefence(t.Context(), "cutover", "abort", "--plan", f.green.PlanPath)
	t.Logf("kubefence cutover abort:\n%s", out)
	if err != nil {
		t.Fatalf("abort: %v", err)
	}
	f.checkAborted(t)
	cli, err := f.blue.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// etcd 3.4 has no AuthStatus: with auth off anyone may list roles (the abort also removed
	// kubefence's own user, this client's CN, so with auth on it could not).
	if _, err := cli.RoleList(t.Context()); err != nil {
		t.Errorf("blue etcd after the abort: %v; want auth off, as before the cutover", err)
	}
	if _, err := f.blue.cs.CoreV1().ConfigMaps("repl").Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-abort"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("blue's apiserver cannot write after the abort: %v", err)
	}
}

// checkRolledBack checks the state after the rollback: proxy open on blue, journals, the same
// keys on both sides at the switch, every acknowledged write on blue, the leaders' Leases kept.
func (f *cutoverFixture) checkRolledBack(t *testing.T, acked []string, leaders []framework.Leader) {
	t.Helper()
	ctx := t.Context()
	st, err := f.px.Admin.Status(ctx)
	if err != nil || st.Backend != f.blue.api.URL || st.Fenced {
		t.Fatalf("proxy after the rollback: %+v %v; want open on blue %s", st, err, f.blue.api.URL)
	}
	if j := loadJournal(t, f); j.State != cutover.StateRolledBack {
		t.Fatalf("cutover after the rollback: %s", j.State)
	}
	rj, err := cutover.LoadJournal(f.green.Plan.StateDir + "/rollback")
	if err != nil || rj.State != cutover.StateDone {
		t.Fatalf("rollback journal: %+v %v", rj, err)
	}
	t.Logf("rollback window %s", rj.UnfencedAt.Sub(rj.FencedAt))
	for _, step := range []string{cutover.StepSwitch} {
		rec, _ := journalStep(rj, step)
		t.Logf("rollback %s: %s", step, rec.Detail)
		if !strings.Contains(rec.Detail, " 0 ended") {
			t.Errorf("the rollback's switch ended watches instead of resuming them on blue: %s", rec.Detail)
		}
	}
	// Killed at gate-green, the rollback's resume picks replication up again to bring blue what
	// green's apiserver wrote before its gate: the step says if it could not, or stopped short.
	if rec, _ := journalStep(rj, cutover.StepStopReplication); strings.Contains(rec.Detail, "could not be picked up") || strings.Contains(rec.Detail, "without catching up") {
		t.Errorf("the resumed rollback's stop-replication did not bring blue green's last writes: %s", rec.Detail)
	}
	blueCli, err := f.blue.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer blueCli.Close()
	greenCli, err := datadir.NewClient(f.green.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer greenCli.Close()
	sameKeysAt(t, greenCli, blueCli, rj.SwitchRevision)
	checkAckedOn(t, f.blue.cs, acked, "blue")
	// The rollback was killed while fenced and resumed by a new process: a leader rides that
	// out while its renewals' span stays under its renew deadline, which a loaded machine's
	// kill, start and resume may pass without anything being wrong with the rollback.
	if fenced := rj.UnfencedAt.Sub(rj.FencedAt); fenced > framework.RenewDeadline-framework.RetryPeriod {
		t.Logf("the rollback was fenced %s across its kill and resume, past what a leader's renewals ride out (%s): leases not checked", fenced, framework.RenewDeadline-framework.RetryPeriod)
		return
	}
	for _, l := range leaders {
		checkKeptLease(t, f.blue.cs, "blue", l, rj.UnfencedAt)
	}
}

// baker is a `kubefence cutover` process that ends baking: it runs until stopped.
type baker struct {
	cmd  *exec.Cmd
	args []string
	mu   sync.Mutex
	out  strings.Builder
	done chan struct{}
	reap sync.Once // Wait, once: by wait, or by the cleanup of a test that failed before it
}

func (b *baker) output() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out.String()
}

// wait waits for the baking process to end after why (it was stopped, or killed); one still
// running after cmdBound fails the test.
func (b *baker) wait(t *testing.T, why string) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(cmdBound):
		t.Fatalf("kubefence cutover %v (baking) did not end within %s after %s:\n%s", b.args, cmdBound, why, b.output())
	}
	b.reap.Do(func() { _ = b.cmd.Wait() })
}

// startBaker starts `kubefence cutover` (with args) and returns once it prints that blue
// follows green.
func (f *cutoverFixture) startBaker(t *testing.T, args ...string) *baker {
	t.Helper()
	b := &baker{cmd: framework.DiesWithParent(exec.Command(kubefenceBin, append([]string{"cutover", "--plan", f.green.PlanPath}, args...)...)), args: args, done: make(chan struct{})}
	pipe, err := b.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	b.cmd.Stderr = b.cmd.Stdout
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Killed and reaped (a test that failed before wait left a zombie): its output pipe
		// closes with it, and Wait must come after the last read of it.
		_ = b.cmd.Process.Kill()
		select {
		case <-b.done:
			b.reap.Do(func() { _ = b.cmd.Wait() })
		case <-time.After(cmdBound):
		}
	})
	following := make(chan struct{})
	go func() {
		defer close(b.done)
		sc := bufio.NewScanner(pipe)
		var once sync.Once
		for sc.Scan() {
			b.mu.Lock()
			b.out.WriteString(sc.Text() + "\n")
			b.mu.Unlock()
			if strings.Contains(sc.Text(), "blue follows green:") {
				once.Do(func() { close(following) })
			}
		}
		_, _ = io.Copy(io.Discard, pipe)
	}()
	select {
	case <-following:
	case <-b.done:
		t.Fatalf("kubefence cutover %v ended before blue followed green:\n%s", args, b.output())
	case <-time.After(5 * time.Minute):
		t.Fatalf("kubefence cutover %v: blue did not follow green within 5 minutes:\n%s", args, b.output())
	}
	return b
}

// followBound bounds each wait of checkBlueFollows: for a write on green through each writer,
// then for blue to catch up with green.
const followBound = 60 * time.Second

// checkBlueFollows checks the baker b keeps blue in step with green, past the line startBaker
// waits for (a rollback catches blue up itself, so it would not notice a baker that stopped
// following): once every writer has had a write acknowledged since the call (on green),
// blue etcd reaches green's revision read then, and `cutover status` shows b following with
// no error.
func (f *cutoverFixture) checkBlueFollows(t *testing.T, b *baker, ws ...*writer) {
	t.Helper()
	ctx := t.Context()
	var counts []int
	for _, w := range ws {
		counts = append(counts, w.count())
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, followBound, true, func(context.Context) (bool, error) {
		for i, w := range ws {
			if w.count() <= counts[i] {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("baking: the writers had no write acknowledged on green within %s", followBound)
	}
	green, err := datadir.NewClient(f.green.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer green.Close()
	blue, err := f.blue.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer blue.Close()
	want, err := etcdRevision(ctx, green)
	if err != nil {
		t.Fatalf("green etcd's revision: %v", err)
	}
	var got int64
	var lastErr error
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, followBound, true, func(ctx context.Context) (bool, error) {
		got, lastErr = etcdRevision(ctx, blue)
		return lastErr == nil && got >= want, nil
	}); err != nil {
		t.Fatalf("baking: blue etcd at revision %d (%v) did not reach green's %d within %s: blue does not follow green\n%s", got, lastErr, want, followBound, b.output())
	}
	st := f.cutoverStatus(t)
	if bk := st.Bake; st.State != cutover.StateBaking || bk == nil || bk.Follower != b.cmd.Process.Pid || bk.FollowingStopped || bk.Error != "" {
		t.Fatalf("baking: cutover status says %s, bake %+v; want baking, followed by the baker (pid %d), no error", st.State, bk, b.cmd.Process.Pid)
	}
	t.Logf("blue follows green: at revision %d, green's %d when read; status: lag %d revisions", got, want, st.Bake.LagRevisions)
}

// etcdRevision is cli's cluster's current revision (bounded at 5 s).
func etcdRevision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return replicate.Revision(ctx, cli)
}

// cutoverStatus is `kubefence cutover status -o json` (bounded by cmdBound).
func (f *cutoverFixture) cutoverStatus(t *testing.T) *cutover.StatusReport {
	t.Helper()
	cmd, explain := boundedKubefence(t.Context(), "cutover", "status", "-o", "json", "--plan", f.green.PlanPath)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err = explain(err); err != nil {
		t.Fatalf("kubefence cutover status: %v\n%s%s", err, out, errOut.String())
	}
	st := &cutover.StatusReport{}
	if err := json.Unmarshal(out, st); err != nil {
		t.Fatalf("kubefence cutover status -o json: %v\n%s", err, out)
	}
	return st
}

// cutoverSub runs `kubefence cutover SUB --plan PLAN args…` (bounded by cmdBound, not by the
// test's end) and returns its output.
func (f *cutoverFixture) cutoverSub(t *testing.T, sub string, args ...string) string {
	t.Helper()
	out, err := runKubefence(context.WithoutCancel(t.Context()), append([]string{"cutover", sub, "--plan", f.green.PlanPath}, args...)...)
	if err != nil {
		t.Fatalf("kubefence cutover %s: %v\n%s", sub, err, out)
	}
	return out
}

// killAt runs kubefence with argv and kills it with SIGKILL as soon as it starts step; a run
// that neither starts it nor ends within cmdBound is killed and fails the test.
func killAt(t *testing.T, step string, argv ...string) {
	t.Helper()
	killed := false
	seen, err := runScanning(t.Context(), t, argv, func(line string, p *os.Process) bool {
		if startsStep(line, step) {
			_ = p.Kill()
			killed = true
			return false
		}
		return true
	})
	t.Logf("kubefence %v (killed at %s):\n%s", argv, step, seen)
	if !killed {
		t.Fatalf("kubefence %v never started step %s: %v", argv, step, err)
	}
}

func loadJournal(t *testing.T, f *cutoverFixture) *cutover.Journal {
	t.Helper()
	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// TestCutoverBakeLost: the cutover is killed as the hand-over to the bake starts (after the
// switch, writes fenced), and something writes straight to green etcd meanwhile, so blue can no
// longer follow green exactly. --resume must not stay stuck fenced: it finishes the cutover
// without a bake (green serves, writes open) and says there is no way back.
func TestCutoverBakeLost(t *testing.T) {
	f, cs := bakeFixture(t)
	ctx := t.Context()
	w := startWriter(t, cs, "repl")
	killAtStep(t, f, cutover.StepHandOver)
	green, err := datadir.NewClient(f.green.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer green.Close()
	if _, err := green.Put(ctx, "/kubefence-test/straight-to-green", "x"); err != nil {
		t.Fatal(err)
	}
	out, err := f.cutoverCmd(ctx, "--resume")
	acked, errs := w.finish()
	t.Logf("kubefence cutover --resume:\n%s", out)
	if err != nil {
		t.Fatalf("resume after the bake became impossible: %v", err)
	}
	if !strings.Contains(strings.ToLower(out), "no way back") {
		t.Error("the resume does not say the bake is lost")
	}
	if st, err := f.px.Admin.Status(ctx); err != nil || st.Fenced || st.Backend != f.green.GreenURL {
		t.Fatalf("proxy: %+v %v; want open on green", st, err)
	}
	if j := loadJournal(t, f); j.State != cutover.StateDone || j.Bake != nil {
		t.Errorf("journal: state %s, bake %+v; want done without a bake", j.State, j.Bake)
	}
	if len(errs) > 0 {
		t.Errorf("the writer saw %d errors; first: %v", len(errs), errs[0])
	}
	checkAckedOnGreen(t, f, acked)
}
