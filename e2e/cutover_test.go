//go:build e2e

package e2e

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/proxy/admin"
)

type cutoverFixture struct {
	env   *framework.Env
	pki   *framework.PKI
	blue  *cluster
	px    *framework.Proxy
	green *framework.GreenSetup
}

func newCutoverFixture(t *testing.T) *cutoverFixture {
	t.Helper()
	return newCutoverFixtureWith(t, framework.EtcdConfig{Version: framework.Etcd34})
}

// newCutoverFixtureWith is newCutoverFixture with blue's etcd as blueEtcd says.
func newCutoverFixtureWith(t *testing.T, blueEtcd framework.EtcdConfig) *cutoverFixture {
	t.Helper()
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd36, "kube-apiserver", framework.Kube136, "kubectl", framework.Kube136)
	f := &cutoverFixture{}
	f.env, f.pki = newEnvPKI(t)
	var err error
	f.blue, f.px = startBehindProxy(t, f.env, f.pki, "blue", blueEtcd)
	if f.green, err = f.env.WriteCutoverPlan("green", f.pki, f.px, f.blue.api, f.blue.etcd, framework.Etcd36, 1); err != nil {
		t.Fatal(err)
	}
	// Registered after newEnv's cleanup, so it runs first: green's processes outlive kubefence.
	t.Cleanup(func() {
		stopped, _ := framework.StopCutoverProcesses(f.green.Plan.StateDir)
		t.Logf("stopped green processes: %v", stopped)
	})
	return f
}

// checkAborted checks blue is as before an aborted cutover: the proxy open on blue, the journal
// aborted, no green process left.
func (f *cutoverFixture) checkAborted(t *testing.T) {
	t.Helper()
	st, err := f.px.Admin.Status(t.Context())
	if err != nil || st.Fenced || st.Backend != f.blue.api.URL {
		t.Fatalf("after abort the proxy is %+v, %v; want open on blue", st, err)
	}
	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil || j.State != cutover.StateAborted {
		t.Fatalf("journal after abort: %+v %v", j, err)
	}
	for name, pid := range j.GreenPIDs {
		if framework.Running(pid) {
			t.Errorf("green %s (pid %d) still running after the abort", name, pid)
		}
	}
}

// cutoverCmd runs `kubefence cutover` with args (bounded by cmdBound) and returns its combined
// output.
func (f *cutoverFixture) cutoverCmd(ctx context.Context, args ...string) (string, error) {
	return runKubefence(ctx, append([]string{"cutover", "--plan", f.green.PlanPath}, args...)...)
}

// cmdBound bounds each kubefence command a cutover test waits for. Here one takes seconds to a
// minute or two; a hung one is killed at the bound and fails its test with an error that names
// it, instead of holding the whole run until go test's -timeout, which names nothing.
const cmdBound = 5 * time.Minute

// boundedKubefence is kubefence with args under ctx, bounded by cmdBound (a caller's context
// without cancellation included); output a process it started may hold open is given up
// WaitDelay after it ends. explain, called once the command has ended, turns the error of a
// command killed at the bound into one that says so.
func boundedKubefence(ctx context.Context, args ...string) (cmd *exec.Cmd, explain func(error) error) {
	bound := fmt.Errorf("kubefence %s did not end within %s", strings.Join(args, " "), cmdBound)
	ctx, cancel := context.WithTimeoutCause(ctx, cmdBound, bound)
	cmd = framework.DiesWithParent(exec.CommandContext(ctx, kubefenceBin, args...))
	cmd.WaitDelay = 10 * time.Second
	return cmd, func(err error) error {
		defer cancel()
		if err != nil && context.Cause(ctx) == bound {
			return fmt.Errorf("%w; killed: %v", bound, err)
		}
		return err
	}
}

// runKubefence runs kubefence with args, bounded as boundedKubefence, and returns its combined
// output.
func runKubefence(ctx context.Context, args ...string) (string, error) {
	cmd, explain := boundedKubefence(ctx, args...)
	out, err := cmd.CombinedOutput()
	return string(out), explain(err)
}

func (f *cutoverFixture) proxyClient(t *testing.T, qps float32) *kubernetes.Clientset {
	t.Helper()
	return qpsClient(t, f.px.Kubeconfig, qps)
}

