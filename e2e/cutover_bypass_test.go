//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefence/kubefence/migrator/cutover"
)

// TestCutoverBypass: while a client-go writer goes through the proxy, a script writes
// configmaps straight to blue's apiserver. The preflight watches blue etcd, compares with the
// writes the proxy forwarded and refuses the cutover, naming the script's resource, namespace
// and field manager (not the writer behind the proxy). Nothing was fenced. With --allow-bypass
// the (replicating) cutover goes on and its preflight still says what it found. (The kubernetes
// Service has no endpoints here: kube-apiserver does not publish its loopback advertise address;
// the endpoint check is covered by TestIsProxyAddress.)
func TestCutoverBypass(t *testing.T) {
	f := newCutoverFixture(t)
	ctx := t.Context()
	f.replicateSettings(t)
	f.green.Plan.Preflight = cutover.Preflight{BypassWatch: cutover.Duration(3 * time.Second)}
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	cs := f.proxyClient(t, 100)
	f.createNamespace(t, "repl")
	f.createNamespace(t, "sneaky")
	w := startWriter(t, cs, "repl")
	sctx, stopSneaky := context.WithCancel(ctx)
	var sneaky atomic.Int64
	go func() { // around the proxy: blue's apiserver directly, every 100 ms
		for i := 0; sctx.Err() == nil; i++ {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%04d", i)}, Data: map[string]string{"k": "v"}}
			if _, err := f.blue.cs.CoreV1().ConfigMaps("sneaky").Create(sctx, cm, metav1.CreateOptions{FieldManager: "sneaky-script"}); err == nil {
				sneaky.Add(1)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	out, err := f.cutoverCmd(ctx)
	t.Logf("kubefence cutover (%d writes around the proxy so far):\n%s", sneaky.Load(), out)
	if err == nil {
		t.Fatal("the cutover started although a script wrote around the proxy")
	}
	for _, want := range []string{"writers go around the proxies", "configmaps in namespace sneaky", "sneaky-script (Update)", "--allow-bypass"} {
		if !strings.Contains(out, want) {
			t.Errorf("the preflight's refusal does not say %q", want)
		}
	}
	if strings.Contains(out, "configmaps in namespace repl") {
		t.Error("the writer behind the proxy was reported as going around it")
	}
	if st, err := f.px.Admin.Status(ctx); err != nil || st.Fenced || st.Backend != f.blue.api.URL {
		t.Fatalf("proxy after a refused preflight: %+v %v; want open on blue", st, err)
	}

	out, err = f.cutoverCmd(ctx, "--allow-bypass")
	stopSneaky()
	acked, errs := w.finish()
	t.Logf("kubefence cutover --allow-bypass:\n%s", out)
	if err != nil {
		t.Fatalf("cutover --allow-bypass: %v", err)
	}
	if !strings.Contains(out, "ALLOWED (allowBypass)") {
		t.Error("the preflight's detail does not say what it allowed")
	}
	if len(errs) > 0 {
		t.Errorf("the writer saw %d errors; first: %v", len(errs), errs[0])
	}
	checkAckedOnGreen(t, f, acked)
}
