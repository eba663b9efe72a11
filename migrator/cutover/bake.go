package cutover

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// The bake (bake.enabled, docs/rollback.md): the window of a replicating cutover also gates
// blue's apiserver (read-only on blue etcd) and hands replication over to the other direction,
// so that after the unfence blue follows green revision for revision. `cutover rollback`
// (rollback.go) goes back through the same window in reverse; `cutover finish` ends the bake.

// Step names of a baking cutover, besides mode replicate's.
const (
	StepBlueAuth   = "blue-etcd-auth"
	StepGateBlue   = "gate-blue"
	StepHandOver   = "reverse-replication"
	StepGateGreen  = "gate-green"
	StepUngateBlue = "ungate-blue"
)

// bakeSteps is a replicating cutover that keeps a way back: blue etcd's auth is set up before
// the fence; after the switch blue's apiserver is gated and replication turns around before
// green's apiserver may write.
var bakeSteps = []step{
	preflightStep{},
	copyStep{},
	migrateStep{},
	greenEtcdStep{},
	holdsGreenLeases{greenAuthStep{}},
	holdsGreenLeases{blueAuthStep{}},
	replicateStep{},
	needsReplication{greenAPIServerStep{}},
	needsReplication{replicaVerifyStep{}},
	needsReplication{fenceStep{}},
	needsReplication{drainStep{}},
	replicaSwitchStep{},
	gateStep{StepGateBlue},
	handOverStep{},
	ungateStep{StepUngateGreen},
	unfenceStep{},
}

// Blue must take any revision of green as one txn, as green takes blue's (replicationEtcdArgs):
// nested, as replication sends it, it needs etcd's default --max-txn-ops, and requests as large
// as green takes (its --max-request-bytes, less the probe's own framing).
const blueMinRequestSize = greenMaxRequestBytes - 64<<10

// blueAuthStep turns etcd auth on in blue, before the fence: kubefence's client certificate is
// root, blue apiserver's user reads and writes as before (the gate after the switch takes
// writing away). It first checks that blue takes green's revisions as single txns, and after
// enabling auth that blue's apiserver is still ready; if not, auth is turned off again.
type blueAuthStep struct{}

func (blueAuthStep) name() string                  { return StepBlueAuth }
func (blueAuthStep) timeout(p *Plan) time.Duration { return p.Timeouts.Preflight.D() }
func (blueAuthStep) pastNoReturn() bool            { return false }

func (blueAuthStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("check blue etcd takes txns of %d operations and of %d bytes; blue etcd auth: users root and kubefence's client certificate CN with role root, user %s (blue apiserver) with role %s; auth enable; check blue's apiserver is still ready (else auth disable)",
		replicate.TxnOps, blueMinRequestSize, r.p.Blue.APIServer.EtcdUser, readWriteRole)
}

