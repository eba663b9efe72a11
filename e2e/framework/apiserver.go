package framework

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APIServerConfig describes a kube-apiserver to start.
type APIServerConfig struct {
	Name          string // log file and kubeconfig names, e.g. "blue-apiserver"
	Version       string // Kube136
	EtcdEndpoints []string
	// EtcdTLS makes the apiserver present PKI's etcd client certificate (green etcd's TLS).
	EtcdTLS bool
	PKI     *PKI
	// StorageMediaType is passed as --storage-media-type when set (e.g. application/json).
	StorageMediaType string
	ExtraArgs        []string
	// AdvertiseAddress is --advertise-address (default 127.0.0.1, which kube-apiserver does not
	// publish in the kubernetes Service's endpoints); Port is --secure-port (default: a free one).
	AdvertiseAddress string
	Port             int
	// BindAddress is --bind-address and the URL's host (default 127.0.0.1).
	BindAddress string
}

// APIServer is a running kube-apiserver.
type APIServer struct {
	Config APIServerConfig
	URL    string
	Proc   *Process
	// Kubeconfig logs in with the admin client certificate, directly (not through a proxy).
	Kubeconfig string
	env        *Env
}

// StartAPIServer starts kube-apiserver on a free loopback port and waits for /readyz.
func (e *Env) StartAPIServer(ctx context.Context, cfg APIServerConfig) (*APIServer, error) {
	if cfg.Version == "" {
		cfg.Version = Kube136
	}
	bin, err := Bin("kube-apiserver", cfg.Version)
	if err != nil {
		return nil, err
	}
	if cfg.Port == 0 {
		ports, err := FreePorts(1)
		if err != nil {
			return nil, err
		}
		cfg.Port = ports[0]
	}
	p := cfg.PKI
	url := fmt.Sprintf("https://%s:%d", cmp.Or(cfg.BindAddress, "127.0.0.1"), cfg.Port)
	args := APIServerArgs(cfg, cfg.Port)
	proc, err := e.Start(cfg.Name, bin, args)
	if err != nil {
		return nil, err
	}
	a := &APIServer{Config: cfg, URL: url, Proc: proc, env: e}
	a.Kubeconfig = filepath.Join(e.Dir, cfg.Name+".kubeconfig")
	if err := WriteKubeconfig(a.Kubeconfig, url, p.CACert, p.AdminCert, p.AdminKey, ""); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := a.WaitReady(ctx, 90*time.Second); err != nil {
		return nil, err
	}
	e.Logf("kube-apiserver %s up at %s in %s (etcd %s)", cfg.Version, url, time.Since(start).Round(10*time.Millisecond), strings.Join(cfg.EtcdEndpoints, ","))
	return a, nil
}

// APIServerArgs are the flags the harness starts kube-apiserver with on port.
func APIServerArgs(cfg APIServerConfig, port int) []string {
	p := cfg.PKI
	args := []string{
		"--bind-address=" + cmp.Or(cfg.BindAddress, "127.0.0.1"),
		"--advertise-address=" + cmp.Or(cfg.AdvertiseAddress, "127.0.0.1"),
		fmt.Sprintf("--secure-port=%d", port),
		"--etcd-servers=" + strings.Join(cfg.EtcdEndpoints, ","),
		"--storage-backend=etcd3",
		"--tls-cert-file=" + p.APIServerCert,
		"--tls-private-key-file=" + p.APIServerKey,
		"--client-ca-file=" + p.CACert,
		"--token-auth-file=" + p.TokenFile,
		"--service-account-key-file=" + p.SAPub,
		"--service-account-signing-key-file=" + p.SAKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/12",
		"--authorization-mode=RBAC",
		"--requestheader-client-ca-file=" + p.FrontProxyCACert,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p.FrontProxyClientCert,
		"--proxy-client-key-file=" + p.FrontProxyClientKey,
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	}
	if cfg.StorageMediaType != "" {
		args = append(args, "--storage-media-type="+cfg.StorageMediaType)
	}
	if cfg.EtcdTLS {
		args = append(args, "--etcd-cafile="+p.EtcdCACert, "--etcd-certfile="+p.APIServerEtcdClientCert, "--etcd-keyfile="+p.APIServerEtcdClientKey)
	}
	return append(args, cfg.ExtraArgs...)
}

// WaitReady waits until /readyz answers 200.
func (a *APIServer) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := a.RestConfig()
	if err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	return WaitUntil(ctx, 200*time.Millisecond, "kube-apiserver "+a.Config.Name+" ready", func(ctx context.Context) (bool, error) {
		if err := a.Proc.ExitError(); err != nil {
			return false, err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.URL+"/readyz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("readyz: %s", resp.Status)
	})
}

// RestConfig is an admin client-certificate config for this apiserver.
func (a *APIServer) RestConfig() (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", a.Kubeconfig)
}

// Clientset is an admin clientset talking to this apiserver directly.
func (a *APIServer) Clientset() (*kubernetes.Clientset, error) {
	cfg, err := a.RestConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// WriteKubeconfig writes a kubeconfig for server, verified by caFile, logging in with a client
// certificate (certFile, keyFile) or a bearer token.
func WriteKubeconfig(path, server, caFile, certFile, keyFile, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubefence-e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile, Token: token}
	cfg.Contexts["kubefence-e2e"] = &clientcmdapi.Context{Cluster: "kubefence-e2e", AuthInfo: "user"}
	cfg.CurrentContext = "kubefence-e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

// ClientsetFor builds a clientset from a kubeconfig file.
func ClientsetFor(kubeconfig string) (*kubernetes.Clientset, *rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, cfg, err
}

// Kubectl runs the real kubectl against kubeconfig and returns stdout, stderr and the error.
func Kubectl(ctx context.Context, kubeconfig string, args ...string) (string, string, error) {
	bin, err := Bin("kubectl", Kube136)
	if err != nil {
		return "", "", err
	}
	cmd := DiesWithParent(exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.Env = append(os.Environ(), "KUBECTL_COMMAND_HEADERS=false")
	err = cmd.Run()
	return out.String(), errOut.String(), err
}
