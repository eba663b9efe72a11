package cutover

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubefence/kubefence/internal/steprun"
	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// EventType is what an Event reports; its values are the JSON wire values -o json prints.
type EventType string

// Event types.
const (
	EventStepStart           = EventType(steprun.Start)
	EventStepEnd             = EventType(steprun.End)
	EventStepSkip            = EventType(steprun.Skip)
	EventNote      EventType = "note"
	EventAbort     EventType = "abort"
	EventReport    EventType = "report"
)

// Event is one line of a cutover's progress (-o json prints them as they happen).
type Event struct {
	Time     time.Time     `json:"time"`
	Type     EventType     `json:"type"`
	Step     string        `json:"step,omitempty"`
	Duration time.Duration `json:"durationNanos,omitempty"`
	Detail   string        `json:"detail,omitempty"`
	Report   *Report       `json:"report,omitempty"`
}

// Report results.
const (
	ResultDone    = "done"
	ResultAborted = "aborted"
	ResultFailed  = "failed"
	// ResultRehearsed: a rehearsal (--rehearse) ran everything before the fence and tore
	// green down.
	ResultRehearsed = "rehearsed"
	// ResultBaking: green serves and blue follows green (bake.enabled), or did until this
	// process stopped.
	ResultBaking = "baking"
	// ResultRolledBack: a rollback went back to blue (the report's Cutover is the cutover it
	// rolled back).
	ResultRolledBack = "rolled-back"
)

// Report is a cutover's outcome.
type Report struct {
	ID string `json:"id"`
	// Cutover is, in a rollback's report, the cutover it rolls back (ID is the rollback's).
	Cutover string `json:"cutover,omitempty"`
	Result  string `json:"result"` // ResultDone, ResultAborted, ResultFailed, ...
	// WriteUnavailability is fence on → fence off: the time writes were refused.
	WriteUnavailability time.Duration `json:"writeUnavailabilityNanos,omitempty"`
	// FenceBarrier is the part of it the fence spent waiting for the writes admitted before it
	// (their latency on blue).
	FenceBarrier     time.Duration `json:"fenceBarrierNanos,omitempty"`
	Steps            []StepRecord  `json:"steps"`
	RefusedWrites    uint64        `json:"refusedWrites"`
	SnapshotRevision int64         `json:"snapshotRevision,omitempty"`
	SnapshotBytes    int64         `json:"snapshotBytes,omitempty"`
	// SwitchRevision (mode replicate) is green's etcd revision, with everything of blue's up to
	// it, when the proxy was switched.
	SwitchRevision int64 `json:"switchRevision,omitempty"`
	// Replication (mode replicate) is where replication stood just before the fence (the lag
	// the window drained) and when it stopped after the switch; Rebuilds counts the times green
	// was rebuilt from a new snapshot because blue compacted what replication needed.
	Replication *ReplicationReport `json:"replication,omitempty"`
	Verified    *VerifyReport      `json:"verified,omitempty"`
	// Rehearsal is what a rehearsal measured and the window it predicts.
	Rehearsal *Rehearsal `json:"rehearsal,omitempty"`
	Backend   string     `json:"backend,omitempty"`
	Error     string     `json:"error,omitempty"`
	Next      string     `json:"next,omitempty"`
}

// ReplicationReport is a Report's account of replication (mode replicate).
type ReplicationReport struct {
	AtFence  *replicate.Progress `json:"atFence,omitempty"`
	AtStop   *replicate.Progress `json:"atStop,omitempty"`
	Rebuilds int                 `json:"rebuilds,omitempty"`
}

// Options are a run's inputs.
type Options struct {
	Plan   *Plan
	Resume bool
	// Rehearse runs everything before the fence, predicts the window and tears green down
	// (rehearse.go); mode replicate only.
	Rehearse bool
	// AllowBypass lets the cutover go on although the preflight found writers around the proxies
	// (--allow-bypass; the plan's preflight.allowBypass does the same).
	AllowBypass bool
	// Emit receives progress events; it must not block for long. It may be called from more
	// than one goroutine (replication progress is reported from its own).
	Emit func(Event)
	Log  *slog.Logger
	// wayBack: an abort or a cleanup, which read the plan without checking the files it
	// names: a proxy whose admin credentials do not load is one that does not answer
	// (newProxyGroup), not a reason to leave the others fenced.
	wayBack bool
}

