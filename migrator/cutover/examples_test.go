package cutover

import (
	"cmp"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/policy"
	"github.com/kubefence/kubefence/proxy/backendurl"
)

// examplePaths are the files and directories each shipped example plan names: kubeadm's
// default paths, and kubefence's own (docs/plan.md, "The examples"). An example that names
// any other path, or leaves one out, fails: a typo in a shipped path is caught here, not on
// the operator's node.
var examplePaths = withGreenTLS(map[string]map[string]string{
	"cutover-plan-kubeadm.yaml": kubeadmPaths,
	"cutover-plan-kubeadm-ha.yaml": with(kubeadmPaths, map[string]string{
		"green.apiservers[0].kubeconfig": "/etc/kubernetes/admin-green-11.conf",
		"green.apiservers[1].kubeconfig": "/etc/kubernetes/admin-green-12.conf",
		"proxies[1].certFile":            "/etc/kubefence/admin-client.crt",
		"proxies[1].keyFile":             "/etc/kubefence/admin-client.key",
		"proxies[1].caFile":              "/etc/kubernetes/pki/ca.crt",
		"proxies[2].certFile":            "/etc/kubefence/admin-client.crt",
		"proxies[2].keyFile":             "/etc/kubefence/admin-client.key",
		"proxies[2].caFile":              "/etc/kubernetes/pki/ca.crt",
	}),
	"cutover-plan-v2-source.yaml": {
		"blue.apiserver.kubeconfig":             "/etc/kubernetes/admin-blue.conf",
		"blue.etcd.dataDir":                     "/var/lib/etcd",
		"green.etcd.binary":                     "/usr/local/bin/etcd-3.6.16",
		"green.apiserver.kubeconfig":            "/etc/kubernetes/admin-green.conf",
		"green.apiserver.staticPod.manifest":    "/etc/kubefence/kube-apiserver-green.yaml",
		"green.apiserver.staticPod.manifestDir": "/etc/kubernetes/manifests",
	},
})

// kubeadmPaths are what a kubeadm node's plan names (the HA example names them too).
var kubeadmPaths = map[string]string{
	"blue.apiserver.kubeconfig":             "/etc/kubernetes/admin-blue.conf",
	"blue.etcd.caFile":                      "/etc/kubernetes/pki/etcd/ca.crt",
	"blue.etcd.certFile":                    "/etc/kubernetes/pki/apiserver-etcd-client.crt",
	"blue.etcd.keyFile":                     "/etc/kubernetes/pki/apiserver-etcd-client.key",
	"green.etcd.binary":                     "/usr/local/bin/etcd-3.6.16",
	"green.apiserver.kubeconfig":            "/etc/kubernetes/admin-green.conf",
	"green.apiserver.staticPod.manifest":    "/etc/kubefence/kube-apiserver-green.yaml",
	"green.apiserver.staticPod.manifestDir": "/etc/kubernetes/manifests",
}

// with is base and extra in a new map.
func with(base, extra map[string]string) map[string]string {
	out := maps.Clone(base)
	maps.Copy(out, extra)
	return out
}

// greenTLSPaths are green etcd's TLS files in kubeadm's layout, which every example names.
var greenTLSPaths = map[string]string{
	"green.etcd.tls.caFile":         "/etc/kubernetes/pki/etcd/ca.crt",
	"green.etcd.tls.serverCertFile": "/etc/kubernetes/pki/etcd/server.crt",
	"green.etcd.tls.serverKeyFile":  "/etc/kubernetes/pki/etcd/server.key",
	"green.etcd.tls.peerCertFile":   "/etc/kubernetes/pki/etcd/peer.crt",
	"green.etcd.tls.peerKeyFile":    "/etc/kubernetes/pki/etcd/peer.key",
	"green.etcd.tls.clientCertFile": "/etc/kubernetes/pki/etcd/healthcheck-client.crt",
	"green.etcd.tls.clientKeyFile":  "/etc/kubernetes/pki/etcd/healthcheck-client.key",
}

func withGreenTLS(m map[string]map[string]string) map[string]map[string]string {
	for _, paths := range m {
		maps.Copy(paths, greenTLSPaths)
	}
	return m
}

