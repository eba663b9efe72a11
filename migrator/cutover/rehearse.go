package cutover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// A rehearsal (`kubefence cutover --rehearse`, mode replicate) does everything before the fence
// — snapshot, green etcd and apiserver, replication, the full verify — then measures what the
// window would take without fencing: a drain (green at blue's current revision) and the check
// at the switch, the round trips to the proxies and to green etcd that the fence, the switch,
// the ungate and the unfence each cost, the state saves they make, blue's latency for the
// writes the fence waits for, and green's apiserver taking as many watches as the switch
// moves. It prints the window it predicts and tears green down (processes stopped, the data
// dirs it restored removed); the journal ends "rehearsed". Writes are never fenced and the
// proxies never switched.

// StateRehearsed is the journal state of a finished rehearsal.
const StateRehearsed = "rehearsed"

// StepRehearseDrain is the rehearsal's last step.
const StepRehearseDrain = "rehearse-drain"

// rehearseSteps are replicateSteps up to the fence, then the measured drain.
var rehearseSteps = func() []step {
	var out []step
	for _, s := range replicateSteps {
		if s.name() == StepFence {
			break
		}
		out = append(out, s)
	}
	return append(out, needsReplication{rehearseDrainStep{}})
}()

// Rehearsal is what a rehearsal measured and the window it predicts from it.
type Rehearsal struct {
	// Drain is green applying up to blue's revision read right after catching up, as the
	// fenced drain does (writes go on meanwhile, as they do until the fence's barrier).
	Drain time.Duration `json:"drainNanos"`
	// Check is the switch's check that green is at blue's revision, applied by the replicator
	// (blue's revision read, waited for, both revisions read again).
	Check time.Duration `json:"checkNanos"`
	// DeltaCheck is the switch's wait for the delta check to have compared every change up
	// to that revision, the same in both etcds' histories.
	DeltaCheck time.Duration `json:"deltaCheckNanos"`
	// ProxyRoundTrip is the slowest proxy's status round trip; fence, switch and unfence each
	// cost one.
	ProxyRoundTrip time.Duration `json:"proxyRoundTripNanos"`
	// EtcdRoundTrip is a read of green apiserver's etcd user over a client connected
	// beforehand: etcd puts it through raft as it does the ungate's role grant, whose client
	// the fence step connects before the fence.
	EtcdRoundTrip time.Duration `json:"etcdRoundTripNanos"`
	// StateSave is one save of the journal (a file written, synced and renamed): the window
	// journals each of its WindowSteps, and fence, switch and unfence each have every proxy
	// save its state the same way (estimated as this host's).
	StateSave   time.Duration `json:"stateSaveNanos"`
	WindowSteps int           `json:"windowSteps"`
	// Barrier estimates the fence's wait for the writes in flight at the flip: the median time
	// blue took to answer the writes the proxies forwarded in the last barrierSample.
	Barrier time.Duration `json:"barrierNanos"`
	// WatchMove estimates how long the Watches open now through the proxies wait for green
	// after the unfence: as long as green's apiserver takes to answer as many watches opened at
	// once (up to maxTrialWatches; beyond, in proportion). The switch moves them off blue inside
	// the window; they ask green once the fence has lifted, so it is not part of the window.
	WatchMove time.Duration `json:"watchMoveNanos"`
	Watches   int           `json:"watches"`
	// WatchMoveError says why the watches could not be timed (then WatchMove is 0 and left out
	// of the prediction; the rehearsal goes on).
	WatchMoveError string `json:"watchMoveError,omitempty"`
	// GateRoundTrip (bake plans) is three auth requests to blue etcd over a client connected
	// beforehand, one after the other, as gate-blue makes (a grant, a revoke, a check).
	GateRoundTrip time.Duration `json:"gateRoundTripNanos,omitempty"`
	// HandOver (bake plans) estimates the hand-over (reverse-replication): a client connected
	// to blue and its leases listed, the check that green is at blue's revision, and the two
	// clients of the bake's replication connected. Not in it: keeping blue's leases alive from
	// there (one keep-alive each) and starting the replication's watch.
	HandOver time.Duration `json:"handOverNanos,omitempty"`
	// PredictedWindow is Barrier + Drain + Check + DeltaCheck + 3 × ProxyRoundTrip + EtcdRoundTrip +
	// (WindowSteps + 3) × StateSave, plus GateRoundTrip + HandOver for a bake.
	PredictedWindow time.Duration `json:"predictedWindowNanos"`
}

// maxTrialWatches bounds the watches a rehearsal opens on green to time the switch's.
const maxTrialWatches = 200

