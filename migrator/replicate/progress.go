package replicate

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Progress is where replication stands. The JSON form is what `-o json` prints.
type Progress struct {
	// Applied is the last blue revision applied to green (green's revision).
	Applied int64 `json:"appliedRevision"`
	// Source is the newest blue revision seen (watch headers, and a read every ProgressInterval).
	// While the read fails (SourceReadFailures) it is the last seen, growing stale
	// (SourceReadAge).
	Source int64 `json:"sourceRevision"`
	// SourceReadAt is when blue's revision was last read from the cluster (the linearizable read
	// every ProgressInterval, each bounded by two of them); zero before the first.
	SourceReadAt time.Time `json:"sourceReadAt,omitzero"`
	// SourceReadAge is how long ago that was, in seconds (since Run started while no read has
	// succeeded); 0 before Run starts. Well above ProgressInterval, Source is stale.
	SourceReadAge float64 `json:"sourceReadAgeSeconds"`
	// SourceReadFailures is how many reads of blue's revision in a row failed or took longer
	// than their bound since the last that succeeded (0 when the last one did), and
	// SourceReadError the last one's error while they fail.
	SourceReadFailures int64  `json:"sourceReadFailures"`
	SourceReadError    string `json:"sourceReadError,omitempty"`
	// Received is the newest blue revision the watch delivered (FromRevision before any), and
	// ReceivedAt when it did (when Run started, before any); ReceivedAge is how long ago, in
	// seconds. Received behind Source while ReceivedAge grows: blue's watch delivers nothing
	// (WatchStalls counts the watchdog's reopens); Received ahead of Applied while Applied stands
	// still: green applies nothing.
	Received    int64     `json:"receivedRevision"`
	ReceivedAt  time.Time `json:"receivedAt,omitzero"`
	ReceivedAge float64   `json:"receivedAgeSeconds"`
	// LagRevisions is Source - Applied.
	LagRevisions int64 `json:"lagRevisions"`
	// LagSeconds is how long green has been behind: the time since the oldest blue revision
	// not yet applied was seen; 0 when caught up.
	LagSeconds float64 `json:"lagSeconds"`
	// Revisions is how many revisions this run applied.
	Revisions int64 `json:"revisions"`
	// RevisionsPerSecond is the apply rate over the last rateWindow up to now (over the whole
	// run while it is shorter): it falls towards 0 while replication stalls.
	RevisionsPerSecond float64 `json:"revisionsPerSecond"`
	// Leases is how many leases the replicator keeps alive on green.
	Leases int `json:"leases"`
	// Resent is how many txns this run sent again because green proposed them before their
	// predecessor (their guards failed; they changed nothing).
	Resent int64 `json:"resent"`
	// Resyncs is how many times this run drained the pipeline and read green's revision because
	// its oldest txn did not apply (its outcome unknown, or its guards failing again and again).
	Resyncs int64 `json:"resyncs"`
	// LeaseWaits is how many times this run drained the pipeline to grant a lease on green.
	LeaseWaits int64 `json:"leaseWaits"`
	// Compactions is how many times this run compacted green, each to the revision blue's
	// apiserver compacted blue to (its compact_rev_key put, applied to green).
	Compactions int64 `json:"compactions"`
	// BacklogBytes is the backlog: the bytes of blue's changes received and not yet applied to
	// green (keys, values and previous values), what replication holds of them in memory. It
	// stays within Config.MaxBacklog and one watch response.
	BacklogBytes int64 `json:"backlogBytes"`
	// BacklogPauses is how many times this run cancelled blue's watch because the backlog passed
	// Config.MaxBacklog, and watched blue again, from the first revision not received, once green
	// had applied half of it.
	BacklogPauses int64 `json:"backlogPauses"`
	// WatchStalls is how many times this run found blue's watch stalled (blue's revision, read
	// from the cluster, ahead of what the watch delivered, and nothing delivered for
	// Config.WatchStall) and watched blue again on a new stream, from the first revision not
	// received.
	WatchStalls int64 `json:"watchStalls"`
}

const rateWindow = 10 * time.Second

// sample is a count (a revision, or revisions applied) at a time.
type sample struct {
	at time.Time
	n  int64
}

// tracker is the state behind Progress; guarded by Replicator.mu.
type tracker struct {
	applied, source int64
	// seen holds, oldest first, when each newest-so-far blue revision was seen; the first
	// entry above applied is when the oldest unapplied revision was first seen.
	seen      []sample
	revisions int64
	samples   []sample // applied counts, one per rateWindow/40 at most
	// resent, resyncs and leaseWaits are Progress.Resent, Resyncs and LeaseWaits.
	resent, resyncs, leaseWaits int64
	// started is when Run started; readAt when blue's revision was last read, readFailures
	// and readErr the reads failed since (Progress.SourceReadAt, SourceReadFailures and
	// SourceReadError).
	started, readAt time.Time
	readFailures    int64
	readErr         string
}

func (t *tracker) sawSource(rev int64, now time.Time) {
	if rev <= t.source {
		return
	}
	t.source = rev
	t.seen = append(t.seen, sample{now, rev})
}

