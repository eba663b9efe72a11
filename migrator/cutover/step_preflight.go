package cutover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/v2v3"
	"github.com/kubefence/kubefence/proxy/admin"
)

// preflightStep checks everything the cutover needs before it changes anything: blue serves,
// the proxy is open on blue, green's binaries, ports, data dirs and disk space are ready.
type preflightStep struct{}

func (preflightStep) name() string                  { return StepPreflight }
func (preflightStep) timeout(p *Plan) time.Duration { return p.Timeouts.Preflight.D() }
func (preflightStep) pastNoReturn() bool            { return false }

func (preflightStep) describe(r *runner, _ bool) string {
	p := r.p
	return fmt.Sprintf("check blue apiserver %s /readyz and etcd %s, proxy %s open on blue and allowing the switch, green binaries and ports, disk space and a rename that replaces nothing (not NFS) in %s; watch blue etcd's writes for %s and compare them with the writes the proxies forwarded, check the kubernetes Service's endpoints are proxies (else refuse, unless allowBypass)",
		p.Blue.APIServer.URL, strings.Join(p.Blue.Etcd.Endpoints, ","), proxyNames(p), p.StateDir, p.Preflight.BypassWatch.D())
}

// CheckPlan is the preflight's checks of the plan alone (no cluster, no file read): what the
// parser takes but a cutover would fail on. A dry run makes them too.
func CheckPlan(p *Plan) error { return errors.Join(checkMemberNames(p), checkPlanForTheWindow(p)) }

func (preflightStep) run(ctx context.Context, r *runner) (string, error) {
	p := r.p
	errs := []error{p.CheckFiles(), CheckPlan(p), checkGreenPrograms(p), checkNoReplaceRenames(p)}
	if r.v2Possible() {
		// As the copy step refuses it, which in snapshot mode runs with writes fenced.
		errs = append(errs, runningMemberDir(p.Blue.Etcd.DataDir))
	}
	if err := readyz(ctx, p.Blue.APIServer.Kubeconfig); err != nil {
		errs = append(errs, fmt.Errorf("blue apiserver: %w", err))
	}
	blueDB, listsNote, err := r.checkBlueEtcd(ctx)
	identityNote, identityErr := checkGreenEtcdIdentity(p)
	systemdNote, systemdErr := r.systemdNote(ctx)
	errs = append(errs, err, systemdErr, r.checkProxyOnBlue(ctx), r.checkProxiesAllowSwitch(ctx), checkSwitchBackCA(ctx, p), checkGreenKubeconfig(ctx, p), checkGreenEtcdServers(ctx, p), identityErr, checkGreenTLS(p), checkBlueBakeCert(p), checkBlueTxnLimits(ctx, p), checkGreenQuota(p, blueDB))
	if err := datadir.CheckBinaryVersion(ctx, p.Green.Etcd.Binary, p.Green.Etcd.Version); err != nil {
		errs = append(errs, fmt.Errorf("green.etcd.binary is not etcd %s: %w", p.Green.Etcd.Version, err))
	}
	for _, m := range p.Green.Etcd.Members {
		if m.External {
			continue // on another host
		}
		urls := []string{m.ClientURL, m.PeerURL}
		if m.MetricsURL != "" {
			urls = append(urls, m.MetricsURL)
		}
		if err := proc.PortFree(urls...); err != nil {
			errs = append(errs, fmt.Errorf("green etcd %s: %w", m.Name, err))
		}
		if entries, err := readDirIfExists(m.DataDir); err != nil || len(entries) > 0 {
			errs = append(errs, fmt.Errorf("green etcd %s: data dir %s must be absent or empty", m.Name, m.DataDir))
		}
	}
	for i, a := range p.greenAPIServers() {
		if i == 0 || len(a.Command) > 0 { // green.apiserver here, a command or a static pod
			if err := proc.PortFree(a.URL); err != nil {
				errs = append(errs, fmt.Errorf("green apiserver %s: %w", a.URL, err))
			}
		}
	}
	if sp := p.Green.APIServer.StaticPod; sp != nil {
		errs = append(errs, manifestAbsent(sp), checkGreenManifest(ctx, p))
	}
	errs = append(errs, enoughSpaceTogether(p.spaceNeeds(blueDB), blueDB)...)
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	bypass, err := r.checkBypass(ctx)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("blue ready, etcd db %.1f MB%s; proxy open on blue; green etcd %s, ports free, space enough; %s%s%s", float64(blueDB)/1e6, listsNote, p.Green.Etcd.Version, bypass, identityNote, systemdNote), nil
}