// proxyAdmin is the proxy's admin API as a cutover uses it: an *admin.Client, or a fake in
// tests.
type proxyAdmin interface {
	Status(ctx context.Context) (admin.Status, error)
	Fence(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error)
	SetBackend(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error)
}

type runner struct {
	o Options
	p *Plan
	j *Journal
	// kept is the ended cutover whose journal this run moves aside to start its own, at its
	// first save (saveJournal: keptAside), once its preflight has passed; a failed preflight
	// puts it back (failPreflight). Until then the state dir's journal stays kept's, so a run
	// killed during its preflight (which changes nothing) leaves it for cleanup, abort and
	// status to find.
	kept      *Journal
	keptAside bool
	// signalNoted: the note that a signal past the switch waits for the window's end is out.
	signalNoted bool
	// resumedFenced: this run resumed one that had journaled its fence and not its unfence (its
	// stop may have kept writes fenced, and it may have made changes this run makes again).
	resumedFenced bool
	// othersFence: an aborted rollback found the proxies fenced by someone else (before its own
	// fence) and left them so; the report says writes stay fenced.
	othersFence bool
	adm         proxyAdmin
	procs       processes
	steps       []step
	// repl is the replicator this process runs (mode replicate), from the replicate step to
	// stop-replication or the abort.
	repl *replication
	// preFence bounds catching up right before the fence; 0 is preFenceCatchUp.
	preFence time.Duration
	// from and to are the sides replication and the window move between: blue → green in a
	// cutover, green → blue in a rollback (rollback.go).
	from, to side
	// journalDir holds r.j: the state dir, or its rollback/ directory in a rollback.
	journalDir string
	// noPickup is the advice when replication cannot be picked up again (pickupAdvice);
	// retryPickup, if set, when that may pass (an etcd that did not answer).
	noPickup, retryPickup string
	// main is the cutover's journal when r is its rollback (r.j is the rollback's).
	main *Journal
	// lock is the state dir's lock this process holds (Run's), marked when it bakes.
	lock *stateLock
	// progressStep labels replication's progress notes ("" is StepReplicate).
	progressStep string
	// authClients are the etcd clients of the window's gate and ungate steps, by side name
	// (authClient).
	authClients map[string]*clientv3.Client
	// blueReady: a resumed rollback found blue's apiserver ready (resumedRollbackReady).
	blueReady bool
	// greenHold ends what keeps green's restored leases alive from green's start until
	// replication takes them over (holdGreenLeases), nil when nothing does.
	greenHold func()
	// unsaved is why the journal could not be written past the switch (saveWindow), nil once a
	// save succeeded again: the run goes on, and its report says so (unjournaled).
	unsaved error
	// fencedMono is when this process sent the fence, with the monotonic clock's reading
	// (r.j.FencedAt, journaled in UTC, has none): the window's budget runs on it, whatever the
	// wall clock does meanwhile. Zero in a process that did not fence (a resume).
	fencedMono time.Time
}

// markUnfenced journals that writes reopened now, and how long they were fenced on the
// monotonic clock when this process fenced.
func (r *runner) markUnfenced() {
	now := time.Now()
	r.j.UnfencedAt = now.UTC()
	if !r.fencedMono.IsZero() && !r.j.FencedAt.IsZero() {
		r.j.Unfenced = now.Sub(r.fencedMono)
	}
}

// ErrRehearseNeedsReplication refuses --rehearse of a plan that does not replicate.
var ErrRehearseNeedsReplication = errors.New("--rehearse needs a replicating plan (migration.mode replicate, or auto with green etcd TLS and no blue.etcd.dataDir): the fenced copy has nothing to rehearse without fencing")

