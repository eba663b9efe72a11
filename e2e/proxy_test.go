//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kubefence/kubefence/e2e/framework"
)

type cluster struct {
	etcd *framework.Etcd
	api  *framework.APIServer
	cs   *kubernetes.Clientset
}

func startCluster(t *testing.T, env *framework.Env, pki *framework.PKI, name, etcdVersion string) *cluster {
	t.Helper()
	return startClusterWith(t, env, pki, name, framework.EtcdConfig{Version: etcdVersion})
}

// startBehindProxy starts a cluster (as startClusterWith) and a kubefence proxy in front of it,
// from the static pod manifest's command.
func startBehindProxy(t *testing.T, env *framework.Env, pki *framework.PKI, name string, cfg framework.EtcdConfig) (*cluster, *framework.Proxy) {
	t.Helper()
	c := startClusterWith(t, env, pki, name, cfg)
	px, err := env.StartProxy(t.Context(), framework.ProxyConfig{Binary: kubefenceBin, Upstream: c.api.URL, PKI: pki, RetryAfter: 1})
	if err != nil {
		t.Fatal(err)
	}
	return c, px
}

// startClusterWith starts etcd as cfg says (its name is set here) and an apiserver on it.
func startClusterWith(t *testing.T, env *framework.Env, pki *framework.PKI, name string, cfg framework.EtcdConfig) *cluster {
	t.Helper()
	cfg.Name, cfg.PKI = name+"-etcd", pki
	etcd, err := env.StartEtcd(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	api, err := env.StartAPIServer(t.Context(), framework.APIServerConfig{Name: name + "-apiserver", EtcdEndpoints: etcd.Endpoints(), PKI: pki, EtcdTLS: cfg.TLS})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := api.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{etcd: etcd, api: api, cs: cs}
}

func mustKubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	out, errOut, err := framework.Kubectl(t.Context(), kubeconfig, args...)
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s%s", args, err, out, errOut)
	}
	return out
}

// writer creates configmaps through the proxy as fast as it can and records what was
// acknowledged and every error it saw.
type writer struct {
	cs       *kubernetes.Clientset
	ns       string
	mu       sync.Mutex
	acked    []string
	errs     []error
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// startWriter starts a writer for the rest of t: it stops at w.finish, or at t's cleanup when the
// test ended without (a failed test), before the cleanups registered earlier stop the cluster
// under it; without that it would outlive the test, failing each write at once against a stopped
// apiserver and spinning hot for the rest of the package.
func startWriter(t *testing.T, cs *kubernetes.Clientset, ns string) *writer {
	t.Helper()
	w := &writer{cs: cs, ns: ns, stop: make(chan struct{}), done: make(chan struct{})}
	ctx := t.Context()
	go func() {
		defer close(w.done)
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			name := fmt.Sprintf("w-%05d", i)
			// Not ctx: a write cancelled by the test's end would leave its outcome unknown.
			wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			_, err := cs.CoreV1().ConfigMaps(ns).Create(wctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": fmt.Sprint(i)},
			}, metav1.CreateOptions{})
			cancel()
			w.mu.Lock()
			if err != nil {
				w.errs = append(w.errs, fmt.Errorf("%s: %w", name, err))
			} else {
				w.acked = append(w.acked, name)
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.finish() })
	return w
}

