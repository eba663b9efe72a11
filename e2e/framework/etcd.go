package framework

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kubefence/kubefence/migrator/datadir"
)

// EtcdConfig describes an etcd cluster to start.
type EtcdConfig struct {
	Name    string // prefix of member names and log files, e.g. "blue-etcd"
	Version string // Etcd34, Etcd35, Etcd36
	Members int    // 1 or 3
	// EnableV2 serves the v2 API (etcd 3.4 and 3.5 only).
	EnableV2 bool
	// DataDirs reuses existing member data dirs (one per member) instead of new ones.
	DataDirs  []string
	ExtraArgs []string
	// TLS makes the cluster serve clients TLS with client-certificate auth, with PKI's etcd
	// certificates (kubeadm's layout: clients present a certificate of PKI's etcd CA).
	TLS bool
	PKI *PKI
	// Hosts are the members' addresses, one per member (default 127.0.0.1): other loopback
	// addresses stand for other hosts.
	Hosts []string
}

// host is member i's address.
func (cfg EtcdConfig) host(i int) string {
	if i < len(cfg.Hosts) {
		return cfg.Hosts[i]
	}
	return "127.0.0.1"
}

// EtcdMember is one running member.
type EtcdMember struct {
	Name, DataDir, ClientURL, PeerURL string
	Proc                              *Process
}

// Etcd is a running cluster.
type Etcd struct {
	Config  EtcdConfig
	Members []*EtcdMember
}

// Endpoints are the members' client URLs.
func (c *Etcd) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// StartEtcd starts a cluster on free loopback ports and waits until every member answers.
func (e *Env) StartEtcd(ctx context.Context, cfg EtcdConfig) (*Etcd, error) {
	if cfg.Members == 0 {
		cfg.Members = 1
	}
	bin, err := Bin("etcd", cfg.Version)
	if err != nil {
		return nil, err
	}
	if cfg.TLS && cfg.PKI == nil {
		return nil, fmt.Errorf("etcd %s: TLS needs a PKI", cfg.Name)
	}
	ports, err := FreePorts(2 * cfg.Members)
	if err != nil {
		return nil, err
	}
	c := &Etcd{Config: cfg}
	var initial []string
	for i := range cfg.Members {
		m := &EtcdMember{
			Name:      fmt.Sprintf("%s-%d", cfg.Name, i),
			ClientURL: clientScheme(cfg) + "://" + cfg.host(i) + ":" + itoa(ports[2*i]),
			PeerURL:   "http://" + cfg.host(i) + ":" + itoa(ports[2*i+1]),
			DataDir:   filepath.Join(e.Dir, fmt.Sprintf("%s-%d.etcd", cfg.Name, i)),
		}
		if i < len(cfg.DataDirs) {
			m.DataDir = cfg.DataDirs[i]
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range c.Members {
		args := []string{
			"--name", m.Name, "--data-dir", m.DataDir,
			"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", cfg.Name,
		}
		if strings.HasPrefix(cfg.Version, "3.4.") {
			args = append(args, "--logger", "zap")
		}
		if cfg.EnableV2 {
			args = append(args, "--enable-v2")
		}
		if p := cfg.PKI; cfg.TLS {
			args = append(args, "--trusted-ca-file", p.EtcdCACert, "--client-cert-auth",
				"--cert-file", filepath.Join(p.EtcdDir, "server.crt"), "--key-file", filepath.Join(p.EtcdDir, "server.key"))
		}
		args = append(args, cfg.ExtraArgs...)
		if m.Proc, err = e.Start(m.Name, bin, args); err != nil {
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	e.Logf("etcd %s up: %s (%d member(s), data in %s)", cfg.Version, strings.Join(c.Endpoints(), ","), cfg.Members, c.Members[0].DataDir)
	return c, nil
}

func clientScheme(cfg EtcdConfig) string {
	if cfg.TLS {
		return "https"
	}
	return "http"
}

// Conn is how a client reaches the cluster: its client URLs and, with TLS, the health-check
// client certificate.
func (c *Etcd) Conn() datadir.ConnSpec {
	spec := datadir.ConnSpec{Endpoints: c.Endpoints()}
	if p := c.Config.PKI; c.Config.TLS {
		spec.CAFile = p.EtcdCACert
		spec.CertFile, spec.KeyFile = filepath.Join(p.EtcdDir, "healthcheck-client.crt"), filepath.Join(p.EtcdDir, "healthcheck-client.key")
	}
	return spec
}

// Client returns a v3 client for the cluster; the caller closes it.
func (c *Etcd) Client() (*clientv3.Client, error) {
	if c.Config.TLS {
		return datadir.NewClient(c.Conn())
	}
	return clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// WaitHealthy waits until every member answers a status request.
func (c *Etcd) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cli, err := c.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	for _, m := range c.Members {
		err := WaitUntil(ctx, 100*time.Millisecond, "etcd member "+m.Name+" healthy", func(ctx context.Context) (bool, error) {
			if err := m.Proc.ExitError(); err != nil {
				return false, err
			}
			sctx, scancel := context.WithTimeout(ctx, time.Second)
			defer scancel()
			_, err := cli.Status(sctx, m.ClientURL)
			return err == nil, err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Revision returns the cluster's current revision.
func (c *Etcd) Revision(ctx context.Context) (int64, error) {
	cli, err := c.Client()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	st, err := cli.Status(ctx, c.Members[0].ClientURL)
	if err != nil {
		return 0, err
	}
	return st.Header.Revision, nil
}

// Stop stops every member.
func (c *Etcd) Stop() error {
	var first error
	for _, m := range c.Members {
		if err := m.Proc.Stop(10 * time.Second); err != nil && first == nil {
			first = err
		}
	}
	return first
}
