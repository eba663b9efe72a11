// Package cutover moves a cluster from its current ("blue") etcd + kube-apiserver to a new
// ("green") pair behind the kubefence proxy: preflight → fence → copy → migrate → start green
// etcd → start green kube-apiserver → verify → switch → unfence. Each finished step is recorded
// in a journal before the next begins, so a crashed run resumes; a failure before the switch
// aborts back to blue.
package cutover

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/kubefence/kubefence/migrator/datadir"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kubefence/kubefence/internal/pathguard"
)

// Plan API version and kind.
const (
	PlanAPIVersion = "kubefence.io/v1alpha1"
	PlanKind       = "CutoverPlan"
)

// Plan is a cutover plan (docs/plan.md).
type Plan struct {
	APIVersion string    `yaml:"apiVersion" json:"apiVersion"`
	Kind       string    `yaml:"kind" json:"kind"`
	StateDir   string    `yaml:"stateDir" json:"stateDir"`
	Proxy      ProxySpec `yaml:"proxy" json:"proxy"`
	Blue       BlueSpec  `yaml:"blue" json:"blue"`
	Green      GreenSpec `yaml:"green" json:"green"`
	Migration  Migration `yaml:"migration" json:"migration"`
	Timeouts   Timeouts  `yaml:"timeouts" json:"timeouts"`

	// hash identifies the plan's content in the journal.
	hash string
}

// ProxySpec says how to reach the kubefence proxy in front of blue.
type ProxySpec struct {
	AdminSocket string `yaml:"adminSocket" json:"adminSocket"`
	// WaitTimeout bounds the fence barrier.
	WaitTimeout Duration `yaml:"waitTimeout" json:"waitTimeout"`
	Reason      string   `yaml:"reason" json:"reason"`
}

// APIServerRef is how the cutover reads an apiserver directly (not through the proxy).
type APIServerRef struct {
	URL        string `yaml:"url" json:"url"`
	Kubeconfig string `yaml:"kubeconfig" json:"kubeconfig"`
	// CAFile verifies the serving certificate when the proxy is switched to it (default: the
	// proxy keeps its current CA).
	CAFile string `yaml:"caFile" json:"caFile"`
}

// EtcdClientSpec is how to reach an etcd cluster.
type EtcdClientSpec = datadir.Client

// BlueSpec is the cluster being moved away from.
type BlueSpec struct {
	APIServer APIServerRef `yaml:"apiserver" json:"apiserver"`
	Etcd      BlueEtcd     `yaml:"etcd" json:"etcd"`
}

// BlueEtcd is blue's etcd: its client endpoints and, for v2 data, one member's data dir on this
// host (read, never written: its snapshot and WAL files are copied while it runs).
type BlueEtcd struct {
	EtcdClientSpec `yaml:",inline" json:",inline"`
	DataDir        string `yaml:"dataDir" json:"dataDir,omitempty"`
	WALDir         string `yaml:"walDir" json:"walDir,omitempty"`
}

// GreenMember is one member of the green etcd cluster.
type GreenMember struct {
	Name       string `yaml:"name" json:"name"`
	DataDir    string `yaml:"dataDir" json:"dataDir"`
	ClientURL  string `yaml:"clientURL" json:"clientURL"`
	PeerURL    string `yaml:"peerURL" json:"peerURL"`
	MetricsURL string `yaml:"metricsURL" json:"metricsURL,omitempty"`
}

// GreenEtcd is the new etcd: its binary, version and members.
type GreenEtcd struct {
	Binary       string        `yaml:"binary" json:"binary"`
	Version      string        `yaml:"version" json:"version"`
	ClusterToken string        `yaml:"clusterToken" json:"clusterToken"`
	Members      []GreenMember `yaml:"members" json:"members"`
	ExtraArgs    []string      `yaml:"extraArgs" json:"extraArgs,omitempty"`
}

// GreenAPIServer is the new kube-apiserver: how to launch it and how to reach it.
type GreenAPIServer struct {
	APIServerRef `yaml:",inline" json:",inline"`
	// Command launches it as a process kubefence starts and leaves running (its first element
	// is the binary).
	Command []string `yaml:"command" json:"command,omitempty"`
	// StaticPod writes Manifest into ManifestDir for the kubelet to run, instead of Command.
	StaticPod *StaticPod `yaml:"staticPod" json:"staticPod,omitempty"`
}

// StaticPod places a pod manifest into a kubelet's static pod directory.
type StaticPod struct {
	Manifest    string `yaml:"manifest" json:"manifest"`
	ManifestDir string `yaml:"manifestDir" json:"manifestDir"`
}

// GreenSpec is the cluster being moved to.
type GreenSpec struct {
	Etcd      GreenEtcd      `yaml:"etcd" json:"etcd"`
	APIServer GreenAPIServer `yaml:"apiserver" json:"apiserver"`
}