// checkBlueEtcd checks every blue endpoint answers and they are exactly blue's members, and
// returns the largest db size and listsReachEtcd's note on their versions.
func (r *runner) checkBlueEtcd(ctx context.Context) (int64, string, error) {
	cli, err := datadir.NewClient(r.p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		return 0, "", fmt.Errorf("blue etcd: %w", err)
	}
	defer cli.Close()
	sts, err := datadir.ClusterStatus(ctx, cli, r.p.Blue.Etcd.Endpoints)
	if err != nil {
		return 0, "", fmt.Errorf("blue etcd: %w", err)
	}
	var blueDB int64
	for _, s := range sts {
		blueDB = max(blueDB, s.DBSize)
	}
	if _, err := datadir.CheckMembers(ctx, r.p.Blue.Etcd.EtcdClientSpec); err != nil {
		return blueDB, "", fmt.Errorf("blue.etcd.endpoints: %w", err)
	}
	return blueDB, listsReachEtcd(sts), nil
}

// listsReachEtcd notes a blue etcd member without the fixed watch progress requests of 3.4.31
// and 3.5.13, by the rule kube-apiserver applies to each of its etcd endpoints (a version it
// cannot parse counts as without): kube-apiserver then serves no consistent list from its watch
// cache and sends each to etcd, where a page of a big collection walks the index of all of it
// while writes wait. Blue's writes are then slower, and the fence's barrier (the writes blue is
// still answering) with them. "" when every member has the fix.
func listsReachEtcd(sts []datadir.MemberStatus) string {
	for _, s := range sts {
		v, err := version.ParseSemantic(s.Version)
		if err == nil && !v.LessThan(progressFixed34) && !(v.AtLeast(etcd35) && v.LessThan(progressFixed35)) {
			continue
		}
		return fmt.Sprintf(" (blue etcd %s predates the fixed watch progress requests of etcd 3.4.31 and 3.5.13: kube-apiserver sends it every consistent list, and lists of big collections slow its writes and the window; see the runbook)", s.Version)
	}
	return ""
}

// The etcd releases kube-apiserver checks its etcd endpoints against (listsReachEtcd).
var (
	progressFixed34 = version.MustParseSemantic("3.4.31")
	etcd35          = version.MustParseSemantic("3.5.0")
	progressFixed35 = version.MustParseSemantic("3.5.13")
)

// checkProxyOnBlue checks the proxy answers, open, with blue as its backend, and that the plan
// names each proxy once.
func (r *runner) checkProxyOnBlue(ctx context.Context) error {
	if err := r.group().namedOnce(ctx); err != nil {
		return err
	}
	st, err := r.adm.Status(ctx)
	switch {
	case err != nil:
		return err
	case checkAPILevel(st) != nil:
		return checkAPILevel(st)
	case st.Fenced:
		return fmt.Errorf("the proxy is already fenced (%s): a cutover starts from an open proxy", st.Reason)
	case st.Backend != strings.TrimSuffix(r.p.Blue.APIServer.URL, "/"):
		return fmt.Errorf("the proxy's backend is %s, not blue's %s", st.Backend, r.p.Blue.APIServer.URL)
	}
	r.j.BlueBackend = st.Backend
	return checkSwitchFitsDrain(r.p, st)
}

// checkSwitchFitsDrain refuses a timeouts.switch shorter than what the proxies' switch may take
// (st: their status, merged: the longest drain timeout): the step would end while a proxy still
// drains, switched, with writes fenced until an operator resumes.
func checkSwitchFitsDrain(p *Plan, st admin.Status) error {
	drain := time.Duration(st.DrainTimeout)
	if drain == 0 || switchBound(drain) <= p.Timeouts.Switch.D() {
		return nil
	}
	return fmt.Errorf("a proxy waits for its watches up to --drain-timeout %s before it answers a switch, %s with the rest, more than timeouts.switch (%s): raise timeouts.switch above %s, or lower the proxies' --drain-timeout", drain, switchBound(drain), p.Timeouts.Switch.D(), switchBound(drain))
}

