package cutover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/kubefence/kubefence/internal/proc"
)

// Green's static pod runs on blue's node, next to blue's apiserver, usually from a copy of
// kubeadm's manifest. Beyond the port, etcd servers and endpoint reconciler the examples name,
// a copy keeps three things that break the cutover: blue's pod name (the kubelet runs one pod
// per namespace/name, so it would stop blue's apiserver while it serves everyone), probes on
// port 6443 (they check blue; once blue stops, the kubelet restarts green for good), and
// --bind-address=127.0.0.1 (green unreachable at a node-IP URL: the cutover aborts).

// checkGreenManifest refuses a green static pod manifest whose namespace/name another manifest
// in the kubelet's directory has, or that cannot serve green.apiserver.url with probes that
// check it (greenPodServes); each refusal says what to edit.
func checkGreenManifest(ctx context.Context, p *Plan) error {
	sp := p.Green.APIServer.StaticPod
	pod, err := readPod(sp.Manifest)
	if err != nil {
		return fmt.Errorf("green.apiserver.staticPod.manifest %s: %w", sp.Manifest, err)
	}
	return errors.Join(podNameFree(sp, pod), greenPodServes(ctx, p.Green.APIServer.URL, sp.Manifest, pod))
}

// readPod reads a pod manifest.
func readPod(path string) (*corev1.Pod, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(data, &pod); err != nil {
		return nil, fmt.Errorf("not a pod manifest: %w", err)
	}
	return &pod, nil
}

// manifestNameFree is podNameFree for the manifest sp names, read again: the placement checks
// it once more right before it writes into the kubelet's directory.
func manifestNameFree(sp *StaticPod) error {
	pod, err := readPod(sp.Manifest)
	if err != nil {
		return fmt.Errorf("green.apiserver.staticPod.manifest %s: %w", sp.Manifest, err)
	}
	return podNameFree(sp, pod)
}

// podKey is a static pod's namespace/name as the kubelet keys it (no namespace is default).
func podKey(m metav1.ObjectMeta) string {
	ns := m.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return ns + "/" + m.Name
}

// podNameFree refuses a green pod without a name, or with the namespace/name of a manifest
// already in the kubelet's directory (every file but hidden ones: the kubelet reads them all).
func podNameFree(sp *StaticPod, pod *corev1.Pod) error {
	if pod.Name == "" {
		return fmt.Errorf("green.apiserver.staticPod.manifest %s has no metadata.name: give it one of its own, like kube-apiserver-green", sp.Manifest)
	}
	entries, err := os.ReadDir(sp.ManifestDir)
	if err != nil {
		return fmt.Errorf("green.apiserver.staticPod.manifestDir: %w", err)
	}
	key, placed := podKey(pod.ObjectMeta), staticPodPath(sp)
	for _, e := range entries {
		path := filepath.Join(sp.ManifestDir, e.Name())
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || path == placed {
			continue
		}
		other, err := readPod(path)
		if err != nil || podKey(other.ObjectMeta) != key {
			continue
		}
		return fmt.Errorf("green.apiserver.staticPod.manifest %s names its pod %s, like %s in the kubelet's manifest dir: the kubelet runs one pod per namespace/name, so placing green's would stop that one (blue's apiserver, while it serves everyone); give green's manifest a metadata.name of its own, like %s-green", sp.Manifest, key, path, pod.Name)
	}
	return nil
}

// greenPodServes refuses an apiserver pod that cannot serve url: a --secure-port that is not
// url's port, a --bind-address that is not url's host (nor every address), probes on another
// port than --secure-port or on a host --bind-address does not serve; and one that would take
// the kubernetes Service's endpoints from the proxies (an endpoint reconciler other than none).
func greenPodServes(ctx context.Context, url, manifest string, pod *corev1.Pod) error {
	c := apiserverContainer(pod)
	if c == nil {
		return fmt.Errorf("green.apiserver.staticPod.manifest %s has no containers", manifest)
	}
	args := append(append([]string{}, c.Command...), c.Args...)
	port := cmp.Or(flagValue(args, "--secure-port"), "6443")
	bind := net.ParseIP(flagValue(args, "--bind-address"))
	if bind != nil && bind.IsUnspecified() {
		bind = nil // every address
	}
	var errs []error
	uhost, uport, err := net.SplitHostPort(proc.HostPort(url))
	switch {
	case err != nil:
	case uport != port:
		errs = append(errs, fmt.Errorf("green.apiserver.url %s has port %s, but green's manifest %s gives --secure-port %s: nothing would answer there; make them the same", url, uport, manifest, port))
	case bind != nil && !containsIP(hostIPs(ctx, uhost), bind):
		errs = append(errs, fmt.Errorf("green's manifest %s gives --bind-address=%s, so green's apiserver cannot serve green.apiserver.url %s: the cutover would wait for it in vain and abort; set --bind-address to %s's address (or 0.0.0.0), or green.apiserver.url's host to %s", manifest, bind, url, uhost, bind))
	}
	if r := flagValue(args, "--endpoint-reconciler-type"); r != "none" {
		errs = append(errs, fmt.Errorf("green's manifest %s gives --endpoint-reconciler-type=%s: once its writes are let through, green's apiserver would point the kubernetes Service at its own address instead of the proxies' (with a loopback --bind-address nothing answers there: every in-cluster client lost); add --endpoint-reconciler-type=none", manifest, cmp.Or(r, "lease (the default)")))
	}
	errs = append(errs, probesServe(c, manifest, port, bind)...)
	errs = append(errs, declaredPorts(pod, c, manifest, port)...)
	return errors.Join(errs...)
}

