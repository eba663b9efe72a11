package framework

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// GreenSetup is a cutover plan for the harness: green etcd of a version with members on free
// ports and green kube-apiserver launched by the cutover, both under the Env's dir.
type GreenSetup struct {
	PlanPath string
	Plan     cutover.Plan
	// GreenURL and GreenKubeconfig reach green's apiserver directly.
	GreenURL        string
	GreenKubeconfig string
	GreenEtcd       []string // client URLs
	// GreenURLs are every green apiserver's URL (after SpreadOver: one per host, in its order).
	GreenURLs []string
}

// WriteCutoverPlan writes a plan that moves blue (apiserver, etcd) behind px to a green etcd of
// etcdVersion and a green kube-apiserver, and returns it.
func (e *Env) WriteCutoverPlan(name string, pki *PKI, px *Proxy, blueAPI *APIServer, blueEtcd *Etcd, etcdVersion string, members int) (*GreenSetup, error) {
	etcdBin, err := Bin("etcd", etcdVersion)
	if err != nil {
		return nil, err
	}
	apiBin, err := Bin("kube-apiserver", Kube136)
	if err != nil {
		return nil, err
	}
	ports, err := FreePorts(2*members + 1)
	if err != nil {
		return nil, err
	}
	g := &GreenSetup{PlanPath: filepath.Join(e.Dir, name+".plan.yaml")}
	var ms []cutover.GreenMember
	for i := range members {
		m := cutover.GreenMember{
			Name:      fmt.Sprintf("%s-etcd-%d", name, i),
			DataDir:   filepath.Join(e.Dir, fmt.Sprintf("%s-etcd-%d.etcd", name, i)),
			ClientURL: fmt.Sprintf("https://127.0.0.1:%d", ports[2*i]),
			PeerURL:   fmt.Sprintf("https://127.0.0.1:%d", ports[2*i+1]),
		}
		ms = append(ms, m)
		g.GreenEtcd = append(g.GreenEtcd, m.ClientURL)
	}
	apiPort := ports[2*members]
	g.GreenURL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	g.GreenURLs = []string{g.GreenURL}
	g.GreenKubeconfig = filepath.Join(e.Dir, name+"-apiserver.kubeconfig")
	if err := WriteKubeconfig(g.GreenKubeconfig, g.GreenURL, pki.CACert, pki.AdminCert, pki.AdminKey, ""); err != nil {
		return nil, err
	}
	g.Plan = cutover.Plan{
		APIVersion: cutover.PlanAPIVersion,
		Kind:       cutover.PlanKind,
		StateDir:   filepath.Join(e.Dir, name+"-cutover"),
		Proxy:      cutover.ProxySpec{AdminSocket: px.AdminSocket},
		Blue: cutover.BlueSpec{
			APIServer: cutover.APIServerRef{URL: blueAPI.URL, Kubeconfig: blueAPI.Kubeconfig},
			Etcd:      cutover.BlueEtcd{EtcdClientSpec: blueEtcd.Conn()},
		},
		Green: cutover.GreenSpec{
			// Green etcd as in production: TLS with client certificates, kubeadm's layout.
			Etcd: cutover.GreenEtcd{Binary: etcdBin, Version: etcdVersion, Members: ms, TLS: &cutover.GreenEtcdTLS{PKIDir: pki.EtcdDir}},
			APIServer: cutover.GreenAPIServer{
				APIServerRef: cutover.APIServerRef{URL: g.GreenURL, Kubeconfig: g.GreenKubeconfig},
				Command: append([]string{apiBin}, APIServerArgs(APIServerConfig{
					Name: name + "-apiserver", EtcdEndpoints: g.GreenEtcd, PKI: pki, EtcdTLS: true,
					StorageMediaType: blueAPI.Config.StorageMediaType, ExtraArgs: greenArgs,
				}, apiPort)...),
			},
		},
		Migration: cutover.Migration{Mode: "snapshot"},
		// A short look for writers around the proxy; allowed, because here the kubernetes
		// Service's endpoint is blue's apiserver itself, not the proxy (every test's topology).
		Preflight: cutover.Preflight{BypassWatch: cutover.Duration(time.Second), AllowBypass: true},
	}
	if err := g.Save(); err != nil {
		return nil, err
	}
	return g, nil
}

// greenArgs are what a green apiserver's command needs besides the usual (the cutover's preflight
// refuses it without): the kubernetes Service's endpoints stay the proxies', not green's own.
var greenArgs = []string{"--endpoint-reconciler-type=none"}

