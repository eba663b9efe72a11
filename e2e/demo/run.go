package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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
)

// summary is what the demo measured.
type summary struct {
	Window       time.Duration
	WritesAcked  int
	WriterErrors int
	// PlainAcked and PlainErrors are the plain HTTP writer's, which never retries.
	PlainAcked, PlainErrors int
	Held, Refused           uint64
	Reads, ReadErr          int
	WatchEvents             int64
	Verified                int
	Missing                 []string
	// Predicted is the window the rehearsal predicted; Leaders says how each leader fared.
	Predicted time.Duration
	Leaders   []string
}

func run(ctx context.Context, o options, out io.Writer) (*summary, error) {
	if o.objects == 0 {
		o.objects = 200
	}
	p := &printer{out: out, start: time.Now()}
	fmt.Fprintln(out, "kubefence demo: move a live control plane from etcd 3.4 (blue) to etcd 3.6 (green) behind the fence proxy")
	env, err := framework.NewEnv(o.dir, func(string, ...any) {})
	if err != nil {
		return nil, err
	}
	keepRunning := false
	defer func() {
		if keepRunning {
			return
		}
		_ = env.Close()
		if left := env.Running(); len(left) > 0 {
			fmt.Fprintf(out, "WARNING: processes left running: %v\n", left)
		}
	}()
	if o.kubefence == "" {
		if o.kubefence, err = framework.Kubefence(env.Dir); err != nil {
			return nil, err
		}
	}
	for _, b := range [][2]string{{"etcd", framework.Etcd34}, {"etcd", framework.Etcd36}, {"etcdutl", framework.Etcd36}, {"kube-apiserver", framework.Kube136}} {
		if _, err := framework.Bin(b[0], b[1]); err != nil {
			return nil, err
		}
	}
	pki, err := framework.NewPKI(filepath.Join(env.Dir, "pki"))
	if err != nil {
		return nil, err
	}

	done := p.begin("start blue: etcd %s + kube-apiserver %s", framework.Etcd34, framework.Kube136)
	blueEtcd, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "blue-etcd", Version: framework.Etcd34})
	if err != nil {
		return nil, err
	}
	blueAPI, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "blue-apiserver", EtcdEndpoints: blueEtcd.Endpoints(), PKI: pki})
	if err != nil {
		return nil, err
	}
	done(blueAPI.URL)

	done = p.begin("start kubefence proxy in front of blue (where the API load balancer stands)")
	px, err := env.StartProxy(ctx, framework.ProxyConfig{Binary: o.kubefence, Upstream: blueAPI.URL, PKI: pki, RetryAfter: 1})
	if err != nil {
		return nil, err
	}
	done(px.URL)

	cs, err := clientset(px.Kubeconfig, 500)
	if err != nil {
		return nil, err
	}
	done = p.begin("create the workload through the proxy")
	if err := createWorkload(ctx, cs, o.objects); err != nil {
		return nil, err
	}
	done(fmt.Sprintf("2 namespaces, 3 deployments, %d configmaps, 10 secrets, 20 events", o.objects))

	done = p.begin("start kube-controller-manager and kube-scheduler behind the proxy (leader election on: renew every 2 s, give up after 10 s)")
	leaders, err := startLeaders(ctx, env, px, pki, cs)
	if err != nil {
		return nil, err
	}
	done(leaders.String())

	done = p.begin("start live writers (client-go %s, and plain HTTP that never retries), a watcher (informer) and a reader, all through the proxy", rateWord(o.writeRate))
	wcs, err := clientset(px.Kubeconfig, 200)
	if err != nil {
		return nil, err
	}
	traffic := startTraffic(ctx, wcs, o.writeRate)
	defer traffic.stop()
	plain, err := startPlainWriter(ctx, px.URL, pki)
	if err != nil {
		return nil, err
	}
	defer plain.stop()
	time.Sleep(2 * time.Second)
	done(fmt.Sprintf("%d writes acknowledged so far", traffic.acked.Load()))

	st, _ := px.Admin.Status(ctx)
	p.note("proxy: fence %s, backend %s", fenceWord(st.Fenced), st.Backend)

	done = p.begin("write green's plan: etcd %s (TLS) + kube-apiserver %s, launched by the cutover; the defaults: migration.mode auto (here: replicate), fence mode hold", framework.Etcd36, framework.Kube136)
	green, err := env.WriteCutoverPlan("green", pki, px, blueAPI, blueEtcd, framework.Etcd36, 1)
	if err != nil {
		return nil, err
	}
	// The default cutover for v3 data onto a TLS green: green is built, replicated live and
	// verified before the fence; the window is only the drain, the switch and the unfence.
	// Hold mode: writes that arrive during it wait and are answered by green.
	green.Plan.Migration.Mode, green.Plan.Proxy.FenceMode = "", ""
	if err := green.Save(); err != nil {
		return nil, err
	}
	defer func() {
		if !keepRunning {
			_, _ = framework.StopCutoverProcesses(green.Plan.StateDir)
		}
	}()
	done(green.PlanPath)
	if o.manual {
		keepRunning = true
		fmt.Fprintf(out, `
Blue is running behind the proxy with a live writer, reader and watcher; nothing is fenced yet.
Follow docs/runbook.md sections 3-5 in another terminal:

  export KUBECONFIG=%[1]s                      # through the proxy
  %[2]s cutover --plan %[3]s --dry-run
  %[2]s fence status --admin-socket %[4]s
  %[2]s cutover --plan %[3]s                   # the move; try kill -9 and --resume, or 'cutover abort'
  curl -s %[5]s/metrics | grep ^kubefence_

  logs: %[6]s; green's (once started): %[7]s/logs

Press Ctrl-C here to stop everything, green included.
`, px.Kubeconfig, o.kubefence, green.PlanPath, px.AdminSocket, px.MetricsURL, env.LogDir, green.Plan.StateDir)
		<-ctx.Done()
		traffic.stop()
		keepRunning = false
		if stopped, _ := framework.StopCutoverProcesses(green.Plan.StateDir); len(stopped) > 0 {
			fmt.Fprintf(out, "stopped %v\n", stopped)
		}
		return nil, nil
	}

	done = p.begin("kubefence cutover --plan %s --rehearse (everything before the fence, a drain measured without fencing, green torn down)", filepath.Base(green.PlanPath))
	if err := cutoverCmd(ctx, o.kubefence, out, env, green.PlanPath, "--rehearse"); err != nil {
		return nil, err
	}
	rj, err := cutover.LoadJournal(green.Plan.StateDir)
	if err != nil || rj.Rehearsal == nil {
		return nil, fmt.Errorf("the rehearsal left no prediction: %v", err)
	}
	done("predicted window " + rj.Rehearsal.PredictedWindow.Round(time.Millisecond).String())

	// --- the write-unavailability window is inside this step ---
	done = p.begin("kubefence cutover --plan %s", filepath.Base(green.PlanPath))
	if err := cutoverCmd(ctx, o.kubefence, out, env, green.PlanPath); err != nil {
		return nil, err
	}
	j, err := cutover.LoadJournal(green.Plan.StateDir)
	if err != nil {
		return nil, err
	}
	sum := &summary{Window: j.UnfencedAt.Sub(j.FencedAt), Predicted: rj.Rehearsal.PredictedWindow}
	if j.Verified != nil {
		sum.Verified = j.Verified.Objects
	}
	done("")
	greenAPI := &framework.APIServer{URL: green.GreenURL, Kubeconfig: green.GreenKubeconfig}

	before := traffic.acked.Load()
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return traffic.acked.Load() > before+20, nil
	})
	traffic.stop()
	plainAcked, plainErrs := plain.stop()
	st, _ = px.Admin.Status(ctx)
	sum.WritesAcked, sum.WriterErrors = int(traffic.acked.Load()), len(traffic.errors())
	sum.PlainAcked, sum.PlainErrors = len(plainAcked), len(plainErrs)
	sum.Held = st.Hold.Released
	sum.Refused, sum.Reads, sum.ReadErr, sum.WatchEvents = st.RefusedWrites, int(traffic.reads.Load()), int(traffic.readErrs.Load()), traffic.watchEvents.Load()

	done = p.begin("check: every write the writer saw acknowledged is on green")
	gcs, err := greenAPI.Clientset()
	if err != nil {
		return nil, err
	}
	lost, err := checkAcked(ctx, gcs, append(traffic.ackedNames(), plainAcked...))
	if err != nil {
		return nil, err
	}
	if len(lost) > 0 {
		return sum, fmt.Errorf("%d acknowledged writes missing on green: %v", len(lost), lost[:min(len(lost), 10)])
	}
	done(fmt.Sprintf("%d of %d present", sum.WritesAcked+sum.PlainAcked, sum.WritesAcked+sum.PlainAcked))

	done = p.begin("check: kube-controller-manager and kube-scheduler kept their leader Leases (same holder, no new transition, renewed on green, no restart)")
	if sum.Leaders, err = leaders.check(ctx, gcs, j.UnfencedAt); err != nil {
		return sum, err
	}
	done(strings.Join(sum.Leaders, "; "))

	fmt.Fprintf(out, "\nSummary\n")
	fmt.Fprintf(out, "  write-unavailability window (fence on -> fence off): %s (the rehearsal predicted %s)\n", sum.Window.Round(time.Millisecond), sum.Predicted.Round(time.Millisecond))
	for _, l := range sum.Leaders {
		fmt.Fprintf(out, "  %s\n", l)
	}
	fmt.Fprintf(out, "  writes held while fenced (hold mode), then answered by green: %d; refused with 429: %d\n", sum.Held, sum.Refused)
	fmt.Fprintf(out, "  client-go writer: %d writes acknowledged, %d errors surfaced\n", sum.WritesAcked, sum.WriterErrors)
	fmt.Fprintf(out, "  plain HTTP writer (never retries): %d writes acknowledged, %d failed\n", sum.PlainAcked, sum.PlainErrors)
	fmt.Fprintf(out, "  reader: %d lists, %d failed; watcher: %d events\n", sum.Reads, sum.ReadErr, sum.WatchEvents)
	fmt.Fprintf(out, "  objects verified on green: %d; acknowledged writes lost: 0\n", sum.Verified)
	fmt.Fprintf(out, "  proxy backend now: %s (green), fence: %s\n", st.Backend, fenceWord(st.Fenced))
	if st.Backend != green.GreenURL || st.Fenced {
		return sum, fmt.Errorf("the proxy is not open on green: %+v", st)
	}
	if sum.WriterErrors > 0 {
		return sum, fmt.Errorf("the writer saw %d errors: %v", sum.WriterErrors, traffic.errors()[0])
	}
	if sum.PlainErrors > 0 {
		return sum, fmt.Errorf("the plain HTTP writer saw %d failed writes: %v", sum.PlainErrors, plainErrs[0])
	}

	if o.keep {
		keepRunning = true
		printKeep(out, o, env, px, blueAPI, greenAPI, green.Plan.StateDir)
		<-ctx.Done()
		keepRunning = false
	}
	return sum, nil
}