// finish stops the writer, waits for its last write (bounded at 60 s) and returns what it saw.
// A second call, such as t's cleanup after the test's own, returns the same.
func (w *writer) finish() ([]string, []error) {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked, w.errs
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// TestFenceProxy runs the fence against real kube-apiservers: clients work through the proxy;
// under an informer and a writer, fence on refuses every write before etcd while reads and
// watches continue; fence off lets the writer's retries land with no error surfaced; a killed
// proxy comes back fenced; a switch to a second apiserver moves watches and then writes.
func TestFenceProxy(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd36, "kube-apiserver", framework.Kube136, "kubectl", framework.Kube136)
	ctx := t.Context()
	env, pki := newEnvPKI(t)
	blue, px := startBehindProxy(t, env, pki, "blue", framework.EtcdConfig{Version: framework.Etcd34})
	kc := px.TokenKubeconfig // bearer tokens pass through untouched
	pcs, _, err := framework.ClientsetFor(kc)
	if err != nil {
		t.Fatal(err)
	}

	// 1. Through the proxy, kubectl and client-go work as if direct.
	mustKubectl(t, kc, "create", "namespace", "e2e")
	mustKubectl(t, kc, "-n", "e2e", "create", "configmap", "first", "--from-literal=a=b")
	if out := mustKubectl(t, kc, "-n", "e2e", "get", "configmap", "first", "-o", "jsonpath={.data.a}"); out != "b" {
		t.Fatalf("kubectl get through proxy = %q", out)
	}
	kwOut := &syncBuffer{}
	kubectlBin, _ := framework.Bin("kubectl", framework.Kube136)
	kw := framework.DiesWithParent(exec.CommandContext(ctx, kubectlBin, "--kubeconfig", kc, "-n", "e2e", "get", "configmaps", "-w", "-o", "name"))
	kw.Stdout, kw.Stderr = kwOut, kwOut
	if err := kw.Start(); err != nil {
		t.Fatal(err)
	}
	kwDone := make(chan error, 1)
	go func() { kwDone <- kw.Wait() }()
	t.Cleanup(func() { _ = kw.Process.Kill() })
	mustKubectl(t, kc, "-n", "e2e", "create", "configmap", "second")
	waitForT(t, 10*time.Second, "kubectl get -w sees configmap/second", func() bool { return strings.Contains(kwOut.String(), "configmap/second") })

	// An informer on configmaps, counting watch errors.
	var watchErrors atomic.Int32
	factory := informers.NewSharedInformerFactoryWithOptions(pcs, 0, informers.WithNamespace("e2e"))
	inf := factory.Core().V1().ConfigMaps().Informer()
	_ = inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		watchErrors.Add(1)
		t.Logf("informer watch error: %v", err)
	})
	infCtx, stopInf := context.WithCancel(ctx)
	defer stopInf()
	factory.Start(infCtx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}

	// 2. kubectl shows the fence message once its retries run out (no writer yet).
	if out, errOut, err := px.CLI(ctx, "fence", "on", "--reason", "e2e test"); err != nil || !strings.Contains(out, "fence is ON") {
		t.Fatalf("fence on: %v\n%s%s", err, out, errOut)
	}
	out, errOut, err := framework.Kubectl(ctx, kc, "-n", "e2e", "create", "configmap", "refused")
	if err == nil || !strings.Contains(errOut, "fenced read-only for a control-plane migration") || !strings.Contains(errOut, "e2e test") {
		t.Fatalf("kubectl create while fenced: err=%v\nstdout=%s\nstderr=%s", err, out, errOut)
	}
	t.Logf("kubectl while fenced printed: %s", strings.TrimSpace(errOut))
	if _, _, err := px.CLI(ctx, "fence", "off"); err != nil {
		t.Fatal(err)
	}

	// 3. Under a writer: fence on refuses everything before etcd; reads and watches continue.
	_, wcfg, err := framework.ClientsetFor(kc)
	if err != nil {
		t.Fatal(err)
	}
	wcfg.QPS, wcfg.Burst = 1000, 1000 // as fast as it can
	wcs, err := kubernetes.NewForConfig(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	w := startWriter(t, wcs, "e2e")
	waitForT(t, 10*time.Second, "writer makes progress", func() bool { return w.count() > 200 })
	ecli, err := blue.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer ecli.Close()
	before, err := px.Admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, err = px.CLI(ctx, "fence", "on", "--reason", "e2e under load")
	if err != nil {
		t.Fatalf("fence on under load: %v\n%s%s", err, out, errOut)
	}
	rev, err := blue.etcd.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The barrier ends when blue answered the last write admitted, maybe before the writer
	// took in that answer; the writer is sequential, so its first refusal says it did.
	waitForT(t, 10*time.Second, "the writer refused once", func() bool {
		st, err := px.Admin.Status(ctx)
		return err == nil && st.RefusedWrites > before.RefusedWrites
	})
	ackedAtFence := w.count()
	// Every configmap write after the barrier would show up here.
	leaks := watchEtcd(ctx, ecli, "/registry/configmaps/e2e/", rev+1)
	reads, readErrs := 0, 0
	fenceUntil := time.Now().Add(4 * time.Second)
	for time.Now().Before(fenceUntil) {
		if _, err := pcs.CoreV1().ConfigMaps("e2e").List(ctx, metav1.ListOptions{Limit: 50}); err != nil {
			readErrs++
			t.Logf("list while fenced: %v", err)
		}
		reads++
		time.Sleep(50 * time.Millisecond)
	}
	st, err := px.Admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fenceEnd, err := blue.etcd.Revision(ctx) // still fenced: no configmap write may lie in (rev, fenceEnd]
	if err != nil {
		t.Fatal(err)
	}
	leakedKeys := leaks.changesThrough(t, fenceEnd)
	if _, _, err := px.CLI(ctx, "fence", "off"); err != nil {
		t.Fatal(err)
	}
	if readErrs > 0 {
		t.Errorf("%d of %d lists failed while fenced", readErrs, reads)
	}
	if st.RefusedWrites == 0 {
		t.Errorf("the writer was never refused: %+v", st)
	}
	if got := w.count(); got != ackedAtFence {
		t.Errorf("writer got %d acknowledgements while fenced", got-ackedAtFence)
	}
	if len(leakedKeys) > 0 {
		t.Errorf("writes reached etcd while fenced: %v", leakedKeys)
	}
	if n := watchErrors.Load(); n > 0 {
		t.Errorf("the informer's watch failed %d times across the fence", n)
	}
	select {
	case err := <-kwDone:
		t.Errorf("kubectl get -w ended during the fence: %v\n%s", err, kwOut.String())
	default:
	}
	waitForT(t, 15*time.Second, "writer resumes after fence off", func() bool { return w.count() > ackedAtFence+20 })
	acked, errs := w.finish()
	if len(errs) > 0 {
		t.Fatalf("the writer saw %d errors (client-go should have retried the 429s): first %v", len(errs), errs[0])
	}
	t.Logf("writer: %d configmaps acknowledged, %d writes refused while fenced, no error surfaced", len(acked), st.RefusedWrites)
	direct, err := blue.cs.CoreV1().ConfigMaps("e2e").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, cm := range direct.Items {
		have[cm.Name] = true
	}
	for _, name := range acked {
		if !have[name] {
			t.Errorf("acknowledged configmap %s missing from blue", name)
		}
	}
	waitForT(t, 10*time.Second, "informer has every acknowledged configmap", func() bool {
		return len(inf.GetStore().ListKeys()) == len(direct.Items)
	})

	// 4. kill -9 while fenced; the restarted proxy is still fenced.
	if _, _, err := px.CLI(ctx, "fence", "on", "--reason", "before crash"); err != nil {
		t.Fatal(err)
	}
	px.Proc.Kill()
	if err := px.Start(ctx); err != nil {
		t.Fatal(err)
	}
	out, _, err = px.CLI(ctx, "fence", "status", "-o", "json")
	if err != nil || !strings.Contains(out, `"fenced": true`) || !strings.Contains(out, "before crash") {
		t.Fatalf("after kill -9 and restart, status = %v\n%s", err, out)
	}
	if code := rawStatus(t, px, "POST", "/api/v1/namespaces/e2e/configmaps"); code != http.StatusTooManyRequests {
		t.Fatalf("after restart a write got %d, want 429", code)
	}

	// 5. Switch to a second apiserver while fenced; watches move; writes land on its etcd.
	// As a real cutover does (snapshot restore with a revision bump), green's revisions are put
	// above every resourceVersion a blue client has seen, so resumed watches are valid there.
	green := startCluster(t, env, pki, "green", framework.Etcd36)
	gcli, err := green.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer gcli.Close()
	blueRev, err := blue.etcd.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := gcli.Put(ctx, "/kubefence-e2e/revision-bump", "x")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Revision > blueRev+100 {
			break
		}
	}
	if _, err := green.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := green.cs.CoreV1().ConfigMaps("e2e").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "green-marker"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-kwDone:
		t.Logf("kubectl get -w ended when the proxy was killed, as with any load balancer restart (%v)", err)
	default:
	}
	out, errOut, err = px.CLI(ctx, "backend", "set", green.api.URL)
	if err != nil || !strings.Contains(out, "backend is "+green.api.URL) {
		t.Fatalf("backend set: %v\n%s%s", err, out, errOut)
	}
	t.Logf("backend set: %s", strings.TrimSpace(out))
	if st, err := px.Admin.Status(ctx); err != nil || st.Backend != green.api.URL || st.Fenced != true {
		t.Fatalf("status after switch: %+v %v", st, err)
	}
	waitForT(t, 30*time.Second, "informer's watch re-established against green", func() bool {
		_, exists, _ := inf.GetStore().GetByKey("e2e/green-marker")
		return exists
	})
	if _, _, err := px.CLI(ctx, "fence", "off"); err != nil {
		t.Fatal(err)
	}
	mustKubectl(t, kc, "-n", "e2e", "create", "configmap", "after-switch")
	if resp, err := gcli.Get(ctx, "/registry/configmaps/e2e/after-switch"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("write after switch not in green etcd: %v %v", resp, err)
	}
	if resp, err := ecli.Get(ctx, "/registry/configmaps/e2e/after-switch"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("write after switch reached blue etcd: %v %v", resp, err)
	}
	waitForT(t, 10*time.Second, "informer sees the write on green", func() bool {
		_, exists, _ := inf.GetStore().GetByKey("e2e/after-switch")
		return exists
	})
}