// checkGreenKubeconfig refuses a green kubeconfig that reaches something other than green, for
// every green apiserver: verify reads green through it (the step waits for its /readyz), and
// pointed at blue (or at the proxy, still on blue) it would compare blue with blue and pass
// whatever green holds. Its server must not be blue's URL nor the server of blue's kubeconfig,
// and, green not being started yet, nothing may answer there (unless its own host starts it).
func checkGreenKubeconfig(ctx context.Context, p *Plan) error {
	var errs []error
	for i, a := range p.greenAPIServers() {
		field := "green.apiserver"
		if i > 0 {
			field = fmt.Sprintf("green.apiservers[%d]", i-1)
		}
		errs = append(errs, checkGreenKubeconfigOf(ctx, p, field, a, i == 0 || len(a.Command) > 0))
	}
	return errors.Join(errs...)
}

func checkGreenKubeconfigOf(ctx context.Context, p *Plan, field string, a GreenAPIServer, startedHere bool) error {
	green, err := restConfig(a.Kubeconfig)
	if err != nil {
		return fmt.Errorf("%s.kubeconfig: %w", field, err)
	}
	server := proc.HostPort(green.Host)
	fix := fmt.Sprintf("point %s.kubeconfig %s at that green apiserver (%s)", field, a.Kubeconfig, a.URL)
	if server == proc.HostPort(p.Blue.APIServer.URL) {
		return fmt.Errorf("%s.kubeconfig's server %s is blue's apiserver: verify would compare blue with blue; %s", field, green.Host, fix)
	}
	for i, pr := range p.Proxies {
		if pr.BlueURL != "" && server == proc.HostPort(pr.BlueURL) {
			return fmt.Errorf("%s.kubeconfig's server %s is proxies[%d].blueURL, a blue apiserver: %s", field, green.Host, i, fix)
		}
	}
	if blue, err := restConfig(p.Blue.APIServer.Kubeconfig); err == nil && proc.HostPort(blue.Host) == server {
		return fmt.Errorf("%s.kubeconfig's server %s is the server of blue.apiserver.kubeconfig: verify would compare blue with blue; %s", field, green.Host, fix)
	}
	if !startedHere {
		return nil // its host starts it, maybe already
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", server)
	if err != nil {
		return nil
	}
	c.Close()
	if server == proc.HostPort(a.URL) {
		// The kubeconfig is right; something holds green's address.
		return fmt.Errorf("something already answers at green's apiserver address %s (%s.url) before green is started: a green apiserver an earlier cutover or rehearsal left ('kubefence cutover cleanup --plan PLAN' stops it), or another process, which verify would read instead of the green this cutover starts: stop it first", a.URL, field)
	}
	return fmt.Errorf("%s.kubeconfig's server %s already answers before green is started: it reaches blue, the proxy or another apiserver, and verify would not be reading green; %s", field, green.Host, fix)
}

func readDirIfExists(dir string) ([]os.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	return entries, err
}

// spaceNeed is what the cutover writes in dir: need bytes.
type spaceNeed struct {
	dir  string
	need int64
}

// spaceNeeds is what the cutover writes, for a blue database of blueDB bytes: the snapshot in
// the state dir (and the member copy, when blue.etcd.dataDir names one: v2-to-v3), and a
// restored member beside each green data dir this host starts.
func (p *Plan) spaceNeeds(blueDB int64) []spaceNeed {
	state := blueDB
	if p.Blue.Etcd.DataDir != "" {
		state += blueDB
	}
	needs := []spaceNeed{{p.StateDir, state}}
	for _, m := range p.Green.Etcd.Members {
		if !m.External {
			needs = append(needs, spaceNeed{filepath.Dir(m.DataDir), blueDB})
		}
	}
	return needs
}

// enoughSpaceTogether checks free space per filesystem for the sum of what the cutover writes
// there, plus room on each (the WAL, compaction): the state dir and green's data dirs on one
// disk (kubeadm's /, with blue's own data) are not each counted as if alone.
func enoughSpaceTogether(needs []spaceNeed, room int64) []error {
	type onFS struct {
		dirs     []string
		existing string // of dirs[0]
		need     int64
	}
	byFS := map[uint64]*onFS{}
	var order []uint64
	var errs []error
	for _, n := range needs {
		dev, existing, err := filesystemOf(n.dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f := byFS[dev]
		if f == nil {
			f = &onFS{existing: existing, need: room}
			byFS[dev], order = f, append(order, dev)
		}
		f.dirs, f.need = append(f.dirs, n.dir), f.need+n.need
	}
	for _, dev := range order {
		f := byFS[dev]
		if err := enoughSpace(f.dirs[0], f.existing, f.need); err != nil {
			if len(f.dirs) > 1 {
				err = fmt.Errorf("%w, for %s together (one filesystem)", err, strings.Join(f.dirs, ", "))
			}
			errs = append(errs, err)
		}
	}
	return errs
}

// filesystemOf is dir's filesystem (its device) and the nearest of dir and its parents that
// exists, to ask about it.
func filesystemOf(dir string) (uint64, string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		var st syscall.Stat_t
		if err := syscall.Stat(d, &st); err == nil {
			return uint64(st.Dev), d, nil
		}
		if d == filepath.Dir(d) {
			return 0, "", fmt.Errorf("%s: cannot tell its filesystem", dir)
		}
	}
}

// enoughSpace refuses less than need bytes free for dir on the filesystem of existing (dir
// or the parent of it that exists).
func enoughSpace(dir, existing string, need int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(existing, &st); err != nil {
		return fmt.Errorf("%s: cannot tell free space: %w", dir, err)
	}
	if free := int64(st.Bavail) * st.Bsize; free < need {
		return fmt.Errorf("%s: %.1f MB free, need %.1f MB", dir, float64(free)/1e6, float64(need)/1e6)
	}
	return nil
}

// checkGreenEtcdServers refuses a green apiserver this host starts whose --etcd-servers name
// one of blue's etcd endpoints (a command or a manifest copied from blue's): it would serve
// blue's data, verify would compare blue with blue, and the switch would send every request
// to blue's etcd through it. One on a green member's host must be one of green's members'
// client URLs (however it is written): another (a typo) would keep green's apiserver from ever
// becoming ready; a host no member has (a load balancer in front of green) is not judged,
// unless it answers with blue's cluster ID (blue's etcd written another way: 127.0.0.1 for the
// host address kubeadm's etcd also listens on, localhost, a name). An apiserver its own host
// starts is that host's to check.
func checkGreenEtcdServers(ctx context.Context, p *Plan) error {
	isBlue := blueEtcdAt(ctx, p)
	blue := map[string]bool{}
	for _, e := range p.Blue.Etcd.Endpoints {
		blue[proc.HostPort(e)] = true
	}
	green, clients := newGreenEndpoints(p), []string{}
	for _, m := range p.Green.Etcd.Members {
		clients = append(clients, m.ClientURL)
	}
	started, errs := p.startedHere()
	for _, a := range started {
		field, args := a.field, a.args
		for _, s := range etcdOverrideServers(args) {
			if blue[proc.HostPort(s)] || !green.serves(s) && isBlue(s) {
				errs = append(errs, fmt.Errorf("%s's --etcd-servers-overrides names %s, blue's etcd: green's apiserver would write those resources to blue's etcd, before the switch (ungated) and after it; give it green's members, or an etcd of their own", field, s))
			}
		}
		for _, s := range etcdServers(args) {
			switch {
			case blue[proc.HostPort(s)]:
				errs = append(errs, fmt.Errorf("%s's --etcd-servers names %s, one of blue.etcd.endpoints: green's apiserver would serve blue's data; give it green's etcd members' client URLs", field, s))
			case !green.serves(s) && isBlue(s):
				errs = append(errs, fmt.Errorf("%s's --etcd-servers names %s, which answers with blue's cluster ID: blue's etcd written another way than in blue.etcd.endpoints; green's apiserver would serve blue's data. Give it green's etcd members' client URLs", field, s))
			case green.typo(s):
				errs = append(errs, fmt.Errorf("%s's --etcd-servers names %s, on a green member's host but none of green.etcd.members' clientURLs (%s): green's apiserver would never become ready; give it their scheme, host and port", field, s, strings.Join(clients, ", ")))
			}
		}
	}
	return errors.Join(errs...)
}

// startedAPIServer is a green apiserver this host starts: its field in the plan and its command
// line (its command, or its static pod's kube-apiserver container's).
type startedAPIServer struct {
	field string
	args  []string
	inPod bool // its paths are the container's, which may be mounted elsewhere on this host
}

// startedHere is each green apiserver this host starts, and why a manifest could not be read.
func (p *Plan) startedHere() ([]startedAPIServer, []error) {
	var out []startedAPIServer
	var errs []error
	for i, a := range p.greenAPIServers() {
		field := "green.apiserver"
		if i > 0 {
			field = fmt.Sprintf("green.apiservers[%d]", i-1)
		}
		args := a.Command
		if a.StaticPod != nil {
			var err error
			if args, err = manifestArgs(a.StaticPod.Manifest); err != nil {
				errs = append(errs, fmt.Errorf("%s.staticPod.manifest: %w", field, err))
				continue
			}
		}
		if len(args) > 0 {
			out = append(out, startedAPIServer{field, args, a.StaticPod != nil})
		}
	}
	return out, errs
}

// checkGreenEtcdIdentity refuses (mode replicate) a green apiserver this host starts whose etcd
// client certificate (--etcd-certfile) is not green.apiserver.etcdUser, the user the write gate
// keeps read-only until the switch: as another user it would write to green before the switch
// (kubefence's own: root; replication then stops on a mismatch) or never become ready (no such
// user: the cutover aborts after timeouts.greenAPIServer). A manifest that cannot be read is
// checkGreenEtcdServers' to report. The note names a certificate it could not look at (a path
// inside a static pod, not found on this host).
func checkGreenEtcdIdentity(p *Plan) (string, error) {
	if !p.Replicating() {
		return "", nil
	}
	started, _ := p.startedHere()
	var errs []error
	var unchecked []string
	for _, a := range started {
		file := flagValue(a.args, "--etcd-certfile")
		if file == "" {
			continue
		}
		cn, err := certCN(file)
		switch {
		case err != nil && a.inPod && errors.Is(err, fs.ErrNotExist):
			// A path inside the pod, mounted from elsewhere on this host: not judged, said.
			unchecked = append(unchecked, fmt.Sprintf("%s's --etcd-certfile %s", a.field, file))
		case err != nil:
			errs = append(errs, fmt.Errorf("%s's --etcd-certfile: %w", a.field, err))
		case cn != p.Green.APIServer.EtcdUser:
			errs = append(errs, fmt.Errorf("%s's --etcd-certfile %s has CN %q, not green.apiserver.etcdUser %q, whom the write gate keeps read-only until the switch: as %[3]q green's apiserver would write before it, or not be let in at all; give it a certificate with that CN (kubeadm's apiserver-etcd-client) or set etcdUser to its CN (not kubefence's own)", a.field, file, cn, p.Green.APIServer.EtcdUser))
		}
	}
	note := ""
	if len(unchecked) > 0 {
		note = fmt.Sprintf("; NOTE: %s not found on this host (a path inside the pod?): its CN, which must be green.apiserver.etcdUser %q, was not checked", strings.Join(unchecked, ", "), p.Green.APIServer.EtcdUser)
	}
	return note, errors.Join(errs...)
}

// endpointOf is an etcd URL's scheme and port, and its host with each address the host resolves
// to (localhost is 127.0.0.1 too), for comparing URLs written differently.
func endpointOf(raw string) (scheme, port string, hosts []string) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", nil
	}
	host, port, err := net.SplitHostPort(proc.HostPort(raw))
	if err != nil {
		return "", "", nil
	}
	return u.Scheme, port, append([]string{host}, hostIPs(context.Background(), host)...)
}

