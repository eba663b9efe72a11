package cutover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/steprun"
)

// A rollback (`kubefence cutover rollback`) is a baking cutover's window run backwards, from
// green to blue, journaled in stateDir/rollback: fence → drain (blue at green's revision) →
// switch every proxy to blue, watches resumed → gate green's apiserver → blue catches up with
// what green's apiserver wrote in between → stop replication → let blue's apiserver write →
// unfence. A failure before the switch unfences green and leaves the bake to be resumed.

// rollbackSteps is a rollback, in order.
var rollbackSteps = []step{
	needsReplication{fenceStep{}},
	needsReplication{drainStep{}},
	replicaSwitchStep{pickUp: true}, // after checking it has not switched already
	gateStep{StepGateGreen},
	stopFollowingStep{},
	ungateStep{StepUngateBlue},
	unfenceStep{},
}

// bakeNotRunning is the advice when a rollback (or finish) fails once it holds the state dir, the baking
// process stopped (or not running): nothing keeps blue in step with green.
const bakeNotRunning = "no process keeps blue following green now (the baking process was asked to stop, or was not running): run 'kubefence cutover --resume --plan PLAN' " + PickupHorizon + ", and try again once the cause is fixed"

// afterRollbackAbort is the advice after a rollback went back to green.
const afterRollbackAbort = "green serves as before and writes are open; blue no longer follows green until 'kubefence cutover --resume --plan PLAN' runs again: start it " + PickupHorizon

// Rollback goes back to blue during a bake. The process that keeps blue following green (the
// cutover, or its --resume) is asked to stop (SIGTERM) and this one picks replication up.
func Rollback(ctx context.Context, o Options) (*Report, error) {
	// What can be refused is refused before the baking process is stopped: once it has, nothing
	// keeps blue in step with green.
	j, err := LoadJournal(o.Plan.StateDir)
	if isUntrustedStateDir(err) {
		return nil, err
	}
	if err == nil {
		if err := rollbackAllowed(j, o.Resume); err != nil {
			return nil, err
		}
		if err := proxiesSpeakOurs(ctx, o.Plan); err != nil {
			return nil, err
		}
		if err := blueServesForRollback(ctx, o); err != nil {
			return nil, err
		}
	}
	lock, main, err := takeOver(ctx, o.Plan)
	if err != nil {
		return nil, err
	}
	defer lock.unlock()
	baking := main.State == StateBaking
	r, err := newRollbackRunner(o, main)
	if err != nil {
		if baking {
			return nil, fmt.Errorf("%w; %s", err, bakeNotRunning)
		}
		return nil, err
	}
	return r.rollBack(ctx)
}

// rollBack walks the rollback's steps (the runner newRollbackRunner made) and ends it: rolled
// back, or what fail makes of a step that failed.
func (r *runner) rollBack(ctx context.Context) (*Report, error) {
	defer func() { _, _ = r.stopReplication() }()
	defer r.closeAuthClients()
	if err := r.walk(ctx); err != nil {
		var serr *steprun.Error
		if !errors.As(err, &serr) {
			return nil, err
		}
		return r.fail(ctx, r.steps[serr.Index], serr.Err)
	}
	if r.unsaved != nil { // its window finished all the same (saveWindow)
		return r.unjournaled(ResultRolledBack, r.unsaved)
	}
	// The cutover's journal first: a crash between the two saves leaves a cutover rolled back
	// and a rollback journal still running, which nothing resumes; the other way round would
	// leave the cutover "rolling-back" for good.
	main := r.main
	main.State, main.Bake.Ended = StateRolledBack, time.Now().UTC()
	if err := main.save(r.p.StateDir); err != nil {
		return r.unjournaled(ResultRolledBack, err)
	}
	r.j.State = StateDone
	var lost *rollbackJournalLost
	if err := r.saveJournal(); err != nil {
		lost = &rollbackJournalLost{dir: r.journalDir, err: err}
	}
	rep := r.report(ResultRolledBack, nil)
	rep.Next = "blue serves behind the proxy, writes open. " + r.greenAfterRollback() + " Going forward again is a new cutover."
	if lost != nil { // the cutover is rolled back all the same: its journal says so
		rep.Error = lost.Error()
		rep.Next = "the rollback is done: the cutover's journal says rolled back. " + rep.Next + " Meanwhile " + lost.advice() + "."
	}
	r.emit(Event{Type: EventReport, Report: rep})
	if lost != nil {
		return rep, lost
	}
	return rep, nil
}