// etcdWatch records the changes under a prefix from a revision on, as an etcd watch delivers
// them, and the highest revision up to which etcd has said it delivered every change.
type etcdWatch struct {
	cli    *clientv3.Client
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	changes  []*clientv3.Event
	progress int64 // from etcd's progress notifications: every change up to here was delivered
	err      error
}

func watchEtcd(ctx context.Context, cli *clientv3.Client, prefix string, from int64) *etcdWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &etcdWatch{cli: cli, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	ch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
	go func() {
		defer close(w.done)
		for resp := range ch {
			w.mu.Lock()
			if err := resp.Err(); err != nil && ctx.Err() == nil && w.err == nil {
				w.err = err
			}
			if resp.IsProgressNotify() && resp.Header.Revision > w.progress {
				w.progress = resp.Header.Revision
			}
			w.changes = append(w.changes, resp.Events...)
			w.mu.Unlock()
		}
	}()
	return w
}

// changesThrough waits until etcd says the watch has delivered every change up to rev, stops
// the watch, waits for it to end, and returns the keys changed up to rev. A watch that fails,
// or ends before it got there, fails the test: it cannot vouch for anything.
func (w *etcdWatch) changesThrough(t *testing.T, rev int64) []string {
	t.Helper()
	defer func() {
		w.cancel()
		select {
		case <-w.done:
		case <-time.After(10 * time.Second):
			t.Error("the etcd watch did not end within 10s of its cancellation")
		}
	}()
	waitForT(t, 15*time.Second, fmt.Sprintf("the etcd watch has delivered every change up to revision %d", rev), func() bool {
		_ = w.cli.RequestProgress(w.ctx) // answered once the watch has caught up
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.err != nil {
			t.Fatalf("etcd watch: %v", w.err)
		}
		if w.progress >= rev {
			return true
		}
		select {
		case <-w.done:
			t.Fatalf("the etcd watch ended before it reached revision %d", rev)
		default:
		}
		return false
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	var keys []string
	for _, ev := range w.changes {
		if ev.Kv.ModRevision <= rev {
			keys = append(keys, fmt.Sprintf("%s %s@%d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision))
		}
	}
	return keys
}

// tokenClient is an HTTP client through the proxy with the admin bearer token, unthrottled.
func tokenClient(t *testing.T, px *framework.Proxy) *http.Client {
	t.Helper()
	_, cfg, err := framework.ClientsetFor(px.TokenKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RateLimiter = nil
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return hc
}

// rawStatus sends one request through the proxy with the admin token and returns the status.
func rawStatus(t *testing.T, px *framework.Proxy, method, path string) int {
	t.Helper()
	hc := tokenClient(t, px)
	req, _ := http.NewRequestWithContext(t.Context(), method, px.URL+path, strings.NewReader(`{"metadata":{"name":"raw"}}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func waitForT(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