// greenEndpoints says whether an etcd URL names one of green's members (however it is written),
// and whether its host is a member's host at least.
type greenEndpoints struct{ keys, hosts map[string]bool }

func newGreenEndpoints(p *Plan) greenEndpoints {
	g := greenEndpoints{keys: map[string]bool{}, hosts: map[string]bool{}}
	for _, m := range p.Green.Etcd.Members {
		scheme, port, hosts := endpointOf(m.ClientURL)
		for _, h := range hosts {
			g.keys[scheme+"://"+net.JoinHostPort(h, port)] = true
			g.hosts[h] = true
		}
	}
	return g
}

// serves is true when a green member serves at raw (its scheme, a host address, its port).
func (g greenEndpoints) serves(raw string) bool {
	scheme, port, hosts := endpointOf(raw)
	for _, h := range hosts {
		if g.keys[scheme+"://"+net.JoinHostPort(h, port)] {
			return true
		}
	}
	return false
}

// blueEtcdAt returns whether an etcd URL answers, with blue.etcd's credentials, as blue's
// cluster (false when blue's cluster ID cannot be read, or the URL does not answer within a
// few seconds).
func blueEtcdAt(ctx context.Context, p *Plan) func(raw string) bool {
	clusterAt := func(endpoints ...string) uint64 {
		spec := p.Blue.Etcd.EtcdClientSpec
		spec.Endpoints = endpoints
		cli, err := newEtcdClient(spec)
		if err != nil {
			return 0
		}
		defer cli.Close()
		for _, e := range endpoints {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			resp, err := cli.Status(sctx, e)
			cancel()
			if err == nil {
				return resp.Header.ClusterId
			}
		}
		return 0
	}
	var blue uint64
	var read bool
	return func(raw string) bool {
		if !read {
			blue, read = clusterAt(p.Blue.Etcd.Endpoints...), true
		}
		return blue != 0 && clusterAt(raw) == blue
	}
}

