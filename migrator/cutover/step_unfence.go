package cutover

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/proxy/admin"
)

// unfenceStep opens writes again, on green.
type unfenceStep struct{}

func (unfenceStep) name() string                  { return StepUnfence }
func (unfenceStep) timeout(p *Plan) time.Duration { return p.Timeouts.Unfence.D() }
func (unfenceStep) pastNoReturn() bool            { return true }
func (unfenceStep) describe(r *runner, _ bool) string {
	return strings.Join(r.p.proxyCommands("fence off --expect-backend", r.to.api.URL), "; ")
}

func (unfenceStep) run(ctx context.Context, r *runner) (string, error) {
	if !r.j.UnfencedAt.IsZero() {
		return r.unfencedBefore(ctx)
	}
	if detail, ok := r.unfencedUnjournaled(ctx); ok {
		return detail, nil
	}
	if err := r.proxiesOnTarget(ctx); err != nil {
		return "", err
	}
	resp, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: false, ExpectBackend: r.to.api.URL})
	if err != nil {
		return "", err
	}
	r.markUnfenced()
	r.j.UnfenceGeneration = resp.Status.Generation
	r.j.RefusedAtUnfence = resp.Status.RefusedWrites
	detail := fmt.Sprintf("writes open on %s; write-unavailability window %s", r.to.name, r.j.writeUnavailability().Round(time.Millisecond))
	if extra := r.changesByHand(r.j.UnfenceGeneration); extra > 0 {
		detail += fmt.Sprintf("; WARNING: the proxies' state changed %d more time(s) since the fence than by this cutover's switch and unfence: a fence or backend command run by hand during the window? Writes may have reopened before this step (check each proxy's log for \"fence off\"); the window reported ends here", extra)
	}
	return detail + r.resumesEnded(ctx, resp.Status), nil
}

// unfencedBefore is the unfence of a run resumed after this step journaled its fence off,
// which every proxy had acknowledged (the run was killed while it waited for the moved
// watches): the window ended then, and the fence off is not sent again: a fence on now is
// someone else's (an operator's, since), as the abort holds too (ownFence). A change since is
// named, and left as it is.
func (r *runner) unfencedBefore(ctx context.Context) (string, error) {
	st, err := r.adm.Status(ctx)
	if err != nil {
		return "", err
	}
	detail := fmt.Sprintf("writes opened on %s at %s, journaled by the run that stopped; write-unavailability window %s", r.to.name, r.j.UnfencedAt.Format(time.RFC3339Nano), r.j.writeUnavailability().Round(time.Millisecond))
	if st.Fenced || r.j.UnfenceGeneration != 0 && st.Generation != r.j.UnfenceGeneration {
		detail += fmt.Sprintf("; WARNING: the proxies changed since (state generation %d then, %d now; fenced now: %v): a fence or backend command run by hand? They are left as they are", r.j.UnfenceGeneration, st.Generation, st.Fenced)
	}
	return detail + r.resumesEnded(ctx, st), nil
}

// unfencedUnjournaled is the unfence of a run resumed after one whose journal lacks its unfence
// (it could not be written: saveWindow): every proxy open on r.to two state generations past the
// fence, as checkFenceHeld takes it. The window ended in that run, not now: its end is when the
// proxies last changed (their ChangedAt, by their clocks), or not known here when they do not
// say. ok is false when the proxies are not so (the unfence is sent). Only a resume looks (in
// the run that fenced, its journal in memory is whole, and a silent proxy's status must not delay
// the others' unfence).
func (r *runner) unfencedUnjournaled(ctx context.Context) (detail string, ok bool) {
	if !r.o.Resume || !r.fencedMono.IsZero() {
		return "", false
	}
	st, err := r.adm.Status(ctx)
	if err != nil { // one does not answer: the unfence is sent to the others, and fails for it
		return "", false
	}
	if !r.windowFinishedOn(&st) {
		return "", false
	}
	r.j.UnfenceGeneration, r.j.RefusedAtUnfence = st.Generation, st.RefusedWrites
	if !st.ChangedAt.IsZero() && st.ChangedAt.After(r.j.FencedAt) {
		r.j.UnfencedAt = st.ChangedAt.UTC()
		detail = fmt.Sprintf("writes already open on %s, since %s by the proxies' clocks (their unfence was not journaled: the run that sent it could not write its journal); write-unavailability window about %s", r.to.name, r.j.UnfencedAt.Format(time.RFC3339Nano), r.j.writeUnavailability().Round(time.Millisecond))
	} else {
		r.j.UnfencedAt, r.j.UnfencedUnknown = time.Now().UTC(), true
		detail = fmt.Sprintf("writes already open on %s (their unfence was not journaled: the run that sent it could not write its journal); the write-unavailability window is not known here (the proxies do not say when they opened): that run's report gave it", r.to.name)
	}
	return detail + r.resumesEnded(ctx, st), true
}

