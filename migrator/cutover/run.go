package cutover

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubefence/kubefence/proxy/admin"
)

// Event is one line of a cutover's progress (-o json prints them as they happen).
type Event struct {
	Time     time.Time     `json:"time"`
	Type     string        `json:"type"` // step-start, step-end, step-skip, note, abort, report
	Step     string        `json:"step,omitempty"`
	Duration time.Duration `json:"durationNanos,omitempty"`
	Detail   string        `json:"detail,omitempty"`
	Report   *Report       `json:"report,omitempty"`
}

// Report is a cutover's outcome.
type Report struct {
	ID     string `json:"id"`
	Result string `json:"result"` // done, aborted, failed
	// WriteUnavailability is fence on → fence off: the time writes were refused.
	WriteUnavailability time.Duration `json:"writeUnavailabilityNanos,omitempty"`
	Steps               []StepRecord  `json:"steps"`
	RefusedWrites       uint64        `json:"refusedWrites"`
	SnapshotRevision    int64         `json:"snapshotRevision,omitempty"`
	SnapshotBytes       int64         `json:"snapshotBytes,omitempty"`
	Verified            *VerifyReport `json:"verified,omitempty"`
	Backend             string        `json:"backend,omitempty"`
	Error               string        `json:"error,omitempty"`
	Next                string        `json:"next,omitempty"`
}

// Options are a run's inputs.
type Options struct {
	Plan   *Plan
	Resume bool
	// Emit receives progress events; it must not block for long.
	Emit func(Event)
	Log  *slog.Logger
}

type runner struct {
	o   Options
	p   *Plan
	j   *Journal
	adm *admin.Client
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
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	lock, err := lockStateDir(p.StateDir)
	if err != nil {
		return nil, err
	}
	defer lock.unlock()
	r := &runner{o: o, p: p, adm: admin.NewClient(p.Proxy.AdminSocket)}
	j, err := LoadJournal(p.StateDir)
	switch {
	case errors.Is(err, errNoJournal):
		if o.Resume {
			return nil, fmt.Errorf("nothing to resume: no journal in %s", p.StateDir)
		}
	case err != nil:
		return nil, err
	case j.State == StateRunning && !o.Resume:
		return nil, fmt.Errorf("%w (id %s, last finished step %q): run again with --resume to continue, or 'kubefence cutover abort' to go back to blue", ErrInProgress, j.ID, lastStep(j))
	case j.State == StateRunning && j.PlanHash != p.hash:
		return nil, fmt.Errorf("the plan changed since cutover %s started (plan hash %s, journal %s): resume with the same plan", j.ID, p.hash, j.PlanHash)
	case j.State == StateRunning:
		r.j = j
		r.emit(Event{Type: "note", Detail: fmt.Sprintf("resuming cutover %s after step %q", j.ID, lastStep(j))})
	case o.Resume:
		return nil, fmt.Errorf("nothing to resume: cutover %s is %s", j.ID, j.State)
	case j.State == StateDone:
		return nil, fmt.Errorf("cutover %s is done: green serves; a new cutover (e.g. back from green) needs a new plan and state dir", j.ID)
	default: // aborted: keep its journal next to the new one
		_ = os.Rename(journalPath(p.StateDir), filepath.Join(p.StateDir, "journal-"+j.ID+".json"))
	}
	if r.j == nil {
		r.j = &Journal{Version: 1, ID: newID(), PlanHash: p.hash, State: StateRunning, Started: time.Now().UTC(), GreenPIDs: map[string]int{}}
		if err := r.j.save(p.StateDir); err != nil {
			return nil, fmt.Errorf("write journal: %w", err)
		}
	}
	if r.j.GreenPIDs == nil {
		r.j.GreenPIDs = map[string]int{}
	}
	for _, step := range Steps {
		if r.j.done(step) {
			r.emit(Event{Type: "step-skip", Step: step, Detail: "finished before the resume"})
			continue
		}
		r.emit(Event{Type: "step-start", Step: step, Detail: r.describe(step, false)})
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, r.timeout(step))
		detail, err := r.step(sctx, step)
		cancel()
		if err != nil {
			return r.fail(ctx, step, err)
		}
		rec := StepRecord{Step: step, Started: start.UTC(), Duration: time.Since(start), Detail: detail}
		r.j.Done = append(r.j.Done, rec)
		if err := r.j.save(p.StateDir); err != nil {
			return r.fail(ctx, step, fmt.Errorf("write journal: %w", err))
		}
		r.emit(Event{Type: "step-end", Step: step, Duration: rec.Duration, Detail: detail})
	}
	r.j.State = StateDone
	if err := r.j.save(p.StateDir); err != nil {
		return nil, err
	}
	rep := r.report("done", nil)
	rep.Next = "green serves behind the proxy. To go back, run a new cutover from green; blue is left as it was at the fence (stop it when you no longer need it)."
	r.emit(Event{Type: "report", Report: rep})
	return rep, nil
}

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