func (blueAuthStep) run(ctx context.Context, r *runner) (string, error) {
	self, err := certCN(r.p.Blue.Etcd.CertFile)
	if err != nil {
		return "", fmt.Errorf("blue.etcd.certFile: %w", err)
	}
	cli, err := newEtcdClient(r.p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	if err := checkTxnLimits(ctx, cli); err != nil {
		return "", err
	}
	user := r.p.Blue.APIServer.EtcdUser
	on, err := authOn(ctx, cli)
	if err != nil {
		return "", fmt.Errorf("blue etcd auth status: %w", err)
	}
	if !on && !r.j.BlueAuthEnabled {
		// Journaled before auth goes on: an abort turns it off again (abortBlueAuth).
		r.j.BlueAuthEnabled = true
		if err := r.saveJournal(); err != nil {
			return "", err
		}
	}
	if err := setupAuth(ctx, cli, "blue", self, user, readWriteRole, nil); err != nil {
		return "", err
	}
	if err := blueReadyWithAuth(ctx, cli, r.p.Blue.APIServer.Kubeconfig, user, r.j.BlueAuthEnabled); err != nil {
		return "", err
	}
	return fmt.Sprintf("auth on: %q root, %q read-write; blue's apiserver ready", self, user), nil
}

// checkBlueBakeCert (preflight) refuses, with a bake, a blue.etcd.certFile that cannot be
// blue etcd's root user: one without a CN, or with blue's apiserver etcd user as its CN (the
// gate would bind root's role to blue's apiserver). The blue-etcd-auth step would refuse it
// too, but only after the copy and green's start.
func checkBlueBakeCert(p *Plan) error {
	if !p.Bake.Enabled {
		return nil
	}
	cn, err := certCN(p.Blue.Etcd.CertFile)
	if err != nil {
		return fmt.Errorf("blue.etcd.certFile: %w", err)
	}
	if cn == p.Blue.APIServer.EtcdUser {
		return fmt.Errorf("blue.etcd.certFile %s has CN %q, the same as blue.apiserver.etcdUser: with bake.enabled kubefence's certificate becomes blue etcd's root user; give kubefence a certificate of its own (kubeadm's healthcheck-client)", p.Blue.Etcd.CertFile, cn)
	}
	return nil
}

// blueReadyWithAuth waits for blue's apiserver to be ready with etcd auth on. If it is not, auth
// is turned off again when ours (this cutover turned it on), even once ctx has ended: an auth
// the operator (or a rolled-back cutover) turned on stays.
func blueReadyWithAuth(ctx context.Context, cli *clientv3.Client, kubeconfig, user string, ours bool) error {
	err := waitReady(ctx, kubeconfig)
	if err == nil {
		return nil
	}
	err = fmt.Errorf("blue's apiserver is not ready with etcd auth on (is %q the CN of its etcd client certificate? blue.apiserver.etcdUser): %w", user, err)
	if !ours {
		return fmt.Errorf("%w; auth stays on, as it was before this cutover", err)
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, derr := cli.AuthDisable(dctx); derr != nil {
		return errors.Join(err, fmt.Errorf("turning blue etcd's auth off again: %w", derr))
	}
	return fmt.Errorf("%w; auth turned off again", err)
}

// abortBlueAuth turns blue etcd's auth off again if this cutover turned it on (an abort before
// the switch: blue goes on as it was).
// blueAuthAbortTimeout bounds an abort's turning blue etcd's auth off: it runs after writes
// reopened, often as an operator's abort with no deadline of its own, and a blue etcd that
// takes the connection and never answers must not keep it waiting. A variable for the tests.
var blueAuthAbortTimeout = 30 * time.Second

func (r *runner) abortBlueAuth(ctx context.Context) error {
	if !r.j.BlueAuthEnabled {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, blueAuthAbortTimeout)
	defer cancel()
	cli, err := newEtcdClient(r.p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		return err
	}
	defer cli.Close()
	self, err := certCN(r.p.Blue.Etcd.CertFile)
	if err != nil {
		return err
	}
	if err := authOff(ctx, cli, self); err != nil {
		return err
	}
	r.j.BlueAuthEnabled = false
	return nil
}

// authOff turns etcd's auth off and removes kubefence's own user self, which has the root role:
// left behind, it would be root again whenever someone turned auth on. Either failing is the
// abort's failure, run again.
func authOff(ctx context.Context, cli clientv3.Auth, self string) error {
	if _, err := cli.AuthDisable(ctx); err != nil {
		return fmt.Errorf("turning blue etcd's auth off again (the cutover turned it on): %w", err)
	}
	if _, err := cli.UserDelete(ctx, self); err != nil && !errors.Is(rpctypes.Error(err), rpctypes.ErrUserNotFound) {
		return fmt.Errorf("removing kubefence's user %q from blue etcd (auth is off; run the abort again): %w", self, err)
	}
	return nil
}

// authOn says whether etcd's auth is enabled. etcd 3.4 has no AuthStatus: there an
// authentication as a user no one has is refused as "auth not enabled" or as "failed".
func authOn(ctx context.Context, cli clientv3.Auth) (bool, error) {
	st, err := cli.AuthStatus(ctx)
	if err == nil {
		return st.Enabled, nil
	}
	if status.Code(err) != codes.Unimplemented {
		return false, err
	}
	// etcd 3.4: authenticating as nobody says which, whatever users exist.
	_, err = cli.Authenticate(ctx, "kubefence-auth-probe", "not a password")
	switch rpctypes.Error(err) {
	case rpctypes.ErrAuthNotEnabled:
		return false, nil
	case rpctypes.ErrAuthFailed:
		return true, nil
	}
	return false, fmt.Errorf("etcd auth: is it on? (asked by authenticating as nobody): %w", err)
}

// checkBlueTxnLimits (preflight) checks, with a bake, that blue takes green's revisions as
// single txns (checkTxnLimits), before anything is copied; a rehearsal checks it too.
func checkBlueTxnLimits(ctx context.Context, p *Plan) error {
	if !p.Bake.Enabled {
		return nil
	}
	cli, err := newEtcdClient(p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		return fmt.Errorf("blue etcd: %w", err)
	}
	defer cli.Close()
	return checkTxnLimits(ctx, cli)
}

// checkTxnLimits asks blue for a txn of replicate.TxnOps comparisons and one of
// blueMinRequestSize bytes; both only compare (no revision), and etcd refuses them before
// reading anything if its --max-txn-ops or --max-request-bytes is lower.
func checkTxnLimits(ctx context.Context, cli *clientv3.Client) error {
	cmps := make([]clientv3.Cmp, replicate.TxnOps)
	for i := range cmps {
		cmps[i] = clientv3.Compare(clientv3.Version(replicate.ProbeKey), "=", 0)
	}
	_, err := cli.Txn(ctx).If(cmps...).Commit()
	if errors.Is(rpctypes.Error(err), rpctypes.ErrTooManyOps) {
		return fmt.Errorf("blue etcd refuses a txn of %d operations: run it with --max-txn-ops %d (etcd's default) or more, so that it can take any green revision as one txn while it follows green", replicate.TxnOps, replicate.TxnOps)
	}
	if err != nil {
		return fmt.Errorf("blue etcd: %w", err)
	}
	big := strings.Repeat("x", blueMinRequestSize)
	_, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(replicate.ProbeKey), "=", big)).Commit()
	// etcd refuses a request above --max-request-bytes itself, or gRPC does, above that plus
	// etcd's allowance for framing ("received message larger than max"): both are the flag.
	if errors.Is(rpctypes.Error(err), rpctypes.ErrRequestTooLarge) || status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("blue etcd refuses a request of %d bytes: run it with --max-request-bytes %d (green's, or more) so that it can take any green revision as one txn while it follows green", blueMinRequestSize, greenMaxRequestBytes)
	}
	if err != nil {
		return fmt.Errorf("blue etcd: %w", err)
	}
	return nil
}

