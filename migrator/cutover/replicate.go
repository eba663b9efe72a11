package cutover

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/replicate"
)

// Mode replicate (docs/plan.md): green is restored at blue's snapshot revision without a bump,
// and blue's revisions are replicated into it one txn each (migrator/replicate) while writes
// stay open; green's apiserver starts warm but may only read (etcd auth on its client
// certificate); the window is only fence → drain → switch → stop replication → ungate green →
// unfence.

// replicateSteps is a cutover in mode replicate, in order. The steps that need the replicator
// of this process are wrapped in needsReplication: a --resume after the cutover process died
// picks replication up again from green's revision once it is checked to be blue's (ensureReplication).
var replicateSteps = []step{
	preflightStep{},
	copyStep{},
	migrateStep{},
	greenEtcdStep{},
	holdsGreenLeases{greenAuthStep{}},
	replicateStep{},
	needsReplication{greenAPIServerStep{}},
	needsReplication{replicaVerifyStep{}},
	needsReplication{fenceStep{}},
	needsReplication{drainStep{}},
	replicaSwitchStep{},
	stopReplicationStep{},
	ungateStep{StepUngateGreen},
	unfenceStep{},
}

// Step names of mode replicate, besides the common ones.
const (
	StepGreenAuth       = "green-etcd-auth"
	StepReplicate       = "replicate"
	StepDrain           = "drain"
	StepStopReplication = "stop-replication"
	StepUngateGreen     = "ungate-green"
)

// stepsFor is the plan's table of steps.
func stepsFor(p *Plan) []step {
	if p.Bake.Enabled {
		return bakeSteps
	}
	if p.Replicating() {
		return replicateSteps
	}
	return steps
}

// greenMaxRequestBytes is green etcd's --max-request-bytes in mode replicate: one blue revision
// is one txn, and may be larger than etcd's default 1.5 MiB. (Its --max-txn-ops stays etcd's
// default: replication nests a revision's operations to fit it.)
const greenMaxRequestBytes = 10 << 20

// replicationEtcdArgs are green etcd's extra flags in mode replicate (docs/replicate.md).
var replicationEtcdArgs = []string{"--max-request-bytes", strconv.Itoa(greenMaxRequestBytes)}

// replication is the replicator running in this process, with its clients: src is the side
// writes move away from (r.from), dst the one being kept in step (r.to).
type replication struct {
	rep      *replicate.Replicator
	src, dst *clientv3.Client
	// check compares src's and dst's changes revision by revision after the full verify's
	// revision (nil before the verify, and when replicating back in a rollback).
	check  *replicate.Checker
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's error, once done is closed
	// release ends what else holds dst's leases (the handover to the bake), if anything.
	release func()
	// srcName and dstName name the sides in its progress lines.
	srcName, dstName string
}

// line says where replication stands (p is its progress).
func (rp *replication) line(p replicate.Progress) string {
	return progressLine(p, rp.srcName, rp.dstName)
}

// newEtcdClient connects to spec for replication: large requests allowed, a short reconnect
// backoff (a green restart must be followed within a lease's TTL), and keepalive pings as
// kube-apiserver's etcd client sends them (30 s, answered within 10 s): a watch on a member whose
// host is lost without a reset, or whose process is frozen, sends nothing, and without pings
// replication stood still, its lag reading 0, until TCP gave up (about 15 minutes) — in a bake,
// past green's compaction of what blue still needed.
func newEtcdClient(spec datadir.ConnSpec) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints: spec.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 30 * time.Second, DialKeepAliveTimeout: 10 * time.Second,
		MaxCallSendMsgSize: greenMaxRequestBytes + 1<<20,
		DialOptions:        []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: 500 * time.Millisecond}, MinConnectTimeout: time.Second})},
	}
	if spec.CAFile != "" || spec.CertFile != "" {
		tc, err := (transport.TLSInfo{CertFile: spec.CertFile, KeyFile: spec.KeyFile, TrustedCAFile: spec.CAFile}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tc
	}
	return clientv3.New(cfg)
}

