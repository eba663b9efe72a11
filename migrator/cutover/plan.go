// Package cutover moves a cluster from its current ("blue") etcd + kube-apiserver to a new
// ("green") pair behind the kubefence proxy: preflight → fence → copy → migrate → start green
// etcd → start green kube-apiserver → verify → switch → unfence. Each finished step is recorded
// in a journal before the next begins, so a crashed run resumes; a failure before the switch
// aborts back to blue.
package cutover

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kubefence/kubefence/internal/pathguard"
	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/internal/strictyaml"
	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/proxy/admin"
	"github.com/kubefence/kubefence/proxy/backendurl"
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
	// Proxies lists every proxy in front of blue when there are several (an HA control plane):
	// each step that changes a proxy changes all of them, or the cutover goes back to blue.
	// Without it, proxy.adminSocket names the one proxy.
	Proxies   []ProxyRef `yaml:"proxies" json:"proxies,omitempty"`
	Migration Migration  `yaml:"migration" json:"migration"`
	// Preflight tunes the preflight's search for writers around the proxies (bypass.go).
	Preflight Preflight `yaml:"preflight" json:"preflight"`
	// Bake keeps a way back after the switch (bake.go): blue follows green until
	// `kubefence cutover finish` or `kubefence cutover rollback`.
	Bake     Bake     `yaml:"bake" json:"bake"`
	Timeouts Timeouts `yaml:"timeouts" json:"timeouts"`

	// hash identifies the plan's content in the journal.
	hash string
}

// ProxySpec says how to reach the kubefence proxy in front of blue.
type ProxySpec struct {
	AdminSocket string `yaml:"adminSocket" json:"adminSocket"`
	// WaitTimeout bounds the fence barrier.
	WaitTimeout Duration `yaml:"waitTimeout" json:"waitTimeout"`
	Reason      string   `yaml:"reason" json:"reason"`
	// FenceMode is what the proxy does with a write during the window: "refuse" (429, the
	// default) or "hold" (keep it until writes reopen, then send it to green; refused after the
	// proxy's --hold-timeout).
	FenceMode string `yaml:"fenceMode" json:"fenceMode"`
}

// APIServerRef is how the cutover reads an apiserver directly (not through the proxy).
type APIServerRef struct {
	URL        string `yaml:"url" json:"url"`
	Kubeconfig string `yaml:"kubeconfig" json:"kubeconfig"`
	// CAFile verifies the serving certificate when the proxy is switched to it (default: the
	// proxy keeps its current CA).
	CAFile string `yaml:"caFile" json:"caFile"`
	// EtcdUser is the etcd user this apiserver is (the CN of its etcd client certificate). For
	// green, in migration mode replicate, it may only read green etcd until the switch; for
	// blue, with bake, it may only read blue etcd from the switch until a rollback.
	EtcdUser string `yaml:"etcdUser" json:"etcdUser,omitempty"`
}

// EtcdClientSpec is how to reach an etcd cluster.
type EtcdClientSpec = datadir.ConnSpec

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
	// Learner: the member is not restored from the snapshot; it joins green empty as a learner
	// once the restored members serve, gets the data by raft, and is promoted when it has caught
	// up (learners.go). Members on other hosts join this way.
	Learner bool `yaml:"learner" json:"learner,omitempty"`
	// External (a learner only): its host starts it (its kubelet, or the operator with the
	// command the cutover prints), not kubefence; the cutover adds it and waits for it.
	External bool `yaml:"external" json:"external,omitempty"`
}

