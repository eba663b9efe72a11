//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/proxy/admin"
)

// TestHoldProxyKilled: held writes die with the proxy. kill -9 while writes are held in hold
// mode: every client sees a connection error (never a success), none of the writes reaches the
// apiserver, and the restarted proxy comes back fenced in hold mode with an empty waiting room
// (nothing is replayed when the fence lifts).
func TestHoldProxyKilled(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "kube-apiserver", framework.Kube136)
	ctx := t.Context()
	env, pki := newEnvPKI(t)
	c, px := startBehindProxy(t, env, pki, "blue", framework.EtcdConfig{Version: framework.Etcd34})
	if _, err := px.Admin.Fence(ctx, admin.FenceRequest{Fenced: true, Mode: admin.ModeHold, Reason: "kill test"}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	hc := tokenClient(t, px)
	errs := make([]error, n)
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"held-%d"}}`, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL+"/api/v1/namespaces/default/configmaps", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	// Bounded: the writes are held within a second; a regression that never holds them all fails
	// here, not at the package's -timeout, which would lose every other e2e result.
	heldCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := framework.WaitUntil(heldCtx, 20*time.Millisecond, "every write held", func(ctx context.Context) (bool, error) {
		st, err := px.Admin.Status(ctx)
		return err == nil && st.Hold.Held == n, err
	})
	if err != nil {
		t.Fatal(err)
	}
	px.Proc.Kill()
	wg.Wait()
	for i := range n {
		if errs[i] == nil {
			t.Errorf("write held-%d: answered %d by a proxy killed while holding it; want a connection error", i, codes[i])
		}
	}
	if err := px.Start(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := px.Admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Fenced || st.Mode != admin.ModeHold || st.Hold.Held != 0 {
		t.Fatalf("restarted proxy: fenced %v, mode %q, held %d; want fenced in hold mode, nothing held", st.Fenced, st.Mode, st.Hold.Held)
	}
	if _, err := px.Admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a replay, were there one, would land now
	for i := range n {
		_, err := c.cs.CoreV1().ConfigMaps("default").Get(ctx, fmt.Sprintf("held-%d", i), metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("configmap held-%d after the kill: err %v; want NotFound (a held write is never forwarded by a dead proxy)", i, err)
		}
	}
}