func newRunner(o Options, j *Journal) (*runner, error) {
	g, err := newProxyGroup(o.Plan, o.wayBack)
	if err != nil {
		return nil, err
	}
	steps := stepsFor(o.Plan)
	if o.Rehearse {
		if !o.Plan.Replicating() {
			return nil, ErrRehearseNeedsReplication
		}
		if o.Resume {
			return nil, errors.New("--rehearse and --resume do not go together: run the rehearsal again")
		}
		steps = rehearseSteps
	}
	return (&runner{o: o, p: o.Plan, j: j, adm: g, procs: osProcesses, steps: steps}).forward(), nil
}

// forward sets r up for a cutover: from blue to green, journaled in the state dir.
func (r *runner) forward() *runner {
	r.from, r.to, r.journalDir = r.p.blueSide(), r.p.greenSide(), r.p.StateDir
	r.noPickup = "abort ('kubefence cutover abort', or this run aborts by itself), remove green's data dirs and run the cutover again"
	return r
}

// saveJournal writes r.j to its directory, first moving the ended cutover's journal this run
// keeps aside (kept) if it has not yet.
func (r *runner) saveJournal() error {
	if r.kept != nil && !r.keptAside {
		if err := keepJournal(r.journalDir, r.kept.ID); err != nil {
			return err
		}
		r.keptAside = true
	}
	return r.j.save(r.journalDir)
}

func (r *runner) emit(e Event) {
	e.Time = time.Now()
	if r.o.Emit != nil {
		r.o.Emit(e)
	}
}

// ErrInProgress means a journal says a cutover is under way in the state dir.
var ErrInProgress = errors.New("a cutover is in progress in this state dir")

// Run carries out (or resumes) the plan. On a failure before the switch it aborts: green is
// stopped and blue unfenced; the returned report says so.
func Run(ctx context.Context, o Options) (*Report, error) {
	p := o.Plan
	if err := makeStateDir(p.StateDir); err != nil {
		return nil, err
	}
	lock, err := lockStateDir(p.StateDir)
	if err != nil {
		return nil, err
	}
	defer lock.unlock()
	r, err := newRunner(o, nil)
	if err != nil {
		return nil, err
	}
	r.lock = lock
	if err := r.openJournal(); err != nil {
		return nil, err
	}
	return r.run(ctx)
}

// openJournal continues the journaled cutover (--resume) or starts a new journal, refusing
// what does not fit: a resume without a cutover in progress, a run over one, a changed plan.
func (r *runner) openJournal() error {
	p, o := r.p, r.o
	j, err := LoadJournal(p.StateDir)
	switch {
	case errors.Is(err, errNoJournal):
		if o.Resume {
			return fmt.Errorf("nothing to resume: no journal in %s", p.StateDir)
		}
	case err != nil:
		return err
	case j.aborting():
		return fmt.Errorf("cutover %s was going back to blue when it stopped (%s): 'kubefence cutover abort --plan PLAN' finishes that", j.ID, j.AbortReason)
	case j.State == StateRunning && j.Rehearse:
		return fmt.Errorf("rehearsal %s stopped partway (last finished step %q): a rehearsal is not resumed, nor run over; 'kubefence cutover abort --plan PLAN' stops what it started, then rehearse again", j.ID, lastStep(j))
	case j.State == StateRunning && !o.Resume:
		return fmt.Errorf("%w (id %s, last finished step %q): %s", ErrInProgress, j.ID, lastStep(j), j.wayOn())
	case (j.State == StateRunning || j.State == StateBaking && o.Resume) && j.PlanHash != p.hash:
		return fmt.Errorf("the plan changed since cutover %s started (plan hash %s, journal %s): resume with the same plan", j.ID, p.hash, j.PlanHash)
	case j.State == StateRunning:
		r.j = j
		r.resumedFenced = !j.FencedAt.IsZero() && j.UnfencedAt.IsZero()
		r.emit(Event{Type: EventNote, Detail: fmt.Sprintf("resuming cutover %s after step %q", j.ID, lastStep(j))})
		r.verifyAgainOnResume()
	case j.State == StateBaking && o.Resume:
		r.j = j
		r.emit(Event{Type: EventNote, Detail: fmt.Sprintf("resuming the bake of cutover %s: blue follows green again", j.ID)})
	case j.State == StateBaking:
		return fmt.Errorf("cutover %s is baking (green serves): 'kubefence cutover --resume' keeps blue following green, 'kubefence cutover rollback' goes back, 'kubefence cutover finish' ends the bake", j.ID)
	case j.State == StateRollingBack:
		return fmt.Errorf("cutover %s is rolling back: finish the rollback first ('kubefence cutover rollback --resume')", j.ID)
	case o.Resume:
		return fmt.Errorf("nothing to resume: cutover %s is %s", j.ID, j.State)
	case j.State == StateDone:
		return fmt.Errorf("cutover %s is done: green serves; a new cutover (e.g. back from green) needs a new plan and state dir", j.ID)
	default: // aborted, rehearsed or rolled back: its journal is kept next to the new one
		// Moved aside at the new run's first save (saveJournal), after its preflight: checked
		// free now, so that a run that could not keep it is refused before anything.
		if _, err := os.Lstat(keptJournalPath(p.StateDir, j.ID)); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("keeping the journal of %s as %s before a new one: that path is taken (%v): move it away by hand", j.ID, keptJournalPath(p.StateDir, j.ID), err)
		}
		r.kept = j
	}
	if r.j == nil {
		r.j = &Journal{Version: 1, ID: newID(), PlanHash: p.hash, State: StateRunning, Started: time.Now().UTC(), GreenPIDs: map[string]int{}, Rehearse: o.Rehearse, PIDsWriteAhead: true}
		if r.kept == nil {
			if err := r.j.save(p.StateDir); err != nil {
				return fmt.Errorf("write journal: %w", err)
			}
		}
	}
	if r.j.GreenPIDs == nil {
		r.j.GreenPIDs = map[string]int{}
	}
	return nil
}

