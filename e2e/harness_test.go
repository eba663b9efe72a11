//go:build e2e

package e2e

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefence/kubefence/e2e/framework"
)

// TestHarness proves the harness: etcd 3.4 and kube-apiserver 1.36 come up, kubectl writes,
// client-go reads back, and everything stops with no process left.
func TestHarness(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "kube-apiserver", framework.Kube136, "kubectl", framework.Kube136)
	ctx := t.Context()
	env, pki := newEnvPKI(t)
	etcd, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "etcd", Version: framework.Etcd34})
	if err != nil {
		t.Fatal(err)
	}
	api, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "apiserver", EtcdEndpoints: etcd.Endpoints(), PKI: pki})
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, err := framework.Kubectl(ctx, api.Kubeconfig, "create", "namespace", "harness"); err != nil {
		t.Fatalf("kubectl create namespace: %v\n%s%s", err, out, errOut)
	}
	if out, errOut, err := framework.Kubectl(ctx, api.Kubeconfig, "-n", "harness", "create", "configmap", "hello", "--from-literal=greeting=hi"); err != nil {
		t.Fatalf("kubectl create configmap: %v\n%s%s", err, out, errOut)
	}
	out, _, err := framework.Kubectl(ctx, api.Kubeconfig, "version", "-o", "json")
	if err != nil || !strings.Contains(out, `"gitVersion": "v`+framework.Kube136+`"`) {
		t.Errorf("kubectl version: %v\n%s", err, out)
	}
	cs, err := api.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "harness", metav1.GetOptions{}); err != nil {
		t.Fatalf("client-go get namespace: %v", err)
	}
	cms, err := cs.CoreV1().ConfigMaps("harness").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, cm := range cms.Items {
		if cm.Name == "hello" && cm.Data["greeting"] == "hi" {
			found = true
		}
	}
	if !found {
		t.Fatalf("configmap hello not listed back: %d items", len(cms.Items))
	}
	if err := env.Close(); err != nil {
		t.Fatal(err)
	}
	if left := env.Running(); len(left) > 0 {
		t.Fatalf("processes left running: %v", left)
	}
}