// proxiesOnTarget readies the proxies for the unfence, each of which opens only on r.to: one
// still fenced elsewhere (restarted since the switch without its state file, fenced on its
// --upstream) is switched to r.to first, as the switch would have; one open elsewhere makes it
// refuse, for writes through that proxy reach an etcd nothing follows any more, and opening the
// others would take writes on both sides. A proxy that does not answer is left to the unfence,
// which fails for it.
func (r *runner) proxiesOnTarget(ctx context.Context) error {
	open, err := r.group().putFencedOn(ctx, r.to.api, nil)
	if len(open) > 0 {
		return fmt.Errorf("%s: writes open there since the switch (restarted without its state file?) reach an etcd that %s no longer follows; no proxy is opened on %s beside it. Fence it and switch it ('kubefence fence on', 'kubefence backend set %s'), list what %s applied through it since the fence (its admin API: GET /v1/writes?since=%s, e.g. curl --unix-socket ITS_ADMIN_SOCKET 'http://kubefence/v1/writes?since=%[6]s'), then %[7]s", strings.Join(open, ", "), r.to.name, r.to.name, r.to.api.URL, r.from.name, r.j.FencedAt.Format(time.RFC3339), r.resumeCommand())
	}
	if err != nil {
		return fmt.Errorf("before opening writes: %w", err)
	}
	return nil
}

// resumeWait bounds how long the unfence, its window closed, waits for the new apiserver to
// answer the watches the switch moved before it counts those it ended.
const resumeWait = 10 * time.Second

// firstEventGrace is how long after the last moved watch was answered the unfence looks again
// for the ERROR events (410) that follow such answers at once.
const firstEventGrace = 100 * time.Millisecond

// resumesEnded says how many of the watches the switch moved the new apiserver then ended, and
// how many of those it answered 410 the proxies resumed all the same. The switch returns once
// they left the old one; the new one answers them meanwhile (pending in st), refusing them or,
// for a resourceVersion older than its watch cache (which starts when its apiserver started),
// sending one ERROR event (410), after which a proxy may list the watched collection to resume
// from where that cache begins (pending again meanwhile): docs/proxy.md.
func (r *runner) resumesEnded(ctx context.Context, st admin.Status) string {
	waited := ""
	if st.ResumesPending > 0 {
		// Journaled first: a crash while waiting must not make a resume report a longer window.
		if err := r.saveJournal(); err != nil {
			waited = fmt.Sprintf("; the window's end not journaled before waiting for the moved watches: %v", err)
		}
		st = r.awaitResumes(ctx, st)
		if st.ResumesPending > 0 {
			waited += fmt.Sprintf("; %d moved watch(es) still waiting for %s's answer %s after writes reopened", st.ResumesPending, r.to.name, resumeWait)
		}
	}
	var out []string
	if st.ResumedThenEnded > 0 {
		out = append(out, fmt.Sprintf("%d watch(es) resumed on %s were then ended by it (refused, or their resourceVersion older than its apiserver's watch cache and their collection not shown unchanged since: those clients relist)", st.ResumedThenEnded, r.to.name))
	}
	if st.ResumedPastExpiry > 0 {
		out = append(out, fmt.Sprintf("%d watch(es) %s answered 410 (their resourceVersion older than its watch cache) resumed from where that cache begins, their collection the same at both revisions", st.ResumedPastExpiry, r.to.name))
	}
	if len(out) == 0 {
		return waited
	}
	return "; " + strings.Join(out, "; ") + waited
}

// awaitResumes waits, up to resumeWait, until no moved watch waits for the new apiserver's
// answer, and returns the proxies' status then. A watch counts as answered once the new
// apiserver's headers came; the ERROR event that may follow them at once (410) is counted as the
// proxy reads it, or starts the proxy's lists (pending again): so it looks again
// firstEventGrace after each time none waited.
func (r *runner) awaitResumes(ctx context.Context, st admin.Status) admin.Status {
	deadline := time.Now().Add(resumeWait)
	for st.ResumesPending > 0 {
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Until(deadline), true, func(ctx context.Context) (bool, error) {
			next, err := r.adm.Status(ctx)
			if err == nil {
				st = next
			}
			return st.ResumesPending == 0, nil
		})
		if err != nil {
			return st
		}
		select {
		case <-time.After(firstEventGrace):
		case <-ctx.Done():
			return st
		}
		if next, err := r.adm.Status(ctx); err == nil {
			st = next
		}
	}
	return st
}

// changesByHand counts the changes of the proxies' state since the fence beyond this cutover's
// own switch and unfence (one each per proxy), given the generation after the unfence. The
// switch refuses a change made before it (its expected generation); one after it, such as a
// fence off by hand, reopened writes before green's apiserver could write. A run resumed inside
// the window may repeat a change itself: it counts none.
func (r *runner) changesByHand(after uint64) int64 {
	if r.resumedFenced || r.j.FenceGeneration == 0 {
		return 0
	}
	return int64(after) - int64(r.j.FenceGeneration) - 2*int64(len(r.p.proxyRefs()))
}

// resumeCommand is the command that resumes this run: a rollback's own, or the cutover's.
func (r *runner) resumeCommand() string {
	if r.main != nil {
		return "'kubefence cutover rollback --resume'"
	}
	return "'kubefence cutover --resume'"
}