// TestShippedExamples parses every example in deploy/examples. A plan must parse without any
// error (parsing checks its shape only), and the paths it names must be exactly the documented
// ones above; whether those exist is the node's business (CheckFiles), not this test's.
func TestShippedExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "examples")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	plans := 0
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.Contains(string(data), "kind: FencePolicy"):
			if _, err := policy.Parse(data); err != nil {
				t.Errorf("%s: %v", e.Name(), err)
			}
		case strings.Contains(string(data), "kind: CutoverPlan"):
			plans++
			checkExamplePlan(t, e.Name(), data)
		default:
			t.Errorf("%s: neither a FencePolicy nor a CutoverPlan", e.Name())
		}
	}
	if plans != len(examplePaths) {
		t.Errorf("found %d example plans, the test knows %d", plans, len(examplePaths))
	}
}

func checkExamplePlan(t *testing.T, name string, data []byte) {
	t.Helper()
	p, err := ParsePlan(data)
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	want, ok := examplePaths[name]
	if !ok {
		t.Errorf("%s: not in examplePaths: list the paths it names", name)
		return
	}
	got := map[string]string{}
	for _, f := range p.paths() {
		if f.path != "" {
			got[f.field] = f.path
		}
	}
	for field, path := range got {
		if want[field] != path {
			t.Errorf("%s: %s is %q, not the documented %q", name, field, path, want[field])
		}
	}
	for field, path := range want {
		if _, ok := got[field]; !ok {
			t.Errorf("%s: %s (documented as %q) is not set", name, field, path)
		}
	}
}

// staticPodAllowedBackends are the --allowed-backends of the shipped static pod proxy.
func staticPodAllowedBackends(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "static-pod", "kubefence-proxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if _, v, ok := strings.Cut(line, "--allowed-backends="); ok {
			return strings.Split(strings.TrimSpace(v), ",")
		}
	}
	t.Fatal("the static pod sets no --allowed-backends")
	return nil
}

// TestExamplesFollowTheRecipe: the single-node examples follow deploy/README.md's stacked recipe
// (blue on 127.0.0.1:6443 behind the proxy on the node's IP; the old :6444 recipe leaves clients
// around the proxy), their green URLs are ones the shipped static pod proxy may switch to, and
// the main example replicates (README's default: a sub-second window). An example whose green
// URLs the static pod does not allow says to edit its --allowed-backends.
func TestExamplesFollowTheRecipe(t *testing.T) {
	allowed := staticPodAllowedBackends(t)
	for _, name := range []string{"cutover-plan-kubeadm.yaml", "cutover-plan-v2-source.yaml", "cutover-plan-kubeadm-ha.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "examples", name))
		if err != nil {
			t.Fatal(err)
		}
		p, err := ParsePlan(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p.Blue.APIServer.URL != "https://127.0.0.1:6443" {
			t.Errorf("%s: blue.apiserver.url %s, want the stacked recipe's https://127.0.0.1:6443", name, p.Blue.APIServer.URL)
		}
		for _, pr := range p.proxyRefs() {
			// The kubelet expands $(NODE_IP) to the proxy's node: the host of its admin address
			// (another node's proxy), else this node, whose green the plan's own URL names.
			node := pr.AdminAddress
			if node == "" {
				node = p.Green.APIServer.URL
			}
			u, err := url.Parse(node)
			if err != nil {
				t.Fatal(err)
			}
			node = u.Hostname()
			var own []string
			for _, a := range allowed {
				own = append(own, strings.ReplaceAll(a, "$(NODE_IP)", node))
			}
			green := cmp.Or(pr.GreenURL, p.Green.APIServer.URL)
			gu, err := backendurl.Parse(green)
			if err != nil {
				t.Fatalf("%s: proxy %s's green %s: %v", name, pr.name(), green, err)
			}
			if !backendurl.Allowed("", own, gu) {
				t.Errorf("%s: proxy %s's green %s is not in the static pod's --allowed-backends %v (on its node %s)", name, pr.name(), green, allowed, node)
			}
		}
		if name == "cutover-plan-kubeadm.yaml" && !p.Replicating() {
			t.Errorf("%s: migration.mode %s does not replicate: the main example should show the default, sub-second cutover", name, p.Migration.Mode)
		}
	}
}
