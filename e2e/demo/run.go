package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/proxy/admin"
)

// summary is what the demo measured.
type summary struct {
	// Window, Rollback and Again are the write-unavailability windows (fence on -> fence off) of
	// the cutover, of its rollback and of the cutover again.
	Window, Rollback, Again time.Duration
	WritesAcked             int
	WriterErrors            int
	// PlainAcked and PlainErrors are the plain HTTP writer's, which never retries.
	PlainAcked, PlainErrors int
	Held, Refused           uint64
	Reads, ReadErr          int
	WatchEvents             int64
	Verified                int
	// Predicted is the window the rehearsal predicted; Leaders says how each leader fared.
	Predicted time.Duration
	Leaders   []string
}

// demo is one run: what it started and what it measured.
type demo struct {
	o       options
	out     io.Writer
	p       *printer
	env     *framework.Env
	pki     *framework.PKI
	blueAPI *framework.APIServer
	px      *framework.Proxy
	cs      *kubernetes.Clientset
	leaders leaders
	traffic *traffic
	plain   *plainWriter
	green   *framework.GreenSetup
	baker   *baker // the process that bakes after a cutover, while it runs
	sum     summary
	// keepRunning leaves everything running when run returns (--keep, --manual).
	keepRunning bool
}

func run(ctx context.Context, o options, out io.Writer) (_ *summary, err error) {
	if o.objects == 0 {
		o.objects = 200
	}
	// The baking cutover process prints while the demo does: one writer for both.
	out = &syncWriter{w: out}
	d := &demo{o: o, out: out, p: &printer{out: out, start: time.Now()}}
	fmt.Fprintln(out, "kubefence demo: move a live control plane from etcd 3.4 (blue) to etcd 3.6 (green) behind the fence proxy, go back, and move again")
	defer func() {
		d.close()
		d.workDir(err)
	}()
	if err := d.setup(ctx); err != nil {
		return nil, err
	}
	defer d.traffic.stop()
	defer d.plain.stop()
	if err := d.writePlan(); err != nil {
		return nil, err
	}
	if o.manual {
		return nil, d.manual(ctx)
	}
	for _, phase := range []func(context.Context) error{d.rehearse, d.cutover, d.rollback, d.forwardAgain, d.check} {
		if err := phase(ctx); err != nil {
			return &d.sum, err
		}
	}
	if o.keep {
		d.keepRunning = true
		printKeep(out, o, d.env, d.px, d.blueAPI, &framework.APIServer{URL: d.green.GreenURL}, d.green.Plan.StateDir)
		<-ctx.Done()
		d.keepRunning = false
	}
	return &d.sum, nil
}

// close stops everything the demo started (unless it is to keep running).
func (d *demo) close() {
	if d.keepRunning || d.env == nil {
		return
	}
	if d.baker != nil {
		if err := d.baker.stop(); err != nil {
			fmt.Fprintf(d.out, "WARNING: %v\n", err)
		}
	}
	if d.green != nil {
		_, _ = framework.StopCutoverProcesses(d.green.Plan.StateDir)
	}
	_ = d.env.Close()
	if left := d.env.Running(); len(left) > 0 {
		fmt.Fprintf(d.out, "WARNING: processes left running: %v\n", left)
	}
}

// workDir removes the work directory (hundreds of MB: data dirs, logs) once a run has passed and
// everything is stopped, unless it is to be kept (--keep, --manual) or is the caller's (--dir);
// otherwise it says where the directory is.
func (d *demo) workDir(err error) {
	if d.env == nil {
		return
	}
	switch {
	case err != nil:
		fmt.Fprintf(d.out, "\nwork directory kept: %s (component logs in %s)\n", d.env.Dir, d.env.LogDir)
	case d.o.keep || d.o.manual:
		fmt.Fprintf(d.out, "\nwork directory kept: %s (remove it when done)\n", d.env.Dir)
	case d.o.dir != "":
		// given with --dir (TestDemo's): the caller's to remove
	case len(d.env.Running()) > 0:
		fmt.Fprintf(d.out, "\nwork directory kept, processes still use it: %s\n", d.env.Dir)
	default:
		if err := os.RemoveAll(d.env.Dir); err != nil {
			fmt.Fprintf(d.out, "WARNING: removing the work directory: %v\n", err)
		}
	}
}

