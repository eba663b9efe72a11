package cutover

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kubeadmAPIServer is blue's manifest as kubeadm writes it with deploy/kubeadm's recipe
// (loopback bind, probes on 127.0.0.1 at the named port probe-port, which the container declares
// as 6443: under hostNetwork, a host port).
const kubeadmAPIServer = `apiVersion: v1
kind: Pod
metadata:
  name: kube-apiserver
  namespace: kube-system
spec:
  hostNetwork: true
  containers:
  - name: kube-apiserver
    image: registry.k8s.io/kube-apiserver:v1.36.0
    command:
    - kube-apiserver
    - --advertise-address=10.0.0.10
    - --bind-address=127.0.0.1
    - --secure-port=6443
    - --etcd-servers=https://127.0.0.1:2379
    ports:
    - {containerPort: 6443, name: probe-port, protocol: TCP}
    livenessProbe:
      httpGet: {host: 127.0.0.1, path: /livez, port: probe-port, scheme: HTTPS}
    readinessProbe:
      httpGet: {host: 127.0.0.1, path: /readyz, port: probe-port, scheme: HTTPS}
    startupProbe:
      httpGet: {host: 127.0.0.1, path: /livez, port: probe-port, scheme: HTTPS}
`

// greenFromKubeadm is kubeadm's manifest with the edits the examples' comments listed before:
// another port, green's etcd, no endpoint reconciler; edit changes it further.
func greenFromKubeadm(edit ...[2]string) string {
	m := strings.NewReplacer(
		"--secure-port=6443", "--secure-port=7443",
		"--etcd-servers=https://127.0.0.1:2379", "--etcd-servers=https://127.0.0.1:2479\n    - --endpoint-reconciler-type=none",
	).Replace(kubeadmAPIServer)
	for _, e := range edit {
		m = strings.ReplaceAll(m, e[0], e[1])
	}
	return m
}

// TestGreenManifestFitsBlueNode: the preflight refuses a green static pod manifest that would
// take blue's pod's name (the kubelet runs one pod per namespace/name: blue's apiserver would be
// stopped while it serves everyone), whose probes still ask port 6443 (blue's: once blue stops,
// the kubelet restarts green for good), or whose --bind-address cannot serve green's URL in the
// plan (green never ready, the cutover aborts); each refusal names what to edit.
func TestGreenManifestFitsBlueNode(t *testing.T) {
	renamed := [2]string{"name: kube-apiserver\n  namespace", "name: kube-apiserver-green\n  namespace"}
	probes := [2]string{"containerPort: 6443", "containerPort: 7443"}
	numbered := [2]string{"port: probe-port", "port: 6443"} // probes with a number, no ports declared
	undeclared := [2]string{"    ports:\n    - {containerPort: 6443, name: probe-port, protocol: TCP}\n", ""}
	for _, tc := range []struct {
		name, manifest, greenURL string
		want                     []string // in the error; none for no error
	}{
		{"fit", greenFromKubeadm(renamed, probes), "https://127.0.0.1:7443", nil},
		{"blue's pod name", greenFromKubeadm(probes), "https://127.0.0.1:7443",
			[]string{"kube-system/kube-apiserver", "kube-apiserver.yaml", "metadata.name"}},
		{"blue's probe port", greenFromKubeadm(renamed), "https://127.0.0.1:7443",
			[]string{"livenessProbe", "readinessProbe", "startupProbe", "port 6443", "--secure-port 7443", "containerPort of port probe-port"}},
		{"probes moved, blue's port still declared", greenFromKubeadm(renamed, [2]string{"port: probe-port", "port: 7443"}), "https://127.0.0.1:7443",
			[]string{"declares port 6443 (probe-port)", "host port", "blue's kube-apiserver pod holds 6443"}},
		{"numbered probes on blue's port", greenFromKubeadm(renamed, undeclared, numbered), "https://127.0.0.1:7443",
			[]string{"port 6443", "set their port to 7443"}},
		{"numbered probes moved", greenFromKubeadm(renamed, undeclared, numbered, [2]string{"port: 6443", "port: 7443"}), "https://127.0.0.1:7443", nil},
		{"loopback bind, node IP URL", greenFromKubeadm(renamed, probes), "https://10.0.0.10:7443",
			[]string{"--bind-address=127.0.0.1", "https://10.0.0.10:7443"}},
		{"every address, node IP URL", greenFromKubeadm(renamed, probes, [2]string{"--bind-address=127.0.0.1", "--bind-address=0.0.0.0"}), "https://10.0.0.10:7443", nil},
		{"node IP bind and probes", greenFromKubeadm(renamed, probes, [2]string{"--bind-address=127.0.0.1", "--bind-address=10.0.0.10"}, [2]string{"host: 127.0.0.1", "host: 10.0.0.10"}), "https://10.0.0.10:7443", nil},
		{"probes on loopback, bound to the node IP", greenFromKubeadm(renamed, probes, [2]string{"--bind-address=127.0.0.1", "--bind-address=10.0.0.10"}), "https://10.0.0.10:7443",
			[]string{"host 127.0.0.1", "--bind-address=10.0.0.10"}},
		{"URL port not --secure-port", greenFromKubeadm(renamed, probes), "https://127.0.0.1:8443",
			[]string{"--secure-port 7443", "https://127.0.0.1:8443"}},
		// Ungated, green's lease reconciler would point the kubernetes Service at green's own
		// address (nothing answers there with a loopback bind): every in-cluster client lost.
		{"endpoint reconciler left on", greenFromKubeadm(renamed, probes, [2]string{"\n    - --endpoint-reconciler-type=none", ""}), "https://127.0.0.1:7443",
			[]string{"--endpoint-reconciler-type=none", "kubernetes Service"}},
		{"endpoint reconciler lease", greenFromKubeadm(renamed, probes, [2]string{"--endpoint-reconciler-type=none", "--endpoint-reconciler-type=lease"}), "https://127.0.0.1:7443",
			[]string{"--endpoint-reconciler-type=lease"}},
		{"endpoint reconciler none, then lease (the last counts)", greenFromKubeadm(renamed, probes, [2]string{"--endpoint-reconciler-type=none", "--endpoint-reconciler-type=none\n    - --endpoint-reconciler-type=lease"}), "https://127.0.0.1:7443",
			[]string{"--endpoint-reconciler-type=lease"}},
		{"endpoint reconciler lease, then none", greenFromKubeadm(renamed, probes, [2]string{"--endpoint-reconciler-type=none", "--endpoint-reconciler-type=lease\n    - --endpoint-reconciler-type=none"}), "https://127.0.0.1:7443", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, dir := validPlan(t)
			kubeletDir := filepath.Join(dir, "manifests")
			if err := os.Mkdir(kubeletDir, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, kubeletDir, "kube-apiserver.yaml", kubeadmAPIServer)
			writeFile(t, kubeletDir, "etcd.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: etcd, namespace: kube-system}\n")
			p.Green.APIServer.URL = tc.greenURL
			p.Green.APIServer.Command = nil
			p.Green.APIServer.StaticPod = &StaticPod{Manifest: writeFile(t, dir, "kube-apiserver-green.yaml", tc.manifest), ManifestDir: kubeletDir}
			err := checkGreenManifest(t.Context(), p)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want a refusal naming %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not name %q", err, w)
				}
			}
		})
	}
}