// verifyAgainOnResume (mode replicate) has a resume before the fence verify again: the changes
// since the full verify were compared by the process that died (the delta check), and its
// revision may since have been compacted away (kube-apiserver keeps about 5 minutes): a new
// full verify starts a new delta check. Inside a window (the fence journaled) there is no time
// for one: the delta check starts again from the journaled revision (ensureReplication).
func (r *runner) verifyAgainOnResume() {
	if !r.p.Replicating() || !r.j.FencedAt.IsZero() || !r.j.done(StepVerify) {
		return
	}
	r.j.Done = slices.DeleteFunc(r.j.Done, func(rec StepRecord) bool { return rec.Step == StepVerify })
	r.j.Verified = nil
	r.emit(Event{Type: EventNote, Step: StepVerify, Detail: "verifying again: the changes since the last full verify were compared by the process that stopped"})
}

// greenForGood is what is left to do once green serves for good (docs/runbook.md): a proxy
// that loses its state file starts on --upstream, and the control plane's own config still
// names blue.
const greenForGood = "Now point each proxy's --upstream (and --upstream-ca-file, --allowed-backends) at green in its manifest or unit (a proxy that loses its state file starts on --upstream), and update what starts the control plane (kubeadm's manifests, your config management) to green's etcd and apiserver."

