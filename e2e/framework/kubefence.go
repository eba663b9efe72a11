package framework

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubefence/kubefence/proxy/admin"
)

// ProxyConfig describes a kubefence proxy to start in front of an apiserver.
type ProxyConfig struct {
	Name       string // log file name, e.g. "proxy"
	Binary     string // the kubefence binary (framework.Kubefence)
	Upstream   string
	PKI        *PKI
	RetryAfter int
	ExtraArgs  []string
	// Env adds environment variables (NAME=value) to the proxy process.
	Env []string
	// Listen is the API's listen address (default: a free loopback port).
	Listen string
}

// Proxy is a running `kubefence proxy`.
type Proxy struct {
	Config      ProxyConfig
	URL         string
	MetricsURL  string
	AdminSocket string
	StateFile   string
	Proc        *Process
	// Kubeconfig logs in through the proxy with the admin client certificate; TokenKubeconfig
	// with the admin bearer token.
	Kubeconfig      string
	TokenKubeconfig string
	Admin           *admin.Client
	env             *Env
	args            []string
}

// StartProxy starts `kubefence proxy` on free loopback ports and waits until it serves.
func (e *Env) StartProxy(ctx context.Context, cfg ProxyConfig) (*Proxy, error) {
	if cfg.Name == "" {
		cfg.Name = "kubefence-proxy"
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = 1
	}
	ports, err := FreePorts(2)
	if err != nil {
		return nil, err
	}
	if cfg.Listen == "" {
		cfg.Listen = fmt.Sprintf("127.0.0.1:%d", ports[0])
	}
	dir := filepath.Join(e.Dir, cfg.Name)
	p := &Proxy{
		Config:      cfg,
		URL:         "https://" + cfg.Listen,
		MetricsURL:  fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		AdminSocket: filepath.Join(dir, "admin.sock"),
		StateFile:   filepath.Join(dir, "state.json"),
		env:         e,
	}
	// The shipped static pod manifest's own command, with the harness's paths and ports.
	p.args, err = ManifestProxyArgs(map[string]string{
		"listen":                    cfg.Listen,
		"tls-cert-file":             cfg.PKI.APIServerCert,
		"tls-key-file":              cfg.PKI.APIServerKey,
		"upstream":                  cfg.Upstream,
		"upstream-ca-file":          cfg.PKI.CACert,
		"client-ca-file":            cfg.PKI.CACert,
		"upstream-client-cert-file": cfg.PKI.FrontProxyClientCert,
		"upstream-client-key-file":  cfg.PKI.FrontProxyClientKey,
		"admin-socket":              p.AdminSocket,
		"state-file":                p.StateFile,
		"metrics-listen":            fmt.Sprintf("127.0.0.1:%d", ports[1]),
		// The manifest starts a proxy with no state file fenced (an operator then runs fence
		// off); the harness's proxies start open, as a proxy that was running before the test.
		"start-fenced": "false",
	})
	if err != nil {
		return nil, err
	}
	if cfg.RetryAfter != 1 {
		p.args = append(p.args, "--retry-after", itoa(cfg.RetryAfter))
	}
	p.args = append(p.args, cfg.ExtraArgs...)
	p.Admin = admin.NewClient(p.AdminSocket)
	p.Kubeconfig = filepath.Join(e.Dir, cfg.Name+".kubeconfig")
	if err := WriteKubeconfig(p.Kubeconfig, p.URL, cfg.PKI.CACert, cfg.PKI.AdminCert, cfg.PKI.AdminKey, ""); err != nil {
		return nil, err
	}
	p.TokenKubeconfig = filepath.Join(e.Dir, cfg.Name+"-token.kubeconfig")
	if err := WriteKubeconfig(p.TokenKubeconfig, p.URL, cfg.PKI.CACert, "", "", cfg.PKI.AdminToken); err != nil {
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Start (re)starts the proxy process with the same flags and waits until it serves.
func (p *Proxy) Start(ctx context.Context) error {
	if err := ensureDir(filepath.Dir(p.AdminSocket)); err != nil {
		return err
	}
	proc, err := p.env.Start(p.Config.Name, p.Config.Binary, p.args, p.Config.Env...)
	if err != nil {
		return err
	}
	p.Proc = proc
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = WaitUntil(ctx, 50*time.Millisecond, "kubefence proxy serving", func(ctx context.Context) (bool, error) {
		if err := proc.ExitError(); err != nil {
			return false, err
		}
		if _, err := p.Admin.Status(ctx); err != nil {
			return false, err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.MetricsURL+"/healthz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return err
	}
	p.env.Logf("kubefence proxy up at %s -> %s", p.URL, p.Config.Upstream)
	return nil
}

// CLI runs a kubefence subcommand against this proxy's admin socket.
func (p *Proxy) CLI(ctx context.Context, args ...string) (string, string, error) {
	args = append(args, "--admin-socket", p.AdminSocket)
	cmd := DiesWithParent(exec.CommandContext(ctx, p.Config.Binary, args...))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// ManifestPath is the static pod manifest that ships in deploy/.
const ManifestPath = "deploy/static-pod/kubefence-proxy.yaml"

// ManifestProxyArgs returns the kubefence arguments of the shipped static pod manifest (the
// container command after the binary) with the value of every flag named in values replaced,
// and $(NODE_IP) in the others (the kubelet expands it from the pod's env, the node's address)
// replaced by the host of values["listen"], the address the proxy takes over.
// Every flag in values must be in the manifest: a manifest that drops one fails here.
func ManifestProxyArgs(values map[string]string) ([]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, ManifestPath))
	if err != nil {
		return nil, err
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(data, &pod); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestPath, err)
	}
	if len(pod.Spec.Containers) != 1 || len(pod.Spec.Containers[0].Command) < 2 {
		return nil, fmt.Errorf("%s: want one container whose command is kubefence proxy ...", ManifestPath)
	}
	cmd := pod.Spec.Containers[0].Command
	args := []string{cmd[1]}
	seen := map[string]bool{}
	nodeIP, _, err := net.SplitHostPort(values["listen"])
	if err != nil {
		return nil, fmt.Errorf("the proxy's listen address %q: %w", values["listen"], err)
	}
	for _, a := range cmd[2:] {
		a = strings.ReplaceAll(a, "$(NODE_IP)", nodeIP)
		name, _, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			return nil, fmt.Errorf("%s: argument %q: write flags as --name=value", ManifestPath, a)
		}
		if v, ok := values[name]; ok {
			a = "--" + name + "=" + v
			seen[name] = true
		}
		args = append(args, a)
	}
	for name := range values {
		if !seen[name] {
			return nil, fmt.Errorf("%s has no --%s: the harness and the manifest disagree", ManifestPath, name)
		}
	}
	return args, nil
}
