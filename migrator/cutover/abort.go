package cutover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/proxy/admin"
)

// The way back to blue: fail decides what a failed step leads to, abort goes back (invariant
// abort-to-blue), Abort is `kubefence cutover abort`.

// abortTimeout bounds an abort after a failed step.
const abortTimeout = 2 * time.Minute

// afterFailedRollbackAbort is the advice after a rollback's abort (back to green) that did not
// complete: 'cutover abort' refuses a rolling-back cutover, and a fence off by hand could open a
// proxy on blue while the others write green.
// Nothing keeps blue following green meanwhile, and 'cutover --resume' refuses a rolling-back
// cutover: the deadline is said (PickupHorizon).
const afterFailedRollbackAbort = "the rollback's abort did not complete: once every proxy answers ('kubefence fence status'), run 'kubefence cutover rollback --resume': it goes on to blue, or back to green if it cannot. Nothing keeps blue following green meanwhile: run it " + PickupHorizon + " (it then goes back to green, and 'kubefence cutover finish' ends the bake)"

// nextAfterAbort is the advice after an abort that completed.
const nextAfterAbort = "blue serves as before and writes are open; green's data dirs are left for inspection (the next cutover needs them gone: 'kubefence cutover cleanup --plan PLAN --remove-data-dirs' removes them)"

// nextAfterBlueStalled is the advice after an abort that completed, replication having stood
// still because blue's watch delivered nothing: blue's etcd is the one to look at; green is not
// the cause, but a new cutover restores green afresh (its preflight wants green's data dirs
// absent or empty).
const nextAfterBlueStalled = "blue serves as before and writes are open; replication stood still because blue's watch delivered nothing (the error says since when): check blue etcd (its health, its log, the network to it) before running the cutover again. Green is not the cause, but the next cutover restores green afresh and needs its data dirs gone: 'kubefence cutover cleanup --plan PLAN --remove-data-dirs' removes them"

// fail handles a step's error. Before the point of no return it aborts back to blue; from the
// switch on, it aborts too unless the switch reached the proxies (pastSwitch), in which case the
// run stops with advice to --resume. The abort runs on a context of its own: the step may have
// failed because ctx was cancelled (Ctrl-C, SIGTERM), and that must not stop the way back to
// blue.
func (r *runner) fail(ctx context.Context, s step, err error) (*Report, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	var seen *proxiesAt // the abort goes on from this look: a silent proxy is waited for once
	if s.pastNoReturn() {
		// Journaled as switched, some proxies are on r.to even if none answers now: there is
		// no abort from there.
		_, switched := r.j.record(StepSwitch)
		at := r.proxiesAt(ctx)
		if switched || r.pastSwitch(at) {
			rep := r.report(ResultFailed, err)
			rep.Next = r.wayOn(at)
			if r.unsaved != nil {
				rep.Next += fmt.Sprintf("; the journal could not be written since the switch (%v): free space in the state dir (or fix its disk) first", r.unsaved)
			}
			r.emit(Event{Type: EventReport, Report: rep})
			return rep, fmt.Errorf("step %s: %w", s.name(), err)
		}
		seen = &at
	}
	if s.name() == StepPreflight {
		return r.failPreflight(err)
	}
	r.emit(Event{Type: EventAbort, Step: s.name(), Detail: err.Error()})
	abortErr := r.abort(ctx, fmt.Sprintf("step %s failed: %v", s.name(), err), seen)
	rep := r.report(ResultAborted, err)
	r.adviseAfterAbort(rep, err, abortErr)
	r.emit(Event{Type: EventReport, Report: rep})
	var refused *refusal
	var lost *rollbackJournalLost
	switch {
	case errors.As(abortErr, &lost) && !errors.As(abortErr, new(*stillFencedOnGreen)):
		return rep, fmt.Errorf("rollback failed at step %s: %w; aborted back to green (the cutover bakes again), but %w", s.name(), err, abortErr)
	case errors.As(abortErr, &refused):
		return rep, fmt.Errorf("cutover failed at step %s: %w; no way back: %s", s.name(), err, refused.msg)
	case abortErr != nil:
		return rep, fmt.Errorf("cutover failed at step %s: %w; the abort did not complete: %w", s.name(), err, abortErr)
	}
	return rep, fmt.Errorf("cutover aborted at step %s: %w", s.name(), err)
}