// GreenEtcd is the new etcd: its binary, version and members.
type GreenEtcd struct {
	Binary       string        `yaml:"binary" json:"binary"`
	Version      string        `yaml:"version" json:"version"`
	ClusterToken string        `yaml:"clusterToken" json:"clusterToken"`
	Members      []GreenMember `yaml:"members" json:"members"`
	ExtraArgs    []string      `yaml:"extraArgs" json:"extraArgs,omitempty"`
	// TLS is required unless Insecure: green etcd serves TLS with client-certificate auth.
	TLS      *GreenEtcdTLS `yaml:"tls" json:"tls,omitempty"`
	Insecure bool          `yaml:"insecure" json:"insecure,omitempty"`
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
	// APIServers are green's further apiservers (an HA control plane: one per node, each
	// behind its node's proxy, proxies[].greenURL). Each has the same etcd user as
	// green.apiserver, so the write gate holds them all. With a command kubefence starts it
	// here; without one its host starts it (its kubelet, or the operator) and the cutover waits
	// for its /readyz. Static pods are for green.apiserver only (this host's kubelet).
	APIServers []GreenAPIServer `yaml:"apiservers" json:"apiservers,omitempty"`
}

// Migration says how green's data is built from blue's.
type Migration struct {
	// Mode: snapshot (v3 data: snapshot restore), replicate (v3 data: snapshot restore without a
	// revision bump, then live replication of blue into green until the window; replicate.go),
	// v2-to-v3 (a member's v2 store migrated along
	// with the v3 snapshot, needs blue.etcd.dataDir), or auto, the default: without
	// blue.etcd.dataDir (v3 data) replicate when green etcd has TLS, snapshot otherwise; with it,
	// v2-to-v3 when that member holds v2 user content, snapshot otherwise.
	Mode string `yaml:"mode" json:"mode"`
	// OnConflict settles a key in both the v2 and the v3 store: "" refuses, v3 or v2 wins.
	OnConflict string `yaml:"onConflict" json:"onConflict,omitempty"`
	// IncludeHidden migrates hidden v2 keys (a path segment starting with _).
	IncludeHidden bool `yaml:"includeHidden" json:"includeHidden,omitempty"`
	// RevisionBump is added to green's revision (with the revisions marked compacted), so that
	// every resourceVersion a client has seen on blue is below green's.
	RevisionBump int64 `yaml:"revisionBump" json:"revisionBump"`
}

// Preflight is how the preflight looks for writers around the proxies.
type Preflight struct {
	// BypassWatch is how long blue etcd's writes are watched and compared with the writes the
	// proxies forwarded (default 15s).
	BypassWatch Duration `yaml:"bypassWatch" json:"bypassWatch"`
	// AllowBypass lets the cutover go on although writes went around the proxies or the
	// kubernetes Service's endpoints are not proxies (the preflight still reports them).
	AllowBypass bool `yaml:"allowBypass" json:"allowBypass,omitempty"`
}

// Bake is the plan's way back (docs/plan.md, docs/rollback.md).
type Bake struct {
	// Enabled: after the unfence, blue follows green (every green revision applied to blue as
	// one txn) and blue's apiserver may only read blue etcd, until the operator runs
	// `kubefence cutover finish` or `kubefence cutover rollback`. Needs mode replicate, blue
	// etcd with TLS client certificates (kubefence's own as blue.etcd.certFile) and
	// blue.apiserver.etcdUser.
	Enabled bool `yaml:"enabled" json:"enabled,omitempty"`
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
	Unfence        Duration `yaml:"unfence" json:"unfence"`
	// Replicate bounds green catching up with blue (mode replicate).
	Replicate Duration `yaml:"replicate" json:"replicate"`
	// Window bounds fence on → the switch in mode replicate: a drain not done inside it unfences
	// blue and aborts.
	Window Duration `yaml:"window" json:"window"`
}