// Migration says how green's data is built from blue's.
type Migration struct {
	// Mode: snapshot (v3 data: snapshot restore), v2-to-v3 (a member's v2 store migrated along
	// with the v3 snapshot, needs blue.etcd.dataDir), or auto (v2-to-v3 when that member holds v2
	// user content, snapshot otherwise or without blue.etcd.dataDir).
	Mode string `yaml:"mode" json:"mode"`
	// OnConflict settles a key in both the v2 and the v3 store: "" refuses, v3 or v2 wins.
	OnConflict string `yaml:"onConflict" json:"onConflict,omitempty"`
	// IncludeHidden migrates hidden v2 keys (a path segment starting with _).
	IncludeHidden bool `yaml:"includeHidden" json:"includeHidden,omitempty"`
	// RevisionBump is added to green's revision (with the revisions marked compacted), so that
	// every resourceVersion a client has seen on blue is below green's.
	RevisionBump int64 `yaml:"revisionBump" json:"revisionBump"`
}

// Timeouts bound each step.
type Timeouts struct {
	Preflight      Duration `yaml:"preflight" json:"preflight"`
	Copy           Duration `yaml:"copy" json:"copy"`
	Migrate        Duration `yaml:"migrate" json:"migrate"`
	GreenEtcd      Duration `yaml:"greenEtcd" json:"greenEtcd"`
	GreenAPIServer Duration `yaml:"greenAPIServer" json:"greenAPIServer"`
	Verify         Duration `yaml:"verify" json:"verify"`
	Switch         Duration `yaml:"switch" json:"switch"`
}

// Duration reads "30s" style values.
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration like 30s or 5m", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D is the duration as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// DefaultRevisionBump is what Kubernetes' own etcd restore guidance uses.
const DefaultRevisionBump = 1_000_000_000

func (p *Plan) setDefaults() {
	if p.Proxy.AdminSocket == "" {
		p.Proxy.AdminSocket = "/run/kubefence/admin.sock"
	}
	if p.Proxy.WaitTimeout == 0 {
		p.Proxy.WaitTimeout = Duration(30 * time.Second)
	}
	if p.Migration.Mode == "" {
		p.Migration.Mode = "snapshot"
	}
	if p.Migration.RevisionBump == 0 {
		p.Migration.RevisionBump = DefaultRevisionBump
	}
	if p.Green.Etcd.ClusterToken == "" {
		p.Green.Etcd.ClusterToken = "kubefence-green"
	}
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	t := &p.Timeouts
	def(&t.Preflight, 30*time.Second)
	def(&t.Copy, 5*time.Minute)
	def(&t.Migrate, 10*time.Minute)
	def(&t.GreenEtcd, 2*time.Minute)
	def(&t.GreenAPIServer, 3*time.Minute)
	def(&t.Verify, 5*time.Minute)
	def(&t.Switch, 1*time.Minute)
}

// LoadPlan reads and validates a plan file; every problem is reported at once.
func LoadPlan(path string) (*Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read plan: %w", err)
	}
	p, err := ParsePlan(data)
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", path, err)
	}
	return p, nil
}

// ParsePlan parses and validates a plan document.
func ParsePlan(data []byte) (*Plan, error) {
	var p Plan
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty plan")
		}
		return nil, errors.New(strings.TrimPrefix(strings.ReplaceAll(err.Error(), "yaml: unmarshal errors:\n  ", ""), "yaml: "))
	}
	p.setDefaults()
	if err := errors.Join(p.validate()...); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	p.hash = hex.EncodeToString(sum[:8])
	return &p, nil
}

