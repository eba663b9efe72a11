package cutover

import (
	"cmp"
	"errors"
	"fmt"
	"github.com/kubefence/kubefence/migrator/replicate"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kubefence/kubefence/internal/pathguard"
	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/proxy/admin"
)

// checkPlanForTheWindow refuses what the plan's parser takes but what would fail late, inside
// the window or past the point of no return. In the preflight, not the parser: a cutover in
// flight, whose abort, rollback or resume read the plan again, is never locked out by it.
func checkPlanForTheWindow(p *Plan) error {
	errs := []error{checkProxiesOnce(p), checkGreenExtraArgs(p), checkGreenCommands(p)}
	for i, m := range p.Green.Etcd.Members {
		for _, u := range []struct{ field, url string }{{"clientURL", m.ClientURL}, {"peerURL", m.PeerURL}, {"metricsURL", m.MetricsURL}} {
			if pu, err := url.Parse(u.url); err == nil && pu.Path != "" {
				errs = append(errs, fmt.Errorf("green.etcd.members[%d].%s %q must have no path (etcd refuses it when the member is restored or started): write %s://%s", i, u.field, u.url, pu.Scheme, pu.Host))
			}
		}
	}
	for _, d := range []string{p.Blue.Etcd.DataDir, p.Blue.Etcd.WALDir} {
		if d == "" {
			continue
		}
		if err := pathguard.CheckApart("stateDir", p.StateDir, "blue's etcd", d); err != nil {
			errs = append(errs, fmt.Errorf("%w: the state dir holds blue's snapshot and the journal; put it outside blue's data dirs", err))
		}
	}
	for field, f := range map[string]string{"green.apiserver.caFile": p.Green.APIServer.CAFile, "blue.apiserver.caFile": p.Blue.APIServer.CAFile} {
		if f != "" && !filepath.IsAbs(f) {
			errs = append(errs, fmt.Errorf("%s %q must be an absolute path: the proxies open it themselves (at the switch, or a switch back), from their own working directory, and on their own hosts", field, f))
		}
	}
	if sp := p.Green.APIServer.StaticPod; sp != nil && !filepath.IsAbs(sp.ManifestDir) {
		errs = append(errs, fmt.Errorf("green.apiserver.staticPod.manifestDir %q must be an absolute path (the kubelet's, e.g. /etc/kubernetes/manifests): an abort or a cleanup run from another directory would not find green's manifest there to remove it", sp.ManifestDir))
	}
	return errors.Join(errs...)
}

// checkProxiesOnce refuses a proxy named twice (a socket path, or an admin address, as written
// differently): fenced twice at once, its generation is then never what the switch expects.
func checkProxiesOnce(p *Plan) error {
	seen := map[string]int{}
	var errs []error
	for i, pr := range p.proxyRefs() {
		key := admin.ProxyKey(pr.AdminSocket, pr.AdminAddress)
		if j, ok := seen[key]; ok {
			errs = append(errs, fmt.Errorf("proxies[%d] and proxies[%d] are one proxy (%s) named twice: list each proxy once", j, i, pr.name()))
			continue
		}
		seen[key] = i
	}
	return errors.Join(errs...)
}

// checkGreenCommands refuses what green's processes would be started with and kubefence could
// not then find, check or stop: a program that execs another (proc.CheckNoExecWrapper) as
// green's etcd binary or a green apiserver's command. And a green apiserver command (one this
// host or its own host starts) without --endpoint-reconciler-type=none: once its writes are
// let through, green's apiserver would point the kubernetes Service at its own address instead
// of the proxies', and in-cluster clients would go around every proxy (a rollback's fence and
// gate would then leave them on a green that refuses their writes). A static pod manifest is
// checked as it is read (checkGreenManifest).
func checkGreenCommands(p *Plan) error {
	var errs []error
	if err := proc.CheckNoExecWrapper([]string{p.Green.Etcd.Binary}); err != nil {
		errs = append(errs, fmt.Errorf("green.etcd.binary: %w", err))
	}
	for i, a := range p.greenAPIServers() {
		field := "green.apiserver.command"
		if i > 0 {
			field = fmt.Sprintf("green.apiservers[%d].command", i-1)
		}
		if len(a.Command) == 0 {
			continue
		}
		if err := proc.CheckNoExecWrapper(a.Command); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
		if r := flagValue(a.Command[1:], "--endpoint-reconciler-type"); r != "none" {
			errs = append(errs, fmt.Errorf("%s gives --endpoint-reconciler-type=%s: once its writes are let through, green's apiserver would point the kubernetes Service at its own address instead of the proxies', and in-cluster clients would go around them; add --endpoint-reconciler-type=none", field, cmp.Or(r, "lease (the default)")))
		}
	}
	return errors.Join(errs...)
}