// run walks the steps the journal has not finished; a failed step ends in fail, unless green
// is rebuilt from a new snapshot (rebuild.go) and the walk starts again.
func (r *runner) run(ctx context.Context) (*Report, error) {
	defer func() { _, _ = r.stopReplication() }()
	defer r.releaseGreenHold()
	defer r.closeAuthClients()
	if r.j.Rebuilding != "" { // begun by a run that stopped: green is gone, or partly
		if err := r.rebuildGreen(errors.New(r.j.Rebuilding)); err != nil {
			return nil, fmt.Errorf("finishing the rebuild of green that a stopped run began (%s): %w; blue serves unfenced: fix that, then --resume again, or 'kubefence cutover abort'", r.j.Rebuilding, err)
		}
	}
	for {
		err := r.walk(ctx)
		var serr *steprun.Error
		if !errors.As(err, &serr) {
			break
		}
		if r.rebuildable(serr.Err) {
			rerr := r.rebuildGreen(serr.Err)
			if rerr == nil {
				continue
			}
			serr.Err = fmt.Errorf("%w; rebuilding green from a new snapshot failed: %w", serr.Err, rerr)
		} else if why := r.noRebuild(serr.Err); why != "" {
			serr.Err = fmt.Errorf("%w; %s", serr.Err, why)
		}
		return r.fail(ctx, r.steps[serr.Index], serr.Err)
	}
	if r.o.Rehearse {
		return r.finishRehearsal()
	}
	if r.unsaved != nil && (!r.p.Bake.Enabled || r.j.Bake == nil || r.journalHasBake()) {
		return r.unjournaled(ResultDone, r.unsaved)
	}
	dropped := r.dropBlueCopies()
	if r.p.Bake.Enabled && r.j.Bake != nil {
		r.closeAuthClients() // the bake runs for days; a rollback is a run of its own
		if dropped != "" {
			r.emit(Event{Type: EventNote, Step: "bake", Detail: strings.TrimSpace(dropped)})
		}
		return r.bake(ctx)
	}
	r.j.State = StateDone
	if err := r.saveJournal(); err != nil {
		return r.unjournaled(ResultDone, err)
	}
	rep := r.report(ResultDone, nil)
	rep.Next = "green serves behind the proxy. To go back, run a new cutover from green; blue is left as it was at the fence (stop it when you no longer need it). " + greenForGood
	if r.p.Bake.Enabled {
		why := r.j.NoBake
		if why == "" {
			why = "see the reverse-replication step"
		}
		rep.Next = "green serves behind the proxy, with NO WAY BACK: the bake could not start (" + why + "). To go back, run a new cutover from green; blue is left as it was at the switch (stop it when you no longer need it). " + greenForGood
	}
	rep.Next += r.rolesTakenAdvice() + dropped
	r.emit(Event{Type: EventReport, Report: rep})
	return rep, nil
}

// dropBlueCopies removes blue's snapshot, and the copy of blue's member files a v2 source
// needed (its backend the snapshot), from the state dir once the switch is behind (only the
// steps before the fence read them): each is a copy of blue's data, Secrets included. It
// returns a sentence for the report ("" when there was none).
func (r *runner) dropBlueCopies() string {
	var removed, left []string
	for _, c := range append(r.blueCopies(), r.partialCopies()...) {
		switch gone, err := removeIfThere(c); {
		case err != nil:
			left = append(left, fmt.Sprintf("%s (%v)", c, err))
		case gone:
			removed = append(removed, c)
		}
	}
	out := ""
	if len(removed) > 0 {
		out += " Blue's copies in the state dir (its data, Secrets included) are removed: " + strings.Join(removed, ", ") + "."
	}
	if len(left) > 0 {
		out += " Remove blue's copies yourself (its data, Secrets included): " + strings.Join(left, ", ") + "."
	}
	return out
}

// blueCopies are the copies of blue's data a cutover keeps in the state dir: the snapshot, and
// the member files of a v2 source.
func (r *runner) blueCopies() []string { return []string{r.snapshotPath(), r.memberCopyPath()} }

// removeIfThere removes path (a file, or a directory and all in it) and says whether it was
// there.
func removeIfThere(path string) (bool, error) {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return true, os.RemoveAll(path)
}

// walk runs the steps the journal has not finished.
func (r *runner) walk(ctx context.Context) error {
	var walk []steprun.Step
	for _, s := range r.steps {
		walk = append(walk, steprun.Step{
			Name: s.name(), Detail: s.describe(r, false), Timeout: s.timeout(r.p), Done: r.j.done(s.name()),
			// Before the switch a stopped walk (a signal, or a step that ended on its timeout
			// as the signal came) does not begin the next step: it would start green's
			// processes only for the abort to stop them. Past it the steps close the window.
			Interruptible: !s.pastNoReturn() && !r.j.done(StepSwitch),
			Run: func(ctx context.Context) (string, error) {
				ctx, cancel := r.pastSwitchContext(ctx)
				defer cancel()
				return s.run(ctx, r)
			},
		})
	}
	return steprun.Run(ctx, walk, journalSteps{r}, func(e steprun.Event) {
		r.emit(Event{Type: EventType(e.Kind), Step: e.Step, Duration: e.Duration, Detail: e.Detail})
	})
}

