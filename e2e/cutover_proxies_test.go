//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
)

// twoProxyFixture is blue behind two proxies, both named in the plan.
func twoProxyFixture(t *testing.T) (*cutoverFixture, *framework.Proxy) {
	t.Helper()
	f := newCutoverFixture(t)
	px2, err := f.env.StartProxy(t.Context(), framework.ProxyConfig{Name: "kubefence-proxy-2", Binary: kubefenceBin, Upstream: f.blue.api.URL, PKI: f.pki})
	if err != nil {
		t.Fatal(err)
	}
	f.green.Plan.Proxies = []cutover.ProxyRef{{AdminSocket: f.px.AdminSocket}, {AdminSocket: px2.AdminSocket}}
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	return f, px2
}

// TestCutoverTwoProxies: the cutover fences, switches and unfences every proxy of the plan.
func TestCutoverTwoProxies(t *testing.T) {
	f, px2 := twoProxyFixture(t)
	out, err := f.cutoverCmd(t.Context())
	if err != nil {
		t.Fatalf("cutover: %v\n%s", err, out)
	}
	for _, px := range []*framework.Proxy{f.px, px2} {
		st, err := px.Admin.Status(t.Context())
		if err != nil || st.Fenced || st.Backend != f.green.GreenURL {
			t.Errorf("proxy %s after the cutover: %+v %v; want open on green", px.AdminSocket, st, err)
		}
	}
}

// TestCutoverProxyKilled: a proxy killed after the fence and before the switch aborts the
// cutover; the other proxy is back open on blue at once, and once the killed one is restarted
// (fenced on blue, from its state file) 'kubefence cutover abort' opens it too.
func TestCutoverProxyKilled(t *testing.T) {
	f, px2 := twoProxyFixture(t)
	killed := false
	out, err := f.cutoverWithHook(t, cutover.StepCopy, func() {
		px2.Proc.Kill()
		killed = true
	})
	t.Logf("kubefence cutover:\n%s", out)
	if !killed || err == nil || !strings.Contains(out, "kubefence-proxy-2") {
		t.Fatalf("cutover with a proxy killed before the switch: killed %v, err %v; want a failure naming the proxy", killed, err)
	}
	st, err := f.px.Admin.Status(t.Context())
	if err != nil || st.Fenced || st.Backend != f.blue.api.URL {
		t.Fatalf("the surviving proxy: %+v %v; want open on blue", st, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := px2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := px2.Admin.Status(ctx); err != nil || !st.Fenced || st.Backend != f.blue.api.URL {
		t.Fatalf("the restarted proxy: %+v %v; want fenced on blue (its state file)", st, err)
	}
	if out, err := f.cutoverCmd(ctx, "abort"); err != nil {
		t.Fatalf("cutover abort: %v\n%s", err, out)
	}
	f.checkAborted(t)
	if st, err := px2.Admin.Status(ctx); err != nil || st.Fenced || st.Backend != f.blue.api.URL {
		t.Fatalf("the restarted proxy after the abort: %+v %v; want open on blue", st, err)
	}
}