// greenAfterRollback is what a rolled-back report says of green's apiserver: read-only on green
// etcd, unless gate-green could not gate it (NotGated).
func (r *runner) greenAfterRollback() string {
	cleanup := "'kubefence cutover cleanup --plan PLAN [--remove-data-dirs]' stops them"
	if r.j.NotGated == "" {
		return "Green's apiserver may only read green etcd; its processes keep running for inspection (" + cleanup + ")."
	}
	g := r.p.greenSide()
	c := g.etcd
	return fmt.Sprintf("Green's apiserver was NOT gated (gate-green: %s): it may still write green etcd, which nothing follows any more. Stop green's processes (%s), or take its write role: 'etcdctl --endpoints %s --cacert %s --cert %s --key %s user revoke-role %s %s'.",
		r.j.NotGated, cleanup, strings.Join(c.Endpoints, ","), c.CAFile, c.CertFile, c.KeyFile, g.api.EtcdUser, readWriteRole)
}

// blueServesForRollback refuses a new rollback while blue's apiserver does not answer /readyz
// (up to 15 s): the rollback's switch sends every proxy to it and its unfence opens writes
// there, past which there is no going back to green but a new cutover. A resumed rollback goes
// on: it may be past its switch (before its fence or its switch it asks again:
// resumedRollbackReady).
func blueServesForRollback(ctx context.Context, o Options) error {
	if o.Resume {
		return nil
	}
	if err := waitReady(ctx, o.Plan.Blue.APIServer.Kubeconfig); err != nil {
		return fmt.Errorf("blue's apiserver (blue.apiserver.kubeconfig) is not ready: %w; a rollback would switch the proxies to it and open writes there. Nothing was changed: green serves and blue follows it; make blue's apiserver ready, then roll back", err)
	}
	return nil
}

// newRollbackRunner is a runner from green to blue on the rollback's journal (new, or the one
// to resume); it marks the cutover rolling back.
func newRollbackRunner(o Options, main *Journal) (*runner, error) {
	if err := rollbackAllowed(main, o.Resume); err != nil {
		return nil, err
	}
	g, err := newProxyGroup(o.Plan, o.wayBack)
	if err != nil {
		return nil, err
	}
	g.backCA = o.Plan.Green.APIServer.CAFile // a partial switch to blue goes back to green
	p := o.Plan
	r := &runner{o: o, p: p, adm: g, procs: osProcesses, steps: rollbackSteps, main: main,
		from: p.greenSide(), to: p.blueSide(), journalDir: filepath.Join(p.StateDir, "rollback"),
		noPickup:    "blue no longer follows green exactly, so going back would lose writes: green keeps serving; end the bake with 'kubefence cutover finish'",
		retryPickup: "this is not known to be lasting: once both etcds answer, try the rollback again as the next step says (it checks that blue is still green change for change)"}
	if r.j, err = openRollbackJournal(r.journalDir, main, o.Resume); err != nil {
		return nil, err
	}
	// The rollback's journal first, then the cutover's: "rolling-back" always has a rollback
	// journal to resume.
	if err := r.saveJournal(); err != nil {
		return nil, err
	}
	main.State, main.Bake.Rollback = StateRollingBack, r.j.ID
	if err := main.save(p.StateDir); err != nil {
		return nil, err
	}
	if o.Resume {
		r.resumedFenced = !r.j.FencedAt.IsZero() && r.j.UnfencedAt.IsZero()
		r.emit(Event{Type: EventNote, Detail: fmt.Sprintf("resuming rollback %s after step %q", r.j.ID, lastStep(r.j))})
	}
	return r, nil
}