// adviseAfterAbort fills rep (an abort's, after err) with what the abort's own error (abortErr)
// leaves to do.
func (r *runner) adviseAfterAbort(rep *Report, err, abortErr error) {
	var refused *refusal
	var still *stillFencedOnGreen
	var lost *rollbackJournalLost
	switch {
	case errors.As(abortErr, &refused):
		rep.Result = ResultFailed
		rep.Error += "; no way back: " + refused.msg
		rep.Next = refused.msg
	case errors.As(abortErr, &still):
		rep.Result = ResultFailed
		rep.Error += "; abort: " + abortErr.Error()
		rep.Next = r.stillFencedAdvice(still.names)
	case errors.As(abortErr, &lost):
		// The cutover's journal says baking, which decides (abortRollback): the bake's advice.
		rep.Error += "; " + abortErr.Error()
		rep.Next = afterRollbackAbort + "; " + lost.advice()
	case abortErr != nil:
		rep.Result = ResultFailed
		rep.Error += "; abort: " + abortErr.Error()
		rep.Next = "the abort did not complete: check 'kubefence fence status', then run 'kubefence cutover abort' again"
		if r.main != nil {
			rep.Next = afterFailedRollbackAbort
		}
	default:
		rep.Next = nextAfterAbort + r.p.leftOnHosts()
		var stall *replicationStalled
		if r.main == nil && errors.As(err, &stall) && stall.onSource {
			rep.Next = nextAfterBlueStalled + r.p.leftOnHosts()
		}
		if r.main != nil {
			rep.Next = afterRollbackAbort
			if r.pickupAdvice(err) == r.noPickup {
				// Lasting: a resume of the bake would fail the same way.
				rep.Next = "green serves as before and writes are open; " + r.noPickup
			}
			if r.othersFence {
				rep.Next = strings.Replace(rep.Next, "writes are open", "writes stay fenced, as they were before the rollback fenced them ('kubefence fence off' reopens them on green)", 1)
			}
		}
	}
}

// failPreflight ends a run whose preflight failed. The preflight changes nothing, so there is
// nothing to abort: what it found (a proxy fenced, ports in use, green processes running) may
// be someone else's, another run of the same plan even, and is left alone.
func (r *runner) failPreflight(err error) (*Report, error) {
	r.j.State, r.j.AbortReason = StateAborted, "preflight failed: "+err.Error()
	if serr := r.saveJournal(); serr != nil {
		err = fmt.Errorf("%w; saving the journal: %w", err, serr)
	}
	rep := r.report(ResultAborted, err)
	rep.Next = "nothing was changed: fix what the preflight names and run the cutover again"
	if r.kept != nil {
		rep.Next = r.restoreKeptJournal()
	}
	r.emit(Event{Type: EventReport, Report: rep})
	return rep, fmt.Errorf("cutover stopped at step %s, nothing was changed: %w", StepPreflight, err)
}

// restoreKeptJournal makes the ended cutover whose journal this run moved aside the state dir's
// again, this run's journal kept beside it: the failed preflight changed nothing, and what it
// found (ports in use, data dirs) is often that cutover's green, which 'cutover cleanup' finds
// only through its journal. This run's journal is written beside first and the old one renamed
// over it then: a crash in between leaves this run's, never none. It returns the advice.
func (r *runner) restoreKeptJournal() string {
	dir, old := r.p.StateDir, r.kept.ID
	err := r.j.saveTo(keptJournalPath(dir, r.j.ID))
	if err == nil {
		err = os.Rename(keptJournalPath(dir, old), journalPath(dir))
	}
	if err == nil {
		err = atomicfile.SyncDir(dir)
	}
	if err != nil {
		return fmt.Sprintf("nothing was changed; putting back the journal of cutover %s failed (%v): move %s back to %s by hand before 'kubefence cutover cleanup' can find what it left; then fix what the preflight names and run the cutover again", old, err, keptJournalPath(dir, old), journalPath(dir))
	}
	return r.keptCleanupAdvice()
}