// readyPatience is how long waitReady waits; a variable for the tests.
var readyPatience = 15 * time.Second

// waitReady waits up to readyPatience for an apiserver's /readyz; it returns the last answer's
// error, not the wait's end, when one came.
func waitReady(ctx context.Context, kubeconfig string) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, readyPatience, true, func(ctx context.Context) (bool, error) {
		err := readyz(ctx, kubeconfig)
		if err == nil || ctx.Err() == nil {
			last = err // not an attempt the wait's end cut short
		}
		return err == nil, nil
	})
	if err != nil && last != nil {
		return last
	}
	return err
}

// handOverStep turns replication around after blue's apiserver was gated: green catches up with
// blue (whose revision no longer moves, but for its own lease expiries, which blue's leases
// being kept alive from here stops), replication of blue into green stops, and replication of
// green into blue starts from that revision, before green's apiserver may write (invariant
// blue-follows-exactly).
type handOverStep struct{}

func (handOverStep) name() string                  { return StepHandOver }
func (handOverStep) timeout(p *Plan) time.Duration { return p.Timeouts.Switch.D() }
func (handOverStep) pastNoReturn() bool            { return true }

func (handOverStep) describe(*runner, bool) string {
	return "keep blue's leases alive, let green catch up with blue, stop replicating blue into green, start replicating green into blue from that revision (the bake)"
}

