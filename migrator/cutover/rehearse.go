package cutover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// A rehearsal (`kubefence cutover --rehearse`, mode replicate) does everything before the fence
// — snapshot, green etcd and apiserver, replication, the full verify — then measures what the
// window would take without fencing: a drain (green at blue's current revision) and the check
// at the switch, and the round trips to the proxies and to green etcd that the fence, the
// switch, the ungate and the unfence each cost. It prints the window it predicts and tears
// green down (processes stopped, the data dirs it restored removed); the journal ends
// "rehearsed". Writes are never fenced and the proxies never switched.

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
	// Check is reading green's and blue's revisions once, as the switch's check does.
	Check time.Duration `json:"checkNanos"`
	// ProxyRoundTrip is the slowest proxy's status round trip; fence, switch and unfence each
	// cost one (plus the proxy persisting its state).
	ProxyRoundTrip time.Duration `json:"proxyRoundTripNanos"`
	// EtcdRoundTrip is a round trip to green etcd, as the ungate's role grant costs.
	EtcdRoundTrip time.Duration `json:"etcdRoundTripNanos"`
	// PredictedWindow is Drain + Check + 3 × ProxyRoundTrip + EtcdRoundTrip.
	PredictedWindow time.Duration `json:"predictedWindowNanos"`
}

// rehearseDrainStep measures what the window's steps cost, without the fence.
type rehearseDrainStep struct{}

func (rehearseDrainStep) name() string { return StepRehearseDrain }
func (rehearseDrainStep) timeout(p *Plan) time.Duration {
	return p.Timeouts.Window.D() + 30*time.Second
}
func (rehearseDrainStep) pastNoReturn() bool { return false }
func (rehearseDrainStep) describe(*runner, bool) string {
	return "without fencing: catch up with blue (as the fence step does), then time green applying blue's current revision (the drain), reading both revisions (the switch's check), a status round trip to every proxy and one to green etcd, and predict the window from them (moving open watches at the switch is not included)"
}

func (rehearseDrainStep) run(ctx context.Context, r *runner) (string, error) {
	// As the fence step does: catch up first, so the drain is what accrues in a moment.
	if err := r.catchUpBeforeFence(ctx); err != nil {
		return "", err
	}
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
	start = time.Now()
	if _, err := replicate.Revision(ctx, r.repl.dst); err != nil {
		return "", fmt.Errorf("green's revision: %w", err)
	}
	if _, err := replicate.Revision(ctx, r.repl.src); err != nil {
		return "", fmt.Errorf("blue's revision: %w", err)
	}
	m.Check = time.Since(start)
	start = time.Now()
	st, err := r.adm.Status(ctx)
	if err != nil {
		return "", err
	}
	m.ProxyRoundTrip = time.Since(start)
	start = time.Now()
	if _, err := r.repl.dst.AuthStatus(ctx); err != nil {
		return "", fmt.Errorf("green etcd: %w", err)
	}
	m.EtcdRoundTrip = time.Since(start)
	m.PredictedWindow = m.Drain + m.Check + 3*m.ProxyRoundTrip + m.EtcdRoundTrip
	r.j.Rehearsal = &m
	return fmt.Sprintf("predicted window %s (drain to revision %d %s, check %s, proxy round trip %s, green etcd round trip %s; not included: moving the %d watch(es) and stream(s) open now to green at the switch); %s",
		m.PredictedWindow.Round(time.Microsecond), target, m.Drain.Round(time.Microsecond), m.Check.Round(time.Microsecond),
		m.ProxyRoundTrip.Round(time.Microsecond), m.EtcdRoundTrip.Round(time.Microsecond), st.OpenStreams, r.progressLine(r.repl.rep.Progress())), nil
}

// finishRehearsal tears green down after a rehearsal and reports what it predicted.
func (r *runner) finishRehearsal() (*Report, error) {
	_, _ = r.stopReplication()
	_, err := r.stopGreen()
	if err == nil {
		err = r.removeRestoredDirs()
	}
	r.j.State = StateRehearsed
	if serr := r.saveJournal(); serr != nil {
		err = errors.Join(err, serr)
	}
	rep := r.report(ResultRehearsed, err)
	if err != nil {
		rep.Result = ResultFailed
		rep.Next = "tearing green down did not complete: run 'kubefence cutover cleanup --plan …' to stop what is left"
	} else {
		rep.Next = "green was torn down (processes stopped, its data dirs removed); writes were never fenced. Run the cutover without --rehearse when ready."
	}
	r.emit(Event{Type: EventReport, Report: rep})
	return rep, err
}
