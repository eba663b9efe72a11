//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/proxy/admin"
)

// countingLW is an informer's ListerWatcher that counts its List and Watch calls: an informer
// that relists, or re-establishes its watch, shows up here.
type countingLW struct {
	*cache.ListWatch
	lists, watches atomic.Int32
	// listWatch makes the reflector list then watch, rather than stream its initial state as a
	// sendInitialEvents watch (client-go's WatchListClient, on by default).
	listWatch bool
}

func (c *countingLW) IsWatchListSemanticsUnSupported() bool { return c.listWatch }

func newCountingLW(cs *kubernetes.Clientset, ns string, listWatch bool) *countingLW {
	c := &countingLW{listWatch: listWatch}
	cms := cs.CoreV1().ConfigMaps(ns)
	c.ListWatch = &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			c.lists.Add(1)
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			c.watches.Add(1)
			return cms.Watch(ctx, o)
		},
	}
	return c
}

// TestWatchResume: two kube-apiservers on one etcd (so they serve the same revisions), the
// proxy in front of blue. Across `backend set GREEN --resume-watches`, `kubectl get -w` keeps
// running and prints every configmap exactly once, and client-go informers (list-then-watch
// over protobuf; a sendInitialEvents watch over JSON) see every configmap without listing or
// watching again. Green serves HTTP/1.1 only (--disable-http2-serving): the proxy, which asks
// for HTTP/2, finds that out on its first dial there and sends the moved watches and the writes
// over HTTP/1.1 (the cutover tests cover a green speaking HTTP/2).
func TestWatchResume(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd36, "kube-apiserver", framework.Kube136, "kubectl", framework.Kube136)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	env, pki := newEnvPKI(t)
	blue, px := startBehindProxy(t, env, pki, "blue", framework.EtcdConfig{Version: framework.Etcd36})
	// A watch of a namespace nothing changes, opened before green's apiserver starts: its
	// resourceVersion is older than green's watch cache, which answers it 410 Expired; the proxy
	// finds the namespace's configmaps the same at that revision and where green's cache begins,
	// and resumes it from there.
	// The same with kubectl's default output, whose events are Tables (the configmap's name
	// in the row). q0 is created once both watch: the last event each delivers before the
	// switch, whose revision the proxy must show green changed q0 alone, the object the event
	// was about, to resume them.
	mustKubectl(t, px.Kubeconfig, "create", "namespace", "quiet")
	quiet := startKubectlWatch(t, px.Kubeconfig, "quiet", false)
	quietTable := startKubectlWatch(t, px.Kubeconfig, "quiet", true)
	waitForT(t, 30*time.Second, "both quiet watches open at the proxy", func() bool {
		st, err := px.Admin.Status(ctx)
		return err == nil && st.OpenStreams >= 2
	})
	mustKubectl(t, px.Kubeconfig, "-n", "quiet", "create", "configmap", "q0")
	quiet.check(t, []string{"q0"})
	quietTable.check(t, []string{"q0"})
	const ns = "wr"
	mustKubectl(t, px.Kubeconfig, "create", "namespace", ns) // a revision past the quiet watch's
	green, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "green-apiserver", EtcdEndpoints: blue.etcd.Endpoints(), PKI: pki,
		ExtraArgs: []string{"--disable-http2-serving"}})
	if err != nil {
		t.Fatal(err)
	}
	greenCS, err := green.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	create := func(cs *kubernetes.Clientset, name string) {
		t.Helper()
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		names = append(names, name)
	}
	pcs, _, err := framework.ClientsetFor(px.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}

	// kubectl get -w through the proxy, logged in with a client certificate (the proxy forwards
	// the identity: the resumed watch must go through the front-proxy pool again).
	kwOut := &syncBuffer{}
	kubectlBin, _ := framework.Bin("kubectl", framework.Kube136)
	kw := framework.DiesWithParent(exec.CommandContext(ctx, kubectlBin, "--kubeconfig", px.Kubeconfig, "-n", ns, "get", "configmaps", "-w", "-o", "name"))
	kw.Stdout, kw.Stderr = kwOut, kwOut
	if err := kw.Start(); err != nil {
		t.Fatal(err)
	}
	kwExited := make(chan struct{})
	var kwErr error
	go func() { kwErr = kw.Wait(); close(kwExited) }()
	t.Cleanup(func() { _ = kw.Process.Kill(); <-kwExited })
	kubectlExited := func() bool {
		select {
		case <-kwExited:
			return true
		default:
			return false
		}
	}

	// Informers through the proxy with a bearer token (the plain pool).
	_, tcfg, err := framework.ClientsetFor(px.TokenKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	pbCfg, jsonCfg := *tcfg, *tcfg
	pbCfg.AcceptContentTypes, pbCfg.ContentType = "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf"
	jsonCfg.AcceptContentTypes, jsonCfg.ContentType = "application/json", "application/json"
	type informer struct {
		name      string
		lw        *countingLW
		inf       cache.SharedIndexInformer
		watchErrs atomic.Int32
	}
	var informers []*informer
	for _, c := range []struct {
		name      string
		cfg       *rest.Config
		listWatch bool
	}{{"list-watch/protobuf", &pbCfg, true}, {"watch-list/json", &jsonCfg, false}} {
		cs, err := kubernetes.NewForConfig(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		i := &informer{name: c.name, lw: newCountingLW(cs, ns, c.listWatch)}
		i.inf = cache.NewSharedIndexInformer(i.lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
		_ = i.inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			i.watchErrs.Add(1)
			t.Logf("informer %s: watch error: %v", i.name, err)
		})
		go i.inf.RunWithContext(ctx)
		informers = append(informers, i)
	}
	for _, i := range informers {
		if !cache.WaitForCacheSync(ctx.Done(), i.inf.HasSynced) {
			t.Fatalf("informer %s did not sync", i.name)
		}
	}

	for n := range 5 {
		create(pcs, fmt.Sprintf("before-%d", n))
	}
	seenAll := func(what string) {
		t.Helper()
		waitForT(t, 30*time.Second, what, func() bool {
			if kubectlExited() {
				t.Fatalf("kubectl get -w exited (%v):\n%s", kwErr, kwOut.String())
			}
			out := kwOut.String()
			for _, n := range names {
				if !strings.Contains(out, "configmap/"+n+"\n") {
					return false
				}
			}
			for _, i := range informers {
				for _, n := range names {
					if _, ok, _ := i.inf.GetStore().GetByKey(ns + "/" + n); !ok {
						return false
					}
				}
			}
			return true
		})
	}
	seenAll("kubectl and the informers see the first configmaps")
	// kubectl prints its list before it asks for the watch: all five watches open, by the
	// proxy's count, before the switch that must move them.
	waitForT(t, 30*time.Second, "the five watches open at the proxy", func() bool {
		st, err := px.Admin.Status(ctx)
		return err == nil && st.OpenStreams >= 5
	})
	before := map[string][2]int32{}
	for _, i := range informers {
		before[i.name] = [2]int32{i.lw.lists.Load(), i.lw.watches.Load()}
	}

	// The switch. Writes that bypass the proxy (straight to either apiserver, same etcd) land
	// around it: the resumed watches must deliver them once, wherever they fall.
	if out, errOut, err := px.CLI(ctx, "fence", "on", "--reason", "watch resume e2e"); err != nil {
		t.Fatalf("fence on: %v\n%s%s", err, out, errOut)
	}
	for n := range 3 {
		create(blue.cs, fmt.Sprintf("fenced-blue-%d", n))
	}
	out, errOut, err := px.CLI(ctx, "backend", "set", green.URL, "--resume-watches", "-o", "json")
	if err != nil {
		t.Fatalf("backend set --resume-watches: %v\n%s%s", err, out, errOut)
	}
	var sw admin.BackendResponse
	if err := json.Unmarshal([]byte(out), &sw); err != nil {
		t.Fatalf("backend set -o json: %v\n%s", err, out)
	}
	t.Logf("backend set --resume-watches: drain %+v (took %s)", sw.Drain, time.Duration(sw.Drain.Duration))
	if sw.Status.Backend != green.URL || sw.Drain.Resumed != 5 || sw.Drain.Ended != 0 || sw.Drain.Forced != 0 {
		t.Errorf("backend set answered %+v; want the three kubectls' and both informers' watches resumed on green", sw)
	}
	for n := range 3 {
		create(greenCS, fmt.Sprintf("fenced-green-%d", n))
	}
	// An object in the quiet namespace that lives only after the switch, before the quiet
	// watch is re-issued: the proxy's lists (at the watch's revision and where green's cache
	// begins) do not see it; the watch, re-issued from where green's cache begins, delivers its
	// creation and its deletion.
	if _, err := greenCS.CoreV1().ConfigMaps("quiet").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "q-transient"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := greenCS.CoreV1().ConfigMaps("quiet").Delete(ctx, "q-transient", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := px.CLI(ctx, "fence", "off"); err != nil {
		t.Fatal(err)
	}
	for n := range 5 {
		create(pcs, fmt.Sprintf("after-%d", n))
	}
	seenAll("kubectl and the informers see every configmap after the switch")
	if _, err := pcs.CoreV1().ConfigMaps("quiet").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "q1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, kw := range []*kubectlWatch{quiet, quietTable} {
		kw.check(t, []string{"q0", "q1"})
		if n := kw.byName()["q-transient"]; n != 2 {
			t.Errorf("the quiet kubectl get -w (table %v) printed configmap/q-transient %d times, want twice (created, deleted):\n%s", kw.table, n, kw.out.String())
		}
	}
	st, err := px.Admin.Status(ctx)
	if err != nil || st.OpenStreams != 5 || st.Backend != green.URL || st.ResumedPastExpiry != 2 || st.ResumedThenEnded != 0 {
		t.Fatalf("proxy status after the switch: %+v, %v; want the 5 watches open on green, the two quiet ones resumed past green's expiry", st, err)
	}

	// Exactly once, and still running.
	time.Sleep(time.Second) // time for a repeated event to show
	if kubectlExited() {
		t.Fatalf("kubectl get -w exited across the switch (%v):\n%s", kwErr, kwOut.String())
	}
	counts := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(kwOut.String()), "\n") {
		counts[l]++
	}
	for _, n := range names {
		if c := counts["configmap/"+n]; c != 1 {
			t.Errorf("kubectl get -w printed configmap/%s %d times, want once", n, c)
		}
	}
	if len(counts) != len(names) {
		t.Errorf("kubectl get -w printed %d distinct lines for %d configmaps:\n%s", len(counts), len(names), kwOut.String())
	}
	for _, i := range informers {
		if got := len(i.inf.GetStore().ListKeys()); got != len(names) {
			t.Errorf("informer %s holds %d configmaps, want %d", i.name, got, len(names))
		}
		lists, watches := i.lw.lists.Load(), i.lw.watches.Load()
		if b := before[i.name]; lists != b[0] || watches != b[1] {
			t.Errorf("informer %s: lists %d→%d, watches %d→%d across the switch; want no relist and no new watch", i.name, b[0], lists, b[1], watches)
		}
		if i.lw.listWatch && lists != 1 {
			t.Errorf("informer %s listed %d times, want once", i.name, lists)
		}
		if n := i.watchErrs.Load(); n > 0 {
			t.Errorf("informer %s saw %d watch errors", i.name, n)
		}
		t.Logf("informer %s: %d list(s), %d watch(es), %d configmaps", i.name, lists, watches, len(i.inf.GetStore().ListKeys()))
	}
	// The proxy found out on a dial (it ended that handshake, which green counts), rather than
	// never trying HTTP/2: all of the above then went over HTTP/1.1.
	metrics := mustKubectl(t, green.Kubeconfig, "get", "--raw", "/metrics")
	if !regexp.MustCompile(`(?m)^apiserver_tls_handshake_errors_total [1-9]`).MatchString(metrics) {
		t.Errorf("green counted no TLS handshake error: the proxy never found HTTP/2 not negotiated there")
	}
}
