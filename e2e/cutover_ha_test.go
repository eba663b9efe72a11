//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
)

// haHosts stand for three control-plane hosts: loopback addresses of their own.
var haHosts = []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}

// haFixture is kubeadm's stacked HA layout on haHosts: on each host a blue etcd member, a blue
// kube-apiserver on its own member, and a proxy in front of that apiserver. The plan names
// every proxy with its own blue and green apiserver; green is a three-member TLS etcd (the
// first restored, the others learners kubefence starts) with an apiserver on each host.
type haFixture struct {
	*cutoverFixture
	apis []*framework.APIServer
	pxs  []*framework.Proxy
}

func newHAFixture(t *testing.T) *haFixture {
	t.Helper()
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd36, "etcdctl", framework.Etcd36, "kube-apiserver", framework.Kube136)
	ctx := t.Context()
	f := &haFixture{cutoverFixture: &cutoverFixture{}}
	var ips []net.IP
	for _, h := range haHosts {
		ips = append(ips, net.ParseIP(h))
	}
	f.env, f.pki = newEnvPKI(t, ips...)
	// Blue etcd with TLS client certificates and the request size a bake needs (bakeFixture).
	etcd, err := f.env.StartEtcd(ctx, framework.EtcdConfig{Name: "blue-etcd", Version: framework.Etcd34, Members: 3, Hosts: haHosts,
		TLS: true, PKI: f.pki, ExtraArgs: []string{"--max-request-bytes", "10485760"}})
	if err != nil {
		t.Fatal(err)
	}
	ports, err := framework.FreePorts(len(haHosts))
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range haHosts {
		api, err := f.env.StartAPIServer(ctx, framework.APIServerConfig{Name: fmt.Sprintf("blue-apiserver-%d", i), EtcdEndpoints: []string{etcd.Members[i].ClientURL}, PKI: f.pki, EtcdTLS: true, BindAddress: h})
		if err != nil {
			t.Fatal(err)
		}
		// Each host's green apiserver listens on the host's own address: the shipped manifest
		// allows any port there ($(NODE_IP), the address the proxy listens on).
		px, err := f.env.StartProxy(ctx, framework.ProxyConfig{
			Name: fmt.Sprintf("kubefence-proxy-%d", i), Binary: kubefenceBin, Upstream: api.URL, PKI: f.pki,
			Listen: fmt.Sprintf("%s:%d", h, ports[i]),
		})
		if err != nil {
			t.Fatal(err)
		}
		f.apis, f.pxs = append(f.apis, api), append(f.pxs, px)
	}
	cs, err := f.apis[0].Clientset()
	if err != nil {
		t.Fatal(err)
	}
	f.blue, f.px = &cluster{etcd: etcd, api: f.apis[0], cs: cs}, f.pxs[0]
	f.writeHAPlan(t)
	return f
}

// writeHAPlan writes the replicating plan over haHosts, every proxy named with its host's
// apiservers.
func (f *haFixture) writeHAPlan(t *testing.T) {
	t.Helper()
	var err error
	if f.green, err = f.env.WriteCutoverPlan("green", f.pki, f.px, f.blue.api, f.blue.etcd, framework.Etcd36, len(haHosts)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = framework.StopCutoverProcesses(f.green.Plan.StateDir) })
	f.replicateSettings(t)
	if err := f.green.SpreadOver(f.env, f.pki, f.blue.api, haHosts); err != nil {
		t.Fatal(err)
	}
	p := &f.green.Plan
	for i := 1; i < len(haHosts); i++ {
		p.Green.Etcd.Members[i].Learner = true
	}
	p.Proxies = nil
	for i, px := range f.pxs {
		p.Proxies = append(p.Proxies, cutover.ProxyRef{AdminSocket: px.AdminSocket, BlueURL: f.apis[i].URL, GreenURL: f.green.GreenURLs[i]})
	}
	p.Preflight = cutover.Preflight{BypassWatch: cutover.Duration(3 * time.Second)}
	p.Bake.Enabled = true
	p.Blue.APIServer.EtcdUser = "kube-apiserver-etcd-client" // the PKI's apiserver-etcd-client, blue's as green's
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
}

// writers starts a client-go writer through each proxy, into namespace prefix-<host>.
func (f *haFixture) writers(t *testing.T, prefix string) []*writer {
	t.Helper()
	var ws []*writer
	for i, px := range f.pxs {
		ns := fmt.Sprintf("%s-%d", prefix, i)
		f.createNamespace(t, ns)
		// 10 writes/s each: three TLS members on two shared cores replicate far fewer revisions
		// per second than one (70-100/s here, with the race detector), and faster writers
		// would outrun them.
		ws = append(ws, startWriter(t, qpsClient(t, px.Kubeconfig, 10), ns))
	}
	return ws
}

// checkProxies checks every proxy is open on its own blue apiserver (green false) or green one.
func (f *haFixture) checkProxies(t *testing.T, when string, green bool) {
	t.Helper()
	for i, px := range f.pxs {
		want := f.apis[i].URL
		if green {
			want = f.green.GreenURLs[i]
		}
		if st, err := px.Admin.Status(t.Context()); err != nil || st.Fenced || st.Backend != want {
			t.Errorf("%s: proxy %d is %+v (%v); want open on %s", when, i, st, err, want)
		}
	}
}