// typo is true when raw's host is a green member's but no member serves there with raw's scheme
// and port (a wrong port, http for https). A host that is no member's (a load balancer in front
// of green) is not judged.
func (g greenEndpoints) typo(raw string) bool {
	if g.serves(raw) {
		return false
	}
	_, _, hosts := endpointOf(raw)
	return slices.ContainsFunc(hosts, func(h string) bool { return g.hosts[h] })
}

// etcdServers are the values of --etcd-servers in a command line ("--etcd-servers=a,b" or
// "--etcd-servers a,b", each time it is given), split at commas.
func etcdServers(args []string) []string {
	var out []string
	for _, v := range flagValues(args, "--etcd-servers") { // a list flag: every one counts
		out = append(out, strings.Split(v, ",")...)
	}
	return out
}

// etcdOverrideServers are the servers of --etcd-servers-overrides in args
// (group/resource#server;server, comma separated).
func etcdOverrideServers(args []string) []string {
	var out []string
	for _, v := range flagValues(args, "--etcd-servers-overrides") {
		for o := range strings.SplitSeq(v, ",") {
			if _, servers, ok := strings.Cut(o, "#"); ok {
				out = append(out, strings.Split(servers, ";")...)
			}
		}
	}
	return out
}

// manifestArgs is the command and arguments of a static pod manifest's kube-apiserver container
// (apiserverContainer), not a sidecar's.
func manifestArgs(path string) ([]string, error) {
	pod, err := readPod(path)
	if err != nil {
		return nil, err
	}
	c := apiserverContainer(pod)
	if c == nil {
		return nil, errors.New("no containers")
	}
	return append(append([]string{}, c.Command...), c.Args...), nil
}