// keptCleanupAdvice says how to clean up after the ended cutover restoreKeptJournal put back:
// cleanup refuses a plan other than the one it ran with.
func (r *runner) keptCleanupAdvice() string {
	plan := "--plan PLAN"
	if r.kept.PlanHash != r.p.hash {
		plan = "--plan with the plan it ran with (this one changed since; cleanup refuses it)"
	}
	return fmt.Sprintf("nothing was changed; the state dir's journal is cutover %s's again (%s): if the preflight found what it left, 'kubefence cutover cleanup %s' stops its processes (with --remove-data-dirs its green data dirs too); then fix what the preflight names and run the cutover again", r.kept.ID, r.kept.State, plan)
}

// proxiesAt is where the proxies stand against the switch to r.to, from what each one that
// answers reports: one that does not answer hides nothing of the others.
type proxiesAt struct {
	on, off, down []string // on r.to; answering, elsewhere; not answering
	openOn        []string // on r.to, unfenced
	fenced        bool     // one answering is fenced
}

// pastSwitch says the switch reached the proxies (at): every one that answers is on r.to (one
// that does not answer hides nothing). Some on r.to and some not is a switch cut short (a
// crash in the middle of it, an answer lost): it goes back, as the switch itself puts back the
// proxies that took it when another refuses (proxyGroup.switchBack), in every mode. After a
// copy, clients that read through a proxy on green meanwhile may hold green's higher
// resourceVersions: on blue their watches get "too large resource version" and they relist.
func (r *runner) pastSwitch(at proxiesAt) bool {
	return len(at.on) > 0 && len(at.off) == 0
}

// refusal is a way back refused before the abort changed anything; its message says the way
// on.
type refusal struct{ msg string }

func (e *refusal) Error() string { return e.msg }

// fenceOpenOnTarget handles proxies open on r.to when going back (a fence off by hand) before
// anything else is changed: opening r.from as well would let both sides take writes. While
// r.to's apiserver may not write (mode replicate, and a rollback: it is gated until the ungate
// past the switch), nothing reached r.to through them: they are fenced again (refenced), and
// the way back goes on with where the proxies stand then, lifting that fence too. Otherwise
// (after a copy, green's apiserver writes) writes may have reached r.to: a refusal that says
// how to go forward by hand.
func (r *runner) fenceOpenOnTarget(ctx context.Context, at proxiesAt) (_ proxiesAt, refenced bool, _ error) {
	if len(at.openOn) == 0 {
		return at, false, nil
	}
	if r.main == nil && !r.p.Replicating() {
		return at, false, &refusal{fmt.Sprintf("%s is open on %s (a fence off by hand?): writes may have reached %[2]s, and going back would lose them. Go forward by hand: %s, then %s",
			named(at.openOn), r.to.name, r.switchRest(at.off), strings.TrimPrefix(finishByHandOn(r.p, r.to, false), "if it cannot run, "))}
	}
	if err := r.toGated(ctx); err != nil {
		return at, false, &refusal{fmt.Sprintf("%s is open on %s and %v: the window was finished (by a run whose journal could not record its switch and unfence, or by hand), and writes may have reached %[2]s: going back would lose them. %[4]s", named(at.openOn), r.to.name, err, r.resumeInstead())}
	}
	for _, pr := range r.proxyClients() {
		if !slices.Contains(at.openOn, pr.Name) {
			continue
		}
		req := admin.FenceRequest{Fenced: true, Reason: "fenced again before going back to " + r.from.name, Mode: r.p.Proxy.FenceMode, WaitTimeout: admin.Duration(r.p.Proxy.WaitTimeout)}
		if _, err := fenceOf(ctx, pr.Client, req); err != nil {
			return at, true, fmt.Errorf("%s is open on %s (a fence off by hand?) and fencing it again failed: %w; every other proxy stays as it is: run the abort again", named([]string{pr.Name}), r.to.name, err)
		}
	}
	at = r.proxiesAt(ctx)
	if len(at.openOn) > 0 {
		return at, true, fmt.Errorf("%s is still open on %s after it was fenced again: run the abort again", named(at.openOn), r.to.name)
	}
	return at, true, nil
}