// replicationClients connects to the etcd of r.from (src) and r.to (dst) for replication.
func (r *runner) replicationClients() (src, dst *clientv3.Client, err error) {
	src, err = newEtcdClient(r.from.etcd)
	if err != nil {
		return nil, nil, fmt.Errorf("%s etcd: %w", r.from.name, err)
	}
	dst, err = newEtcdClient(r.to.etcd)
	if err != nil {
		src.Close()
		return nil, nil, fmt.Errorf("%s etcd: %w", r.to.name, err)
	}
	return src, dst, nil
}

// startReplication starts replicating src (r.from) into dst (r.to) from revision from, on
// clients it then owns (closed when replication stops, or now if it cannot start), in a
// goroutine of this process that runs until stopReplication.
func (r *runner) startReplication(src, dst *clientv3.Client, from int64) error {
	if err := r.startReplicationOf(src, dst, from, r.from.name, r.to.name); err != nil {
		return err
	}
	// Run keeps dst's leases alive from its start: what held them since green started goes
	// when replication stops.
	r.repl.release = r.takeGreenHold()
	return nil
}

// startReplicationOf is startReplication with the sides' names given.
func (r *runner) startReplicationOf(src, dst *clientv3.Client, from int64, srcName, dstName string) error {
	rep, err := replicate.New(replicate.Config{Source: src, Dest: dst, FromRevision: from, Log: r.o.Log, SourceName: srcName, DestName: dstName})
	if err != nil {
		src.Close()
		dst.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp := &replication{rep: rep, src: src, dst: dst, cancel: cancel, done: make(chan struct{}), srcName: srcName, dstName: dstName}
	go func() {
		defer close(rp.done)
		rp.err = rep.Run(ctx)
	}()
	go r.reportProgress(rp, r.progressStep)
	r.repl = rp
	return nil
}

// holdGreenLeases keeps every lease green was restored with alive, over a client of spec, until
// replication takes them over (takeGreenHold) or releaseGreenHold: joining learners, or the auth
// step, may take longer than a lease's TTL (15 s for kube-apiserver's master leases), and an
// expiry green made by itself would be a revision of its own, which the auth step and
// replication refuse. It holds nothing a second time.
func (r *runner) holdGreenLeases(ctx context.Context, spec datadir.ConnSpec) error {
	if r.greenHold != nil {
		return nil
	}
	cli, err := datadir.NewClient(spec)
	if err != nil {
		return fmt.Errorf("%s etcd, to keep its leases alive: %w", r.to.name, err)
	}
	release, err := replicate.HoldLeases(context.Background(), ctx, cli, r.o.Log)
	if err != nil {
		cli.Close()
		return fmt.Errorf("keeping %s's restored leases alive: %w", r.to.name, err)
	}
	r.greenHold = func() { release(); cli.Close() }
	return nil
}

// takeGreenHold hands what keeps green's leases alive to its taker (nil if nothing does).
func (r *runner) takeGreenHold() func() {
	h := r.greenHold
	r.greenHold = nil
	return h
}

// releaseGreenHold stops keeping green's leases alive, if this process does.
func (r *runner) releaseGreenHold() {
	if h := r.takeGreenHold(); h != nil {
		h()
	}
}

// progressEvery is how often where replication stands is reported while it runs.
const progressEvery = 5 * time.Second

// reportProgress emits where replication stands (the lag, live) every progressEvery until it
// stops, its notes labelled step ("" is StepReplicate). It reads nothing of r's but emit.
func (r *runner) reportProgress(rp *replication, step string) {
	if step == "" {
		step = StepReplicate
	}
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-rp.done:
			return
		case <-t.C:
			r.emit(Event{Type: EventNote, Step: step, Detail: "replication: " + rp.line(rp.rep.Progress())})
		}
	}
}