// barrierSample is how far back a rehearsal looks at the proxies' writes for their latency:
// the last moments before it measures, not the full verify before them, which slows blue's
// writes down (bench-cutover at 50,000 configmaps: with 10 s, 71-102 ms predicted for windows
// of 30-45 ms).
const barrierSample = 2 * time.Second

func (m *Rehearsal) predict() {
	m.PredictedWindow = m.Barrier + m.Drain + m.Check + m.DeltaCheck + 3*m.ProxyRoundTrip + m.EtcdRoundTrip + time.Duration(m.WindowSteps+3)*m.StateSave +
		m.GateRoundTrip + m.HandOver
}

// rehearseDrainStep measures what the window's steps cost, without the fence.
type rehearseDrainStep struct{}

func (rehearseDrainStep) name() string { return StepRehearseDrain }
func (rehearseDrainStep) timeout(p *Plan) time.Duration {
	return beforeFence + p.Timeouts.Window.D() + 30*time.Second
}
func (rehearseDrainStep) pastNoReturn() bool { return false }
func (rehearseDrainStep) describe(*runner, bool) string {
	return "without fencing: catch up with blue and have the proxies open their connections to green's apiserver (as the fence step does), then time green applying blue's current revision (the drain), the switch's checks (green at blue's revision, applied by the replicator; every change since the full verify the same in both etcds' histories: the rehearsal fails if not, as the switch would), a status round trip to every proxy, an auth request to green etcd on a connected client (as the ungate), a journal save, for a bake three auth requests to blue etcd (as gate-blue makes) and the hand-over's clients and leases list, blue's median latency for the writes the proxies forwarded in the last 2s (what the fence waits for), and predict the window from them; then time as many watches opened at once on green's apiserver as are open through the proxies (the switch moves them off blue; after the unfence they wait that long for green)"
}

func (rehearseDrainStep) run(ctx context.Context, r *runner) (string, error) {
	// As the fence step does: catch up first, so the drain is what accrues in a moment.
	rounds, err := r.catchUpBeforeFence(ctx)
	if err != nil {
		return "", err
	}
	prepared := r.prepareSwitch(ctx) // as the fence step does; the window needs no fence here
	var m Rehearsal
	start := time.Now()
	target, err := replicate.Revision(ctx, r.repl.src)
	if err != nil {
		return "", fmt.Errorf("blue's revision: %w", err)
	}
	if err := r.repl.rep.WaitFor(ctx, target); err != nil {
		return "", fmt.Errorf("drain: %w", err)
	}
	m.Drain = time.Since(start)
	checked, err := r.rehearseSwitchChecks(ctx, &m)
	if err != nil {
		return "", err
	}
	start = time.Now()
	st, err := r.adm.Status(ctx)
	if err != nil {
		return "", err
	}
	m.ProxyRoundTrip = time.Since(start)
	m.Watches = int(st.OpenWatches)
	if err := r.measureWindowCosts(ctx, &m); err != nil {
		return "", err
	}
	m.predict()
	r.j.Rehearsal = &m
	return fmt.Sprintf("%s; %s%s; predicted window %s (blue answering the writes in flight at the fence, estimated from its median write latency %s; drain to revision %d %s; check %s; delta check %s; proxy round trip %s; green etcd auth request %s; %d journal saves of the window's steps and 3 proxy state saves, %s each%s); after the window, green answering the %d watch(es) open now %s; %s",
		rounds, prepared, checked, m.PredictedWindow.Round(time.Microsecond), m.Barrier.Round(time.Microsecond), target, m.Drain.Round(time.Microsecond), m.Check.Round(time.Microsecond), m.DeltaCheck.Round(time.Microsecond),
		m.ProxyRoundTrip.Round(time.Microsecond), m.EtcdRoundTrip.Round(time.Microsecond), m.WindowSteps, m.StateSave.Round(time.Microsecond), m.BakeText("; "), m.Watches, m.WatchMoveText(), r.progressLine(r.repl.rep.Progress())), nil
}

// rehearseSwitchChecks runs the switch's checks, timed into m: green at blue's revision of now,
// applied by the replicator (waitCaughtUp), and every change since the full verify up to it the
// same in both etcds' histories (deltaChecked). Either failing fails the rehearsal, naming the
// difference: the cutover's switch would refuse it inside the window, after the fence.
func (r *runner) rehearseSwitchChecks(ctx context.Context, m *Rehearsal) (string, error) {
	start := time.Now()
	rev, err := r.waitCaughtUp(ctx)
	if err != nil {
		return "", fmt.Errorf("the switch's check would fail: %w; a cutover would abort inside the window", err)
	}
	m.Check = time.Since(start)
	start = time.Now()
	checked, err := r.deltaChecked(ctx, rev)
	if err != nil {
		return "", fmt.Errorf("the switch's delta check would fail: %w; a cutover would abort inside the window", err)
	}
	m.DeltaCheck = time.Since(start)
	return checked, nil
}

// BakeText is what a bake adds to the predicted window ("" without one), each part after sep.
func (m Rehearsal) BakeText(sep string) string {
	if m.GateRoundTrip == 0 && m.HandOver == 0 {
		return ""
	}
	return fmt.Sprintf("%s3 blue etcd auth requests (gate-blue) %s%shand-over %s", sep, m.GateRoundTrip.Round(time.Microsecond), sep, m.HandOver.Round(time.Microsecond))
}

// WatchMoveText is the rehearsal's estimate of green answering the moved watches after the
// unfence, or why there is none.
func (m Rehearsal) WatchMoveText() string {
	if m.WatchMoveError != "" {
		return "not timed, left out (" + m.WatchMoveError + ")"
	}
	return m.WatchMove.Round(time.Microsecond).String()
}

// timeWatchMove opens min(n, maxTrialWatches) watches at once on green's apiserver (configmaps
// from their current resourceVersion: no events to send) and returns how long it took until
// green had answered all of them, scaled to n.
func (r *runner) timeWatchMove(ctx context.Context, n int) (time.Duration, error) {
	if n == 0 {
		return 0, nil
	}
	cfg, err := restConfig(r.p.Green.APIServer.Kubeconfig)
	if err != nil {
		return 0, err
	}
	cfg.QPS = -1 // all at once, as the switch resumes them: no client-side rate limit
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	list, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, err
	}
	k := min(n, maxTrialWatches)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			w, err := cs.CoreV1().ConfigMaps("").Watch(wctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true})
			if err == nil {
				w.Stop()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	took := time.Since(start)
	return took * time.Duration(n) / time.Duration(k), errors.Join(errs...)
}

// measureWindowCosts times what the window's steps do besides the drain: an auth request to
// green etcd as the ungate makes it (on the client it uses, connected), a journal save, and the
// latency of the writes the proxies forwarded lately.
func (r *runner) measureWindowCosts(ctx context.Context, m *Rehearsal) error {
	var err error
	if m.EtcdRoundTrip, err = r.timeAuthRequests(ctx, r.to, 1); err != nil {
		return err
	}
	start := time.Now()
	if err := r.saveJournal(); err != nil {
		return err
	}
	m.StateSave = time.Since(start)
	m.WindowSteps = windowSteps(stepsFor(r.p))
	if r.p.Bake.Enabled {
		if err := r.measureBakeCosts(ctx, m); err != nil {
			return err
		}
	}
	if m.WatchMove, err = r.timeWatchMove(ctx, m.Watches); err != nil {
		m.WatchMove, m.WatchMoveError = 0, err.Error()
	}
	if wl, ok := r.adm.(writesLister); ok {
		ws, err := wl.Writes(ctx, time.Now().Add(-barrierSample))
		if err != nil {
			return fmt.Errorf("the writes the proxies forwarded: %w", err)
		}
		m.Barrier = medianTook(ws.Writes)
	}
	return nil
}

// measureBakeCosts times, for a bake plan, what gate-blue and the hand-over do inside the
// window, without changing blue: three auth requests to blue etcd (a user that does not exist yet
// answers as fast: blue's auth is set up only by a cutover), and the hand-over's clients, leases
// list and check. m.Check and m.StateSave must be measured.
func (r *runner) measureBakeCosts(ctx context.Context, m *Rehearsal) error {
	var err error
	if m.GateRoundTrip, err = r.timeAuthRequests(ctx, r.from, 3); err != nil { // grant, revoke, check
		return err
	}
	start := time.Now()
	for i, sd := range []side{r.from, r.to, r.from} {
		c, err := newEtcdClient(sd.etcd)
		if err != nil {
			return fmt.Errorf("%s etcd: %w", sd.name, err)
		}
		_, err = replicate.Revision(ctx, c)
		if err == nil && i == 0 {
			_, err = c.Leases(ctx)
		}
		c.Close()
		if err != nil {
			return fmt.Errorf("%s etcd: %w", sd.name, err)
		}
	}
	m.HandOver = time.Since(start) + m.Check + m.StateSave
	return nil
}