func (handOverStep) run(ctx context.Context, r *runner) (string, error) {
	if r.j.NoBake != "" {
		// As stop-replication: blue's last revisions go to green first (picked up again after
		// a --resume), then replication stops.
		picked, ok := r.pickUpAfterSwitch(ctx)
		detail := "skipped, NO WAY BACK: " + r.j.NoBake + "; replication "
		if ok {
			detail += r.stoppedAfterSwitch(r.applyBlueLast(ctx))
		} else {
			detail += "not running"
		}
		if picked != "" {
			detail += "; " + picked
		}
		return detail, nil
	}
	if r.j.Bake != nil {
		// Handed over before the process stopped (startBake journaled it; the step was not
		// recorded): blue follows green from the bake's revision, which the bake picks up. Not
		// again: green has written since, and blue into green would find green past blue.
		_, _ = r.stopReplication()
		return fmt.Sprintf("green and blue at revision %d, handed over before the process stopped; blue follows green from there once the bake picks replication up", r.j.Bake.Revision), nil
	}
	wctx, cancel := r.bakeContext(ctx)
	defer cancel()
	rev, err := r.handOver(wctx)
	if err != nil {
		_, _ = r.stopReplication()
		return r.forgoBake(fmt.Errorf("blue cannot follow green: %w", err)) + " (its apiserver may only read blue etcd)", nil
	}
	return fmt.Sprintf("green and blue at revision %d; blue follows green from here", rev), nil
}

// bakeStepFloor is the least time a bake step past the switch gets, whatever is left of the
// window: the steps take milliseconds, and a switch that used the budget up (a slow drain of
// watches) should not cost the way back for them.
const bakeStepFloor = 2 * time.Second

// bakeContext bounds a step past the switch that only keeps the way back (gate-blue,
// reverse-replication, the rollback's last catch-up) by the window's budget from the fence, but
// at least bakeStepFloor from now; in a run resumed inside its window (resumedFenced: the stop
// kept writes fenced anyway), at least one more timeouts.window, so that a resume does not give
// the way back up only for coming late.
func (r *runner) bakeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	least := bakeStepFloor
	if r.resumedFenced {
		least = r.p.Timeouts.Window.D()
	}
	deadline := r.windowEnd()
	if floor := time.Now().Add(least); floor.After(deadline) {
		deadline = floor
	}
	return context.WithDeadline(ctx, deadline)
}

// forgoBake gives the way back up, past the switch with writes fenced: going on without a bake
// beats staying fenced. It returns the step's detail.
func (r *runner) forgoBake(why error) string {
	r.j.Bake, r.j.NoBake = nil, why.Error()
	return fmt.Sprintf("NO WAY BACK: %s; the cutover finishes without a bake: green serves, blue stays as it was at the switch (its apiserver may have lost its right to write blue etcd)", r.j.NoBake)
}

// handOver turns replication around (handOverStep) and returns the bake's revision.
func (r *runner) handOver(ctx context.Context) (int64, error) {
	if _, err := r.ensureReplication(ctx); err != nil {
		return 0, err
	}
	blueCli, err := newEtcdClient(r.p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		return 0, err
	}
	// The leases are kept alive until the bake's replication takes them over (or the hand-over
	// fails); only listing them is bounded by ctx.
	release, err := replicate.HoldLeases(context.Background(), ctx, blueCli, r.o.Log)
	if err != nil {
		blueCli.Close()
		return 0, err
	}
	hold := func() { release(); blueCli.Close() }
	rev, err := r.caughtUpQuiet(ctx)
	if err != nil {
		hold()
		return 0, err
	}
	prog, err := r.stopReplication()
	r.j.ReplicationAtStop = &prog
	if err == nil && prog.Applied != rev {
		err = fmt.Errorf("%w: replication stopped at revision %d, not %d", replicate.ErrRevisionMismatch, prog.Applied, rev)
	}
	if err != nil {
		hold()
		return 0, fmt.Errorf("replication of blue into green, stopping: %w", err)
	}
	return rev, r.startBake(ctx, rev, hold)
}