// pastSwitchContext is the context a step runs with. Once the switch is journaled there is no
// way back, and the steps left only finish the window (milliseconds each): a signal (Ctrl-C,
// SIGTERM) then must not stop them half-way, leaving writes fenced or a bake given up for it.
// They keep the step's own timeout (ctx's deadline) but not the signal's cancellation; the run
// stops after them (a bake's loop ends on the signal).
func (r *runner) pastSwitchContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if !r.j.done(StepSwitch) {
		return ctx, func() {}
	}
	if ctx.Err() != nil && !r.signalNoted {
		r.signalNoted = true
		r.emit(Event{Type: EventNote, Detail: "stopping after the window: past the switch its last steps still run, each within its timeout (a second signal exits at once; " + r.resumeCommand() + " finishes then)"})
	}
	return withoutSignal(ctx)
}

// withoutSignal is ctx without its cancellation (a signal's) but with its deadline (the step's
// timeout).
func withoutSignal(ctx context.Context) (context.Context, context.CancelFunc) {
	detached := context.WithoutCancel(ctx)
	if deadline, ok := ctx.Deadline(); ok {
		return context.WithDeadline(detached, deadline)
	}
	return context.WithCancel(detached)
}

// journalSteps is the journal as steprun writes it: a finished step is appended and saved
// (saveWindow: past the switch a failed save does not stop the walk).
type journalSteps struct{ r *runner }

func (journalSteps) Begin(int) error { return nil }

func (js journalSteps) Finish(rec steprun.Record) error {
	js.r.j.Done = append(js.r.j.Done, StepRecord{Step: rec.Step, Started: rec.Started, Duration: rec.Duration, Detail: rec.Detail})
	return js.r.saveWindow()
}

// saveWindow saves the journal. Past the switch (the switch's own record included) a failed save
// (a full disk, EIO) does not stop the run: the steps left are safe to repeat and have what they
// need in memory, and stopping would leave writes fenced until the state dir is fixed. The
// failure is noted at once and kept (unsaved) for the report (unjournaled); a later save that
// succeeds clears it.
func (r *runner) saveWindow() error {
	err := r.saveJournal()
	switch {
	case err == nil:
		r.unsaved = nil
		return nil
	case !r.j.done(StepSwitch):
		return err
	}
	if r.unsaved == nil {
		r.emit(Event{Type: EventNote, Detail: fmt.Sprintf("WARNING: the journal could not be written (%v): past the switch the window goes on (its steps are safe to repeat and have what they need in memory); the report says what the journal lacks", err)})
	}
	r.unsaved = err
	return nil
}

// unjournaled ends a run whose steps are done, writes open on r.to, but whose journal could not
// be written since its switch (err): the report (result) says so first, what the journal on
// disk says instead, and what to do.
func (r *runner) unjournaled(result string, err error) (*Report, error) {
	err = fmt.Errorf("the journal could not be written: %w", err)
	rep := r.report(result, err)
	onDisk := "could not be read either"
	if disk, lerr := LoadJournal(r.journalDir); lerr == nil {
		onDisk = fmt.Sprintf("still says %s, last step %q", disk.State, lastStep(disk))
	}
	rep.Next = fmt.Sprintf("writes are open on %s: the window finished (unfenced at %s), but the journal in %s %s, and 'kubefence cutover status' reads it. Do not abort or roll back meanwhile. Free space in the state dir (or fix its disk), then run %s: it runs the steps the journal lacks again (each is safe to repeat; the proxies are where they go) and journals the end",
		r.to.name, r.j.UnfencedAt.Format(time.RFC3339Nano), r.journalDir, onDisk, r.resumeCommand())
	if r.main == nil && r.p.Bake.Enabled && r.j.Bake != nil {
		rep.Next += "; blue does not follow green meanwhile (the bake needs its journal): run it " + PickupHorizon
	}
	if r.main != nil && r.j.NotGated != "" { // a rollback whose gate-green failed: said as rolled back
		rep.Next += ". " + r.greenAfterRollback()
	}
	r.emit(Event{Type: EventReport, Report: rep})
	return rep, err
}