// TestCutoverHA: three "hosts", each with a blue etcd member, a blue kube-apiserver and a proxy
// in front of it, and a writer through each proxy. (1) A script writing straight to the third
// host's apiserver is named by the preflight, which refuses; nothing is fenced. (2) A proxy
// killed before the switch aborts the cutover: the others are back open on blue at once, and
// `cutover abort` finishes once it is restarted. (3) The cutover moves all three proxies, each
// to its own host's green apiserver, onto a three-member green etcd with TLS spread over the
// hosts, and bakes; green etcd refuses a client without a certificate. (4) `cutover rollback`
// moves every proxy back to its own host's blue apiserver. No acknowledged write through any
// proxy is lost, and the writers of the cutover saw no error.
func TestCutoverHA(t *testing.T) {
	f := newHAFixture(t)
	ctx := t.Context()

	// (1) A writer around the proxies.
	phase1 := f.writers(t, "one")
	f.createNamespace(t, "sneaky")
	sneaky := startWriter(t, qpsClient(t, f.apis[2].Kubeconfig, 10), "sneaky")
	out, err := f.cutoverCmd(ctx)
	sneakyAcked, _ := sneaky.finish()
	t.Logf("kubefence cutover with a writer around the proxies (%d writes):\n%s", len(sneakyAcked), out)
	if err == nil || !strings.Contains(out, "writers go around the proxies") || !strings.Contains(out, "configmaps in namespace sneaky") {
		t.Fatalf("the preflight did not refuse naming the writer around the proxies: %v", err)
	}
	if strings.Contains(out, "configmaps in namespace one-") {
		t.Error("a writer behind a proxy was reported as going around it")
	}
	f.checkProxies(t, "after the refused preflight", false)

	// (2) A proxy killed before the switch. The kubernetes Service has no endpoints here
	// (loopback advertise addresses), so the rest runs with allowBypass.
	f.green.Plan.Preflight.AllowBypass = true
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	killed := f.pxs[2]
	out, err = f.cutoverWithHook(t, cutover.StepGreenAPIServer, killed.Proc.Kill)
	t.Logf("kubefence cutover with a proxy killed:\n%s", out)
	if err == nil || !strings.Contains(out, "kubefence-proxy-2") {
		t.Fatalf("cutover with a proxy killed before the switch: %v; want a failure naming the proxy", err)
	}
	for i, px := range f.pxs[:2] {
		if st, err := px.Admin.Status(ctx); err != nil || st.Fenced || st.Backend != f.apis[i].URL {
			t.Fatalf("proxy %d after the failed cutover: %+v %v; want open on blue", i, st, err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := killed.Start(rctx); err != nil {
		t.Fatal(err)
	}
	if j, err := cutover.LoadJournal(f.green.Plan.StateDir); err != nil || j.State != cutover.StateAborted {
		f.cutoverSub(t, "abort")
	}
	f.checkAborted(t)
	f.checkProxies(t, "after the abort", false)
	f.cutoverSub(t, "cleanup", "--remove-data-dirs")
	phase1Done := finishAll(phase1)

	// (3) The cutover, with writers through every proxy. It bakes: blue follows green.
	phase3 := f.writers(t, "three")
	baker := f.startBaker(t)
	t.Logf("kubefence cutover (baking):\n%s", baker.output())
	f.checkProxies(t, "baking", true)
	gcs := qpsClient(t, f.green.Plan.Green.APIServers[1].Kubeconfig, 100)
	checkHAWrites(t, gcs, "green", "one", phase1Done)
	checkGreenVoters(t, f.green, len(haHosts))
	checkGreenEtcdTLS(t, f.green, "three-0")
	time.Sleep(2 * time.Second) // writes on green, followed by blue
	f.checkBlueFollows(t, baker, phase3...)

	// (4) The way back: every proxy to its own host's blue apiserver, nothing lost.
	t.Logf("kubefence cutover rollback:\n%s", f.cutoverSub(t, "rollback"))
	baker.wait(t, "the rollback stopped it")
	f.checkProxies(t, "after the rollback", false)
	bcs := qpsClient(t, f.apis[2].Kubeconfig, 100)
	checkHAWrites(t, bcs, "blue", "one", phase1Done)
	checkHAWrites(t, bcs, "blue", "three", finishAll(phase3))
}

// checkHAWrites: every write the writers of a phase had acknowledged is in cs (side names it);
// they saw no error, but for the first phase's writer through the proxy that was killed.
func checkHAWrites(t *testing.T, cs kubernetes.Interface, side, phase string, ws []writerResult) {
	t.Helper()
	for i, w := range ws {
		if len(w.errs) > 0 && (phase != "one" || i != 2) {
			t.Errorf("the writer through proxy %d (phase %s) saw %d errors; first: %v", i, phase, len(w.errs), w.errs[0])
		}
		checkAckedIn(t, cs, w.ns, w.acked, side)
	}
}

// writerResult is what a finished writer had acknowledged and the errors it saw.
type writerResult struct {
	ns    string
	acked []string
	errs  []error
}

func finishAll(ws []*writer) []writerResult {
	var out []writerResult
	for _, w := range ws {
		acked, errs := w.finish()
		out = append(out, writerResult{w.ns, acked, errs})
	}
	return out
}