// caughtUpQuiet is caughtUp on a blue nothing writes any more (gated), where replication stops
// at a revision blue is at: until blue's revision, read again, is the one green caught up with
// (a lease blue expired before the hold is revoked on blue a moment later), within ctx.
func (r *runner) caughtUpQuiet(ctx context.Context) (int64, error) {
	for {
		rev, err := r.caughtUp(ctx)
		if err != nil {
			return 0, err
		}
		s, err := replicate.Revision(ctx, r.repl.src)
		if err != nil {
			return 0, fmt.Errorf("%s's revision: %w", r.from.name, err)
		}
		if s == rev {
			return rev, nil
		}
	}
}

// startBake starts replicating green into blue from rev, records the bake in the journal, and
// hands hold (what keeps blue's leases alive until then) to the replication. A journal that
// cannot be written (past the switch: saveWindow) does not cost the bake: it goes on in this
// process, and its report says what the journal lacks (bake).
func (r *runner) startBake(ctx context.Context, rev int64, hold func()) error {
	green, err := newEtcdClient(r.p.greenConn())
	if err != nil {
		hold()
		return err
	}
	blue, err := newEtcdClient(r.p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		green.Close()
		hold()
		return err
	}
	r.progressStep = "bake"
	if err := r.startReplicationOf(green, blue, rev, "green", "blue"); err != nil {
		hold()
		return err
	}
	r.repl.release = hold
	r.j.Bake = &BakeRecord{Revision: rev, Started: time.Now().UTC()}
	return r.saveWindow()
}

// bake is the end of a baking cutover: the process keeps blue following green until it is
// stopped (Ctrl-C, SIGTERM: `cutover rollback` and `cutover finish` stop it that way) or blue
// cannot follow any more. It returns the report of where the bake stands.
func (r *runner) bake(ctx context.Context) (*Report, error) {
	r.from, r.to = r.p.greenSide(), r.p.blueSide()
	r.progressStep = "bake"
	r.noPickup = "blue no longer follows green exactly, so a rollback would lose writes: run 'kubefence cutover finish' (green serves; blue stays as it was)"
	r.retryPickup = "this is not known to be lasting: once both etcds answer, run 'kubefence cutover --resume --plan PLAN' (it checks that blue is still green change for change) " + PickupHorizon + "; 'kubefence cutover finish' gives up the way back"
	if r.j.State != StateBaking {
		r.j.State = StateBaking
		err := r.saveJournal()
		if err != nil && r.journalHasBake() {
			return r.unjournaled(ResultBaking, err)
		}
		rep := r.report(ResultBaking, nil)
		rep.Next = r.bakeAdvice() + r.rolesTakenAdvice()
		if err != nil {
			rep = r.unjournaledBake(err)
		}
		r.emit(Event{Type: EventReport, Report: rep})
	}
	err := followGreen(ctx, r.followOnce, func(err error, d time.Duration) {
		r.emit(Event{Type: EventNote, Step: "bake", Detail: fmt.Sprintf("blue stopped following green (%v); trying again in %s (and on, until it follows or an error is lasting); blue must follow again %s", err, d, PickupHorizon)})
	})
	if err != nil {
		rep := r.report(ResultFailed, fmt.Errorf("blue stopped following green: %w", err))
		rep.Next = r.pickupAdvice(err)
		r.emit(Event{Type: EventReport, Report: rep})
		return rep, err
	}
	rep := r.report(ResultBaking, nil)
	rep.Next = "this process stopped keeping blue in step with green (a signal: 'kubefence cutover rollback' and 'finish' stop it this way). Unless one of them runs now, run 'kubefence cutover --resume --plan PLAN' " + PickupHorizon
	r.emit(Event{Type: EventNote, Step: "bake", Detail: rep.Next})
	return rep, nil
}

// journalHasBake says whether the journal on disk records the bake (a --resume picks it up).
func (r *runner) journalHasBake() bool {
	disk, err := LoadJournal(r.journalDir)
	return err == nil && disk.Bake != nil
}