// qpsClient is a clientset for kubeconfig limited to qps requests per second.
func qpsClient(t *testing.T, kubeconfig string, qps float32) *kubernetes.Clientset {
	t.Helper()
	_, cfg, err := framework.ClientsetFor(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = qps, int(qps)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestCutover moves a live cluster from etcd 3.4 to etcd 3.6 behind the proxy while a writer,
// two informers, kubectl get -w and a reader run, and checks nothing was lost or surfaced.
func TestCutover(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	cs := f.proxyClient(t, 1000)
	seedCutover(t, cs)
	ld := startCutoverLoad(t, attemptsClient(t, f.px.Kubeconfig))
	// Informers on configmaps and namespaces.
	infCtx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	factory := informers.NewSharedInformerFactory(cs, 0)
	cmInf := factory.Core().V1().ConfigMaps().Informer()
	nsInf := factory.Core().V1().Namespaces().Informer()
	factory.Start(infCtx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), cmInf.HasSynced, nsInf.HasSynced) {
		t.Fatal("informers did not sync")
	}
	// kubectl get -w, started once the writer runs. Its first line comes from its list: a
	// create sent after that line reaches kubectl only through its watch.
	kw := startKubectlWatch(t, f.px.Kubeconfig, "load", false)
	probe := ld.createdAfter(t, kw.firstLine(t))
	if !kw.printed(probe, 30*time.Second) {
		t.Fatalf("kubectl get -w did not print configmap/%s, created after its list:\n%s", probe, kw.out.String())
	}

	out, err := f.cutoverCmd(ctx)
	t.Logf("kubefence cutover:\n%s", out)
	if err != nil {
		t.Fatalf("cutover failed: %v", err)
	}
	time.Sleep(2 * time.Second) // writes continue on green
	kw.checkAfterCutover(t, ld.lastCreated())
	want, times, writeErrs := ld.stop(t)

	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != cutover.StateDone || j.UnfencedAt.Sub(j.FencedAt) <= 0 {
		t.Fatalf("journal: %+v", j)
	}
	t.Logf("write-unavailability window %s; writer: %d configmaps; reader: %d lists, %d failed", j.UnfencedAt.Sub(j.FencedAt), len(want), ld.reads.Load(), ld.readFails.Load())
	if len(writeErrs) > 0 {
		t.Errorf("the writer saw %d errors; first: %v", len(writeErrs), writeErrs[0])
	}
	ld.checkOutlasted(t, j)
	if fails := ld.readFails.Load(); float64(fails) > 0.001*float64(ld.reads.Load()) {
		t.Errorf("%d of %d lists failed (more than 0.1%%)", fails, ld.reads.Load())
	}
	st, err := f.px.Admin.Status(ctx)
	if err != nil || st.Backend != f.green.GreenURL || st.Fenced {
		t.Fatalf("proxy after cutover: %+v %v", st, err)
	}
	gcs, greenKeys := checkGreenHasWrites(t, f, want)
	// Blue was left as it was at the fence, checked write by write.
	blueCMs, err := f.blue.cs.CoreV1().ConfigMaps("load").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkBlueAtFence(t, j, blueCMs.Items, times, ld.attempts())
	checkInformerKeys(t, cmInf.GetStore(), greenKeys)
	gns, err := gcs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(gns.Items) != len(nsInf.GetStore().ListKeys()) {
		t.Errorf("namespace informer has %d, green %d", len(nsInf.GetStore().ListKeys()), len(gns.Items))
	}
	// Green is blue's copy: equal counts hold even for an informer whose watch died at the
	// switch. A namespace made now, through the proxy, shows that it went on (relisted on green).
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "after-cutover"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForT(t, 30*time.Second, "the namespace informer to see a namespace made after the cutover", func() bool {
		_, ok, _ := nsInf.GetStore().GetByKey("after-cutover")
		return ok
	})
	kw.checkLines(t)
}

// firstLine waits (60 s at most) for kubectl's first line of output and returns when it saw it.
func (kw *kubectlWatch) firstLine(t *testing.T) time.Time {
	t.Helper()
	var at time.Time
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		at = time.Now()
		return strings.Contains(kw.out.String(), "\n"), nil
	})
	if err != nil {
		t.Fatalf("kubectl get -w printed no line within 60 s: %q", kw.out.String())
	}
	return at
}