// keepJournal moves the journal of an ended cutover (or rollback) with id aside in dir, so that
// a new one does not overwrite it.
func keepJournal(dir, id string) error {
	kept := keptJournalPath(dir, id)
	if err := os.Rename(journalPath(dir), kept); err != nil {
		return fmt.Errorf("keeping the journal of %s as %s before a new one: %w (move it away by hand)", id, kept, err)
	}
	return nil
}

// keptJournalPath is where keepJournal keeps the journal of the cutover with id.
func keptJournalPath(dir, id string) string { return filepath.Join(dir, "journal-"+id+".json") }

func lastStep(j *Journal) string {
	if len(j.Done) == 0 {
		return "none"
	}
	return j.Done[len(j.Done)-1].Step
}

func newID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return time.Now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b)
}

func (r *runner) report(result string, err error) *Report {
	j := r.j
	rep := &Report{ID: j.ID, Result: result, Steps: j.Done, SnapshotRevision: j.SnapshotRevision, SnapshotBytes: j.SnapshotBytes, SwitchRevision: j.SwitchRevision, Verified: j.Verified, Rehearsal: j.Rehearsal}
	if r.main != nil {
		rep.Cutover = r.main.ID
	}
	if j.ReplicationAtFence != nil || j.ReplicationAtStop != nil || j.Rebuilds > 0 {
		rep.Replication = &ReplicationReport{AtFence: j.ReplicationAtFence, AtStop: j.ReplicationAtStop, Rebuilds: j.Rebuilds}
	}
	if !j.FencedAt.IsZero() && !j.UnfencedAt.IsZero() {
		rep.WriteUnavailability = j.writeUnavailability()
	}
	rep.FenceBarrier = j.FenceBarrier
	if j.RefusedAtUnfence >= j.RefusedAtFence {
		rep.RefusedWrites = j.RefusedAtUnfence - j.RefusedAtFence
	}
	if err != nil {
		rep.Error = err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), reportStatusTimeout)
	defer cancel()
	if st, serr := r.adm.Status(ctx); serr == nil {
		rep.Backend = st.Backend
	}
	return rep
}

// reportStatusTimeout bounds the report's look at the proxies, and fail's and the abort's
// (proxiesAt): one that does not answer must not keep them, and the state dir's lock, for ever.
const reportStatusTimeout = 10 * time.Second

func restConfig(kubeconfig string) (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// readyz asks an apiserver's /readyz with the given credentials.
func readyz(ctx context.Context, kubeconfig string) error {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/readyz", nil)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// PlannedStep is one step of a dry run.
type PlannedStep struct {
	Step   string `json:"step"`
	Action string `json:"action"`
}

// DryRun returns the steps the plan would run, with their exact actions; it changes nothing.
func DryRun(p *Plan) []PlannedStep { return dryRun(p, stepsFor(p)) }

// DryRunRehearsal is DryRun for --rehearse: the steps up to the fence, then the measured drain,
// then the teardown (finishRehearsal).
func DryRunRehearsal(p *Plan) []PlannedStep {
	return append(dryRun(p, rehearseSteps), PlannedStep{Step: StepTeardown, Action: teardownAction(p)})
}

func dryRun(p *Plan, steps []step) []PlannedStep {
	r := (&runner{p: p, j: &Journal{ID: "dry-run"}, steps: steps}).forward()
	var out []PlannedStep
	for _, s := range r.steps {
		out = append(out, PlannedStep{Step: s.name(), Action: s.describe(r, true)})
	}
	return out
}

// RefusedWritesLine says what the proxy knows of the writes it refused while fenced: how many
// got a 429. Whether a client retried one is the client's business (client-go does; the official
// Python client does not retry POST or PATCH), so it claims nothing about that.
func RefusedWritesLine(n uint64) string {
	return fmt.Sprintf("writes refused with 429 while fenced: %d (client-go retries them; clients that do not retry saw an error)", n)
}