// Duration reads "30s" style values.
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration like 30s or 5m", n.Line, n.Value)
	}
	if v < 0 { // every one is a bound or a period: a step would start past its deadline
		return fmt.Errorf("line %d: %q is negative: give a duration like 30s or 5m, or leave it out for the default", n.Line, n.Value)
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

// canonicalURL is raw as a proxy keeps a backend's URL (backendurl.Parse: the scheme and host
// in lower case, no trailing slash), or raw when it is not a backend's URL (the plan's checks
// say why).
func canonicalURL(raw string) string {
	u, err := backendurl.Parse(raw)
	if err != nil {
		return raw
	}
	return u.String()
}

func (p *Plan) setDefaults() {
	// The apiserver URLs as a proxy keeps them (scheme and host in lower case), so
	// that the cutover's comparisons and expectations match what the proxies report.
	for _, u := range []*string{&p.Blue.APIServer.URL, &p.Green.APIServer.URL} {
		*u = canonicalURL(*u)
	}
	for i := range p.Green.APIServers {
		p.Green.APIServers[i].URL = canonicalURL(p.Green.APIServers[i].URL)
	}
	for i := range p.Proxies {
		pr := &p.Proxies[i]
		pr.BlueURL, pr.GreenURL = canonicalURL(pr.BlueURL), canonicalURL(pr.GreenURL)
	}
	if p.Proxy.AdminSocket == "" {
		p.Proxy.AdminSocket = "/run/kubefence/admin.sock"
	}
	if p.Proxy.WaitTimeout == 0 {
		p.Proxy.WaitTimeout = Duration(30 * time.Second)
	}
	if p.Migration.Mode == "" {
		p.Migration.Mode = "auto"
	}
	if p.Proxy.FenceMode == "" {
		// Hold is what makes a sub-second window invisible; a window of seconds (the fenced
		// copy) would hold writes past their clients' timeouts, so those refuse.
		p.Proxy.FenceMode = admin.ModeRefuse
		if p.Replicating() {
			p.Proxy.FenceMode = admin.ModeHold
		}
	}
	if p.Migration.RevisionBump == 0 {
		p.Migration.RevisionBump = DefaultRevisionBump
	}
	p.Green.Etcd.TLS.setDefaults()
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
	def(&t.Unfence, 1*time.Minute)
	def(&t.Replicate, 10*time.Minute)
	def(&t.Window, 5*time.Second)
	def(&p.Preflight.BypassWatch, 15*time.Second)
	if p.Green.APIServer.EtcdUser == "" {
		p.Green.APIServer.EtcdUser = DefaultGreenEtcdUser
	}
}

// etcdRootUser is etcd's user "root": auth checks no permission of its.
const etcdRootUser = "root"

// DefaultGreenEtcdUser is the CN of kubeadm's apiserver-etcd-client certificate.
const DefaultGreenEtcdUser = "kube-apiserver-etcd-client"

// Replicating says whether the cutover replicates: migration.mode replicate, or auto when
// there is no blue member data dir to look for v2 content in (v3 data) and green etcd speaks
// TLS (the write gate on green's apiserver is etcd auth on its client certificate).
func (p *Plan) Replicating() bool {
	switch p.Migration.Mode {
	case ModeReplicate:
		return true
	case "auto":
		return p.Blue.Etcd.DataDir == "" && !p.Green.Etcd.Insecure && p.Green.Etcd.TLS != nil
	}
	return false
}

// ModeReplicate is migration.mode replicate.
const ModeReplicate = "replicate"

// revisionBump is what the restore adds to green's revision: none when replicating (green
// must be at blue's revisions exactly).
func (p *Plan) revisionBump() int64 {
	if p.Replicating() {
		return 0
	}
	return p.Migration.RevisionBump
}

// LoadPlan reads a plan file and checks its shape (ParsePlan) and the files it names
// (CheckFiles); every problem is reported at once.
func LoadPlan(path string) (*Plan, error) {
	p, err := ReadPlan(path)
	if err != nil {
		return nil, err
	}
	if err := p.CheckFiles(); err != nil {
		return nil, fmt.Errorf("plan %s: %w", path, err)
	}
	return p, nil
}

// ReadPlan reads and parses a plan file, checking its shape but not the files it names: for
// the commands that must work when some are gone (abort, cleanup, status), which need the
// journal and the proxies, and report a file they do use when they use it.
func ReadPlan(path string) (*Plan, error) {
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

// ParsePlan parses a plan document and checks its shape: required fields, URLs, versions,
// member names and the choice of modes. It does no I/O: the files and directories the plan
// names are checked by CheckFiles.
func ParsePlan(data []byte) (*Plan, error) {
	var p Plan
	if err := strictyaml.Decode(data, &p); err != nil {
		if errors.Is(err, strictyaml.ErrEmpty) {
			return nil, errors.New("empty plan")
		}
		return nil, err
	}
	p.setDefaults()
	if err := errors.Join(p.validate()...); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	p.hash = hex.EncodeToString(sum[:8])
	return &p, nil
}

// problems collects a check's errors.
type problems []error

func (ps *problems) add(format string, args ...any) { *ps = append(*ps, fmt.Errorf(format, args...)) }

// bindURL is url for a URL etcd listens on: etcd refuses to start unless its host is an IP
// (or localhost), it has a port, and no path.
func (ps *problems) bindURL(field, u string) {
	n := len(*ps)
	if ps.url(field, u); len(*ps) > n {
		return
	}
	pu, _ := url.Parse(u)
	host, port, err := net.SplitHostPort(pu.Host)
	if err != nil || port == "" || (host != "localhost" && net.ParseIP(host) == nil) || (pu.Path != "" && pu.Path != "/") {
		ps.add("%s %q: etcd listens on it, so give an IP address (or localhost) and a port, without a path, like https://10.0.0.1:2379", field, u)
	}
}

// url refuses an empty or non-http(s) URL.
func (ps *problems) url(field, u string) {
	if u == "" {
		ps.add("%s is required", field)
		return
	}
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "https" && pu.Scheme != "http") || pu.Host == "" {
		ps.add("%s %q: want a URL like https://10.0.0.1:6443", field, u)
	}
}

// required refuses an empty value.
func (ps *problems) required(field, v string) {
	if v == "" {
		ps.add("%s is required", field)
	}
}

// validate checks the plan's shape; it touches no file.
func (p *Plan) validate() []error {
	var ps problems
	if p.APIVersion != PlanAPIVersion || p.Kind != PlanKind {
		ps.add("apiVersion/kind %q/%q: want %s/%s", p.APIVersion, p.Kind, PlanAPIVersion, PlanKind)
	}
	switch {
	case p.StateDir == "":
		ps.add("stateDir is required: the journal, the snapshot and green's logs go there")
	case !filepath.IsAbs(p.StateDir):
		ps.add("stateDir %q must be absolute: the run's lock and journal are found through it, whatever directory kubefence runs in", p.StateDir)
	}
	if m := p.Proxy.FenceMode; m != admin.ModeRefuse && m != admin.ModeHold {
		ps.add("proxy.fenceMode %q: want %s or %s", m, admin.ModeRefuse, admin.ModeHold)
	}
	p.validateProxies(&ps)
	p.validateBlue(&ps)
	p.validateGreenEtcd(&ps)
	p.validateGreenTLS(&ps)
	p.validateGreenAPIServer(&ps)
	p.validateMigration(&ps)
	p.validateBake(&ps)
	if w, pf := p.Preflight.BypassWatch.D(), p.Timeouts.Preflight.D(); w < 0 || pf < w+10*time.Second {
		ps.add("preflight.bypassWatch %s: it must be positive and at least 10s below timeouts.preflight (%s), which bounds the whole preflight", w, pf)
	}
	return ps
}

func (p *Plan) validateBlue(ps *problems) {
	ps.url("blue.apiserver.url", p.Blue.APIServer.URL)
	ps.required("blue.apiserver.kubeconfig", p.Blue.APIServer.Kubeconfig)
	if len(p.Blue.Etcd.Endpoints) == 0 {
		ps.add("blue.etcd.endpoints is required (the copy is a snapshot through etcd's maintenance API)")
	}
	for i, e := range p.Blue.Etcd.Endpoints {
		ps.url(fmt.Sprintf("blue.etcd.endpoints[%d]", i), e)
	}
	if (p.Blue.Etcd.CertFile == "") != (p.Blue.Etcd.KeyFile == "") {
		ps.add("blue.etcd.certFile and keyFile go together")
	}
}

func (p *Plan) validateGreenEtcd(ps *problems) {
	g := p.Green.Etcd
	ps.required("green.etcd.binary", g.Binary)
	if g.Version == "" {
		ps.add("green.etcd.version is required (checked against the binary's --version)")
	} else if _, err := datadir.ParseVersion(g.Version); err != nil {
		ps.add("green.etcd.version: %v", err)
	}
	if n := len(g.Members); n != 1 && n != 3 {
		ps.add("green.etcd.members: %d given, want 1 or 3", n)
	}
	seen := map[string]bool{}
	addrs := map[string]string{} // host:port of what this host binds -> the field naming it
	if a := p.Green.APIServer; len(a.Command) > 0 || a.StaticPod != nil {
		ps.distinctAddrs(addrs, map[string]string{"green.apiserver.url": a.URL})
	}
	for i, m := range g.Members {
		f := fmt.Sprintf("green.etcd.members[%d]", i)
		ps.required(f+".name", m.Name)
		if m.DataDir == "" {
			ps.add("%s.dataDir is required", f)
		} else if !filepath.IsAbs(m.DataDir) {
			ps.add("%s.dataDir %q must be absolute", f, m.DataDir)
		}
		if m.External { // its host binds them
			ps.url(f+".clientURL", m.ClientURL)
			ps.url(f+".peerURL", m.PeerURL)
		} else {
			ps.bindURL(f+".clientURL", m.ClientURL)
			ps.bindURL(f+".peerURL", m.PeerURL)
			if m.MetricsURL != "" {
				ps.bindURL(f+".metricsURL", m.MetricsURL)
			}
		}
		switch {
		case m.External && !m.Learner:
			ps.add("%s.external needs learner: true (a member on another host joins as a learner; only this host's are restored)", f)
		case i == 0 && m.Learner:
			ps.add("%s: the first member is restored from the snapshot; learners join it (learner: true on a later member)", f)
		}
		if i > 0 && !m.Learner && g.Members[i-1].Learner {
			ps.add("%s: restored members come before the learners (a learner starts with the members listed before it as its initial cluster)", f)
		}
		unique := []string{m.Name, m.ClientURL, m.PeerURL, m.MetricsURL}
		if !m.External { // an external member's data dir is on its own host
			unique = append(unique, m.DataDir)
			ps.distinctAddrs(addrs, map[string]string{f + ".clientURL": m.ClientURL, f + ".peerURL": m.PeerURL, f + ".metricsURL": m.MetricsURL})
		}
		for _, v := range unique {
			if v != "" && seen[v] {
				ps.add("%s: %q is used twice", f, v)
			}
			seen[v] = true
		}
	}
}

func (p *Plan) validateGreenAPIServer(ps *problems) {
	a := p.Green.APIServer
	ps.url("green.apiserver.url", a.URL)
	ps.required("green.apiserver.kubeconfig", a.Kubeconfig)
	switch {
	case len(a.Command) > 0 && a.StaticPod != nil:
		ps.add("green.apiserver: give command or staticPod, not both")
	case len(a.Command) > 0:
		ps.required("green.apiserver.command[0]", a.Command[0])
	case a.StaticPod != nil:
		ps.required("green.apiserver.staticPod.manifest", a.StaticPod.Manifest)
		ps.required("green.apiserver.staticPod.manifestDir", a.StaticPod.ManifestDir)
	default:
		ps.add("green.apiserver: give command (kubefence starts it) or staticPod (the kubelet starts it)")
	}
	if a.URL != "" && sameURL(a.URL) == sameURL(p.Blue.APIServer.URL) {
		ps.add("green.apiserver.url is blue's URL")
	}
	if p.Replicating() && a.EtcdUser == etcdRootUser {
		ps.add("green.apiserver.etcdUser is etcd's root user, whom no role binds: the write gate could not keep green's apiserver from writing before the switch; give its etcd client certificate a CN of its own (kubeadm: kube-apiserver-etcd-client)")
	}
	seen := map[string]bool{sameURL(a.URL): true, sameURL(p.Blue.APIServer.URL): true}
	for i, x := range p.Green.APIServers {
		f := fmt.Sprintf("green.apiservers[%d]", i)
		ps.url(f+".url", x.URL)
		ps.required(f+".kubeconfig", x.Kubeconfig)
		if seen[sameURL(x.URL)] {
			ps.add("%s.url %q is used twice (or is blue's)", f, x.URL)
		}
		seen[sameURL(x.URL)] = true
		if x.StaticPod != nil {
			ps.add("%s.staticPod: only green.apiserver may be a static pod (this host's kubelet); give a command, or none when its host starts it", f)
		}
		if x.EtcdUser != "" && x.EtcdUser != a.EtcdUser {
			ps.add("%s.etcdUser %q is not green.apiserver.etcdUser %q: every green apiserver must be the one etcd user the write gate holds", f, x.EtcdUser, a.EtcdUser)
		}
		if x.CAFile != "" && x.CAFile != a.CAFile {
			ps.add("%s.caFile: the proxies verify every green apiserver with green.apiserver.caFile; leave it out (one CA for all)", f)
		}
	}
}

// sameURL is a URL as the proxies report it: without a trailing slash.
func sameURL(u string) string { return strings.TrimSuffix(u, "/") }

// greenAPIServers are green.apiserver and green.apiservers.
func (p *Plan) greenAPIServers() []GreenAPIServer {
	return append([]GreenAPIServer{p.Green.APIServer}, p.Green.APIServers...)
}

func (p *Plan) validateMigration(ps *problems) {
	switch p.Migration.Mode {
	case "snapshot":
	case ModeReplicate:
		if p.Green.Etcd.Insecure || p.Green.Etcd.TLS == nil {
			ps.add("migration.mode replicate needs green.etcd.tls (not insecure): green's apiserver is kept from writing by etcd auth on its client certificate")
		}
	case "v2-to-v3", "auto":
		if p.Blue.Etcd.DataDir == "" && p.Migration.Mode == "v2-to-v3" {
			ps.add("migration.mode v2-to-v3 needs blue.etcd.dataDir: a member data dir on this host (its v2 store is not reachable through the v3 API)")
		}
		switch p.Migration.OnConflict {
		case "", "v2", "v3":
		default:
			ps.add("migration.onConflict %q: use v2 or v3 (or leave it out to refuse conflicts)", p.Migration.OnConflict)
		}
	default:
		ps.add("migration.mode %q: use snapshot, replicate, v2-to-v3 or auto", p.Migration.Mode)
	}
	if p.Migration.RevisionBump < 0 {
		ps.add("migration.revisionBump must not be negative")
	}
}

func (p *Plan) validateBake(ps *problems) {
	if !p.Bake.Enabled {
		return
	}
	if !p.Replicating() {
		ps.add("bake.enabled needs a replicating cutover (migration.mode replicate, or auto with green etcd TLS and no blue.etcd.dataDir): blue can only follow green revision for revision")
	}
	switch p.Blue.APIServer.EtcdUser {
	case "":
		ps.add("bake.enabled needs blue.apiserver.etcdUser, the CN of blue apiserver's etcd client certificate (kubeadm: kube-apiserver-etcd-client): it may only read blue etcd while blue follows green")
	case etcdRootUser:
		ps.add("blue.apiserver.etcdUser is etcd's root user, whom no role binds: the gate could not keep blue's apiserver from writing while blue follows green; give its etcd client certificate a CN of its own (kubeadm: kube-apiserver-etcd-client)")
	}
	if p.Blue.Etcd.CertFile == "" || p.Blue.Etcd.CAFile == "" {
		ps.add("bake.enabled needs blue.etcd.caFile, certFile and keyFile: kubefence's own client certificate for blue etcd (kubeadm: healthcheck-client), which becomes blue etcd's root user")
	}
	for i, e := range p.Blue.Etcd.Endpoints {
		if u, err := url.Parse(e); err == nil && u.Scheme != "https" {
			ps.add("blue.etcd.endpoints[%d] %q: bake.enabled needs blue etcd with TLS and client-certificate auth (https): its apiserver is kept from writing by etcd auth on its certificate", i, e)
		}
	}
}

// planPath is a file or directory a plan names.
type planPath struct {
	field, path string
	// want is what must be there: a file (anything stat-able), a directory, an etcd member
	// data dir (a directory holding member/), or a program.
	want pathKind
}

type pathKind int

const (
	aFile pathKind = iota
	aDir
	aMemberDir
	aProgram // a regular file with an execute bit
)

// paths lists the files and directories the plan names and the cutover reads, set or not.
func (p *Plan) paths() []planPath {
	a := p.Green.APIServer
	ps := []planPath{
		{"blue.apiserver.kubeconfig", p.Blue.APIServer.Kubeconfig, aFile},
		{"blue.etcd.caFile", p.Blue.Etcd.CAFile, aFile},
		{"blue.etcd.certFile", p.Blue.Etcd.CertFile, aFile},
		{"blue.etcd.keyFile", p.Blue.Etcd.KeyFile, aFile},
		{"green.etcd.binary", p.Green.Etcd.Binary, aProgram},
		{"green.apiserver.kubeconfig", a.Kubeconfig, aFile},
		{"green.apiserver.caFile", a.CAFile, aFile},
	}
	if len(a.Command) > 0 {
		ps = append(ps, planPath{"green.apiserver.command[0]", a.Command[0], aProgram})
	}
	for i, pr := range p.Proxies {
		f := fmt.Sprintf("proxies[%d]", i)
		ps = append(ps, planPath{f + ".certFile", pr.CertFile, aFile}, planPath{f + ".keyFile", pr.KeyFile, aFile}, planPath{f + ".caFile", pr.CAFile, aFile})
	}
	if sp := a.StaticPod; sp != nil {
		ps = append(ps, planPath{"green.apiserver.staticPod.manifest", sp.Manifest, aFile}, planPath{"green.apiserver.staticPod.manifestDir", sp.ManifestDir, aDir})
	}
	for i, x := range p.Green.APIServers {
		f := fmt.Sprintf("green.apiservers[%d]", i)
		ps = append(ps, planPath{f + ".kubeconfig", x.Kubeconfig, aFile}, planPath{f + ".caFile", x.CAFile, aFile})
		if len(x.Command) > 0 {
			ps = append(ps, planPath{f + ".command[0]", x.Command[0], aProgram})
		}
	}
	if p.Migration.Mode != "snapshot" && !p.Replicating() {
		ps = append(ps, planPath{"blue.etcd.dataDir", p.Blue.Etcd.DataDir, aMemberDir}, planPath{"blue.etcd.walDir", p.Blue.Etcd.WALDir, aDir})
	}
	return append(ps, p.Green.Etcd.TLS.files()...)
}

// CheckFiles checks the files and directories the plan names: that they exist (the
// kubeconfigs, the etcd TLS files, the binaries, the static pod's manifest and directory,
// blue's member data dir), and that no green data dir is, lies inside or holds blue's member
// data dir or WAL dir, symlinks and bind mounts resolved (invariant source-untouched); every
// problem is reported at once. LoadPlan (the CLI) calls it, and the preflight again before
// anything changes.
func (p *Plan) CheckFiles() error {
	ps := checkPaths(p.paths())
	for i, m := range p.Green.Etcd.Members {
		if m.External { // an external member's data dir is on its own host
			continue
		}
		field := fmt.Sprintf("green.etcd.members[%d].dataDir", i)
		ps = append(ps, apartFromBlue(field, m.DataDir, p.Blue.Etcd)...)
		ps = append(ps, insideEtcdDataDir(field, m.DataDir))
		for j, o := range p.Green.Etcd.Members[:i] {
			if !o.External && m.DataDir != "" && o.DataDir != "" {
				if err := pathguard.CheckApart(field, m.DataDir, fmt.Sprintf("green.etcd.members[%d].dataDir", j), o.DataDir); err != nil {
					ps = append(ps, fmt.Errorf("%w: two green members would run on one data dir; give each its own", err))
				}
			}
		}
	}
	return errors.Join(ps...)
}

// insideEtcdDataDir refuses a data dir under an etcd member's data dir (a directory holding
// member/wal or member/snap), blue's when the plan does not name it: removing that member (after
// the cutover, kubeadm reset) would remove green.
func insideEtcdDataDir(field, dir string) error {
	if dir == "" {
		return nil
	}
	for d := filepath.Dir(pathguard.Resolve(dir)); d != filepath.Dir(d); d = filepath.Dir(d) {
		for _, sub := range []string{"member/wal", "member/snap"} {
			if st, err := os.Stat(filepath.Join(d, sub)); err == nil && st.IsDir() {
				return fmt.Errorf("%s %s lies inside an etcd data dir, %s: removing that member would remove green; give green a data dir outside it", field, dir, d)
			}
		}
	}
	return nil
}

// CheckFilesAfterSwitch is CheckFiles for what is left from the switch on (the unfence, the
// bake, a rollback, a finish): the files that only build and start green (the programs, the
// static pod, blue's member data dir, green etcd's serving and peer certificates) are read no
// more, so one gone since keeps nobody fenced, and the plan need not be edited (which a resume
// refuses).
func (p *Plan) CheckFilesAfterSwitch() error {
	return errors.Join(checkPaths(slices.DeleteFunc(p.paths(), startsGreen))...)
}

// CheckFilesToGoOn checks the files that what is left of the cutover journaled in the plan's
// state dir needs: CheckFilesAfterSwitch once its switch is journaled (or it bakes, or rolls
// back), CheckFiles before, or without a journal to read.
func (p *Plan) CheckFilesToGoOn() error {
	// The journal says which files; LoadJournal reads it only from a state dir no other user
	// controls (a FIFO planted as journal.json would block the read for ever).
	j, err := LoadJournal(p.StateDir)
	if isUntrustedStateDir(err) {
		return err
	}
	if err == nil && (j.done(StepSwitch) || j.State == StateBaking || j.State == StateRollingBack) {
		return p.CheckFilesAfterSwitch()
	}
	return p.CheckFiles()
}

// startsGreen says whether only building and starting green reads f.
func startsGreen(f planPath) bool {
	switch {
	case f.want == aProgram, f.want == aMemberDir, f.field == "blue.etcd.walDir":
		return true
	case strings.HasPrefix(f.field, "green.apiserver.staticPod."):
		return true
	}
	for _, tls := range []string{"green.etcd.tls.server", "green.etcd.tls.peer"} {
		if strings.HasPrefix(f.field, tls) {
			return true
		}
	}
	return false
}

// checkPaths checks that each path is there as it should be.
func checkPaths(paths []planPath) problems {
	var ps problems
	for _, f := range paths {
		if f.path == "" {
			continue
		}
		st, err := os.Stat(f.path)
		switch {
		case f.want == aFile && err != nil:
			ps.add("%s: %v", f.field, err)
		case f.want == aDir && (err != nil || !st.IsDir()):
			ps.add("%s %q is not a directory", f.field, f.path)
		case f.want == aProgram && err != nil:
			ps.add("%s: %v", f.field, err)
		case f.want == aProgram && (!st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0):
			ps.add("%s %q is not executable (mode %v): give the program's path", f.field, f.path, st.Mode())
		case f.want == aMemberDir:
			if st, err := os.Stat(filepath.Join(f.path, "member")); err != nil || !st.IsDir() {
				ps.add("%s %s is not an etcd member data dir (no member/ directory)", f.field, f.path)
			}
		}
	}
	return ps
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

// distinctAddrs adds a problem for each URL of urls (by field) whose address this host binds
// already for another field of addrs, however it is written (localhost or 127.0.0.1, a trailing
// slash), and records the others.
func (ps *problems) distinctAddrs(addrs map[string]string, urls map[string]string) {
	for _, field := range slices.Sorted(maps.Keys(urls)) {
		hp := proc.HostPort(urls[field])
		if urls[field] == "" || hp == "" {
			continue
		}
		if host, port, err := net.SplitHostPort(hp); err == nil && host == "localhost" {
			hp = net.JoinHostPort("127.0.0.1", port)
		}
		if other, ok := addrs[hp]; ok && other != field {
			ps.add("%s %q: the same address as %s (%s); each needs a port of its own", field, urls[field], other, hp)
			continue
		}
		addrs[hp] = field
	}
}