// checkGreenQuota refuses a green whose etcd quota leaves too little room for blue's database
// (blueDB, the largest member's file; v2v3.PastQuotaShare, the rule the v2 migration warns by):
// green is restored from it at about its size and would refuse writes (NOSPACE) soon after.
func checkGreenQuota(p *Plan, blueDB int64) error {
	quota, set := greenQuota(p)
	if !v2v3.PastQuotaShare(blueDB, quota) { // negative: no quota
		return nil
	}
	source := "etcd's default, green.etcd.extraArgs sets none"
	if set {
		source = "from green.etcd.extraArgs"
	}
	return fmt.Errorf("green etcd's quota (--quota-backend-bytes, %s: %s) leaves too little room for blue's database of %s: green would refuse writes once restored from it; set --quota-backend-bytes in green.etcd.extraArgs at least as large as blue's and above %s, or defragment blue first", gibs(quota), source, gibs(blueDB), gibs(v2v3.QuotaFor(blueDB)))
}

// greenQuota is green etcd's --quota-backend-bytes (set: green.etcd.extraArgs gives it), else
// etcd's default (v2v3.DefaultQuota); negative for none.
func greenQuota(p *Plan) (quota int64, set bool) {
	quota = v2v3.DefaultQuota
	for _, f := range etcdFlags(etcdCommand(p, p.Green.Etcd.Members[0])) {
		if n, err := strconv.ParseInt(f.value, 10, 64); f.name == "quota-backend-bytes" && err == nil && n != 0 {
			quota, set = n, true
		}
	}
	return quota, set
}

// gibs is n bytes in GiB, one decimal.
func gibs(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }
