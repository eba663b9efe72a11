package cutover

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// switchStep points the proxy at green, only if the fence held since the fence step: the
// point of no return.
type switchStep struct{}

func (switchStep) name() string                  { return StepSwitch }
func (switchStep) timeout(p *Plan) time.Duration { return p.Timeouts.Switch.D() }
func (switchStep) pastNoReturn() bool            { return true }

func (switchStep) describe(r *runner, _ bool) string {
	return strings.Join(r.p.proxyCommands("backend set", r.p.Green.APIServer.URL), "; ")
}

func (switchStep) run(ctx context.Context, r *runner) (string, error) {
	switched, err := r.checkFenceHeld(ctx)
	if err != nil {
		return "", err
	}
	if switched {
		return fmt.Sprintf("the proxy was switched to %s before the process that ran the switch stopped", r.to.name), nil
	}
	covered, err := r.checkBumpCovers(ctx)
	if err != nil {
		return "", err
	}
	resp, lost, err := r.sendSwitch(ctx, admin.BackendRequest{URL: r.p.Green.APIServer.URL, CAFile: r.p.Green.APIServer.CAFile, ExpectGeneration: r.j.FenceGeneration})
	switch {
	case err != nil:
		return "", err
	case lost != "":
		return lost + covered, nil
	}
	return switchDetail(resp) + covered, nil
}

// sendSwitch points the proxies at r.to (req). Once sent, a signal (Ctrl-C, SIGTERM, a dropped
// SSH session's SIGHUP) does not cut it short: a proxy commits its switch before it drains the
// watches it moves (up to its --drain-timeout), so a call cancelled meanwhile leaves it on r.to,
// fenced, its answer lost, and the run would stop there with writes fenced until --resume. The
// call keeps ctx's deadline (the step's timeout); a signal before it is sent still fails the
// step (the cutover goes back). An answer lost all the same (a connection reset, the deadline)
// is looked at again: when every proxy reports the switch (switchLanded), lost says so and the
// step succeeds, so that the window is finished.
func (r *runner) sendSwitch(ctx context.Context, req admin.BackendRequest) (_ admin.BackendResponse, lost string, _ error) {
	if err := ctx.Err(); err != nil {
		return admin.BackendResponse{}, "", fmt.Errorf("stopped before the switch was sent: %w", err)
	}
	sctx, cancel := withoutSignal(ctx)
	defer cancel()
	resp, err := r.adm.SetBackend(sctx, req)
	if err == nil {
		return resp, "", nil
	}
	if !r.switchLanded(ctx) {
		return resp, "", err
	}
	return resp, fmt.Sprintf("the switch's answer was lost (%v), but every proxy reports it: on %s, fenced, one state generation on", err, r.to.name), nil
}

// switchLanded looks, after a switch whose answer was lost, whether every proxy took it
// (checkFenceHeld's "switched"), within statusAnswerTimeout even once ctx has ended.
func (r *runner) switchLanded(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statusAnswerTimeout)
	defer cancel()
	switched, _ := r.checkFenceHeld(ctx)
	return switched
}

// checkBumpCovers refuses the switch once blue's revision is past green's start, the
// snapshot's revision plus migration.revisionBump (marked compacted there): blue moves on while
// fenced (its apiservers' own writes, their leases; writes a fence policy rule lets through),
// and a client may hold one of its resourceVersions above green's start, where green has a
// history of its own: a watch from there would get events at revisions it saw, or miss some.
// At or below it, green answers such a watch "too old" and the client relists. Blue's revision
// is read right before the switch (its apiservers' writes after it reach no client: the
// switch moves them to green). It says how far blue was from the limit.
func (r *runner) checkBumpCovers(ctx context.Context) (string, error) {
	bump := r.p.revisionBump()
	if bump == 0 { // replicating: green has blue's revisions exactly
		return "", nil
	}
	cli, err := datadir.NewClient(r.p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		return "", fmt.Errorf("blue etcd, to check that migration.revisionBump covers its revision: %w", err)
	}
	defer cli.Close()
	rev, err := replicate.Revision(ctx, cli)
	if err != nil {
		return "", fmt.Errorf("blue etcd's revision, to check that migration.revisionBump covers it: %w; not switching", err)
	}
	start := r.j.SnapshotRevision + bump
	if rev > start {
		return "", fmt.Errorf("blue etcd is at revision %d, past green's start at %d (the snapshot's revision %d + migration.revisionBump %d): blue moved on %d revisions since the snapshot (its apiservers' own writes, writes a fence policy rule let through), and clients may hold resourceVersions up to %d, which green gives to its own history (their watches would get events they saw, or miss some); not switching: raise migration.revisionBump well above what blue writes in a cutover's window (the default is %d) and run the cutover again",
			rev, start, r.j.SnapshotRevision, bump, rev-r.j.SnapshotRevision, rev, DefaultRevisionBump)
	}
	return fmt.Sprintf("; blue at revision %d, within green's start at %d (migration.revisionBump %d)", rev, start, bump), nil
}

// checkFenceHeld refuses the switch unless the proxy is still in the state the cutover's fence
// on left it in: fenced, on blue, at the generation journaled then. Any change in between (fence
// off and on by hand, a backend set) means writes may have reached blue after the copy
// (invariant acked-on-green). It says switched when the proxy is on r.to already, one
// generation on per proxy: the switch happened before a crash and was not journaled. Some
// proxies on r.to, not all, is a switch a crash cut short: not switched, and not someone's
// change by hand. On r.to and open, two generations on per proxy, is a switch and an unfence
// the journal lacks (a run whose journal could not be written past its switch: saveWindow), or a
// fence lifted by hand after the switch: switched too, the steps after it finish the window.
func (r *runner) checkFenceHeld(ctx context.Context) (switched bool, err error) {
	st, err := r.adm.Status(ctx)
	if err != nil {
		return false, err
	}
	to, from := strings.TrimSuffix(r.to.api.URL, "/"), r.from.name
	n := uint64(len(r.p.proxyRefs()))
	switch {
	case st.Backend == to && st.Fenced && st.Generation == r.j.FenceGeneration+n:
		return true, nil
	case r.windowFinishedOn(&st):
		return true, nil
	case st.Backend != to && st.Backend != sameURL(r.from.api.URL):
		// Some proxies on r.to, others not: the run that switched stopped in the middle of it
		// (pastSwitch decides whether that leaves a way back).
		if at := r.proxiesAt(ctx); len(at.on) > 0 {
			return false, fmt.Errorf("the switch reached %s only (%s): the run that switched stopped in the middle of it; not switching the rest", named(at.on), st.Backend)
		}
	}
	switch {
	case !st.Fenced:
		return false, fmt.Errorf("the proxy is not fenced (generation %d, changed %s): writes may have reached %s after the fence; not switching. Abort and run again", st.Generation, st.ChangedAt.Format(time.RFC3339), from)
	case st.Generation != r.j.FenceGeneration:
		return false, fmt.Errorf("the proxy's state changed since it was fenced (generation %d then, %d now, last change %s, reason %q): someone ran fence off/on or backend set by hand, and writes may have reached %s after the fence; not switching. Abort and run again", r.j.FenceGeneration, st.Generation, st.ChangedAt.Format(time.RFC3339), st.Reason, from)
	}
	return false, nil
}

// windowFinishedOn says whether the proxies' status (st, the group's) is the window this
// cutover fenced, finished: on r.to and open, two generations on per proxy (a switch and an
// unfence), which a run whose journal could not record them (saveWindow) leaves.
func (r *runner) windowFinishedOn(st *admin.Status) bool {
	n := uint64(len(r.p.proxyRefs()))
	return !st.Fenced && sameURL(st.Backend) == sameURL(r.to.api.URL) && r.j.FenceGeneration != 0 && st.Generation == r.j.FenceGeneration+2*n
}

// switchDetail says what the switch did to the watches open on blue: they were ended. Informers
// reconnect and relist (on green); a client that does not reconnect, like `kubectl get -w`,
// exits. Writes a fence policy rule let through that the switch waited for were answered by
// blue after the copy: green does not have them (a snapshot cutover copies once), which is
// said.
func switchDetail(resp admin.BackendResponse) string {
	d := fmt.Sprintf("proxy backend %s; %d watch(es) and stream(s) on blue were ended (informers reconnect and relist, on green; `kubectl get -w` exits)", resp.Status.Backend, resp.Drain.Streams)
	if resp.Drain.Writes > 0 {
		d += fmt.Sprintf("; WARNING: %d write(s) a fence policy rule let through were in flight on blue at the switch, after the copy: they are not on green (their clients were answered by blue; each proxy's log names them: \"write let through: fence is on\"). Let no writes through in a snapshot cutover", resp.Drain.Writes)
	}
	return d
}