func (r *runner) timeout(step string) time.Duration {
	t := r.p.Timeouts
	switch step {
	case StepPreflight:
		return t.Preflight.D()
	case StepFence:
		return r.p.Proxy.WaitTimeout.D() + 30*time.Second
	case StepCopy:
		return t.Copy.D()
	case StepMigrate:
		return t.Migrate.D()
	case StepGreenEtcd:
		return t.GreenEtcd.D()
	case StepGreenAPIServer:
		return t.GreenAPIServer.D()
	case StepVerify:
		return t.Verify.D()
	}
	return t.Switch.D()
}

// abortTimeout bounds an abort after a failed step.
const abortTimeout = 2 * time.Minute

// fail handles a step's error: before the switch it aborts back to blue. The abort runs on a
// context of its own: the step may have failed because ctx was cancelled (Ctrl-C, SIGTERM), and
// that must not stop the way back to blue.
func (r *runner) fail(ctx context.Context, step string, err error) (*Report, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	if slices.Index(Steps, step) >= slices.Index(Steps, StepSwitch) {
		st, serr := r.adm.Status(ctx)
		if serr == nil && st.Backend == strings.TrimSuffix(r.p.Green.APIServer.URL, "/") {
			rep := r.report("failed", err)
			rep.Next = "the proxy already sends requests to green; fix the cause and run again with --resume to finish (unfence)"
			r.emit(Event{Type: "report", Report: rep})
			return rep, fmt.Errorf("step %s: %w", step, err)
		}
	}
	r.emit(Event{Type: "abort", Step: step, Detail: err.Error()})
	abortErr := r.abort(ctx, fmt.Sprintf("step %s failed: %v", step, err))
	rep := r.report("aborted", err)
	if abortErr != nil {
		rep.Result = "failed"
		rep.Error += "; abort: " + abortErr.Error()
		rep.Next = "the abort did not complete: check 'kubefence fence status', then run 'kubefence cutover abort' again"
	} else {
		rep.Next = "blue serves as before and writes are open; green's data dirs are left for inspection (remove them before the next cutover)"
	}
	r.emit(Event{Type: "report", Report: rep})
	return rep, fmt.Errorf("cutover aborted at step %s: %w", step, err)
}

func (r *runner) report(result string, err error) *Report {
	j := r.j
	rep := &Report{ID: j.ID, Result: result, Steps: j.Done, SnapshotRevision: j.SnapshotRevision, SnapshotBytes: j.SnapshotBytes, Verified: j.Verified}
	if !j.FencedAt.IsZero() && !j.UnfencedAt.IsZero() {
		rep.WriteUnavailability = j.UnfencedAt.Sub(j.FencedAt)
	}
	if j.RefusedAtUnfence >= j.RefusedAtFence {
		rep.RefusedWrites = j.RefusedAtUnfence - j.RefusedAtFence
	}
	if err != nil {
		rep.Error = err.Error()
	}
	if st, serr := r.adm.Status(context.Background()); serr == nil {
		rep.Backend = st.Backend
	}
	return rep
}