// declaredPorts refuses a port green's container declares other than its --secure-port: under
// hostNetwork (kubeadm's) a declared port is a host port, and kubeadm's manifest declares 6443
// (probe-port), which blue's kube-apiserver pod declares too: the kubelet refuses a pod whose host
// port another pod holds (NodePorts), and green would never start.
func declaredPorts(pod *corev1.Pod, c *corev1.Container, manifest, port string) []error {
	var errs []error
	for _, cp := range c.Ports {
		hp := cp.HostPort
		if hp == 0 && pod.Spec.HostNetwork {
			hp = cp.ContainerPort
		}
		if hp == 0 || fmt.Sprint(hp) == port {
			continue
		}
		errs = append(errs, fmt.Errorf("green's manifest %s declares port %d (%s), a host port under hostNetwork, other than its --secure-port %s, which only green's apiserver listens on (the kubelet refuses a pod whose host port another pod holds, as blue's kube-apiserver pod holds 6443); set its containerPort to %s", manifest, hp, cmp.Or(cp.Name, "unnamed"), port, port))
	}
	return errs
}

// probesServe refuses probes that do not ask green's apiserver: another port than its
// --secure-port (blue's 6443), or a host its --bind-address (bind, nil for every address) does
// not serve; no host is the pod's IP, the node's, which a loopback bind does not serve.
func probesServe(c *corev1.Container, manifest, port string, bind net.IP) []error {
	var wrongPort, wrongHost, named []string
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
	}{{"livenessProbe", c.LivenessProbe}, {"readinessProbe", c.ReadinessProbe}, {"startupProbe", c.StartupProbe}} {
		ppt, host, ok := probeTarget(pr.probe)
		if !ok {
			continue
		}
		if p := probePort(c, ppt); p != port {
			wrongPort = append(wrongPort, fmt.Sprintf("%s (port %s)", pr.name, p))
			if ppt.Type == intstr.String && !slices.Contains(named, ppt.StrVal) {
				named = append(named, ppt.StrVal)
			}
		}
		switch h := net.ParseIP(host); {
		case bind == nil:
		case host == "" && bind.IsLoopback():
			wrongHost = append(wrongHost, pr.name+" (no host: the node's IP)")
		case h != nil && !h.Equal(bind):
			wrongHost = append(wrongHost, fmt.Sprintf("%s (host %s)", pr.name, host))
		}
	}
	var errs []error
	if len(wrongPort) > 0 {
		fix := "set their port to " + port
		if len(named) > 0 { // kubeadm's probe-port: the number is the container's declared port
			fix = fmt.Sprintf("set the containerPort of port %s to %s (or their port to %s)", strings.Join(named, ", "), port, port)
		}
		errs = append(errs, fmt.Errorf("green's manifest %s: %s ask another port than its --secure-port %s: they would check blue's apiserver, and once blue stops the kubelet would restart green over and over; %s", manifest, strings.Join(wrongPort, ", "), port, fix))
	}
	if len(wrongHost) > 0 {
		errs = append(errs, fmt.Errorf("green's manifest %s: %s ask where its --bind-address=%s does not listen: the kubelet would restart green over and over; set their host to %s", manifest, strings.Join(wrongHost, ", "), bind, bind))
	}
	return errs
}

// probeTarget is the port and host a probe asks (httpGet, tcpSocket or grpc); ok is false for
// no probe or an exec probe.
func probeTarget(p *corev1.Probe) (port intstr.IntOrString, host string, ok bool) {
	switch {
	case p == nil:
	case p.HTTPGet != nil:
		return p.HTTPGet.Port, p.HTTPGet.Host, true
	case p.TCPSocket != nil:
		return p.TCPSocket.Port, p.TCPSocket.Host, true
	case p.GRPC != nil:
		return intstr.FromInt32(p.GRPC.Port), "", true
	}
	return intstr.IntOrString{}, "", false
}

// probePort is a probe's port as a number, a named port looked up in the container's ports.
func probePort(c *corev1.Container, p intstr.IntOrString) string {
	if p.Type == intstr.Int {
		return fmt.Sprint(p.IntVal)
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return fmt.Sprint(cp.ContainerPort)
		}
	}
	return p.StrVal + " (a port name the container does not declare)"
}

// apiserverContainer is the pod's kube-apiserver container: the one running kube-apiserver,
// else the first.
func apiserverContainer(pod *corev1.Pod) *corev1.Container {
	for i, c := range pod.Spec.Containers {
		for _, a := range append(append([]string{}, c.Command...), c.Args...) {
			if filepath.Base(a) == "kube-apiserver" {
				return &pod.Spec.Containers[i]
			}
		}
	}
	if len(pod.Spec.Containers) > 0 {
		return &pod.Spec.Containers[0]
	}
	return nil
}

// flagValue is the value of a flag in a command line ("--f=v" or "--f v"), "" if absent; the
// last one given, as kube-apiserver's flag parsing takes it.
func flagValue(args []string, flag string) string {
	vs := flagValues(args, flag)
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// flagValues is every value a flag is given in a command line, in order (a list flag's add up).
func flagValues(args []string, flag string) []string {
	var out []string
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			out = append(out, v)
		} else if a == flag && i+1 < len(args) {
			out = append(out, args[i+1])
		}
	}
	return out
}