func (p *Plan) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.APIVersion != PlanAPIVersion || p.Kind != PlanKind {
		bad("apiVersion/kind %q/%q: want %s/%s", p.APIVersion, p.Kind, PlanAPIVersion, PlanKind)
	}
	if p.StateDir == "" {
		bad("stateDir is required: the journal, the snapshot and green's logs go there")
	}
	checkURL := func(field, u string) {
		if u == "" {
			bad("%s is required", field)
			return
		}
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "https" && pu.Scheme != "http") || pu.Host == "" {
			bad("%s %q: want a URL like https://10.0.0.1:6443", field, u)
		}
	}
	checkFile := func(field, f string, required bool) {
		if f == "" {
			if required {
				bad("%s is required", field)
			}
			return
		}
		if _, err := os.Stat(f); err != nil {
			bad("%s: %v", field, err)
		}
	}
	checkURL("blue.apiserver.url", p.Blue.APIServer.URL)
	checkFile("blue.apiserver.kubeconfig", p.Blue.APIServer.Kubeconfig, true)
	if len(p.Blue.Etcd.Endpoints) == 0 {
		bad("blue.etcd.endpoints is required (the copy is a snapshot through etcd's maintenance API)")
	}
	for i, e := range p.Blue.Etcd.Endpoints {
		checkURL(fmt.Sprintf("blue.etcd.endpoints[%d]", i), e)
	}
	checkFile("blue.etcd.caFile", p.Blue.Etcd.CAFile, false)
	checkFile("blue.etcd.certFile", p.Blue.Etcd.CertFile, false)
	checkFile("blue.etcd.keyFile", p.Blue.Etcd.KeyFile, false)
	if (p.Blue.Etcd.CertFile == "") != (p.Blue.Etcd.KeyFile == "") {
		bad("blue.etcd.certFile and keyFile go together")
	}
	g := p.Green.Etcd
	checkFile("green.etcd.binary", g.Binary, true)
	if g.Version == "" {
		bad("green.etcd.version is required (checked against the binary's --version)")
	} else if _, err := datadir.ParseVersion(g.Version); err != nil {
		bad("green.etcd.version: %v", err)
	}
	if n := len(g.Members); n != 1 && n != 3 {
		bad("green.etcd.members: %d given, want 1 or 3", n)
	}
	seen := map[string]bool{}
	for i, m := range g.Members {
		f := fmt.Sprintf("green.etcd.members[%d]", i)
		if m.Name == "" {
			bad("%s.name is required", f)
		}
		if m.DataDir == "" {
			bad("%s.dataDir is required", f)
		} else if !filepath.IsAbs(m.DataDir) {
			bad("%s.dataDir %q must be absolute", f, m.DataDir)
		}
		errs = append(errs, apartFromBlue(f+".dataDir", m.DataDir, p.Blue.Etcd)...)
		checkURL(f+".clientURL", m.ClientURL)
		checkURL(f+".peerURL", m.PeerURL)
		for _, v := range []string{m.Name, m.DataDir, m.ClientURL, m.PeerURL} {
			if v != "" && seen[v] {
				bad("%s: %q is used twice", f, v)
			}
			seen[v] = true
		}
	}
	a := p.Green.APIServer
	checkURL("green.apiserver.url", a.URL)
	checkFile("green.apiserver.kubeconfig", a.Kubeconfig, true)
	checkFile("green.apiserver.caFile", a.CAFile, false)
	switch {
	case len(a.Command) > 0 && a.StaticPod != nil:
		bad("green.apiserver: give command or staticPod, not both")
	case len(a.Command) > 0:
		checkFile("green.apiserver.command[0]", a.Command[0], true)
	case a.StaticPod != nil:
		checkFile("green.apiserver.staticPod.manifest", a.StaticPod.Manifest, true)
		if st, err := os.Stat(a.StaticPod.ManifestDir); err != nil || !st.IsDir() {
			bad("green.apiserver.staticPod.manifestDir %q is not a directory", a.StaticPod.ManifestDir)
		}
	default:
		bad("green.apiserver: give command (kubefence starts it) or staticPod (the kubelet starts it)")
	}
	if a.URL != "" && a.URL == p.Blue.APIServer.URL {
		bad("green.apiserver.url is blue's URL")
	}
	switch p.Migration.Mode {
	case "snapshot":
	case "v2-to-v3", "auto":
		if d := p.Blue.Etcd.DataDir; d != "" {
			if st, err := os.Stat(filepath.Join(d, "member")); err != nil || !st.IsDir() {
				bad("blue.etcd.dataDir %s is not an etcd member data dir (no member/ directory)", d)
			}
		} else if p.Migration.Mode == "v2-to-v3" {
			bad("migration.mode v2-to-v3 needs blue.etcd.dataDir: a member data dir on this host (its v2 store is not reachable through the v3 API)")
		}
		switch p.Migration.OnConflict {
		case "", "v2", "v3":
		default:
			bad("migration.onConflict %q: use v2 or v3 (or leave it out to refuse conflicts)", p.Migration.OnConflict)
		}
	default:
		bad("migration.mode %q: use snapshot, v2-to-v3 or auto", p.Migration.Mode)
	}
	if p.Migration.RevisionBump < 0 {
		bad("migration.revisionBump must not be negative")
	}
	return errs
}

// hostPort returns the host:port of a URL (with the scheme's default port).
func hostPort(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// apartFromBlue refuses a green data dir that is, lies inside or holds blue's member data dir
// or WAL dir (symlinks resolved): the cutover would write into blue's member.
func apartFromBlue(field, dir string, blue BlueEtcd) []error {
	var errs []error
	for _, src := range []struct{ role, path string }{{"blue.etcd.dataDir", blue.DataDir}, {"blue.etcd.walDir", blue.WALDir}} {
		if dir == "" || src.path == "" {
			continue
		}
		if err := pathguard.CheckApart(field, dir, src.role, src.path); err != nil {
			errs = append(errs, fmt.Errorf("%w: give green a data dir of its own, outside blue's", err))
		}
	}
	return errs
}