// rollbackAllowed refuses a rollback (or its resume) that the cutover's state does not allow.
func rollbackAllowed(main *Journal, resume bool) error {
	switch {
	case main.State == StateBaking && resume:
		return fmt.Errorf("nothing to resume: no rollback of cutover %s is in progress", main.ID)
	case main.State == StateRollingBack && !resume:
		return fmt.Errorf("a rollback of cutover %s is in progress: run 'kubefence cutover rollback --resume'", main.ID)
	case main.State != StateBaking && main.State != StateRollingBack:
		return fmt.Errorf("cutover %s is %s: a rollback goes back to blue during the bake only (plan bake.enabled)", main.ID, main.State)
	}
	return nil
}

// openRollbackJournal is the rollback's journal to resume, or a new one (an earlier aborted
// one is kept beside it).
func openRollbackJournal(dir string, main *Journal, resume bool) (*Journal, error) {
	j, err := LoadJournal(dir)
	switch {
	case resume && err == nil && j.State == StateRunning:
		return j, nil
	case resume && err == nil:
		return nil, fmt.Errorf("nothing to resume: rollback %s is %s (the cutover's journal says %s: see 'kubefence cutover status')", j.ID, j.State, main.State)
	case resume:
		return nil, fmt.Errorf("nothing to resume: %v", err)
	case err == nil:
		if err := keepJournal(dir, j.ID); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Journal{Version: 1, ID: newID(), PlanHash: main.PlanHash, State: StateRunning, Started: time.Now().UTC(),
		SnapshotRevision: main.Bake.Revision, GreenPIDs: map[string]int{}}, nil
}

// abortRollback unfences green (the proxy still sends everything there) and leaves the bake
// to be resumed; a rollback that switched to blue is finished with --resume instead.
func (r *runner) abortRollback(ctx context.Context, reason string, seen *proxiesAt) error {
	if _, ok := r.j.record(StepSwitch); ok {
		return &refusal{fmt.Sprintf("the rollback already switched the proxy to blue: finish it with 'kubefence cutover rollback --resume'; %s", finishRollbackByHand(r.p, r.j))}
	}
	at, refenced, err := r.fenceOpenOnTarget(ctx, r.lookedAt(ctx, seen))
	if err != nil {
		return err
	}
	if r.pastSwitch(at) && !refenced { // one changed by hand: back it goes (abort)
		return &refusal{fmt.Sprintf("the rollback's switch reached %s (on blue) before it was journaled: finish it with 'kubefence cutover rollback --resume'; %s", named(at.on), finishRollbackByHand(r.p, r.j))}
	}
	// Unfenced before replication stops, which waits for its txns in flight: writes must not
	// stay fenced past the budget for that.
	defer r.stopReplicationLogged()
	if err := r.proxiesBack(ctx, at.down); err != nil {
		return err
	}
	// Only a fence this rollback placed is lifted (its time is journaled before it is sent, its
	// lifting too): one on before it is the operator's, put on to stop a misbehaving green, say.
	r.othersFence = at.fenced && !r.ownFence() && !refenced
	var still error
	if (at.fenced || len(at.down) > 0) && (r.ownFence() || refenced) { // a silent proxy is waited for once
		if err := r.unfenceBack(ctx); err != nil {
			still = &stillFencedOnGreen{names: r.j.StillFenced, err: err}
		}
	}
	// The rollback ends here even when a proxy did not acknowledge its unfence: every other one
	// is open on green, taking writes, and 'cutover --resume' (which refuses a rolling-back
	// cutover) must be able to keep blue following green before green compacts past it; the
	// proxy left fenced is journaled (StillFenced) and the report says how to reopen it.
	// The cutover's journal decides: baking, its advice is the bake's (stillFencedOnGreen, even
	// if the rollback's own journal could not be written); not saved, it is still rolling back.
	r.main.State = StateBaking
	if err := r.main.save(r.p.StateDir); err != nil {
		if still != nil {
			return fmt.Errorf("%v; %w", still, err)
		}
		return err
	}
	r.j.State, r.j.AbortReason = StateAborted, reason
	if err := r.saveJournal(); err != nil {
		return errors.Join(still, &rollbackJournalLost{dir: r.journalDir, err: err})
	}
	return still
}

// rollbackJournalLost is a rollback's own journal (rollback/) that could not be written once
// the cutover's journal was: the cutover's decides ('rollback --resume' follows it), so the
// advice is the cutover's state's, with what the rollback's journal lacks.
type rollbackJournalLost struct {
	dir string
	err error
}

func (e *rollbackJournalLost) Error() string {
	return fmt.Sprintf("the rollback's journal could not be written: %v", e.err)
}

func (e *rollbackJournalLost) Unwrap() error { return e.err }

// advice says what the rollback's journal on disk lacks, and that nothing acts on it.
func (e *rollbackJournalLost) advice() string {
	onDisk := "could not be read either"
	if disk, err := LoadJournal(e.dir); err == nil {
		onDisk = fmt.Sprintf("still says %s, last step %q", disk.State, lastStep(disk))
	}
	return fmt.Sprintf("the rollback's own journal in %s could not be written (%v) and %s: the cutover's journal (in the state dir) decides, so the rollback needs no resume (none would start from it); 'kubefence cutover status' may name that rollback as it last was. Free space there (or fix its disk)", e.dir, e.err, onDisk)
}

// stillFencedOnGreen is a rollback's abort that reopened every proxy on green but names, which
// did not acknowledge their unfence (err): they stay fenced, and the rollback is over all the
// same (abortRollback).
type stillFencedOnGreen struct {
	names []string
	err   error
}

func (e *stillFencedOnGreen) Error() string {
	return fmt.Sprintf("unfence: %v; %s not acknowledged (still fenced)", e.err, named(e.names))
}

func (e *stillFencedOnGreen) Unwrap() error { return e.err }

// stillFencedAdvice is the advice after a rollback's abort that left the proxies still fenced
// (a stillFencedOnGreen): the bake to resume in time, and how to reopen them once they answer.
func (r *runner) stillFencedAdvice(still []string) string {
	if _, ok := r.adm.(*proxyGroup); !ok {
		still = []string{""} // the plan's one proxy
	}
	green, who := r.p.greenSide().api.URL, named(still)
	stays := "stays"
	if len(still) > 1 {
		stays = "stay"
	}
	return fmt.Sprintf("green serves and every other proxy is open on green; %s did not acknowledge the unfence and %s fenced (writes through it are held or refused). The rollback is over (the cutover bakes again), but blue no longer follows green until 'kubefence cutover --resume --plan PLAN' runs: start it now, %s. Once %s answers ('kubefence fence status'): on green, %s reopens it; on blue (a switch it took before it went silent), %s first",
		who, stays, PickupHorizon, who, r.commandsFor(still, "fence off --expect-backend", green), r.commandsFor(still, "backend set", green))
}

// stopFollowingStep stops replicating green into blue once blue has what green's apiserver
// wrote between the switch and its gate (its own leases): from here blue's revisions are
// blue's own.
type stopFollowingStep struct{}

func (stopFollowingStep) name() string                  { return StepStopReplication }
func (stopFollowingStep) timeout(p *Plan) time.Duration { return p.Timeouts.Switch.D() }
func (stopFollowingStep) pastNoReturn() bool            { return true }
func (stopFollowingStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("let %s catch up with %s (whose apiserver writes no more), then stop replicating", r.to.name, r.from.name)
}

func (stopFollowingStep) run(ctx context.Context, r *runner) (string, error) {
	wctx, cancel := r.bakeContext(ctx) // what is missing is not worth writes fenced long past the budget
	defer cancel()
	if r.repl == nil {
		// The process that replicated died after the switch: pick it up to bring over what
		// the gated apiserver wrote before its gate, if green is still blue change for change.
		if _, err := r.ensureReplication(wctx); err != nil {
			return fmt.Sprintf("replication could not be picked up again (%v); what %s got after the revision %s had at the switch is not on %s: %[2]s's apiserver's own writes between the switch and its gate (its leases; %[4]s's apiserver writes its own), and any write the fence's policy let through right at the switch (each proxy logs them: \"write let through: fence is on\", naming the object)", err, r.from.name, r.to.name, r.to.name), nil
		}
	}
	rev, cerr := r.caughtUp(wctx)
	prog, err := r.stopReplication()
	r.j.ReplicationAtStop = &prog
	if err = errors.Join(cerr, err); err != nil {
		// The switch happened with the other side at this one's revision of then; what is
		// missing came after it: the gated apiserver's own writes (its leases, which the other
		// apiserver writes itself), and a write a policy let through right at the switch.
		return fmt.Sprintf("stopped without catching up (%v): %s; what %s got after that is not on %s: its apiserver's own writes before its gate (its leases), and any write the fence's policy let through right at the switch (each proxy logs them: \"write let through: fence is on\", naming the object)", err, r.progressLine(prog), r.from.name, r.to.name), nil
	}
	return fmt.Sprintf("%s and %s at revision %d; replication stopped", r.to.name, r.from.name, rev), nil
}

// Finish ends a bake: blue stops following green (the process that kept it in step is asked
// to stop) and the cutover is done.
func Finish(ctx context.Context, o Options) (*Report, error) {
	// What can be refused is refused before the baking process is stopped (takeOver): once it
	// has, nothing keeps blue in step with green. An untrusted state dir is refused by takeOver's
	// LoadJournal, before that.
	r, err := newRunner(o, nil)
	if err != nil {
		return nil, err
	}
	if err := r.refuseLeftFenced(ctx); err != nil {
		return nil, err
	}
	lock, main, err := takeOver(ctx, o.Plan)
	if err != nil {
		return nil, err
	}
	defer lock.unlock()
	if main.State != StateBaking {
		return nil, fmt.Errorf("cutover %s is %s: finish ends a bake", main.ID, main.State)
	}
	r.j = main
	main.State, main.Bake.Ended = StateDone, time.Now().UTC()
	if err := r.saveJournal(); err != nil {
		return nil, fmt.Errorf("%w; %s", err, bakeNotRunning)
	}
	rev := main.Bake.Revision
	if s := main.Bake.LastStop; s != nil {
		rev = s.Applied
	}
	rep := r.report(ResultDone, nil)
	rep.Next = fmt.Sprintf("the bake is over: green serves; blue no longer follows green and stays as it last followed it (revision %d as last journaled; a baking process killed without stopping cleanly may have taken it further) (its data dir is kept; its apiserver may only read blue etcd). kubefence started none of blue's processes: stop blue's etcd and apiserver when you no longer need them. %s%s", rev, greenForGood, r.dropBlueCopies())
	r.emit(Event{Type: EventReport, Report: rep})
	return rep, nil
}

// refuseLeftFenced refuses to finish a bake while proxies that a rollback's abort left fenced
// (leftFencedByRollback) do not answer open on green: once the bake is over, status no longer
// names them and nothing would reopen them. Read before the baking process is stopped; the
// bake goes on.
func (r *runner) refuseLeftFenced(ctx context.Context) error {
	j, err := LoadJournal(r.p.StateDir)
	if err != nil {
		return nil // takeOver says why
	}
	rj, err := LoadJournal(filepath.Join(r.p.StateDir, "rollback"))
	if err != nil {
		return nil
	}
	still := leftFencedByRollback(j, rj)
	if len(still) == 0 {
		return nil
	}
	green := r.p.greenSide().api.URL
	var fenced []string
	for _, name := range still {
		if !r.openOn(ctx, name, green) {
			fenced = append(fenced, name)
		}
	}
	if len(fenced) == 0 {
		return nil
	}
	return fmt.Errorf("cutover %s: the abort of rollback %s left %s fenced, and it does not answer open on green: finishing would end the bake with nothing to name it or reopen it. The bake goes on. Once it answers ('kubefence fence status'): on green, %s reopens it; on blue (a switch it took before it went silent), %s first; then run finish again (or take the proxy out of the plan and its load balancer)",
		j.ID, rj.ID, named(fenced), r.commandsFor(fenced, "fence off --expect-backend", green), r.commandsFor(fenced, "backend set", green))
}

// openOn says whether the plan's proxy name answers its status unfenced on url.
func (r *runner) openOn(ctx context.Context, name, url string) bool {
	g, ok := r.adm.(*proxyGroup)
	if !ok {
		return false
	}
	for _, px := range g.proxies {
		if px.Name != name {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, statusAnswerTimeout)
		st, err := statusOf(sctx, px.Client)
		cancel()
		return err == nil && !st.Fenced && sameURL(st.Backend) == sameURL(url)
	}
	return false
}

// takeOver takes the state dir's lock for a rollback or a finish. While a process keeps blue
// following green it holds the lock: it is asked to stop (SIGTERM, which it takes as the end of
// its bake) and the lock taken once it has. It returns the cutover's journal, checked against
// the plan.
func takeOver(ctx context.Context, p *Plan) (*stateLock, *Journal, error) {
	j, err := LoadJournal(p.StateDir)
	if errors.Is(err, errNoJournal) {
		return nil, nil, fmt.Errorf("no cutover in %s", p.StateDir)
	}
	if err != nil {
		return nil, nil, err
	}
	if j.PlanHash != p.hash {
		return nil, nil, fmt.Errorf("the plan changed since cutover %s started (plan hash %s, journal %s): use the same plan", j.ID, p.hash, j.PlanHash)
	}
	lock, err := lockStateDir(p.StateDir)
	if err != nil && j.State == StateBaking {
		lock, err = stopHolder(ctx, p.StateDir, err)
	}
	if err != nil {
		return nil, nil, err
	}
	// The journal as the holder left it.
	if j, err = LoadJournal(p.StateDir); err != nil {
		lock.unlock()
		return nil, nil, fmt.Errorf("%w; %s", err, bakeNotRunning)
	}
	return lock, j, nil
}

// stopHolder sends SIGTERM to the kubefence process holding the state dir's lock and waits for
// the lock; busy is the error the lock gave. Once the signal is sent, an error says that nothing
// will keep blue in step (bakeNotRunning): the bake stops whether or not this waits for it.
func stopHolder(ctx context.Context, stateDir string, busy error) (*stateLock, error) {
	// Only a holder that says it bakes is stopped: not a rollback or a finish that has just
	// taken the lock (the journal read before may still say baking).
	pid, role := holder(stateDir)
	if pid <= 0 || role != bakeRole || !holdsLock(stateDir, pid) {
		return nil, busy
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil, fmt.Errorf("asking the process that keeps blue in step (pid %d) to stop: %w", pid, err)
	}
	var lock *stateLock
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		l, err := lockStateDir(stateDir)
		lock = l
		return err == nil, nil
	})
	if err != nil {
		// It was asked to stop: it stops keeping blue in step (or has), whatever ends this wait.
		why := "did not let the state dir go within a minute of SIGTERM"
		if ctx.Err() != nil {
			why = "was asked to stop (SIGTERM), and this command was interrupted while it stopped"
		}
		return nil, fmt.Errorf("the process that keeps blue in step (pid %d) %s: %w; once it has stopped, %s", pid, why, err, bakeNotRunning)
	}
	return lock, nil
}

