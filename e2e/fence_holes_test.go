//go:build e2e

package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/proxy/admin"
)

// TestFenceHolesOnRealAPIServer: what the fence lets through while on must persist nothing on a
// real kube-apiserver. A DELETE with ?dryRun=All and a body is a real delete there (the body's
// DeleteOptions win), so the proxy must refuse it; a body that says dryRun All passes and deletes
// nothing; any method but GET on a /watch/ path is a write.
func TestFenceHolesOnRealAPIServer(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "kube-apiserver", framework.Kube136)
	ctx := t.Context()
	env, pki := newEnvPKI(t)
	blue, px := startBehindProxy(t, env, pki, "blue", framework.EtcdConfig{Version: framework.Etcd34})
	for _, name := range []string{"cm-query", "cm-body", "cm-collection"} {
		mustKubectl(t, blue.api.Kubeconfig, "-n", "default", "create", "configmap", name, "--from-literal=a=b")
		mustKubectl(t, blue.api.Kubeconfig, "-n", "default", "label", "configmap", name, "fenceholes=1")
	}
	if _, err := px.Admin.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: "e2e", WaitTimeout: admin.Duration(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	hc := tokenClient(t, px)
	const cms = "/api/v1/namespaces/default/configmaps"
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"query dry run with a DeleteOptions body", "DELETE", cms + "/cm-query?dryRun=All", `{"kind":"DeleteOptions","apiVersion":"v1"}`, 429},
		{"query dry run with an empty body object", "DELETE", cms + "/cm-query?dryRun=All", `{}`, 429},
		{"deletecollection, query dry run with a body", "DELETE", cms + "?dryRun=All&labelSelector=fenceholes%3D1", `{}`, 429},
		{"body dry run", "DELETE", cms + "/cm-body", `{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}`, 200},
		{"query dry run, no body", "DELETE", cms + "/cm-collection?dryRun=All", "", 200},
		{"POST on a watch path", "POST", "/api/v1/watch/namespaces/default/configmaps", `{"metadata":{"name":"via-watch"}}`, 429},
		{"DELETE on a watch path", "DELETE", "/api/v1/watch/namespaces/default/configmaps/cm-body", `{}`, 429},
	}
	for _, tc := range cases {
		var body *strings.Reader
		if tc.body != "" {
			body = strings.NewReader(tc.body)
		}
		req, _ := http.NewRequestWithContext(ctx, tc.method, px.URL+tc.path, nil)
		if body != nil {
			req, _ = http.NewRequestWithContext(ctx, tc.method, px.URL+tc.path, body)
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %s %s = %d, want %d", tc.name, tc.method, tc.path, resp.StatusCode, tc.want)
		}
	}
	// Straight to blue: every configmap is still there, and nothing was created.
	for _, name := range []string{"cm-query", "cm-body", "cm-collection"} {
		if _, err := blue.cs.CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("configmap %s after the fenced requests: %v (the fence let a delete through)", name, err)
		}
	}
	if _, err := blue.cs.CoreV1().ConfigMaps("default").Get(ctx, "via-watch", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("configmap via-watch: %v, want not found", err)
	}
}