// tipCheckTimeout bounds reading where green stands when replication is picked up again.
const tipCheckTimeout = 30 * time.Second

// ensureReplication makes sure the replicator runs in this process. When it does not (a
// --resume after the cutover process died), it picks replication up from green's revision once
// replicate.Tip has checked that green's newest revision is blue's (while nobody kept green's
// leases alive, green may have expired one by itself: then green cannot be trusted and the
// cutover aborts to blue). It returns what it did, "" when replication was running.
func (r *runner) ensureReplication(ctx context.Context) (string, error) {
	if r.repl != nil {
		return "", r.replicationAlive()
	}
	src, dst, err := r.replicationClients()
	if err != nil {
		return "", err
	}
	// Past the switch the callers bound this themselves (bakeContext), and an abort is no
	// longer the way out: the advice for a run before its switch would be wrong there.
	pastSwitch := r.j.done(StepSwitch)
	inWindow := !pastSwitch && r.windowOpen(ctx)
	if inWindow {
		// Inside the window before the switch (a resume after the process that ran it died):
		// its budget bounds this too, so that a spent one aborts to blue at once, not after the
		// check's own time.
		var wcancel context.CancelFunc
		ctx, wcancel = r.windowContext(ctx)
		defer wcancel()
	}
	tctx, cancel := context.WithTimeout(ctx, tipCheckTimeout)
	rev, err := replicate.Tip(tctx, src, dst)
	err = replicate.Rename(err, r.from.name, r.to.name)
	cancel()
	if err != nil && inWindow && ctx.Err() != nil {
		err = fmt.Errorf("%w (the window's budget, timeouts.window %s from the fence at %s, is spent)", err, r.p.Timeouts.Window.D(), r.j.FencedAt.Format(time.RFC3339))
	}
	if err != nil {
		src.Close()
		dst.Close()
		err = fmt.Errorf("picking replication up again (the process that replicated stopped): %w", err)
		if pastSwitch {
			return "", err
		}
		return "", fmt.Errorf("%w; %s", err, r.pickupAdvice(err))
	}
	if err := r.startReplication(src, dst, rev); err != nil {
		return "", err
	}
	if v := r.j.Verified; v != nil && v.Revision > 0 && r.j.done(StepVerify) && !r.j.done(StepSwitch) {
		// The changes since the full verify were compared by the process that died: compare
		// them again from there (etcd keeps them until blue's apiserver compacts).
		r.startDeltaCheck(v.Revision)
	}
	if rev == r.j.SnapshotRevision {
		return "", nil
	}
	return fmt.Sprintf("replication picked up again at %s's revision %d (it is %s's revision %d, change for change)", r.to.name, rev, r.from.name, rev), nil
}

// pickupAdvice is what to do when replication could not be picked up again, or stopped, with
// err. A revision mismatch or a compaction means the side that followed no longer does, and a
// revision the follower cannot take as one txn or an etcd refusing replication's requests
// means picking it up again fails the same way (noPickup); another error (an etcd that did
// not answer in time) may pass, and where the advice would give up the way back (a bake, a
// rollback), trying again comes first.
func (r *runner) pickupAdvice(err error) string {
	if lastingPickup(err) || r.retryPickup == "" {
		return r.noPickup
	}
	return r.retryPickup
}

// lastingPickup says err keeps replication from being picked up again for good: the two sides
// no longer equal change for change, the history needed compacted, or a change the destination
// refuses.
func lastingPickup(err error) bool {
	for _, lasting := range []error{replicate.ErrRevisionMismatch, replicate.ErrCompacted, replicate.ErrTooManyOps, replicate.ErrRefused} {
		if errors.Is(err, lasting) {
			return true
		}
	}
	return false
}

