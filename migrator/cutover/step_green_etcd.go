package cutover

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// greenEtcdStep starts green's etcd members (processes that outlive kubefence) and waits until
// they serve the bumped revision.
type greenEtcdStep struct{}

func (greenEtcdStep) name() string                  { return StepGreenEtcd }
func (greenEtcdStep) timeout(p *Plan) time.Duration { return p.Timeouts.GreenEtcd.D() }
func (greenEtcdStep) pastNoReturn() bool            { return false }

func (greenEtcdStep) describe(r *runner, verbose bool) string {
	p := r.p
	var cmds []string
	for _, m := range p.Green.Etcd.Members {
		how := ""
		switch {
		case m.External:
			how = " (learner started by its own host, then promoted)"
		case m.Learner:
			how = " (learner, then promoted)"
		}
		if verbose {
			cmds = append(cmds, strings.Join(etcdCommand(p, m), " ")+how)
		} else {
			cmds = append(cmds, m.Name+" at "+m.ClientURL+how)
		}
	}
	return "start etcd " + p.Green.Etcd.Version + ": " + strings.Join(cmds, "; ")
}

func (greenEtcdStep) run(ctx context.Context, r *runner) (string, error) {
	p := r.p
	var eps []string
	var members []greenProcess
	for _, m := range p.seeds() {
		eps = append(eps, m.ClientURL)
		gp := greenEtcdProcess(p, m)
		if err := r.startGreenProcess(ctx, gp, m.ClientURL, m.PeerURL); err != nil {
			return "", err
		}
		members = append(members, gp)
	}
	learnersUp, err := r.restartLearners(ctx)
	if err != nil {
		return "", err
	}
	// Connect once every member accepts connections: a gRPC client that dials too early backs
	// off for a second before trying again.
	for i, m := range p.seeds() {
		err := r.pollGreen(ctx, 20*time.Millisecond, "green etcd "+m.Name+" does not accept connections", func(context.Context) error {
			c, err := net.DialTimeout("tcp", proc.HostPort(m.ClientURL), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}, members[i])
		if err != nil {
			return "", err
		}
	}
	learners, err := r.seedsHealthy(ctx, eps, append(members, learnersUp...))
	if err != nil {
		return "", err
	}
	cli, err := datadir.NewClient(p.greenConn())
	if err != nil {
		return "", err
	}
	defer cli.Close()
	eps = nil
	for _, m := range p.Green.Etcd.Members {
		eps = append(eps, m.ClientURL)
	}
	var sts []datadir.MemberStatus
	err = r.pollGreen(ctx, 20*time.Millisecond, "green etcd not healthy", func(ctx context.Context) (err error) {
		sts, err = datadir.ClusterStatus(ctx, cli, eps)
		return err
	}, members...)
	if err != nil {
		return "", err
	}
	if err := r.holdRestoredLeases(ctx); err != nil { // held already if learners joined
		return "", err
	}
	rev := sts[0].Revision
	if want := r.j.SnapshotRevision + p.revisionBump(); rev < want {
		return "", fmt.Errorf("green etcd serves revision %d, below the bumped %d", rev, want)
	}
	return withNote(learnersNote(learners), fmt.Sprintf("%d member(s) healthy, etcd %s, revision %d", len(sts), sts[0].Version, rev)), nil
}

// seedsHealthy waits until the restored members answer, then adds and promotes the learners.
func (r *runner) seedsHealthy(ctx context.Context, eps []string, members []greenProcess) ([]string, error) {
	if len(r.p.seeds()) == len(r.p.Green.Etcd.Members) {
		return nil, nil
	}
	cli, err := datadir.NewClient(r.p.seedConn())
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	err = r.pollGreen(ctx, 20*time.Millisecond, "green etcd's restored members not healthy", func(ctx context.Context) error {
		_, err := datadir.ClusterStatus(ctx, cli, eps)
		return err
	}, members...)
	if err != nil {
		return nil, err
	}
	if err := r.holdRestoredLeases(ctx); err != nil { // learners join for longer than a TTL
		return nil, err
	}
	return r.joinLearners(ctx)
}

// holdRestoredLeases (mode replicate) keeps the leases green was restored with alive until
// replication takes them over: from the restored members' start, green must change nothing
// by itself.
func (r *runner) holdRestoredLeases(ctx context.Context) error {
	if !r.p.Replicating() {
		return nil
	}
	return r.holdGreenLeases(ctx, r.p.seedConn())
}

func learnersNote(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return "joined as learners and promoted: " + strings.Join(names, ", ")
}

func greenEtcdProcess(p *Plan, m GreenMember) greenProcess {
	return greenProcess{name: m.Name, what: "green etcd " + m.Name, log: m.Name, argv: etcdCommand(p, m)}
}

// etcdCommand is the command line a green member starts with, binary first.
func etcdCommand(p *Plan, m GreenMember) []string {
	args := []string{
		p.Green.Etcd.Binary,
		"--name", m.Name, "--data-dir", m.DataDir,
		"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", p.initialClusterFor(m), "--initial-cluster-token", p.Green.Etcd.ClusterToken,
	}
	if m.Learner {
		args = append(args, "--initial-cluster-state", "existing")
	}
	if m.MetricsURL != "" {
		args = append(args, "--listen-metrics-urls", m.MetricsURL)
	}
	args = append(args, p.Green.Etcd.TLS.tlsArgs()...)
	if p.Replicating() {
		args = append(args, replicationEtcdArgs...)
	}
	return append(args, p.Green.Etcd.ExtraArgs...)
}

// greenInitialCluster is the restored members' NAME=PEER-URL,... list (learners join later).
func (p *Plan) greenInitialCluster() string { return p.initialClusterFor(p.seeds()[0]) }

// greenEtcdProcesses are green's etcd members this host started (their pids journaled): the
// steps after start-green-etcd watch them too, so that one exiting fails the step at once,
// named, not after its timeout as something else not ready.
func (r *runner) greenEtcdProcesses() []greenProcess {
	var out []greenProcess
	for _, m := range r.p.Green.Etcd.Members {
		if pid, ok := r.j.GreenPIDs[m.Name]; ok && pid > 0 && !m.External {
			out = append(out, greenEtcdProcess(r.p, m))
		}
	}
	return out
}

// greenProcess is a process of green's that kubefence starts: journaled under name, started
// with argv (a process started before may run another: runner.startedArgv), its output in
// logs/<log>.log.
type greenProcess struct {
	name, what, log string
	argv            []string
}

// startGreenProcess starts gp unless it runs already (started before a crash), after checking
// its ports are free, and journals its pid; not once ctx has ended.
func (r *runner) startGreenProcess(ctx context.Context, gp greenProcess, urls ...string) error {
	if r.greenPID(gp.name, gp.argv) > 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		// The step's timeout or a signal: a process started now would only be stopped by the
		// abort.
		return fmt.Errorf("%s not started: %w", gp.what, err)
	}
	if err := proc.PortFree(urls...); err != nil {
		return fmt.Errorf("%s: %w", gp.what, err)
	}
	if pid, ok := r.j.GreenPIDs[gp.name]; !ok || pid != 0 || !slices.Equal(r.j.GreenArgv[gp.name], gp.argv) {
		// Write-ahead: a run killed before it journals the pid adopts the process by its
		// command line (greenPID), and only then (not when a pid journaled before has ended).
		// The command line is journaled with it: the process is known by it from now on.
		r.j.GreenPIDs[gp.name] = 0
		if r.j.GreenArgv == nil {
			r.j.GreenArgv = map[string][]string{}
		}
		r.j.GreenArgv[gp.name] = gp.argv
		if err := r.saveJournal(); err != nil {
			return err
		}
	}
	pid, err := r.procs.start(gp.argv, r.logPath(gp.log))
	if err != nil {
		return err
	}
	r.j.GreenPIDs[gp.name] = pid
	return r.saveJournal()
}