// holderPID is the pid the lock's holder wrote into the lock file, 0 if none.
func holderPID(stateDir string) int {
	pid, _ := holder(stateDir)
	return pid
}

// holder is the pid and the role ("bake", or "") the lock's holder wrote into the lock file.
func holder(stateDir string) (int, string) {
	data, err := os.ReadFile(lockPath(stateDir))
	if err != nil {
		return 0, ""
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0, ""
	}
	pid, _ := strconv.Atoi(f[0])
	role := ""
	if len(f) > 1 {
		role = f[1]
	}
	return pid, role
}

// holdsLock says whether pid holds the flock on stateDir's lock file, by /proc/locks (so a
// stale pid in the file is never signalled).
func holdsLock(stateDir string, pid int) bool {
	var st syscall.Stat_t
	if err := syscall.Stat(lockPath(stateDir), &st); err != nil {
		return false
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false
	}
	return flockHolder(string(locks), st.Ino, pid)
}

// flockHolder says whether /proc/locks (its text) has a FLOCK held by pid on inode ino (the
// device field is "major:minor:inode").
func flockHolder(locks string, ino uint64, pid int) bool {
	for line := range strings.SplitSeq(locks, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" || f[4] != strconv.Itoa(pid) {
			continue
		}
		dev := strings.Split(f[5], ":")
		if n, err := strconv.ParseUint(dev[len(dev)-1], 10, 64); err == nil && n == ino {
			return true
		}
	}
	return false
}