// replicationAlive says why replication cannot be relied on, or nil while it runs.
func (r *runner) replicationAlive() error {
	if r.repl == nil {
		return errors.New("replication is not running in this process")
	}
	select {
	case <-r.repl.done:
		return fmt.Errorf("replication stopped: %w", r.repl.err)
	default:
	}
	if c := r.repl.check; c != nil {
		if err := c.Err(); err != nil {
			return fmt.Errorf("comparing %s's changes with %s's since the full verify (revision %d): %w", r.to.name, r.from.name, c.From(), err)
		}
	}
	return nil
}

// startDeltaCheck starts comparing the replication's two sides revision by revision after
// rev, a revision the full verify found identical on both (replicate.Checker), replacing a
// check already running.
func (r *runner) startDeltaCheck(rev int64) {
	rp := r.repl
	if rp.check != nil {
		rp.check.Stop()
	}
	rp.check = replicate.StartCheck(rp.src, rp.dst, rev, r.o.Log)
}

// deltaChecked waits (within ctx) until the delta check has compared every revision up to rev
// and says what it covered.
func (r *runner) deltaChecked(ctx context.Context, rev int64) (string, error) {
	c := r.repl.check
	if c == nil {
		if v := r.j.Verified; v != nil && v.Revision == 0 {
			// A journal of a kubefence before the delta check does not say where the verify was.
			return "the changes since the full verify were not compared (its journal does not say at which revision it ran)", nil
		}
		return "", errors.New("the changes since the full verify are not being compared in this process: not switching")
	}
	if err := c.WaitFor(ctx, rev); err != nil {
		return "", fmt.Errorf("comparing %s's changes with %s's since the full verify: %w", r.to.name, r.from.name, err)
	}
	if rev == c.From() {
		return fmt.Sprintf("nothing changed since the full verify at revision %d", rev), nil
	}
	return fmt.Sprintf("revisions %d-%d identical in both etcds' histories, change for change", c.From()+1, rev), nil
}

// stopReplication stops the replicator (if this process runs one) and closes its clients; it
// returns where it stood and why it had stopped, if it had before, with a difference the delta
// check found (in blue's last revisions, after the switch, only this says so).
func (r *runner) stopReplication() (replicate.Progress, error) {
	rp := r.repl
	if rp == nil {
		return replicate.Progress{}, nil
	}
	r.repl = nil
	var checkErr error
	if rp.check != nil {
		rp.check.Stop()
		if err := rp.check.Err(); err != nil {
			checkErr = fmt.Errorf("comparing %s's changes with %s's: %w", rp.dstName, rp.srcName, err)
		}
	}
	rp.cancel()
	<-rp.done
	prog := rp.rep.Progress()
	if rp.release != nil {
		rp.release()
	}
	rp.src.Close()
	rp.dst.Close()
	if rp.err != nil && !errors.Is(rp.err, context.Canceled) {
		return prog, errors.Join(rp.err, checkErr)
	}
	return prog, checkErr
}

// stopReplicationLogged stops replication where its error changes nothing (an abort): it is
// logged.
func (r *runner) stopReplicationLogged() {
	if _, err := r.stopReplication(); err != nil && r.o.Log != nil {
		r.o.Log.Warn("replication had stopped with an error", "err", err)
	}
}

// caughtUp waits until dst (green in a cutover) has src's revision as of the call (read
// linearizable), applied by the replicator (waitCaughtUp), and returns dst's revision then. A
// dst whose lag grows through catchUpPatience fails it at once (notCatchingUpError).
func (r *runner) caughtUp(ctx context.Context) (int64, error) {
	if err := r.replicationAlive(); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	watching := make(chan struct{})
	progress, src, dst := r.repl.rep.Progress, r.from.name, r.to.name
	go func() {
		defer close(watching)
		watchCatchUp(ctx, cancel, progress, catchUpSampleEvery, catchUpPatience, src, dst)
	}()
	rev, err := r.waitCaughtUp(ctx)
	cancel(nil)
	<-watching
	// The watch's cause replaces only the error its cancel made (a read of a revision answers
	// context.Canceled, without the cause); any other error keeps its kind (a compaction, say).
	var behind *notCatchingUpError
	if err != nil && !errors.As(err, &behind) && errors.Is(err, context.Canceled) && errors.As(context.Cause(ctx), &behind) {
		return 0, behind
	}
	return rev, err
}