// setup starts blue behind the proxy with the workload, the leaders and the live traffic.
func (d *demo) setup(ctx context.Context) error {
	var err error
	if d.env, err = framework.NewEnv(d.o.dir, func(string, ...any) {}); err != nil {
		return err
	}
	if d.o.kubefence == "" {
		if d.o.kubefence, err = framework.Kubefence(d.env.Dir); err != nil {
			return err
		}
	}
	for _, b := range [][2]string{{"etcd", framework.Etcd34}, {"etcd", framework.Etcd36}, {"etcdutl", framework.Etcd36}, {"kube-apiserver", framework.Kube136}} {
		if _, err := framework.Bin(b[0], b[1]); err != nil {
			return err
		}
	}
	if d.pki, err = framework.NewPKI(filepath.Join(d.env.Dir, "pki")); err != nil {
		return err
	}
	if err := d.startBlue(ctx); err != nil {
		return err
	}
	return d.startLoad(ctx)
}

// blueEtcdArgs let blue take any green revision as one request while it follows green (the
// bake); its --max-txn-ops stays etcd's default.
var blueEtcdArgs = []string{"--max-request-bytes", "10485760"}

// startBlue starts blue etcd (TLS with client certificates, as kubeadm's) and apiserver and the
// proxy in front of them, and creates the workload through the proxy.
func (d *demo) startBlue(ctx context.Context) error {
	done := d.p.begin("start blue: etcd %s (TLS, client certificates) + kube-apiserver %s", framework.Etcd34, framework.Kube136)
	etcd, err := d.env.StartEtcd(ctx, framework.EtcdConfig{Name: "blue-etcd", Version: framework.Etcd34, TLS: true, PKI: d.pki, ExtraArgs: blueEtcdArgs})
	if err != nil {
		return err
	}
	if d.blueAPI, err = d.env.StartAPIServer(ctx, framework.APIServerConfig{Name: "blue-apiserver", EtcdEndpoints: etcd.Endpoints(), PKI: d.pki, EtcdTLS: true}); err != nil {
		return err
	}
	done(d.blueAPI.URL)
	done = d.p.begin("start kubefence proxy in front of blue (where the API load balancer stands)")
	if d.px, err = d.env.StartProxy(ctx, framework.ProxyConfig{Binary: d.o.kubefence, Upstream: d.blueAPI.URL, PKI: d.pki, RetryAfter: 1}); err != nil {
		return err
	}
	done(d.px.URL)
	if d.cs, err = clientset(d.px.Kubeconfig, 500); err != nil {
		return err
	}
	done = d.p.begin("create the workload through the proxy")
	if err := createWorkload(ctx, d.cs, d.o.objects); err != nil {
		return err
	}
	done(fmt.Sprintf("2 namespaces, 3 deployments, %d configmaps, 10 secrets, 20 events", d.o.objects))
	d.green, err = d.env.WriteCutoverPlan("green", d.pki, d.px, d.blueAPI, etcd, framework.Etcd36, 1)
	return err
}