func fenceWord(f bool) string {
	if f {
		return "ON"
	}
	return "off"
}

func printKeep(out io.Writer, o options, env *framework.Env, px *framework.Proxy, blue, green *framework.APIServer, stateDir string) {
	fmt.Fprintf(out, `
Everything is still running (KEEP=1). Try it by hand in another terminal:

  export KUBECONFIG=%s        # through the proxy (admin client certificate)
  kubectl get configmaps -n demo | head
  %s fence status --admin-socket %s
  %s fence on --reason "trying it" --admin-socket %s
  kubectl -n demo create configmap while-fenced   # waits: 429 + Retry-After, retried by kubectl
  (or: fence on --mode hold, and the create waits, unanswered, until fence off)
  %s fence off --admin-socket %s                  # ... and now it goes through

  blue apiserver (stopped serving clients, still running): %s
  green apiserver (behind the proxy now):                   %s
  logs: %s and %s/logs (green, started by the cutover)
  cutover journal: %s/journal.json

Press Ctrl-C here to stop everything (etcd, apiservers, proxy).
`, px.Kubeconfig, o.kubefence, px.AdminSocket, o.kubefence, px.AdminSocket, o.kubefence, px.AdminSocket, blue.URL, green.URL, env.LogDir, stateDir, stateDir)
}

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