// unjournaledBake is the report of a bake whose journal could not be written since before its
// record (err): only this process knows that blue follows green (a --resume would hand over
// again, find green past blue, and give the way back up), so it bakes on, and saves the
// journal again when it stops.
func (r *runner) unjournaledBake(err error) *Report {
	rep := r.report(ResultBaking, fmt.Errorf("the journal could not be written: %w", err))
	rep.Next = fmt.Sprintf("writes are open on green (unfenced at %s) and blue follows green from revision %d, but the journal in %s lacks the bake: only this process knows of it, and a 'kubefence cutover --resume' run before the journal is written would give the way back up. Free space in the state dir (or fix its disk), then stop this process (Ctrl-C: it writes the journal as it stops, and says so) and run 'kubefence cutover --resume --plan PLAN' %s. Do not abort, roll back or finish meanwhile",
		r.j.UnfencedAt.Format(time.RFC3339Nano), r.j.Bake.Revision, r.journalDir, PickupHorizon)
	return rep
}

// PickupHorizon is how soon blue must follow green again once no process keeps it in step:
// green's apiserver compacts green's history every --etcd-compaction-interval, and blue can be
// picked up only from a revision green still holds; nor once blue expired, by itself, a lease it
// holds for green (nothing keeps them alive meanwhile): its events' after --event-ttl, but a
// green apiserver with the default endpoint reconciler (the preflight refuses it in the green
// apiservers the cutover starts) keeps one of 15 s.
const PickupHorizon = "within minutes: once green's apiserver compacts green past blue's revision (every --etcd-compaction-interval, 5 min by default), or blue lets a lease it holds for green run out (nothing keeps them alive meanwhile: events' after --event-ttl, 1 h by default; 15 s for the master lease of a green apiserver with the default endpoint reconciler), blue cannot be picked up again and the way back is lost"

// bakeRetryBase and bakeRetryCap are the first and the longest wait of the baking process
// before it tries again to keep blue following green (followGreen). Variables for the tests.
var bakeRetryBase, bakeRetryCap = time.Second, 30 * time.Second

// followGreen keeps blue following green (once follows until ctx ends or replication stops)
// until ctx ends (a signal: 'cutover rollback' and 'finish' stop the baking process so) or an
// error is lasting (lastingPickup: blue no longer green change for change, green compacted past
// blue). Any other error (blue's etcd restarting, its host rebooting, a partition) is tried
// again, the waits doubling up to bakeRetryCap, each one noted: a bake of days rides it out, as
// long as green still holds the history since blue's revision (PickupHorizon), which it would
// not for long once this process had ended.
func followGreen(ctx context.Context, once func(context.Context) error, note func(error, time.Duration)) error {
	b := wait.Backoff{Duration: bakeRetryBase, Factor: 2, Cap: bakeRetryCap, Steps: math.MaxInt32}
	for {
		start := time.Now()
		err := once(ctx)
		if err == nil || ctx.Err() != nil || lastingPickup(err) {
			return err
		}
		if time.Since(start) > bakeRetryCap { // it followed for a while: a new outage
			b = wait.Backoff{Duration: bakeRetryBase, Factor: 2, Cap: bakeRetryCap, Steps: math.MaxInt32}
		}
		d := b.Step()
		note(err, d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// followOnce picks replication of green into blue up (or finds it running) and waits until ctx
// ends or it stops; the position it stopped at is journaled.
func (r *runner) followOnce(ctx context.Context) error {
	picked, err := r.ensureReplication(ctx)
	r.lock.markBaking()
	if err != nil {
		if r.repl != nil {
			// Found stopped (before the bake began, say): cleared, so that the next attempt
			// picks replication up again rather than find it stopped for ever. Its error is err.
			_, _ = r.stopReplication()
		}
		return err
	}
	r.emit(Event{Type: EventNote, Step: "bake", Detail: withNote(picked, "blue follows green: "+r.repl.line(r.repl.rep.Progress()))})
	select {
	case <-ctx.Done():
	case <-r.repl.done:
	}
	prog, err := r.stopReplication()
	r.j.Bake.LastStop = &prog
	return errors.Join(err, r.saveJournal())
}

// bakeAdvice says what an operator can do during the bake.
func (r *runner) bakeAdvice() string {
	const plan = "--plan PLAN"
	return fmt.Sprintf("green serves; blue follows green while 'kubefence cutover --resume %s' runs (this process until stopped). Go back with 'kubefence cutover rollback %s'; end the bake with 'kubefence cutover finish %s'; see the lag with 'kubefence cutover status %s'", plan, plan, plan, plan)
}