// startLoad starts the leaders and the writers, watcher and reader through the proxy.
func (d *demo) startLoad(ctx context.Context) error {
	done := d.p.begin("start kube-controller-manager and kube-scheduler behind the proxy (leader election on: renew every 2 s, give up after 10 s)")
	var err error
	if d.leaders, err = startLeaders(ctx, d.env, d.px, d.pki, d.cs); err != nil {
		return err
	}
	done(d.leaders.String())
	done = d.p.begin("start live writers (client-go %s, and plain HTTP that never retries), a watcher (informer) and a reader, all through the proxy", rateWord(d.o.writeRate))
	wcs, err := clientset(d.px.Kubeconfig, 200)
	if err != nil {
		return err
	}
	d.traffic = startTraffic(ctx, wcs, d.o.writeRate)
	if d.plain, err = startPlainWriter(ctx, d.px.URL, d.pki); err != nil {
		d.plain = &plainWriter{}
		return err
	}
	time.Sleep(2 * time.Second)
	done(fmt.Sprintf("%d writes acknowledged so far", d.traffic.acked.Load()))
	st, _ := d.px.Admin.Status(ctx)
	d.p.note("proxy: fence %s, backend %s", fenceWord(st.Fenced), st.Backend)
	return nil
}

// writePlan writes green's plan: the defaults (replication in hold mode) with a bake.
func (d *demo) writePlan() error {
	done := d.p.begin("write green's plan: etcd %s (TLS) + kube-apiserver %s, launched by the cutover; the defaults (migration.mode auto, here: replicate; fence mode hold) and bake.enabled: after the switch blue follows green, for a way back", framework.Etcd36, framework.Kube136)
	g := d.green
	g.Plan.Migration.Mode, g.Plan.Proxy.FenceMode = "", ""
	g.Plan.Bake.Enabled = true
	g.Plan.Blue.APIServer.EtcdUser = "kube-apiserver-etcd-client" // the CN of the PKI's apiserver-etcd-client
	if err := g.Save(); err != nil {
		return err
	}
	done(g.PlanPath)
	return nil
}

// manual stops before the cutover and prints the commands to run it by hand.
func (d *demo) manual(ctx context.Context) error {
	d.keepRunning = true
	fmt.Fprintf(d.out, `
Blue is running behind the proxy with a live writer, reader and watcher; nothing is fenced yet.
Follow docs/runbook.md sections 3-5 in another terminal, with the kubectl that make e2e-deps
pinned (a kubectl on your PATH may be another version, or another program):

  export KUBECONFIG=%[1]s                      # through the proxy
  %[8]s get configmaps -n demo | head
  %[2]s cutover --plan %[3]s --dry-run
  %[2]s fence status --admin-socket %[4]s
  %[2]s cutover --plan %[3]s                   # the move, then the bake; try kill -9 and --resume
  %[2]s cutover status --plan %[3]s            # in a third terminal: blue's lag behind green
  %[2]s cutover rollback --plan %[3]s          # back to blue; or: cutover finish
  curl -s %[5]s/metrics | grep ^kubefence_

  logs: %[6]s; green's (once started): %[7]s/logs

Press Ctrl-C here to stop everything, green included.
`, d.px.Kubeconfig, d.o.kubefence, d.green.PlanPath, d.px.AdminSocket, d.px.MetricsURL, d.env.LogDir, d.green.Plan.StateDir, kubectl())
	<-ctx.Done()
	d.traffic.stop()
	d.keepRunning = false
	return nil
}

// rehearse runs the rehearsal and keeps its prediction.
func (d *demo) rehearse(ctx context.Context) error {
	done := d.p.begin("kubefence cutover --plan %s --rehearse (everything before the fence, a drain measured without fencing, green torn down)", filepath.Base(d.green.PlanPath))
	if err := d.cutoverCmd(ctx, "--rehearse"); err != nil {
		return err
	}
	j, err := cutover.LoadJournal(d.green.Plan.StateDir)
	if err != nil || j.Rehearsal == nil {
		return fmt.Errorf("the rehearsal left no prediction: %v", err)
	}
	d.sum.Predicted = j.Rehearsal.PredictedWindow
	done("predicted window " + d.sum.Predicted.Round(time.Millisecond).String())
	return nil
}