func (t *tracker) didApply(rev int64, now time.Time) {
	t.applied = rev
	t.revisions++
	t.sawSource(rev, now)
	i := 0
	for i < len(t.seen) && t.seen[i].n <= t.applied {
		i++
	}
	t.seen = t.seen[i:]
	if n := len(t.samples); n == 0 || now.Sub(t.samples[n-1].at) >= rateWindow/40 {
		t.samples = append(t.samples, sample{now, t.revisions})
	} else {
		t.samples[n-1].n = t.revisions
	}
	for len(t.samples) > 2 && now.Sub(t.samples[1].at) > rateWindow {
		t.samples = t.samples[1:]
	}
}

func (t *tracker) snapshot(now time.Time) Progress {
	p := Progress{Applied: t.applied, Source: t.source, LagRevisions: t.source - t.applied, Revisions: t.revisions,
		Resent: t.resent, Resyncs: t.resyncs, LeaseWaits: t.leaseWaits}
	if len(t.seen) > 0 {
		p.LagSeconds = now.Sub(t.seen[0].at).Seconds()
	}
	p.RevisionsPerSecond = t.rate(now)
	p.SourceReadAt, p.SourceReadFailures, p.SourceReadError = t.readAt, t.readFailures, t.readErr
	if last := t.readAt; !last.IsZero() || !t.started.IsZero() {
		if last.IsZero() {
			last = t.started
		}
		p.SourceReadAge = now.Sub(last).Seconds()
	}
	return p
}

// rate is the revisions applied per second from the start of the rateWindow before now (the
// newest sample at or before it; the oldest sample while the run is shorter) up to now, so that
// it falls towards 0 while nothing is applied.
func (t *tracker) rate(now time.Time) float64 {
	if len(t.samples) == 0 {
		return 0
	}
	base := t.samples[0]
	for _, s := range t.samples[1:] {
		if now.Sub(s.at) < rateWindow {
			break
		}
		base = s
	}
	dt := now.Sub(base.at).Seconds()
	if dt <= 0 {
		return 0
	}
	return float64(t.revisions-base.n) / dt
}

// Progress reports where replication stands now.
func (r *Replicator) Progress() Progress {
	now := time.Now()
	r.mu.Lock()
	p := r.progress.snapshot(now)
	r.mu.Unlock()
	p.Leases = r.leases.count()
	p.Compactions = r.compact.count()
	r.feed.fill(&p, now)
	return p
}

func (r *Replicator) sawSource(rev int64) {
	r.mu.Lock()
	r.progress.sawSource(rev, time.Now())
	r.mu.Unlock()
}

// applied records blue's revision rev (its events evs) as applied, wakes WaitFor, takes it off
// the backlog, tells the compactor and calls OnApplied.
func (r *Replicator) applied(rev int64, evs []*clientv3.Event) {
	r.mu.Lock()
	r.progress.didApply(rev, time.Now())
	close(r.cond)
	r.cond = make(chan struct{})
	r.mu.Unlock()
	r.feed.applied(evs)
	r.compact.applied(rev, evs)
	if r.cfg.OnApplied != nil {
		r.cfg.OnApplied(r.Progress())
	}
}

// drained counts a drain of the pipeline: a resync, or a wait to grant a lease.
func (r *Replicator) drained(resync bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if resync {
		r.progress.resyncs++
	} else {
		r.progress.leaseWaits++
	}
}

// resent counts n txns sent again.
func (r *Replicator) resent(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress.resent += int64(n)
}

// pollSource reads blue's current revision every ProgressInterval, so the lag is right while
// the watch is quiet or behind, and hands it to the feed's watchdog.
func (r *Replicator) pollSource(ctx context.Context) {
	_ = wait.PollUntilContextCancel(ctx, r.cfg.ProgressInterval, false, func(ctx context.Context) (bool, error) {
		r.readSource(ctx)
		return false, nil // until ctx ends
	})
}

// readSource reads blue's revision once, within two ProgressIntervals: a linearizable read
// that reaches a member that stopped applying waits for ever (etcd 3.6 linearizableReadLoop
// waits for the member's applied index), and etcd's client sends reads to its endpoints in
// turn, so without a bound one such read would stop Source, and the lag with it, for good.
// A read that fails is counted and logged, and Source kept with its age.
func (r *Replicator) readSource(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 2*r.cfg.ProgressInterval)
	rev, err := Revision(rctx, r.cfg.Source)
	cancel()
	now := time.Now()
	if ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	t := &r.progress
	last, failures := t.readAt, t.readFailures
	if err != nil {
		t.readFailures++
		t.readErr = err.Error()
	} else {
		t.readAt, t.readFailures, t.readErr = now, 0, ""
		t.sawSource(rev, now)
	}
	r.mu.Unlock()
	if err != nil {
		r.cfg.Log.Warn("reading blue's revision for the lag failed; the lag counts from the last revision seen", "err", err, "failed in a row", failures+1, "last read", sinceOrNever(last, now))
		return
	}
	if failures > 0 {
		r.cfg.Log.Info("read blue's revision again", "revision", rev, "failed before", failures, "last read", sinceOrNever(last, now))
	}
	r.feed.dog.sawCluster(rev, now)
}

// sinceOrNever is how long before now at was, for a log ("never" for a zero at).
func sinceOrNever(at, now time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return now.Sub(at).Round(time.Millisecond).String()
}