// timeAuthRequests times n auth requests to sd's etcd, one after the other, on the client the
// window's gate and ungate use, connected first as warmAuthClients leaves it (etcd puts each
// through raft, as a role grant or revoke). A user that does not exist yet (blue's, before a
// cutover sets its auth up) answers as fast.
func (r *runner) timeAuthRequests(ctx context.Context, sd side, n int) (time.Duration, error) {
	cli, err := r.authClient(sd)
	if err != nil {
		return 0, err
	}
	if _, err := replicate.Revision(ctx, cli); err != nil {
		return 0, fmt.Errorf("%s etcd: %w", sd.name, err)
	}
	start := time.Now()
	for range n {
		if _, err := cli.UserGet(ctx, sd.api.EtcdUser); err != nil && !errors.Is(rpctypes.Error(err), rpctypes.ErrUserNotFound) {
			return 0, fmt.Errorf("%s etcd: %w", sd.name, err)
		}
	}
	return time.Since(start), nil
}

// windowSteps counts the steps from the fence to the unfence in table.
func windowSteps(table []step) int {
	n, in := 0, false
	for _, s := range table {
		in = in || s.name() == StepFence
		if in {
			n++
		}
		if s.name() == StepUnfence {
			break
		}
	}
	return n
}

// medianTook is the median backend latency of ws (0 for none).
func medianTook(ws []admin.ForwardedWrite) time.Duration {
	if len(ws) == 0 {
		return 0
	}
	took := make([]time.Duration, len(ws))
	for i, w := range ws {
		took[i] = time.Duration(w.Took)
	}
	slices.Sort(took)
	return took[len(took)/2]
}

// finishRehearsal tears green down after a rehearsal and reports what it predicted.
// StepTeardown names, in a rehearsal's dry run, what finishRehearsal does (not a journaled step).
const StepTeardown = "teardown"

// teardownAction is what a rehearsal's teardown does, for its dry run.
func teardownAction(p *Plan) string {
	r := (&runner{p: p}).forward()
	var dirs []string
	for _, m := range p.Green.Etcd.Members {
		if !m.External {
			dirs = append(dirs, m.DataDir)
		}
	}
	return fmt.Sprintf("stop replication and green's processes this host started (SIGTERM, then SIGKILL after 30 s), remove green's data dirs the rehearsal restored (%s: only those carrying its marker), blue's snapshot %s and the partial copies an interrupted copy or restore left (%s)%s; writes are never fenced", strings.Join(dirs, ", "), r.snapshotPath(), strings.Join(r.partialCopies(), ", "), p.leftOnHosts())
}

func (r *runner) finishRehearsal() (*Report, error) {
	// A difference the delta check found after the drain step (or replication failing then)
	// fails the rehearsal: the cutover's switch would refuse it inside the window.
	_, found := r.stopReplication()
	_, err := r.stopGreen()
	if err == nil {
		_, err = r.removeRestored()
	}
	// Blue's snapshot (Secrets included) goes with green: nothing will use it; and so do the
	// partial copies an interrupted copy or restore left.
	if rerr := os.Remove(r.snapshotPath()); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if err == nil {
		_, err = r.removePartialCopies()
	}
	r.j.State = StateRehearsed
	if serr := r.saveJournal(); serr != nil {
		err = errors.Join(err, serr)
	}
	if found != nil {
		found = fmt.Errorf("replication or its delta check failed before the teardown: %w; a cutover's switch would refuse this inside the window", found)
	}
	rep := r.report(ResultRehearsed, errors.Join(found, err))
	switch {
	case err != nil:
		rep.Result = ResultFailed
		rep.Next = "tearing green down did not complete: run 'kubefence cutover cleanup --plan PLAN' to stop what is left"
	case found != nil:
		rep.Result = ResultFailed
		rep.Next = "green was torn down" + r.p.leftOnHosts() + "; writes were never fenced. Find what made green differ from blue (the error names the revision: something else writing to green, or green expiring a lease by itself) before rehearsing again."
	default:
		rep.Next = "green was torn down (processes stopped, its data dirs and blue's snapshot removed)" + r.p.leftOnHosts() + "; writes were never fenced. Run the cutover without --rehearse when ready."
	}
	if r.p.Bake.Enabled {
		// A rehearsal changes nothing in blue; its preflight checked blue takes green's
		// revisions (checkBlueTxnLimits).
		rep.Next += " Not rehearsed: " + StepBlueAuth + " (turning etcd auth on in blue, with blue's apiserver checked ready under it, else turned off again), which the cutover does before it replicates: a rehearsal changes nothing in blue."
	}
	r.emit(Event{Type: EventReport, Report: rep})
	return rep, errors.Join(found, err)
}