// cutover runs the cutover, which ends baking, and leaves it baking for a few seconds.
func (d *demo) cutover(ctx context.Context) error {
	// --- the write-unavailability window is inside this step ---
	done := d.p.begin("kubefence cutover --plan %s (it goes on running: blue follows green)", filepath.Base(d.green.PlanPath))
	var err error
	if d.baker, err = startBaker(ctx, d.o.kubefence, d.out, d.env, d.green.PlanPath, d.green.Plan.StateDir); err != nil {
		return err
	}
	j, err := cutover.LoadJournal(d.green.Plan.StateDir)
	if err != nil {
		return err
	}
	d.sum.Window = j.UnfencedAt.Sub(j.FencedAt)
	if j.Verified != nil {
		d.sum.Verified = j.Verified.Objects
	}
	done("window " + d.sum.Window.Round(time.Millisecond).String())
	done = d.p.begin("bake: green serves, writes go on, blue follows green")
	time.Sleep(3 * time.Second)
	if err := d.cutoverCmd(ctx, "status"); err != nil {
		return err
	}
	done("")
	return nil
}

// rollback goes back to blue and checks the writes and the leaders there.
func (d *demo) rollback(ctx context.Context) error {
	done := d.p.begin("kubefence cutover rollback --plan %s (stops the baking process; the window backwards)", filepath.Base(d.green.PlanPath))
	if err := d.cutoverCmd(ctx, "rollback"); err != nil {
		return err
	}
	if err := d.baker.stop(); err != nil { // the rollback stopped it: wait for its end
		return err
	}
	rj, err := cutover.LoadJournal(filepath.Join(d.green.Plan.StateDir, "rollback"))
	if err != nil {
		return err
	}
	d.sum.Rollback = rj.UnfencedAt.Sub(rj.FencedAt)
	done("window " + d.sum.Rollback.Round(time.Millisecond).String())
	bcs, err := d.blueAPI.Clientset()
	if err != nil {
		return err
	}
	return d.checkSide(ctx, "blue", bcs, rj.UnfencedAt)
}

// forwardAgain cleans green up and moves to it again, then ends the bake.
func (d *demo) forwardAgain(ctx context.Context) error {
	done := d.p.begin("forward again: kubefence cutover cleanup --remove-data-dirs, then kubefence cutover, then kubefence cutover finish")
	if err := d.cutoverCmd(ctx, "cleanup", "--remove-data-dirs"); err != nil {
		return err
	}
	var err error
	if d.baker, err = startBaker(ctx, d.o.kubefence, d.out, d.env, d.green.PlanPath, d.green.Plan.StateDir); err != nil {
		return err
	}
	if err := d.cutoverCmd(ctx, "finish"); err != nil {
		return err
	}
	if err := d.baker.stop(); err != nil { // finish stopped it: wait for its end
		return err
	}
	j, err := cutover.LoadJournal(d.green.Plan.StateDir)
	if err != nil {
		return err
	}
	d.sum.Again = j.UnfencedAt.Sub(j.FencedAt)
	done("window " + d.sum.Again.Round(time.Millisecond).String())
	return nil
}

// checkSide checks that every write acknowledged so far is on side (cs) and that the leaders
// renewed their Leases there after unfenced.
func (d *demo) checkSide(ctx context.Context, side string, cs *kubernetes.Clientset, unfenced time.Time) error {
	done := d.p.begin("check: every write acknowledged so far is on %s; kube-controller-manager and kube-scheduler kept their leader Leases", side)
	names := d.traffic.ackedNames()
	lost, err := checkAcked(ctx, cs, names)
	if err != nil {
		return err
	}
	if len(lost) > 0 {
		return fmt.Errorf("%d acknowledged writes missing on %s: %v", len(lost), side, lost[:min(len(lost), 10)])
	}
	ls, err := d.leaders.check(ctx, cs, unfenced, side)
	if err != nil {
		return err
	}
	done(fmt.Sprintf("%d of %d present; %s", len(names), len(names), strings.Join(ls, "; ")))
	return nil
}