// SpreadOver places green on hosts (loopback addresses that stand for hosts), as kubeadm's
// stacked layout does: member i and an apiserver on hosts[i], each apiserver on its host's
// member only; the first apiserver is green.apiserver, the others green.apiservers, all
// started by the cutover. The plan must have one member per host.
func (g *GreenSetup) SpreadOver(e *Env, pki *PKI, blueAPI *APIServer, hosts []string) error {
	ms := g.Plan.Green.Etcd.Members
	if len(ms) != len(hosts) {
		return fmt.Errorf("green has %d members for %d hosts", len(ms), len(hosts))
	}
	apiBin, err := Bin("kube-apiserver", Kube136)
	if err != nil {
		return err
	}
	ports, err := FreePorts(3 * len(hosts))
	if err != nil {
		return err
	}
	g.GreenEtcd, g.GreenURLs, g.Plan.Green.APIServers = nil, nil, nil
	for i, h := range hosts {
		ms[i].ClientURL = fmt.Sprintf("https://%s:%d", h, ports[3*i])
		ms[i].PeerURL = fmt.Sprintf("https://%s:%d", h, ports[3*i+1])
		g.GreenEtcd = append(g.GreenEtcd, ms[i].ClientURL)
		cfg := APIServerConfig{
			Name: fmt.Sprintf("green-apiserver-%d", i), EtcdEndpoints: []string{ms[i].ClientURL}, PKI: pki, EtcdTLS: true,
			StorageMediaType: blueAPI.Config.StorageMediaType, BindAddress: h, ExtraArgs: greenArgs,
		}
		a := cutover.GreenAPIServer{
			APIServerRef: cutover.APIServerRef{URL: fmt.Sprintf("https://%s:%d", h, ports[3*i+2]), Kubeconfig: filepath.Join(e.Dir, cfg.Name+".kubeconfig")},
			Command:      append([]string{apiBin}, APIServerArgs(cfg, ports[3*i+2])...),
		}
		if err := WriteKubeconfig(a.Kubeconfig, a.URL, pki.CACert, pki.AdminCert, pki.AdminKey, ""); err != nil {
			return err
		}
		g.GreenURLs = append(g.GreenURLs, a.URL)
		if i == 0 {
			a.EtcdUser = g.Plan.Green.APIServer.EtcdUser
			g.Plan.Green.APIServer, g.GreenURL, g.GreenKubeconfig = a, a.URL, a.Kubeconfig
			continue
		}
		g.Plan.Green.APIServers = append(g.Plan.Green.APIServers, a)
	}
	return g.Save()
}

// EtcdConn is how a test reaches green etcd: its client URLs with the health-check client
// certificate (green requires client certificates).
func (g *GreenSetup) EtcdConn() datadir.ConnSpec {
	spec := datadir.ConnSpec{Endpoints: g.GreenEtcd}
	if t := g.Plan.Green.Etcd.TLS; t != nil {
		spec.CAFile = filepath.Join(t.PKIDir, "ca.crt")
		spec.CertFile, spec.KeyFile = filepath.Join(t.PKIDir, "healthcheck-client.crt"), filepath.Join(t.PKIDir, "healthcheck-client.key")
	}
	return spec
}

// CutoverBound is the longest a `kubefence cutover` of the plan at path may run (any
// subcommand, --rehearse included): the sum of the plan's step timeouts and fence barrier, the
// defaults filled in, and a minute for the rest. Every step is bounded by its own timeout, so a
// run past that is hung; a caller that waits for one can fail instead of waiting on forever.
func CutoverBound(path string) (time.Duration, error) {
	p, err := cutover.ReadPlan(path)
	if err != nil {
		return 0, err
	}
	t := p.Timeouts
	sum := time.Minute + p.Proxy.WaitTimeout.D()
	for _, d := range []cutover.Duration{t.Preflight, t.Copy, t.Migrate, t.GreenEtcd, t.GreenAPIServer, t.Verify, t.Switch, t.Unfence, t.Replicate, t.Window} {
		sum += d.D()
	}
	return sum, nil
}

// Save writes Plan to PlanPath (after a test changed it).
func (g *GreenSetup) Save() error {
	data, err := yaml.Marshal(&g.Plan)
	if err != nil {
		return err
	}
	return os.WriteFile(g.PlanPath, data, 0o644)
}

// StopCutoverProcesses stops the green processes a cutover started (they outlive the
// kubefence process by design, so the Env does not know them) and reports what it stopped. A
// journal's pid whose process has ended may since name another process (pids are recycled,
// within minutes on a busy machine): only a process whose command line names the state dir's
// environment (its data dir, its certificates) is stopped.
func StopCutoverProcesses(stateDir string) ([]string, error) {
	j, err := cutover.LoadJournal(stateDir)
	if err != nil {
		return nil, nil // no journal: nothing was started
	}
	env := []byte(filepath.Dir(stateDir) + string(filepath.Separator))
	var stopped []string
	for name, pid := range j.GreenPIDs {
		// Checked before each signal: the process may end and its pid be taken meanwhile.
		ours := func() bool {
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			return err == nil && bytes.Contains(cmdline, env) && Running(pid)
		}
		if pid <= 0 || !ours() || syscall.Kill(pid, syscall.SIGTERM) != nil {
			continue
		}
		stopped = append(stopped, fmt.Sprintf("%s (pid %d)", name, pid))
		gone := func(context.Context) (bool, error) { return !ours(), nil }
		if wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, gone) != nil && ours() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return stopped, nil
}

// Running reports whether pid is a live process (not gone, not a zombie waiting to be reaped).
func Running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return !(i > 0 && i+2 < len(b) && b[i+2] == 'Z')
}