// toGated checks what going back through proxies open on r.to rests on (fenceOpenOnTarget):
// r.to's apiserver may not write r.to's etcd, its user lacking the read-write role, so nothing
// reached r.to through them. The ungate past the switch grants it: a run whose journal could not
// be written past its switch (saveWindow) finished the window all the same, and so may an
// operator by hand. An error when it holds the role, or when that cannot be read.
func (r *runner) toGated(ctx context.Context) error {
	user := r.to.api.EtcdUser
	cli, err := r.authClient(r.to)
	if err != nil {
		return fmt.Errorf("whether %s's apiserver may write %s etcd could not be read (%w)", r.to.name, r.to.name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, gatedCheckTimeout)
	defer cancel()
	roles, err := userRoles(ctx, cli, user)
	switch {
	case err != nil:
		return fmt.Errorf("whether %s's apiserver may write %s etcd could not be read (user %s: %w)", r.to.name, r.to.name, user, err)
	case slices.Contains(roles, readWriteRole):
		return fmt.Errorf("%s's apiserver may write %s etcd (user %s holds %s)", r.to.name, r.to.name, user, readWriteRole)
	}
	return nil
}

// gatedCheckTimeout bounds toGated's read, retried through a leader change, while the proxies
// that answered stay fenced.
const gatedCheckTimeout = 5 * time.Second

// resumeInstead is the way on when proxies are open on r.to with its apiserver writing: the
// journal records the switch and the unfence by resuming.
func (r *runner) resumeInstead() string {
	if r.main != nil {
		return "Run 'kubefence cutover rollback --resume --plan PLAN' to record them (blue serves, writes open); to stay on green instead, a new rollback is not possible: blue no longer follows green"
	}
	return "Run 'kubefence cutover --resume --plan PLAN' to record them (green serves, writes open); to go back afterwards, 'kubefence cutover rollback' during a bake (bake.enabled)"
}

// group is the proxies as a proxyGroup.
func (r *runner) group() *proxyGroup {
	if g, ok := r.adm.(*proxyGroup); ok {
		return g
	}
	return &proxyGroup{proxies: r.proxyClients()} // the plan's one proxy
}

// proxyClients are the proxies one by one; the plan's one proxy is unnamed.
func (r *runner) proxyClients() []admin.Target[proxyAdmin] {
	if g, ok := r.adm.(*proxyGroup); ok {
		return g.proxies
	}
	return []admin.Target[proxyAdmin]{{Client: r.adm}}
}

// lookedAt is seen, a look at the proxies made a moment ago, or a look now when there is none.
func (r *runner) lookedAt(ctx context.Context, seen *proxiesAt) proxiesAt {
	if seen != nil {
		return *seen
	}
	return r.proxiesAt(ctx)
}

// proxiesAt asks every proxy where it is (proxiesAt, the type).
func (r *runner) proxiesAt(ctx context.Context) proxiesAt {
	res, _ := admin.Each(ctx, r.proxyClients(), statusOf) // a host gone must not hold the abort
	var at proxiesAt
	to := sameURL(r.to.api.URL)
	for _, pr := range res {
		st := pr.Value
		switch {
		case pr.Err != nil:
			at.down = append(at.down, pr.Proxy)
			continue
		case sameURL(st.Backend) == to:
			at.on = append(at.on, pr.Proxy)
			if !st.Fenced {
				at.openOn = append(at.openOn, pr.Proxy)
			}
		default:
			at.off = append(at.off, pr.Proxy)
		}
		at.fenced = at.fenced || st.Fenced
	}
	return at
}

// named names proxies in a message; the plan's one proxy, unnamed, is "the proxy".
func named(names []string) string {
	switch {
	case len(names) == 1 && names[0] == "":
		return "the proxy"
	case len(names) == 1:
		return "proxy " + names[0]
	}
	return "proxies " + strings.Join(names, ", ")
}

// wayOn is the advice when a step fails once the switch reached a proxy (at): finish with
// --resume, once the proxies that do not answer are back and those the switch missed are on
// r.to; or by hand.
func (r *runner) wayOn(at proxiesAt) string {
	next := "the proxies were switched to " + r.to.name
	if len(at.on) > 0 && len(at.down)+len(at.off) > 0 {
		next = fmt.Sprintf("the switch reached %s (on %s)", named(at.on), r.to.name)
	}
	switch {
	case len(at.down) > 0:
		next += fmt.Sprintf("; %s did not answer: once every proxy answers, run the same command again with --resume to finish (unfence)", named(at.down))
	case len(at.off) > 0:
		next += fmt.Sprintf("; it missed %s: finish the switch there (%s), then run the same command again with --resume to finish (unfence)", named(at.off), r.switchRest(at.off))
	default:
		next += "; fix the cause and run the same command again with --resume to finish (unfence)"
	}
	if r.main == nil {
		return next + "; " + finishByHand(r.p, r.j)
	}
	return next + "; " + finishRollbackByHand(r.p, r.j)
}

// switchRest is the command that points the proxies named off at r.to, as an operator types it.
func (r *runner) switchRest(off []string) string {
	return r.commandsFor(off, "backend set", r.to.api.URL)
}

// commandsFor is the command 'kubefence verb url' for each of the proxies named, as an operator
// types it.
func (r *runner) commandsFor(names []string, verb, url string) string {
	cmds := r.p.proxyCommands(verb, url)
	var rest []string
	for i, pr := range r.p.proxyRefs() {
		if slices.Contains(names, pr.name()) || slices.Contains(names, "") || slices.Contains(names, pr.AdminSocket) {
			rest = append(rest, cmds[i])
		}
	}
	if len(rest) == 0 {
		return "'kubefence " + verb + " " + url + "' on each"
	}
	return "'" + strings.Join(rest, "', '") + "'"
}

// finishByHand is what an operator does past the switch when --resume cannot run: what the
// steps still to run would do, by hand. In mode replicate green's apiserver may only read until
// ungate-green: a bare fence off would reopen writes onto a green that answers each one 500.
func finishByHand(p *Plan, j *Journal) string {
	advice := finishByHandOn(p, p.greenSide(), p.Replicating() && !j.done(StepUngateGreen))
	if p.Replicating() && !j.done(StepUngateGreen) && p.Bake.Enabled && !j.done(StepHandOver) {
		advice += "; blue then no longer follows green: the bake's way back is lost"
	}
	return advice
}

// finishRollbackByHand is finishByHand for a rollback past its switch (rj, the rollback's
// journal): blue's apiserver may only read blue etcd until ungate-blue.
func finishRollbackByHand(p *Plan, rj *Journal) string {
	return finishByHandOn(p, p.blueSide(), !rj.done(StepUngateBlue))
}

// finishByHandOn is the advice that reopens writes on side to by hand: its apiserver's etcd
// user gets read-write first while it is still gated, then each proxy's fence goes off where
// it is on to.
func finishByHandOn(p *Plan, to side, gated bool) string {
	fenceOff := "'" + strings.Join(p.proxyCommands("fence off --expect-backend", to.api.URL), "', '") + "'"
	if !gated {
		return "if it cannot run, " + fenceOff + " reopens writes where the proxy is on " + to.name
	}
	c := to.etcd
	grant := fmt.Sprintf("'etcdctl --endpoints %s --cacert %s --cert %s --key %s user grant-role %s %s' (%s's apiserver may only read until then: every write would fail)",
		strings.Join(c.Endpoints, ","), c.CAFile, c.CertFile, c.KeyFile, to.api.EtcdUser, readWriteRole, to.name)
	return "if it cannot run, first " + grant + ", then " + fenceOff
}

// abort stops green and unfences blue, unless the proxy already points at green. seen is where
// the proxies stood a moment ago (fail's look), nil when nobody looked: one that did not answer
// then is not waited for again (statusAnswerTimeout) while the others stay fenced.
func (r *runner) abort(ctx context.Context, reason string, seen *proxiesAt) error {
	if r.main != nil {
		return r.abortRollback(ctx, reason, seen)
	}
	if rec, ok := r.j.record(StepSwitch); ok {
		return &refusal{fmt.Sprintf("cutover %s switched to green at %s: there is no going back by abort. Run 'kubefence cutover --resume --plan PLAN' to finish it (writes reopen on green); %s. To go back afterwards: 'kubefence cutover rollback' during a bake (bake.enabled), else a new cutover from green", r.j.ID, rec.Started.Format(time.RFC3339), finishByHand(r.p, r.j))}
	}
	// A proxy that cannot be reached does not stop the others from going back to blue: they
	// are unfenced (all on blue, so no split brain), and the abort is reported incomplete. Not
	// when those that answer say the switch reached them.
	at, refenced, err := r.fenceOpenOnTarget(ctx, r.lookedAt(ctx, seen))
	if err != nil {
		return err
	}
	// A proxy fenced again was changed by hand since the switch reached it: --resume, whose
	// switch checks the fence's generation, would refuse it; green being gated, back it goes.
	if r.pastSwitch(at) && !refenced {
		if err := r.backFromGreenFenced(at); err != nil {
			return err
		}
	}
	// Write-ahead: a run killed from here on is no cutover to resume (green may be stopped and
	// its steps would wait for it), but an abort to finish. An abort finishing one keeps the
	// first reason.
	if r.j.AbortReason == "" {
		r.j.AbortReason = reason
		if err := r.saveJournal(); err != nil && r.o.Log != nil {
			r.o.Log.Warn("journaling the abort before it starts failed; aborting anyway", "err", err)
		}
	}
	// Only a fence this run placed is lifted: its time is journaled before it is sent, so none
	// journaled means one on now is someone else's (an operator's, around a rehearsal), unless
	// this abort placed it (refenced); so does one journaled as lifted (an abort run again).
	fenced := (len(at.down) > 0 || at.fenced) && (r.ownFence() || refenced)
	unfence := func() error {
		if fenced {
			// Right before the unfence, so that a proxy coming back meanwhile is looked at too;
			// not one found silent above (one wait for it is enough: unlooked at, it stays
			// fenced, the unfence expecting blue).
			if err := r.proxiesBack(ctx, at.down); err != nil {
				return err
			}
			// Expecting blue: a proxy that could not be looked at just before stays fenced
			// unless it is on blue.
			if err := r.unfenceBack(ctx); err != nil {
				return fmt.Errorf("unfence: %w; the proxies that answered are open on blue: run 'kubefence cutover abort' again once every proxy is back", err)
			}
			fenced = false
		}
		return nil
	}
	// The proxies are unfenced first, in every mode: they are on blue, which serves either way,
	// and writes must not wait for the replicator's txns in flight (up to their timeout each) or
	// for green's processes to stop (up to 30 s of grace each; an apiserver whose etcd failed is
	// the slow kind). A green process that will not stop makes the abort incomplete.
	unfenceErr := unfence()
	if r.p.Replicating() {
		r.stopReplicationLogged()
		r.releaseGreenHold()
	}
	_, stopErr := r.stopGreen()
	if err := errors.Join(unfenceErr, stopErr); err != nil {
		return err
	}
	if err := r.abortBlueAuth(ctx); err != nil {
		return err
	}
	r.j.State = StateAborted
	return r.saveJournal()
}

// backFromGreenFenced answers an abort that finds the switch reached a proxy (at), with no
// switch journaled. Without an abort under way that is a switch made before a crash: --resume
// finishes it. With one (the switch's answer lost, the proxies unreachable, green stopped
// since), --resume is refused, so the abort goes on, in mode replicate: green is blue revision
// for revision and its apiserver was gated, so nothing but blue's writes is on green, and
// proxiesBack puts every proxy still fenced back on blue before the unfence. Not in a mode that
// restored green with revisions above blue's: clients reading through the proxies may hold
// those.
func (r *runner) backFromGreenFenced(at proxiesAt) error {
	reached := fmt.Sprintf("the switch reached %s before it was journaled (on green)", named(at.on))
	if len(at.down) > 0 {
		reached += fmt.Sprintf(", and %s did not answer", named(at.down))
	}
	switch {
	case !r.j.aborting():
		return &refusal{fmt.Sprintf("%s: run with --resume to finish instead", reached)}
	case !r.p.Replicating():
		return &refusal{fmt.Sprintf("%s; an abort is under way, but green was restored with revisions above blue's, which clients reading through the proxies may hold: going back would hand them resourceVersions blue has not reached. Go forward (start green's etcd and apiserver again, then on each proxy 'kubefence backend set %[2]s' if it is not on green, and 'kubefence fence off --expect-backend %[2]s'), or back by hand ('kubefence backend set %[3]s', then 'kubefence fence off --expect-backend %[3]s' on each proxy) and restart the clients that watch", reached, r.p.Green.APIServer.URL, r.from.api.URL)}
	}
	return nil
}

// ownFence says a fence on now may be this run's: one was journaled, and not its lifting.
func (r *runner) ownFence() bool { return !r.j.FencedAt.IsZero() && r.j.UnfencedAt.IsZero() }

// unfenceBack lifts the fence of every proxy, each only where it is on r.from (an abort going
// back). One that does not acknowledge stays fenced while the others reopen: which ones is
// journaled at once (StillFenced), for status to name, and cleared once every one is open
// (journalUnfenced).
func (r *runner) unfenceBack(ctx context.Context) error {
	req := admin.FenceRequest{Fenced: false, ExpectBackend: r.from.api.URL}
	var res []admin.Result[admin.FenceResponse]
	var err error
	if g, ok := r.adm.(*proxyGroup); ok { // as its Fence, with each proxy's answer
		res, err = admin.Each(ctx, g.proxies, func(ctx context.Context, c proxyAdmin) (admin.FenceResponse, error) {
			return fenceOf(ctx, c, req)
		})
	} else { // the plan's one proxy
		_, err = r.adm.Fence(ctx, req)
		res = []admin.Result[admin.FenceResponse]{{Err: err}}
	}
	if err == nil {
		r.journalUnfenced()
		return nil
	}
	r.j.StillFenced = nil
	for _, pr := range res {
		if pr.Err != nil {
			r.j.StillFenced = append(r.j.StillFenced, cmp.Or(pr.Proxy, r.p.Proxy.AdminSocket, "the proxy"))
		}
	}
	if serr := r.saveJournal(); serr != nil && r.o.Log != nil {
		r.o.Log.Warn("journaling which proxies stay fenced failed; the abort goes on", "err", serr)
	}
	return err
}

// journalUnfenced journals, at once, that an abort reopened writes: the abort may not get to its
// end (a green process that will not stop), and status must not say writes are fenced
// meanwhile. A failed save is logged: the abort goes on.
func (r *runner) journalUnfenced() {
	r.markUnfenced()
	r.j.StillFenced = nil
	if err := r.saveJournal(); err != nil && r.o.Log != nil {
		r.o.Log.Warn("journaling the unfence failed; the abort goes on", "err", err)
	}
}

// proxiesBack puts every proxy back on the side the run came from before an abort unfences
// them (proxyGroup.putFencedOn), but those in silent (found so just before); if one cannot be,
// all stay fenced. One open away from it is the abort's to have found before (fenceOpenOnTarget).
func (r *runner) proxiesBack(ctx context.Context, silent []string) error {
	if _, err := r.group().putFencedOn(ctx, r.from.api, silent); err != nil {
		return fmt.Errorf("%w; every proxy stays fenced: run the abort again", err)
	}
	return nil
}

// leftOnHosts names, for the advice after an abort, the green processes other hosts started,
// which kubefence does not stop ("" if none).
func (p *Plan) leftOnHosts() string {
	left := p.startedByHosts()
	if len(left) == 0 {
		return ""
	}
	return "; their hosts started " + strings.Join(left, ", ") + ", which kubefence does not stop: stop them there"
}

// startedByHosts are the green processes other hosts start: green.apiservers without a
// command, external etcd members.
func (p *Plan) startedByHosts() []string {
	var left []string
	for _, a := range p.Green.APIServers {
		if len(a.Command) == 0 {
			left = append(left, "green apiserver "+a.URL)
		}
	}
	for _, m := range p.Green.Etcd.Members {
		if m.External {
			left = append(left, "green etcd member "+m.Name)
		}
	}
	return left
}

// stopGreen stops green's apiserver (or removes the static pod manifest the cutover placed,
// and only it) and its etcd members; it returns what it stopped or removed.
func (r *runner) stopGreen() ([]string, error) {
	var stopped []string
	var errs []error
	a := r.p.Green.APIServer
	var gps []greenProcess
	if a.StaticPod != nil {
		if placed := r.j.StaticPodPlaced; placed != "" {
			switch err := os.Remove(placed); {
			case err == nil:
				stopped = append(stopped, "static pod manifest "+placed)
			case !errors.Is(err, os.ErrNotExist):
				// Green's etcd members are stopped all the same: the kubelet's apiserver then
				// serves nothing, and the abort or cleanup is reported incomplete.
				errs = append(errs, fmt.Errorf("removing green's static pod manifest: %w; remove it by hand, then run this again", err))
			}
		}
	}
	for _, gp := range r.p.greenAPIServerProcesses() {
		gps = append(gps, gp.greenProcess)
	}
	for _, m := range r.p.Green.Etcd.Members {
		if m.External {
			continue // its host started it, and stops it
		}
		gps = append(gps, greenEtcdProcess(r.p, m))
	}
	for _, gp := range gps {
		if pid := r.greenPID(gp.name, gp.argv); pid > 0 {
			argv := r.startedArgv(gp.name, gp.argv)
			r.procs.stop(pid, argv, 30*time.Second)
			if r.procs.alive(pid, argv) { // e.g. stuck in the kernel on a dead disk
				errs = append(errs, fmt.Errorf("%s (pid %d) is still running after SIGTERM and SIGKILL: stop it by hand, then run this again", gp.what, pid))
				continue
			}
			stopped = append(stopped, fmt.Sprintf("%s (pid %d)", gp.what, pid))
		}
	}
	return stopped, errors.Join(errs...)
}

// Abort stops a cutover in progress before its switch: green is stopped, blue unfenced.
func Abort(ctx context.Context, o Options) (*Report, error) {
	var rep *Report
	err := withJournal(o, "no cutover to abort", func(r *runner) (err error) {
		rep, err = r.abortByOperator(ctx)
		return err
	})
	return rep, err
}

// withJournal runs do on a runner of the journaled cutover in o's state dir, holding the state
// dir's lock; none says what a missing state dir or journal means ("no cutover to abort").
func withJournal(o Options, none string, do func(*runner) error) error {
	if _, err := os.Stat(o.Plan.StateDir); err != nil {
		return fmt.Errorf("%s: %w", none, err)
	}
	lock, err := lockStateDir(o.Plan.StateDir)
	if err != nil {
		return err
	}
	defer lock.unlock()
	j, err := LoadJournal(o.Plan.StateDir)
	if errors.Is(err, errNoJournal) {
		return fmt.Errorf("%s: no journal in %s", none, o.Plan.StateDir)
	}
	if err != nil {
		return err
	}
	if j.GreenPIDs == nil {
		j.GreenPIDs = map[string]int{}
	}
	o.wayBack = true
	r, err := newRunner(o, j)
	if err != nil {
		return err
	}
	return do(r)
}

// abortByOperator is `kubefence cutover abort` on the journal of a cutover.
func (r *runner) abortByOperator(ctx context.Context) (*Report, error) {
	switch r.j.State {
	case StateRunning:
	case StateBaking:
		return nil, fmt.Errorf("cutover %s is baking (green serves): nothing to abort; 'kubefence cutover rollback' goes back to blue, 'kubefence cutover finish' ends the bake", r.j.ID)
	case StateRollingBack:
		return nil, fmt.Errorf("cutover %s is rolling back: nothing to abort; finish it with 'kubefence cutover rollback --resume'", r.j.ID)
	default:
		return nil, fmt.Errorf("cutover %s is %s: nothing to abort", r.j.ID, r.j.State)
	}
	if r.j.PlanHash != r.p.hash {
		// Green's processes are found by the command lines the plan gives, the proxies by its
		// list: an edited plan would stop none of green and may unfence other proxies.
		return nil, fmt.Errorf("the plan changed since cutover %s started (plan hash %s, journal %s): abort with the plan it ran with. Nothing was changed; if writes must open at once, 'kubefence fence off --expect-backend BLUE_URL' on each proxy reopens them where the proxy is still on blue", r.j.ID, r.p.hash, r.j.PlanHash)
	}
	if err := r.abort(ctx, "aborted by the operator", nil); err != nil {
		return nil, err
	}
	rep := r.report(ResultAborted, nil)
	rep.Next = nextAfterAbort + r.p.leftOnHosts()
	r.emit(Event{Type: EventReport, Report: rep})
	return rep, nil
}