// check stops the traffic and checks the end: every write on green, the leaders, the proxy.
func (d *demo) check(ctx context.Context) error {
	j, err := cutover.LoadJournal(d.green.Plan.StateDir)
	if err != nil {
		return err
	}
	if n, bound := moreWrites(d.o.writeRate); n > 0 {
		// The writer must go on after the last move: a write that never returns (a stream the
		// proxy lost) would otherwise be cut off by the stop below and counted nowhere.
		before := d.traffic.acked.Load()
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, bound, true, func(context.Context) (bool, error) {
			return d.traffic.acked.Load() > before+n, nil
		}); err != nil {
			return fmt.Errorf("the client-go writer had %d more writes acknowledged within %s after the last move, want over %d: a write hangs (%v)", d.traffic.acked.Load()-before, bound, n, err)
		}
	}
	d.traffic.stop()
	plainAcked, plainErrs := d.plain.stop()
	st, _ := d.px.Admin.Status(ctx)
	sum := &d.sum
	sum.WritesAcked, sum.WriterErrors = int(d.traffic.acked.Load()), len(d.traffic.errors())
	sum.PlainAcked, sum.PlainErrors = len(plainAcked), len(plainErrs)
	sum.Held = st.Hold.Released
	sum.Refused, sum.Reads, sum.ReadErr, sum.WatchEvents = st.RefusedWrites, int(d.traffic.reads.Load()), int(d.traffic.readErrs.Load()), d.traffic.watchEvents.Load()
	done := d.p.begin("check: every write either writer saw acknowledged, through the three windows, is on green")
	gcs, err := (&framework.APIServer{URL: d.green.GreenURL, Kubeconfig: d.green.GreenKubeconfig}).Clientset()
	if err != nil {
		return err
	}
	lost, err := checkAcked(ctx, gcs, append(d.traffic.ackedNames(), plainAcked...))
	if err != nil {
		return err
	}
	if len(lost) > 0 {
		return fmt.Errorf("%d acknowledged writes missing on green: %v", len(lost), lost[:min(len(lost), 10)])
	}
	done(fmt.Sprintf("%d of %d present", sum.WritesAcked+sum.PlainAcked, sum.WritesAcked+sum.PlainAcked))
	done = d.p.begin("check: kube-controller-manager and kube-scheduler kept their leader Leases (same holder, no new transition, renewed on green, no restart)")
	if sum.Leaders, err = d.leaders.check(ctx, gcs, j.UnfencedAt, "green"); err != nil {
		return err
	}
	done(strings.Join(sum.Leaders, "; "))
	d.printSummary(st)
	return d.verdict(st, plainErrs)
}

// moreWrites is how many more writes check lets the client-go writer make on green before it
// stops the traffic, and how long it waits for them: none with the writer off (rate 0); at a
// set rate, their time at that rate and 10 s more; as fast as the API lets it, up to 60 s.
func moreWrites(rate int) (int64, time.Duration) {
	const n = 20
	switch {
	case rate == 0:
		return 0, 0
	case rate > 0:
		return n, 10*time.Second + n*time.Second/time.Duration(rate)
	}
	return n, 60 * time.Second
}

// printSummary prints what the demo measured.
func (d *demo) printSummary(st admin.Status) {
	sum, out := &d.sum, d.out
	fmt.Fprintf(out, "\nSummary\n")
	fmt.Fprintf(out, "  write-unavailability windows (fence on -> fence off): cutover %s (the rehearsal predicted %s), rollback %s, cutover again %s\n",
		sum.Window.Round(time.Millisecond), sum.Predicted.Round(time.Millisecond), sum.Rollback.Round(time.Millisecond), sum.Again.Round(time.Millisecond))
	for _, l := range sum.Leaders {
		fmt.Fprintf(out, "  %s\n", l)
	}
	fmt.Fprintf(out, "  writes held while fenced (hold mode), then answered by the new side: %d; refused with 429: %d\n", sum.Held, sum.Refused)
	fmt.Fprintf(out, "  client-go writer: %d writes acknowledged, %d errors surfaced\n", sum.WritesAcked, sum.WriterErrors)
	fmt.Fprintf(out, "  plain HTTP writer (never retries): %d writes acknowledged, %d failed\n", sum.PlainAcked, sum.PlainErrors)
	fmt.Fprintf(out, "  reader: %d lists, %d failed; watcher: %d events\n", sum.Reads, sum.ReadErr, sum.WatchEvents)
	fmt.Fprintf(out, "  objects verified on green: %d; acknowledged writes lost: 0\n", sum.Verified)
	fmt.Fprintf(out, "  proxy backend now: %s (green), fence: %s\n", st.Backend, fenceWord(st.Fenced))
}

// verdict fails the demo on anything a user would have noticed.
func (d *demo) verdict(st admin.Status, plainErrs []error) error {
	switch {
	case st.Backend != d.green.GreenURL || st.Fenced:
		return fmt.Errorf("the proxy is not open on green: %+v", st)
	case d.sum.WriterErrors > 0:
		return fmt.Errorf("the writer saw %d errors: %v", d.sum.WriterErrors, d.traffic.errors()[0])
	case d.sum.PlainErrors > 0:
		return fmt.Errorf("the plain HTTP writer saw %d failed writes: %v", d.sum.PlainErrors, plainErrs[0])
	case d.sum.ReadErr > 0:
		return fmt.Errorf("the reader saw %d failed lists of %d", d.sum.ReadErr, d.sum.Reads)
	case d.o.writeRate < 0 && d.sum.Held == 0:
		// A writer as fast as it can has writes in every window: none held means the windows
		// showed nothing of hold mode (or the writes went around the fence).
		return fmt.Errorf("no write was held in any window, with the writer writing as fast as it can: %+v", st.Hold)
	}
	return nil
}

func fenceWord(f bool) string {
	if f {
		return "ON"
	}
	return "off"
}

func printKeep(out io.Writer, o options, env *framework.Env, px *framework.Proxy, blue, green *framework.APIServer, stateDir string) {
	fmt.Fprintf(out, `
Everything is still running (KEEP=1). Try it by hand in another terminal, with the kubectl that
make e2e-deps pinned (a kubectl on your PATH may be another version, or another program):

  export KUBECONFIG=%[1]s        # through the proxy (admin client certificate)
  %[2]s get configmaps -n demo | head
  %[3]s fence status --admin-socket %[4]s
  %[3]s fence on --reason "trying it" --admin-socket %[4]s
  %[2]s -n demo create configmap while-fenced
      # 429 + Retry-After: 1: kubectl (client-go) retries it 10 times, about 10 s, then fails
  (or: fence on --mode hold: the create is held, unanswered, up to the proxy's --hold-timeout
   of 4 s, then gets the 429 and is retried as above)
  %[3]s fence off --admin-socket %[4]s
      # run within those ~10 s, and the create being retried goes through

  blue apiserver (stopped serving clients, still running): %[5]s
  green apiserver (behind the proxy now):                   %[6]s
  logs: %[7]s and %[8]s/logs (green, started by the cutover)
  cutover journal: %[8]s/journal.json

Press Ctrl-C here to stop everything (etcd, apiservers, proxy).
`, px.Kubeconfig, kubectl(), o.kubefence, px.AdminSocket, blue.URL, green.URL, env.LogDir, stateDir)
}

// kubectl is the pinned kubectl of make e2e-deps, by its full path: a bare kubectl on PATH may be
// another version, or another program.
func kubectl() string { return framework.BinPath("kubectl", framework.Kube136) }

func clientset(kubeconfig string, qps float32) (*kubernetes.Clientset, error) {
	_, cfg, err := framework.ClientsetFor(kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = qps, int(qps)
	return kubernetes.NewForConfig(cfg)
}

func createWorkload(ctx context.Context, cs *kubernetes.Clientset, n int) error {
	for _, ns := range []string{"demo", "shop"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	replicas := int32(2)
	for _, name := range []string{"web", "api", "worker"} {
		labels := map[string]string{"app": name}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: appsv1.DeploymentSpec{
				Replicas: &replicas,
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: "registry.k8s.io/pause:3.10"}}},
				},
			},
		}
		if _, err := cs.AppsV1().Deployments("shop").Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if err := framework.CreateConfigMaps(ctx, cs, "shop", "config", n, 2000); err != nil {
		return err
	}
	for i := range 10 {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("secret-%02d", i)}, StringData: map[string]string{"password": fmt.Sprintf("pw-%d", i)}}
		if _, err := cs.CoreV1().Secrets("shop").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for i := range 20 {
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("web.%d", i)},
			InvolvedObject: corev1.ObjectReference{Kind: "Deployment", Namespace: "shop", Name: "web"},
			Reason:         "DemoEvent", Message: "an event with a TTL", Type: "Normal",
		}
		if _, err := cs.CoreV1().Events("shop").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// traffic is the live load during the move: a writer, a reader and a watcher.
type traffic struct {
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	once        sync.Once
	acked       atomic.Int64
	reads       atomic.Int64
	readErrs    atomic.Int64
	watchEvents atomic.Int64
	mu          sync.Mutex
	names       []string
	errs        []error
}

// startTraffic starts the writer (rate writes/s; < 0: one after another, as fast as the API
// lets it; 0: none), the reader and the watcher.
func startTraffic(ctx context.Context, cs *kubernetes.Clientset, rate int) *traffic {
	ctx, cancel := context.WithCancel(ctx)
	t := &traffic{cancel: cancel}
	t.wg.Add(2)
	go func() { // writer: creates configmaps one after another
		defer t.wg.Done()
		if rate == 0 {
			return
		}
		var tick <-chan time.Time
		if rate > 0 {
			tk := time.NewTicker(time.Second / time.Duration(rate))
			defer tk.Stop()
			tick = tk.C
		}
		for i := 0; ctx.Err() == nil; i++ {
			if tick != nil {
				select {
				case <-ctx.Done():
					return
				case <-tick:
				}
			}
			name := fmt.Sprintf("live-%05d", i)
			_, err := cs.CoreV1().ConfigMaps("demo").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"n": fmt.Sprint(i)}}, metav1.CreateOptions{})
			if ctx.Err() != nil {
				return
			}
			t.mu.Lock()
			if err != nil {
				t.errs = append(t.errs, fmt.Errorf("create %s: %w", name, err))
			} else {
				t.names = append(t.names, name)
				t.acked.Add(1)
			}
			t.mu.Unlock()
		}
	}()
	go func() { // reader: lists every 100 ms
		defer t.wg.Done()
		for ctx.Err() == nil {
			if _, err := cs.CoreV1().ConfigMaps("shop").List(ctx, metav1.ListOptions{Limit: 100}); err != nil && ctx.Err() == nil {
				t.readErrs.Add(1)
			}
			t.reads.Add(1)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace("demo"))
	inf := factory.Core().V1().ConfigMaps().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { t.watchEvents.Add(1) },
		UpdateFunc: func(any, any) { t.watchEvents.Add(1) },
	})
	factory.Start(ctx.Done())
	return t
}

func (t *traffic) stop() {
	t.once.Do(func() {
		t.cancel()
		t.wg.Wait()
	})
}

func (t *traffic) errors() []error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]error(nil), t.errs...)
}

func (t *traffic) ackedNames() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.names...)
}

func checkAcked(ctx context.Context, cs *kubernetes.Clientset, names []string) ([]string, error) {
	l, err := cs.CoreV1().ConfigMaps("demo").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, o := range l.Items {
		have[o.Name] = true
	}
	var lost []string
	for _, n := range names {
		if !have[n] {
			lost = append(lost, n)
		}
	}
	return lost, nil
}

// syncWriter serialises writes from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// indent prefixes every line written through it.
type indent struct {
	w      io.Writer
	prefix string
	mid    bool
}

