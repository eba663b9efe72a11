//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
)

// TestStackedTopology: the deploy recipe for a kubeadm control-plane node (deploy/static-pod,
// deploy/kubeadm). Blue's kube-apiserver runs with the recipe's extraArgs (bind-address
// 127.0.0.1) and advertises the node's IP; the proxy, started from the shipped manifest's
// command, listens on the node's IP at the apiserver's port. Then the kubernetes Service's
// endpoint (what in-cluster clients reach) is the proxy, and a replicating cutover's preflight,
// with bypass not allowed, finds no writer around the proxy and goes on.
func TestStackedTopology(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd36, "kube-apiserver", framework.Kube136)
	nodeIP := nonLoopbackIP(t)
	env := newEnv(t)
	ctx := t.Context()
	pki, err := framework.NewPKI(filepath.Join(env.Dir, "pki"), nodeIP)
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "blue-etcd", Version: framework.Etcd34})
	if err != nil {
		t.Fatal(err)
	}
	ports, err := framework.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	api, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "blue-apiserver", EtcdEndpoints: etcd.Endpoints(), PKI: pki,
		AdvertiseAddress: nodeIP.String(), Port: ports[0], ExtraArgs: kubeadmExtraArgs(t)})
	if err != nil {
		t.Fatal(err)
	}
	nodeAddr := net.JoinHostPort(nodeIP.String(), fmt.Sprint(ports[0]))
	px, err := env.StartProxy(ctx, framework.ProxyConfig{Binary: kubefenceBin, Upstream: api.URL, PKI: pki, Listen: nodeAddr})
	if err != nil {
		t.Fatal(err)
	}
	waitServiceEndpoint(t, px.Kubeconfig, nodeAddr)

	green, err := env.WriteCutoverPlan("green", pki, px, api, etcd, framework.Etcd36, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = framework.StopCutoverProcesses(green.Plan.StateDir) })
	green.Plan.Migration.Mode = cutover.ModeReplicate
	green.Plan.Green.APIServer.EtcdUser = "kube-apiserver-etcd-client"
	green.Plan.Preflight = cutover.Preflight{BypassWatch: cutover.Duration(2 * time.Second)}
	if err := green.Save(); err != nil {
		t.Fatal(err)
	}
	cs, _, err := framework.ClientsetFor(px.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	w := startWriter(t, cs, "default")
	out, err := runKubefence(ctx, "cutover", "--plan", green.PlanPath)
	acked, errs := w.finish()
	t.Logf("kubefence cutover:\n%s", out)
	if err != nil {
		t.Fatalf("cutover in the stacked topology, bypass not allowed: %v", err)
	}
	if !strings.Contains(out, "none of those writes went around the proxies") {
		t.Error("the preflight's detail does not say it found no writer around the proxy")
	}
	if len(errs) > 0 || len(acked) == 0 {
		t.Errorf("the writer through the node's address: %d acknowledged, %d errors (first: %v)", len(acked), len(errs), errs)
	}
}

// nonLoopbackIP is this host's first IPv4 address that is not loopback (a node's address: the
// one kube-apiserver publishes in the kubernetes Service's endpoints).
func nonLoopbackIP(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.To4()
		}
	}
	t.Fatal("this host has no non-loopback IPv4 address: the stacked topology needs a node address that kube-apiserver publishes (it does not publish loopback)")
	return nil
}

// kubeadmExtraArgs are the apiServer.extraArgs of deploy/kubeadm/cluster-config.yaml as flags.
func kubeadmExtraArgs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../deploy/kubeadm/cluster-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		APIServer struct {
			CertSANs  []string `json:"certSANs"`
			ExtraArgs []struct {
				Name, Value string
			} `json:"extraArgs"`
		} `json:"apiServer"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range cfg.APIServer.ExtraArgs {
		args = append(args, "--"+a.Name+"="+a.Value)
	}
	if len(args) == 0 {
		t.Fatal("deploy/kubeadm/cluster-config.yaml has no apiServer.extraArgs")
	}
	return args
}

// waitServiceEndpoint waits until the kubernetes Service's EndpointSlice (read through
// kubeconfig) has exactly the address want.
func waitServiceEndpoint(t *testing.T, kubeconfig, want string) {
	t.Helper()
	cs, _, err := framework.ClientsetFor(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	err = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got = nil
		sl, err := cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
		if err != nil {
			return false, nil
		}
		for _, s := range sl.Items {
			for _, ep := range s.Endpoints {
				for _, p := range s.Ports {
					for _, a := range ep.Addresses {
						got = append(got, net.JoinHostPort(a, fmt.Sprint(*p.Port)))
					}
				}
			}
		}
		return len(got) == 1 && got[0] == want, nil
	})
	if err != nil {
		t.Fatalf("the kubernetes Service's endpoints are %v, want the proxy %s: %v", got, want, err)
	}
	t.Logf("the kubernetes Service's endpoint is the proxy: %s", want)
}