// checkGreenPrograms refuses, in the preflight, a script as the program of green's processes
// this host starts (proc.CheckNotScript, as proc.Daemon refuses it), which it would otherwise
// find only at start-green-etcd or -apiserver, after the snapshot, the restore and replication
// (in snapshot mode fenced); checkGreenCommands refuses the other thing proc.Daemon refuses, a
// program that execs another. Not in CheckPlan: it reads the programs' files, which only the
// host that runs the cutover has.
func checkGreenPrograms(p *Plan) error {
	var errs []error
	if slices.ContainsFunc(p.Green.Etcd.Members, func(m GreenMember) bool { return !m.External }) {
		if err := proc.CheckNotScript(p.Green.Etcd.Binary); err != nil {
			errs = append(errs, fmt.Errorf("green.etcd.binary: %w", err))
		}
	}
	for i, a := range p.greenAPIServers() {
		if len(a.Command) == 0 {
			continue
		}
		field := "green.apiserver.command"
		if i > 0 {
			field = fmt.Sprintf("green.apiservers[%d].command", i-1)
		}
		if err := proc.CheckNotScript(a.Command[0]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
	}
	return errors.Join(errs...)
}

// checkGreenExtraArgs refuses a green.etcd.extraArgs flag that kubefence sets itself: they come
// last on the command line, where etcd takes the last value, and would undo what the cutover
// set and checked (the data dir, the URLs, TLS). --max-request-bytes may only grow, and in mode
// replicate --max-txn-ops too (from etcd's default, which the replication's txns are sized for).
func checkGreenExtraArgs(p *Plan) error {
	if len(p.Green.Etcd.Members) == 0 {
		return nil
	}
	m := p.Green.Etcd.Members[0]
	extra := p.Green.Etcd.ExtraArgs
	own := map[string]bool{}
	cmd := etcdCommand(p, m)
	for _, f := range etcdFlags(cmd[1 : len(cmd)-len(extra)]) {
		own[f.name] = true
	}
	var errs []error
	for _, f := range etcdFlags(extra) {
		if n, err := strconv.Atoi(f.value); f.name == "max-txn-ops" && p.Replicating() && (err != nil || n < replicate.TxnOps) {
			errs = append(errs, fmt.Errorf("green.etcd.extraArgs %q: the replication applies one blue revision as one txn of up to %d operations (etcd's default --max-txn-ops); a lower limit refuses the first large revision (a lease expiry deleting many keys), inside the window an abort: leave it out or give at least %[2]d", f.arg, replicate.TxnOps))
			continue
		}
		if !own[f.name] {
			continue
		}
		if n, err := strconv.Atoi(f.value); f.name == "max-request-bytes" && err == nil && n >= greenMaxRequestBytes {
			continue
		}
		errs = append(errs, fmt.Errorf("green.etcd.extraArgs %q: kubefence sets --%s itself, and one given last would undo it (etcd takes the last value): leave it out", f.arg, f.name))
	}
	return errors.Join(errs...)
}

// etcdFlag is one flag of an etcd command line: as given (arg), its name and its value.
type etcdFlag struct{ arg, name, value string }

// etcdFlags are the flags of an etcd command line, as etcd's flag parsing (Go's flag package)
// reads them: one dash or two, the value after "=" or in the next argument (which may begin
// with a dash: "-1").
func etcdFlags(args []string) []etcdFlag {
	var out []etcdFlag
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, eq := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if name == "" {
			continue
		}
		if !eq && i+1 < len(args) { // a boolean flag's value is never read here
			value = args[i+1]
		}
		out = append(out, etcdFlag{arg: a, name: name, value: value})
	}
	return out
}