// waitCaughtUp is caughtUp's wait, without the watch on the lag: blue's revision, read now
// (linearizable), applied to green; it returns green's revision then, d, at least that, and
// applied by the replicator too. Not an instant at which the two revisions are equal: blue
// written steadily (the node heartbeats a fence policy lets through the window) keeps green a
// few revisions behind, and such an instant may not come within the window. Blue's later
// revisions are the replicator's too, until it stops (stop-replication takes blue's last).
func (r *runner) waitCaughtUp(ctx context.Context) (int64, error) {
	rp := r.repl
	target, err := replicate.Revision(ctx, rp.src)
	if err != nil {
		return 0, fmt.Errorf("%s's revision: %w", r.from.name, err)
	}
	if err := rp.rep.WaitFor(ctx, target); err != nil {
		return 0, err
	}
	d, err := replicate.Revision(ctx, rp.dst)
	if err != nil {
		return 0, fmt.Errorf("%s's revision: %w", r.to.name, err)
	}
	s, err := replicate.Revision(ctx, rp.src)
	if err != nil {
		return 0, fmt.Errorf("%s's revision: %w", r.from.name, err)
	}
	if d > s {
		return 0, fmt.Errorf("%w: %s is at revision %d, past %s's %d: something wrote to %s", replicate.ErrRevisionMismatch, r.to.name, d, r.from.name, s, r.to.name)
	}
	// d may not be the replicator's: something else may have written to green as blue moved
	// on. The replicator checks green's revision after each revision it applies, so once it
	// has applied d, d is its own (or it stopped on the mismatch).
	if err := rp.rep.WaitFor(ctx, d); err != nil {
		return 0, err
	}
	return d, nil
}

// progressLine says where replication from r.from into r.to stands.
func (r *runner) progressLine(p replicate.Progress) string {
	return progressLine(p, r.from.name, r.to.name)
}

// progressLine says where replication from src into dst stands.
func progressLine(p replicate.Progress, src, dst string) string {
	line := fmt.Sprintf("%s at revision %d, %s at %d (lag %d revisions, %.1fs); %d revisions applied (%.0f/s), %d leases kept alive",
		dst, p.Applied, src, p.Source, p.LagRevisions, p.LagSeconds, p.Revisions, p.RevisionsPerSecond, p.Leases)
	if p.Resent > 0 || p.Resyncs > 0 || p.LeaseWaits > 0 {
		line += fmt.Sprintf("; %d txns sent again (proposed before their predecessor), pipeline drained %d times (%d resyncs, %d lease grants)", p.Resent, p.Resyncs+p.LeaseWaits, p.Resyncs, p.LeaseWaits)
	}
	if p.BacklogPauses > 0 {
		line += fmt.Sprintf("; %s's watch paused %d times: %s fell behind by more than the backlog bound (%d bytes waiting now)", src, p.BacklogPauses, dst, p.BacklogBytes)
	}
	return line
}

// side is one of the two clusters as replication sees it: r.from, the one writes move away from
// (blue in a cutover, green in a rollback), and r.to, the one they move to.
type side struct {
	name string
	etcd datadir.ConnSpec
	api  APIServerRef
}

func (p *Plan) blueSide() side {
	return side{name: "blue", etcd: p.Blue.Etcd.EtcdClientSpec, api: p.Blue.APIServer}
}

func (p *Plan) greenSide() side {
	return side{name: "green", etcd: p.greenConn(), api: p.Green.APIServer.APIServerRef}
}