// abort stops green and unfences blue, unless the proxy already points at green.
func (r *runner) abort(ctx context.Context, reason string) error {
	if r.j.done(StepSwitch) {
		return fmt.Errorf("cutover %s switched to green at %s: there is no going back by abort; reverse with a new cutover from green", r.j.ID, r.j.Done[slices.IndexFunc(r.j.Done, func(s StepRecord) bool { return s.Step == StepSwitch })].Started.Format(time.RFC3339))
	}
	st, err := r.adm.Status(ctx)
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	if st.Backend == strings.TrimSuffix(r.p.Green.APIServer.URL, "/") {
		return errors.New("the proxy already sends requests to green (the switch happened before it was journaled): run with --resume to finish instead")
	}
	if a := r.p.Green.APIServer; a.StaticPod != nil {
		if placed := r.j.StaticPodPlaced; placed != "" {
			if err := os.Remove(placed); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	} else if pid := r.greenPID("apiserver", a.Command); pid > 0 {
		stop(pid, a.Command, 30*time.Second)
	}
	for _, m := range r.p.Green.Etcd.Members {
		if pid := r.greenPID(m.Name, etcdCommand(r.p, m)); pid > 0 {
			stop(pid, etcdCommand(r.p, m), 30*time.Second)
		}
	}
	if st.Fenced {
		if _, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
			return fmt.Errorf("unfence: %w", err)
		}
	}
	r.j.State = StateAborted
	r.j.AbortReason = reason
	return r.j.save(r.p.StateDir)
}

// Abort stops a cutover in progress before its switch: green is stopped, blue unfenced.
func Abort(ctx context.Context, o Options) (*Report, error) {
	if _, err := os.Stat(o.Plan.StateDir); err != nil {
		return nil, fmt.Errorf("no cutover to abort: %w", err)
	}
	lock, err := lockStateDir(o.Plan.StateDir)
	if err != nil {
		return nil, err
	}
	defer lock.unlock()
	j, err := LoadJournal(o.Plan.StateDir)
	if errors.Is(err, errNoJournal) {
		return nil, fmt.Errorf("no cutover to abort: no journal in %s", o.Plan.StateDir)
	}
	if err != nil {
		return nil, err
	}
	if j.State != StateRunning {
		return nil, fmt.Errorf("cutover %s is %s: nothing to abort", j.ID, j.State)
	}
	r := &runner{o: o, p: o.Plan, j: j, adm: admin.NewClient(o.Plan.Proxy.AdminSocket)}
	if err := r.abort(ctx, "aborted by the operator"); err != nil {
		return nil, err
	}
	rep := r.report("aborted", nil)
	rep.Next = "blue serves as before and writes are open; green's data dirs are left for inspection (remove them before the next cutover)"
	r.emit(Event{Type: "report", Report: rep})
	return rep, nil
}

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
func DryRun(p *Plan) []PlannedStep {
	r := &runner{p: p, j: &Journal{ID: "dry-run"}}
	var out []PlannedStep
	for _, s := range Steps {
		out = append(out, PlannedStep{Step: s, Action: r.describe(s, true)})
	}
	return out
}

// RefusedWritesLine says what the proxy knows of the writes it refused while fenced: how many
// got a 429. Whether a client retried one is the client's business (client-go does; the official
// Python client does not retry POST or PATCH), so it claims nothing about that.
func RefusedWritesLine(n uint64) string {
	return fmt.Sprintf("writes refused with 429 while fenced: %d (client-go retries them; clients that do not retry saw an error)", n)
}

// switchDetail says what the switch did to the watches open on blue: they were ended. Informers
// reconnect and relist (on green); a client that does not reconnect, like `kubectl get -w`,
// exits.
func switchDetail(resp admin.BackendResponse) string {
	return fmt.Sprintf("proxy backend %s; %d watch(es) and stream(s) on blue were ended (informers reconnect and relist, on green; `kubectl get -w` exits)", resp.Status.Backend, resp.Drain.Streams)
}