// printed waits up to bound for kubectl to print configmap/name, and says whether it did.
func (kw *kubectlWatch) printed(name string, bound time.Duration) bool {
	for deadline := time.Now().Add(bound); ; time.Sleep(50 * time.Millisecond) {
		if slices.Contains(strings.Split(kw.out.String(), "\n"), "configmap/"+name) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// checkAfterCutover checks kubectl as the load stops: exited 0 (the switch ended its watch on
// blue, as a snapshot cutover does) or still running; one still running still watches, so it
// prints last, the writer's last create.
func (kw *kubectlWatch) checkAfterCutover(t *testing.T, last string) {
	t.Helper()
	select {
	case err := <-kw.done:
		if err != nil {
			t.Errorf("kubectl get -w failed during the cutover (%v); want it running or exited 0:\n%s", err, kw.out.String())
			return
		}
		t.Log("kubectl get -w exited 0 (the switch ended its watch)")
	default:
		if !kw.printed(last, 30*time.Second) {
			t.Errorf("kubectl get -w still runs but did not print configmap/%s, created after the cutover:\n%s", last, kw.out.String())
		}
	}
}

// checkLines checks every line kubectl printed (stdout and stderr) names a configmap: no error,
// no warning.
func (kw *kubectlWatch) checkLines(t *testing.T) {
	t.Helper()
	for l := range strings.SplitSeq(kw.out.String(), "\n") {
		if l != "" && !configmapLine.MatchString(l) {
			t.Errorf("kubectl get -w printed %q, not a configmap", l)
		}
	}
}

var configmapLine = regexp.MustCompile(`^configmap/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// seedCutover creates TestCutover's namespaces app and load, and 100 configmaps of 2 kB in app.
func seedCutover(t *testing.T, cs *kubernetes.Clientset) {
	t.Helper()
	ctx := t.Context()
	for _, ns := range []string{"app", "load"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		if _, err := cs.CoreV1().ConfigMaps("app").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%03d", i)}, Data: map[string]string{"v": strings.Repeat("x", 2000)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// checkGreenHasWrites checks every configmap in load on green has the writer's last acknowledged
// content (want), and returns a clientset for green and the namespace/name keys of all green's
// configmaps.
func checkGreenHasWrites(t *testing.T, f *cutoverFixture, want map[string]string) (*kubernetes.Clientset, map[string]bool) {
	t.Helper()
	gcs, _, err := framework.ClientsetFor(f.green.GreenKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	greenCMs, err := gcs.CoreV1().ConfigMaps("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	greenKeys := map[string]bool{}
	for _, cm := range greenCMs.Items {
		greenKeys[cm.Namespace+"/"+cm.Name] = true
		if cm.Namespace == "load" {
			got[cm.Name] = cm.Data["v"]
		}
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("configmap load/%s on green: %q, want the last acknowledged %q", name, got[name], v)
		}
	}
	return gcs, greenKeys
}

// cutoverLoad is TestCutover's load: a writer that creates configmap i and updates configmap i-1
// in namespace load, as fast as it can, recording the last acknowledged content of each and when
// each write was sent and acknowledged; and a reader that lists pods every 20 ms, counting
// failures.
type cutoverLoad struct {
	ctx       context.Context // ends at stop
	mu        sync.Mutex
	want      map[string]string
	times     map[string]*writeTimes
	tried     []time.Time // every write attempt the writer sent
	writeErrs []error
	// outlasted are the attempts of writes the fence refused more often than client-go retries
	// (10 times, a second apart): a snapshot cutover's window on a loaded machine may be that
	// long. Each must lie in the window (checkOutlasted); they are not errors.
	outlasted        [][]time.Time
	reads, readFails atomic.Int64
	stopping         atomic.Bool
	cancel           context.CancelFunc
	wg               sync.WaitGroup
	done             chan struct{} // closed when both loops have ended
	// writing and reading are the request each loop waits for, nil between requests: what
	// stop names when the loops do not end.
	writing, reading atomic.Pointer[inFlight]
	// abandoned: stop gave up waiting for the loops (under mu); the reader logs no more, as
	// the test may be over.
	abandoned bool
}

// loadRequestBound bounds each request of the load, client-go's retries of a refused write
// included (10, a second apart, as a long fence window may take); a request past it is a
// write error (its outcome unknown) or a failed list. loadStopBound bounds stop: past the last
// request's bound, something ignores it.
const (
	loadRequestBound = 60 * time.Second
	loadStopBound    = 2 * time.Minute
)

// inFlight is a request being sent: what it is and since when.
type inFlight struct {
	what  string
	since time.Time
}

// startCutoverLoad starts the load for the rest of t: it ends at stop, or at t's cleanup. Its
// requests are not cancelled when t's context ends (an answer the writer did not wait for would
// leave its outcome unknown) but each is bounded by loadRequestBound; the loops stop between
// requests, at stop or when t's context ends: the test is over and its requests would fail at
// once, spinning hot for the rest of the package.
func startCutoverLoad(t *testing.T, cs *kubernetes.Clientset) *cutoverLoad {
	t.Helper()
	testCtx := t.Context()
	ld := &cutoverLoad{want: map[string]string{}, times: map[string]*writeTimes{}, done: make(chan struct{})}
	ld.ctx, ld.cancel = context.WithCancel(testCtx)
	running := func() bool { return !ld.stopping.Load() && testCtx.Err() == nil }
	// Registered after the fixture's cleanups, so it runs before them: after a failure the
	// loops end before the cluster under them stops, and no t.Logf comes after the test.
	t.Cleanup(func() { ld.stop(t) })
	reqCtx := context.WithoutCancel(testCtx)
	ld.wg.Go(func() {
		for i := 0; running(); i++ {
			ld.write(reqCtx, cs, i)
		}
	})
	ld.wg.Go(func() {
		for running() {
			ctx, cancel := context.WithTimeout(reqCtx, loadRequestBound)
			ld.reading.Store(&inFlight{"list pods", time.Now()})
			_, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			ld.reading.Store(nil)
			cancel()
			if err != nil {
				ld.readFails.Add(1)
				ld.mu.Lock()
				if !ld.abandoned {
					t.Logf("list pods: %v", err)
				}
				ld.mu.Unlock()
			}
			ld.reads.Add(1)
			time.Sleep(20 * time.Millisecond)
		}
	})
	go func() { ld.wg.Wait(); close(ld.done) }()
	return ld
}

// write creates w-<i> and updates w-<i-1>, recording each outcome and when each attempt of each
// was sent (client-go sends a refused write again after Retry-After). Each request is bounded by
// loadRequestBound under ctx; one past it is a write error.
func (ld *cutoverLoad) write(ctx context.Context, cs *kubernetes.Clientset, i int) {
	name := fmt.Sprintf("w-%05d", i)
	var tried []time.Time
	rctx, cancel := context.WithTimeout(ctx, loadRequestBound)
	ld.writing.Store(&inFlight{"create of load/" + name, time.Now()})
	_, err := cs.CoreV1().ConfigMaps("load").Create(withAttempts(rctx, &tried), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "created"}}, metav1.CreateOptions{})
	ld.writing.Store(nil)
	cancel()
	ld.mu.Lock()
	ld.tried = append(ld.tried, tried...)
	switch {
	case apierrors.IsTooManyRequests(err):
		ld.outlasted = append(ld.outlasted, tried)
	case err != nil:
		ld.writeErrs = append(ld.writeErrs, fmt.Errorf("create load/%s: %w", name, err))
	default:
		ld.want[name] = "created"
		ld.times[name] = &writeTimes{createSent: tried[len(tried)-1], createAcked: time.Now()}
	}
	created := ld.times[fmt.Sprintf("w-%05d", i-1)] != nil
	ld.mu.Unlock()
	if i == 0 || !created { // w-<i-1> was refused, not written: nothing to update
		return
	}
	prev := fmt.Sprintf("w-%05d", i-1)
	tried = nil
	rctx, cancel = context.WithTimeout(ctx, loadRequestBound)
	ld.writing.Store(&inFlight{"update of load/" + prev, time.Now()})
	_, err = cs.CoreV1().ConfigMaps("load").Update(withAttempts(rctx, &tried), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: prev}, Data: map[string]string{"v": "updated"}}, metav1.UpdateOptions{})
	ld.writing.Store(nil)
	cancel()
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.tried = append(ld.tried, tried...)
	switch {
	case apierrors.IsTooManyRequests(err):
		ld.outlasted = append(ld.outlasted, tried)
	case err != nil:
		ld.writeErrs = append(ld.writeErrs, fmt.Errorf("update load/%s: %w", prev, err))
	}
	if wt := ld.times[prev]; err == nil && wt != nil {
		ld.want[prev] = "updated"
		wt.updateSent, wt.updateAcked = tried[len(tried)-1], time.Now()
	}
}

// attemptsKey carries, in a request's context, where attemptsClient's transport records when
// each attempt of the request was sent.
type attemptsKey struct{}

func withAttempts(ctx context.Context, tried *[]time.Time) context.Context {
	return context.WithValue(ctx, attemptsKey{}, tried)
}

// attemptsClient is a clientset for kubeconfig whose transport records each attempt of a
// request made withAttempts (client-go's retries go through it again, in the caller's goroutine).
func attemptsClient(t *testing.T, kubeconfig string) *kubernetes.Clientset {
	t.Helper()
	_, cfg, err := framework.ClientsetFor(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if tried, ok := r.Context().Value(attemptsKey{}).(*[]time.Time); ok {
				*tried = append(*tried, time.Now())
			}
			return rt.RoundTrip(r)
		})
	})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// createdAfter waits (60 s at most) until the writer has created a configmap whose create it
// sent after at, and returns the first such one's name.
func (ld *cutoverLoad) createdAfter(t *testing.T, at time.Time) string {
	t.Helper()
	var name string
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		ld.mu.Lock()
		defer ld.mu.Unlock()
		var first time.Time
		for n, wt := range ld.times {
			if wt.createSent.After(at) && (name == "" || wt.createSent.Before(first)) {
				name, first = n, wt.createSent
			}
		}
		return name != "", nil
	})
	if err != nil {
		t.Fatalf("the writer created no configmap within 60 s of %s", at.Format(time.RFC3339Nano))
	}
	return name
}

// lastCreated is the name of the configmap the writer's last acknowledged create made.
func (ld *cutoverLoad) lastCreated() string {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	var name string
	var last time.Time
	for n, wt := range ld.times {
		if wt.createAcked.After(last) {
			name, last = n, wt.createAcked
		}
	}
	return name
}

// stop ends the loops, waits for their last requests and returns what the writer recorded. A
// second call returns the same. Loops still running loadStopBound after it fail t, naming the
// request each waits for; a later call does not wait again.
func (ld *cutoverLoad) stop(t *testing.T) (want map[string]string, times map[string]*writeTimes, writeErrs []error) {
	t.Helper()
	ld.stopping.Store(true)
	ld.cancel()
	ld.mu.Lock()
	abandoned := ld.abandoned
	ld.mu.Unlock()
	if !abandoned {
		select {
		case <-ld.done:
		case <-time.After(loadStopBound):
			ld.mu.Lock()
			ld.abandoned = true
			ld.mu.Unlock()
			t.Fatalf("TestCutover's load did not stop within %s: %s", loadStopBound, ld.hung())
		}
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.want, ld.times, ld.writeErrs
}

// hung names the requests the loops wait for.
func (ld *cutoverLoad) hung() string {
	var hung []string
	for _, l := range []struct {
		who string
		p   *atomic.Pointer[inFlight]
	}{{"the writer", &ld.writing}, {"the reader", &ld.reading}} {
		if r := l.p.Load(); r != nil {
			hung = append(hung, fmt.Sprintf("%s waits for its %s, sent %s ago", l.who, r.what, time.Since(r.since).Round(time.Second)))
		}
	}
	return cmp.Or(strings.Join(hung, "; "), "neither waits for a request")
}

// checkOutlasted fails the test for a write refused past client-go's retries with an attempt
// outside the window (fence to unfence, 250 ms either side for the clocks of the journal and
// the writer): the fence refused a write it should not have.
func (ld *cutoverLoad) checkOutlasted(t *testing.T, j *cutover.Journal) {
	t.Helper()
	ld.mu.Lock()
	defer ld.mu.Unlock()
	from, to := j.FencedAt.Add(-250*time.Millisecond), j.UnfencedAt.Add(250*time.Millisecond)
	for _, tried := range ld.outlasted {
		for _, at := range tried {
			if at.Before(from) || at.After(to) {
				t.Errorf("a write refused past client-go's retries was sent at %s, outside the window %s..%s", at.Format(time.RFC3339Nano), j.FencedAt.Format(time.RFC3339Nano), j.UnfencedAt.Format(time.RFC3339Nano))
				return
			}
		}
	}
	if n := len(ld.outlasted); n > 0 {
		t.Logf("%d writes were refused more often than client-go retries them, all inside the window of %s (a loaded machine's)", n, j.UnfencedAt.Sub(j.FencedAt))
	}
}

// attempts is every write attempt the writer sent (its retries of refused writes among them).
func (ld *cutoverLoad) attempts() []time.Time {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return slices.Clone(ld.tried)
}

// checkInformerKeys checks an informer's store ends with exactly the keys green has, once the
// last events have arrived (within 10 s).
func checkInformerKeys(t *testing.T, store cache.Store, greenKeys map[string]bool) {
	t.Helper()
	var missing, extra []string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		missing, extra = nil, nil
		infKeys := map[string]bool{}
		for _, k := range store.ListKeys() {
			infKeys[k] = true
			if !greenKeys[k] {
				extra = append(extra, k)
			}
		}
		for k := range greenKeys {
			if !infKeys[k] {
				missing = append(missing, k)
			}
		}
		return len(missing) == 0 && len(extra) == 0, nil
	})
	if err != nil {
		t.Errorf("configmap informer differs from green: lacks %v, has extra %v", missing, extra)
	}
}

// writeTimes is when the writer sent the attempt of a configmap's create and update that was
// acknowledged (client-go's last: those before it were refused), and when each was acknowledged
// (zero: not sent or not acknowledged).
type writeTimes struct {
	createSent, createAcked time.Time
	updateSent, updateAcked time.Time
}

// checkBlueAtFence checks, by name and time, that blue holds exactly the writer's writes of
// before the fence: every write acknowledged before the fence step began is on blue, and no
// write sent after the fence was on (refused, retried, and after the switch sent to green)
// reached blue: a write is on blue only if the attempt acknowledged was sent before the fence.
// One leaked write fails it; a window in which the writer sent no attempt proves nothing.
func checkBlueAtFence(t *testing.T, j *cutover.Journal, blue []corev1.ConfigMap, times map[string]*writeTimes, tried []time.Time) {
	t.Helper()
	// fencedAt is when the fence was surely on: when the fence step ended (its request
	// returned after the flip). The journal's FencedAt is saved before the request is sent
	// (write-ahead), so a write sent just after it may still be admitted before the flip.
	var fenceBegan, fencedAt time.Time
	for _, s := range j.Done {
		if s.Step == cutover.StepFence {
			fenceBegan, fencedAt = s.Started, s.Started.Add(s.Duration)
		}
	}
	if fenceBegan.IsZero() || j.FencedAt.IsZero() {
		t.Fatalf("journal has no fence times: %+v", j)
	}
	onBlue := map[string]string{}
	for _, cm := range blue {
		if !strings.HasPrefix(cm.Name, "w-") {
			continue // kube-root-ca.crt and the like
		}
		onBlue[cm.Name] = cm.Data["v"]
		wt := times[cm.Name]
		switch {
		case wt == nil:
			t.Errorf("blue holds load/%s, which no acknowledged write created", cm.Name)
		case !wt.createSent.Before(fencedAt):
			t.Errorf("load/%s reached blue: its create was sent at %s, after the fence was on (%s)", cm.Name, wt.createSent.Format(time.RFC3339Nano), fencedAt.Format(time.RFC3339Nano))
		case cm.Data["v"] == "updated" && !wt.updateSent.Before(fencedAt):
			t.Errorf("the update of load/%s reached blue: sent at %s, after the fence was on (%s)", cm.Name, wt.updateSent.Format(time.RFC3339Nano), fencedAt.Format(time.RFC3339Nano))
		}
	}
	inWindow := 0
	for _, at := range tried {
		if !at.Before(fencedAt) && at.Before(j.UnfencedAt) {
			inWindow++
		}
	}
	for name, wt := range times {
		if wt.createAcked.Before(fenceBegan) && onBlue[name] == "" {
			t.Errorf("load/%s, acknowledged at %s before the fence began (%s), is not on blue", name, wt.createAcked.Format(time.RFC3339Nano), fenceBegan.Format(time.RFC3339Nano))
		}
		if !wt.updateAcked.IsZero() && wt.updateAcked.Before(fenceBegan) && onBlue[name] != "updated" {
			t.Errorf("load/%s on blue is %q; its update was acknowledged before the fence began", name, onBlue[name])
		}
	}
	if inWindow == 0 {
		t.Errorf("the writer sent no write while the fence was on: the check proves nothing")
	}
	t.Logf("blue holds %d of the writer's configmaps; the writer sent %d attempts while the fence was on (refused, none on blue)", len(onBlue), inWindow)
}

// TestCutoverAbort: a green apiserver that never gets ready aborts the cutover; blue serves,
// unfenced and unchanged, and green etcd is stopped.
func TestCutoverAbort(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	cs := f.proxyClient(t, 100)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "keep"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A "kube-apiserver" that runs but never answers, given the flag the plan check asks of a
	// green apiserver's command (as $0; two commands, so that the shell stays the process).
	f.green.Plan.Green.APIServer.Command = []string{"/bin/sh", "-c", "sleep 3600; exit 0", "--endpoint-reconciler-type=none"}
	f.green.Plan.Timeouts.GreenAPIServer = cutover.Duration(3 * time.Second)
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	out, err := f.cutoverCmd(ctx)
	t.Logf("kubefence cutover:\n%s", out)
	if err == nil || !strings.Contains(out, "ABORT at start-green-apiserver") || !strings.Contains(out, ": aborted") {
		t.Fatalf("want an abort at start-green-apiserver: %v", err)
	}
	f.checkAborted(t)
	// Blue serves writes again, through the proxy.
	if _, err := cs.CoreV1().ConfigMaps("keep").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-abort"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("write after abort: %v", err)
	}
	if _, err := f.blue.cs.CoreV1().ConfigMaps("keep").Get(ctx, "after-abort", metav1.GetOptions{}); err != nil {
		t.Fatalf("write after abort not on blue: %v", err)
	}
}

// TestCutoverResume kills `kubefence cutover` with SIGKILL as each step starts, then resumes it:
// every run must end on green, open, with every acknowledged object.
func TestCutoverResume(t *testing.T) {
	for _, step := range cutover.Steps {
		t.Run(step, func(t *testing.T) {
			f := newCutoverFixture(t)
			ctx := t.Context()
			cs := f.proxyClient(t, 200)
			if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "r"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				if _, err := cs.CoreV1().ConfigMaps("r").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", i)}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			killAtStep(t, f, step)
			out, err := f.cutoverCmd(ctx, "--resume")
			t.Logf("resume:\n%s", out)
			if err != nil {
				t.Fatalf("resume after kill -9 at %s: %v", step, err)
			}
			st, err := f.px.Admin.Status(ctx)
			if err != nil || st.Fenced || st.Backend != f.green.GreenURL {
				t.Fatalf("after resume the proxy is %+v, %v", st, err)
			}
			l, err := cs.CoreV1().ConfigMaps("r").List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) < 20 {
				t.Fatalf("after resume green has %d configmaps in r (%v)", len(l.Items), err)
			}
		})
	}
}

// killAtStep starts a cutover (with args) and kills it with SIGKILL as soon as it starts step.
func killAtStep(t *testing.T, f *cutoverFixture, step string, args ...string) {
	t.Helper()
	killAt(t, step, append([]string{"cutover", "--plan", f.green.PlanPath}, args...)...)
}

// TestCutoverAbortCommand: a cutover killed before its switch is rolled back by
// `kubefence cutover abort`: green stopped, blue unfenced on its own backend.
func TestCutoverAbortCommand(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	killAtStep(t, f, cutover.StepVerify)
	if st, err := f.px.Admin.Status(ctx); err != nil || !st.Fenced {
		t.Fatalf("after the kill the proxy should still be fenced: %+v %v", st, err)
	}
	out, err := runKubefence(ctx, "cutover", "abort", "--plan", f.green.PlanPath)
	t.Logf("kubefence cutover abort:\n%s", out)
	if err != nil || !strings.Contains(out, "aborted") {
		t.Fatalf("abort: %v", err)
	}
	f.checkAborted(t)
	if out, err := f.cutoverCmd(ctx, "--resume"); err == nil || !strings.Contains(out, "nothing to resume") {
		t.Errorf("--resume after abort: %v\n%s", err, out)
	}
}

// cutoverWithHook runs `kubefence cutover` and calls hook once, as step starts (the cutover goes
// on meanwhile), and returns the combined output.
func (f *cutoverFixture) cutoverWithHook(t *testing.T, step string, hook func()) (string, error) {
	t.Helper()
	hooked := false
	out, err := runScanning(t.Context(), t, []string{"cutover", "--plan", f.green.PlanPath}, func(line string, _ *os.Process) bool {
		if !hooked && startsStep(line, step) {
			hooked = true
			hook()
		}
		return true
	})
	if !hooked {
		t.Errorf("the cutover never started step %s", step)
	}
	return out, err
}

// runScanning runs kubefence with args, reading its stdout and stderr line by line as they come:
// onLine sees each line and the process (to signal it, or to start what a line asks for) and
// returns false to stop looking (the rest is read and dropped). It returns the lines looked at
// and the exit error. A run past cmdBound is killed, and its error says so.
func runScanning(ctx context.Context, t *testing.T, args []string, onLine func(line string, p *os.Process) bool) (string, error) {
	t.Helper()
	cmd, explain := boundedKubefence(ctx, args...)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if !onLine(sc.Text(), cmd.Process) {
			break
		}
	}
	_, _ = io.Copy(io.Discard, pipe)
	return out.String(), explain(cmd.Wait())
}

// startsStep says whether a line of the cutover's output is the start of step.
func startsStep(line, step string) bool { return strings.Contains(line, ". "+step+": ") }

func (f *cutoverFixture) createNamespace(t *testing.T, name string) {
	t.Helper()
	cs := f.proxyClient(t, 100)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestCutoverBypassWriteAborts: a write that goes around the fenced proxy, straight to blue's
// apiserver after the copy, is not on green; verify must abort and name the object.
func TestCutoverBypassWriteAborts(t *testing.T) {
	f := newCutoverFixture(t)
	f.createNamespace(t, "bypass")
	out, err := f.cutoverWithHook(t, cutover.StepMigrate, func() {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "sneaky"}, Data: map[string]string{"v": "around the proxy"}}
		if _, err := f.blue.cs.CoreV1().ConfigMaps("bypass").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Errorf("write straight to blue: %v", err)
		}
	})
	t.Logf("kubefence cutover:\n%s", out)
	for _, want := range []string{"ABORT at verify", "configmaps bypass/sneaky: created on blue after the copy", ": aborted"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("cutover (err %v) does not say %q", err, want)
		}
	}
	f.checkAborted(t)
}

// TestCutoverFenceChangedAborts: someone runs fence off and on by hand while the cutover runs;
// writes may have reached blue in between, so the cutover must not switch.
func TestCutoverFenceChangedAborts(t *testing.T) {
	f := newCutoverFixture(t)
	out, err := f.cutoverWithHook(t, cutover.StepGreenAPIServer, func() {
		for _, on := range []bool{false, true} {
			if _, err := f.px.Admin.Fence(t.Context(), admin.FenceRequest{Fenced: on, Reason: "by hand"}); err != nil {
				t.Errorf("fence %v by hand: %v", on, err)
			}
		}
	})
	t.Logf("kubefence cutover:\n%s", out)
	for _, want := range []string{"ABORT at switch", "someone ran fence off/on", ": aborted"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("cutover (err %v) does not say %q", err, want)
		}
	}
	f.checkAborted(t)
}

// TestCutoverForeignEndpoint: blue.etcd.endpoints reaching another cluster's etcd is refused at
// preflight (the snapshot could come from it), naming the endpoint; nothing is fenced.
func TestCutoverForeignEndpoint(t *testing.T) {
	f := newCutoverFixture(t)
	other, err := f.env.StartEtcd(t.Context(), framework.EtcdConfig{Name: "other-etcd", Version: framework.Etcd34})
	if err != nil {
		t.Fatal(err)
	}
	f.green.Plan.Blue.Etcd.Endpoints = append(f.green.Plan.Blue.Etcd.Endpoints, other.Endpoints()[0])
	f.green.Plan.Timeouts.Copy = cutover.Duration(20 * time.Second)
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	out, err := f.cutoverCmd(t.Context())
	t.Logf("kubefence cutover:\n%s", out)
	if err == nil || !strings.Contains(out, other.Endpoints()[0]+" belongs to cluster") || strings.Contains(out, "2. fence") {
		t.Fatalf("want a preflight refusal naming %s (err %v)", other.Endpoints()[0], err)
	}
	if st, err := f.px.Admin.Status(t.Context()); err != nil || st.Fenced {
		t.Fatalf("proxy after a refused preflight: %+v %v", st, err)
	}
}

// TestCutoverInterrupted: Ctrl-C (SIGINT) or SIGTERM while a step runs aborts the cutover
// cleanly: the abort does not reuse the cancelled context, so blue is unfenced and green stopped.
func TestCutoverInterrupted(t *testing.T) {
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			f := newCutoverFixture(t)
			out, err := f.signalAtStep(t, cutover.StepGreenAPIServer, sig)
			t.Logf("kubefence cutover:\n%s", out)
			if err == nil || !strings.Contains(out, "ABORT at "+cutover.StepGreenAPIServer) || !strings.Contains(out, ": aborted") {
				t.Fatalf("want a clean abort at %s after %s (err %v)", cutover.StepGreenAPIServer, sig, err)
			}
			f.checkAborted(t)
		})
	}
}

// signalAtStep runs `kubefence cutover`, sends it sig as it starts step, and returns its output
// and exit error.
func (f *cutoverFixture) signalAtStep(t *testing.T, step string, sig os.Signal) (string, error) {
	t.Helper()
	return runScanning(t.Context(), t, []string{"cutover", "--plan", f.green.PlanPath}, func(line string, p *os.Process) bool {
		if startsStep(line, step) {
			_ = p.Signal(sig)
		}
		return true
	})
}