func (i *indent) Write(p []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(p), "\n") {
		if line == "" {
			continue
		}
		if !i.mid {
			if _, err := io.WriteString(i.w, i.prefix); err != nil {
				return 0, err
			}
		}
		if _, err := io.WriteString(i.w, line); err != nil {
			return 0, err
		}
		i.mid = !strings.HasSuffix(line, "\n")
	}
	return len(p), nil
}

// cutoverCmd runs `kubefence cutover args... --plan plan` (args may start with a subcommand),
// its output indented under the step. A run past the bound (options.cutoverBound, or the plan's
// timeouts) is killed and fails the demo, saying so.
func (d *demo) cutoverCmd(ctx context.Context, args ...string) error {
	bound := d.o.cutoverBound
	if bound == 0 {
		var err error
		if bound, err = framework.CutoverBound(d.green.PlanPath); err != nil {
			return err
		}
	}
	what := "kubefence cutover " + strings.Join(args, " ")
	hung := fmt.Errorf("%s did not end within %s", what, bound)
	ctx, cancel := context.WithTimeoutCause(ctx, bound, hung)
	defer cancel()
	cmd := framework.DiesWithParent(exec.CommandContext(ctx, d.o.kubefence, append(append([]string{"cutover"}, args...), "--plan", d.green.PlanPath)...))
	cmd.Stdout = &indent{w: d.out, prefix: "            | "}
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = 10 * time.Second // its output, should a process it started hold it open
	if err := cmd.Run(); err != nil {
		if context.Cause(ctx) == hung {
			return fmt.Errorf("%w; killed: %v (logs in %s)", hung, err, d.env.LogDir)
		}
		return fmt.Errorf("%s: %w (logs in %s)", what, err, d.env.LogDir)
	}
	return nil
}

// baker is a `kubefence cutover` process that bakes after the cutover (it runs until stopped).
type baker struct {
	cmd     *exec.Cmd
	done    chan struct{}
	once    sync.Once
	stopErr error
}

// bakerStopBound is how long stop waits for the baking process to end: a clean stop takes
// seconds.
const bakerStopBound = 2 * time.Minute

// startBaker starts `kubefence cutover --plan plan`, its output indented under the step, and
// returns once the cutover is baking (its journal says so), or its error if it ended before.
func startBaker(ctx context.Context, bin string, out io.Writer, env *framework.Env, plan, stateDir string) (*baker, error) {
	b := &baker{cmd: framework.DiesWithParent(exec.Command(bin, "cutover", "--plan", plan)), done: make(chan struct{})}
	b.cmd.Stdout = &indent{w: out, prefix: "            | "}
	b.cmd.Stderr = b.cmd.Stdout
	b.cmd.WaitDelay = 10 * time.Second // its output, should a process it started hold it open
	if err := b.cmd.Start(); err != nil {
		return nil, err
	}
	var exit error
	go func() { exit = b.cmd.Wait(); close(b.done) }()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case <-b.done:
			return false, fmt.Errorf("kubefence cutover ended before it baked: %v (logs in %s)", exit, env.LogDir)
		default:
		}
		j, err := cutover.LoadJournal(stateDir)
		return err == nil && j.State == cutover.StateBaking, nil
	})
	if err != nil {
		_ = b.stop()
		return nil, err
	}
	return b, nil
}

// stop ends the baking process (SIGTERM: it stops cleanly) if it still runs, and waits for it;
// one still running bakerStopBound after the SIGTERM is killed, and stop says so.
func (b *baker) stop() error {
	b.once.Do(func() {
		select {
		case <-b.done:
			return
		default:
			_ = b.cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-b.done:
		case <-time.After(bakerStopBound):
			_ = b.cmd.Process.Kill()
			<-b.done
			b.stopErr = fmt.Errorf("the baking kubefence cutover (pid %d) did not end within %s of SIGTERM; killed it", b.cmd.Process.Pid, bakerStopBound)
		}
	})
	return b.stopErr
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