func (r *runner) logPath(log string) string {
	return filepath.Join(r.p.StateDir, "logs", log+".log")
}

// exitTailLines is how much of an exited green process's log its step's error shows.
const exitTailLines = 12

// exited says that gp exited while its step waited (what, last: ready's last error), with the
// end of its log: the process's own words (a flag it refused, a port taken, a file missing, a
// full disk) in the error, and so in the report and -o json.
func (r *runner) exited(gp greenProcess, what string, last error) error {
	path := r.logPath(gp.log)
	return fmt.Errorf("%s exited (while waiting: %s; last: %v); the end of its log %s:\n%s", gp.what, what, last, path, datadir.LogTail(path, exitTailLines))
}

// pollGreen calls ready every interval until it returns nil; it fails at once when one of the watched
// processes has exited, and says what it waited for, with ready's last error, when ctx ends.
func (r *runner) pollGreen(ctx context.Context, interval time.Duration, what string, ready func(context.Context) error, watch ...greenProcess) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		if last = ready(ctx); last == nil {
			return true, nil
		}
		for _, gp := range watch {
			if !r.procs.alive(r.j.GreenPIDs[gp.name], r.startedArgv(gp.name, gp.argv)) {
				return false, r.exited(gp, what, last)
			}
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), last)
	}
	return err
}
