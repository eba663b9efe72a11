package cutover

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// Catching up gives up early when green cannot: blue writing faster than green applies makes
// the lag grow without end, and waiting out timeouts.replicate (10 minutes by default) would
// only say so later, with nothing learnt. The lag is sampled every catchUpSampleEvery (from
// one interval after the start, when the replicator has read blue's revision); once, over
// catchUpPatience, it has grown in both halves by more than catchUpGrowth of what blue wrote
// in each, and is above catchUpLagFloor, the catch-up fails with both rates. Both halves: a
// burst of writes near the end (a rollout) is not a trend; a share of blue's writes: a lag
// that only wobbles while green keeps pace is not one either.
const (
	catchUpSampleEvery = 5 * time.Second
	catchUpPatience    = 2 * time.Minute
	// catchUpGrowth is the share of blue's writes the lag must grow by in each half.
	catchUpGrowth = 0.05
	// catchUpLagFloor is a lag left to the wait itself: a few revisions behind a busy blue is
	// what catching up looks like, not falling behind.
	catchUpLagFloor = 100
)

// notCatchingUpError says that green's lag grew through a whole patience (see lagTrend.add).
type notCatchingUpError struct {
	src, dst         string
	over             time.Duration
	applied, written int64
	lagThen, lagNow  int64
	// now is where replication stood when it gave up: which side stalled (stalledSide).
	now replicate.Progress
}

func (e *notCatchingUpError) Error() string {
	secs := e.over.Seconds()
	if e.applied == 0 {
		return fmt.Sprintf("%s is not catching up with %s: over the last %s %s applied no revision while %s wrote %d; the lag went from %d to %d revisions; %s; waiting out timeouts.replicate would not help",
			e.dst, e.src, e.over.Round(time.Second), e.dst, e.src, e.written, e.lagThen, e.lagNow, stalledSide(e.now, side{name: e.src}, side{name: e.dst}))
	}
	return fmt.Sprintf("%s is not catching up with %s: over the last %s %s applied %d revisions (%.0f/s) while %s wrote %d (%.0f/s); the lag went from %d to %d revisions. "+
		"Waiting out timeouts.replicate would not help: give %s faster disks or hosts, or cut over when %s writes less",
		e.dst, e.src, e.over.Round(time.Second), e.dst, e.applied, float64(e.applied)/secs, e.src, e.written, float64(e.written)/secs,
		e.lagThen, e.lagNow, e.dst, e.src)
}

// Unwrap is, when nothing was applied, which side stalled (a replicationStalled), so that the
// abort's advice reads it as it reads the drain's.
func (e *notCatchingUpError) Unwrap() error {
	if e.applied != 0 {
		return nil
	}
	return stalledError(e.now, side{name: e.src}, side{name: e.dst})
}

// lagSample is where replication stood at a time.
type lagSample struct {
	at              time.Time
	applied, source int64
}

// lagTrend follows green's lag while it catches up.
type lagTrend struct {
	patience time.Duration
	src, dst string
	// samples, oldest first: the first is the newest one at least patience old, once there is
	// one.
	samples []lagSample
}

// add records p at now; it returns a *notCatchingUpError once the lag, above
// catchUpLagFloor, has grown in both halves of the last patience (see catchUpPatience).
func (t *lagTrend) add(now time.Time, p replicate.Progress) error {
	cur := lagSample{now, p.Applied, p.Source}
	t.samples = append(t.samples, cur)
	for len(t.samples) > 1 && now.Sub(t.samples[1].at) >= t.patience {
		t.samples = t.samples[1:]
	}
	ref := t.samples[0]
	if now.Sub(ref.at) < t.patience || cur.lag() <= catchUpLagFloor {
		return nil
	}
	half := ref.at.Add(now.Sub(ref.at) / 2)
	mid := t.samples[slices.IndexFunc(t.samples, func(s lagSample) bool { return !s.at.Before(half) })]
	if !falling(ref, mid) || !falling(mid, cur) {
		return nil
	}
	return &notCatchingUpError{src: t.src, dst: t.dst, over: now.Sub(ref.at), applied: cur.applied - ref.applied,
		written: cur.source - ref.source, lagThen: ref.lag(), lagNow: cur.lag(), now: p}
}

func (s lagSample) lag() int64 { return s.source - s.applied }

// falling says whether the lag grew from a to b by more than catchUpGrowth of what the source
// wrote between them.
func falling(a, b lagSample) bool {
	grew := b.lag() - a.lag()
	return grew > 0 && float64(grew) > catchUpGrowth*float64(b.source-a.source)
}

// watchCatchUp samples progress every interval until ctx ends; once the lag has grown through
// patience (lagTrend.add), it cancels ctx with the *notCatchingUpError.
func watchCatchUp(ctx context.Context, cancel context.CancelCauseFunc, progress func() replicate.Progress, every, patience time.Duration, src, dst string) {
	t := lagTrend{patience: patience, src: src, dst: dst}
	_ = wait.PollUntilContextCancel(ctx, every, false, func(context.Context) (bool, error) {
		if err := t.add(time.Now(), progress()); err != nil {
			cancel(err)
			return true, nil
		}
		return false, nil
	})
}

// catchUpRates describes a catch-up that began with dst at revision from and src at srcFrom and
// ended with both at rev after took: how fast dst applied against src's writes, the headroom a
// rehearsal is run to learn. dst was behind throughout, so its rate is a lower bound of what it
// can apply. Empty when dst was not behind or the catch-up was too short to time.
func catchUpRates(from, srcFrom, rev int64, took time.Duration, src, dst string) string {
	behind, applied, written := srcFrom-from, rev-from, rev-srcFrom
	if behind <= 0 || took < time.Second {
		return ""
	}
	secs := took.Seconds()
	out := fmt.Sprintf("; from %d revisions behind, %s applied %d (%.0f/s) while %s wrote ", behind, dst, applied, float64(applied)/secs, src)
	if written <= 0 {
		return out + "nothing"
	}
	return out + fmt.Sprintf("%d (%.0f/s): %s applies at least %.1fx %s's write rate", written, float64(written)/secs, dst, float64(applied)/float64(written), src)
}

// preFenceCatchUp bounds catching up with blue right before the fence (mode replicate). After
// a full verify of a large cluster green can be thousands of revisions behind; each round
// shortens the lag by the ratio of blue's write rate to green's apply rate, so the bound is
// generous and a green that stops gaining ends the wait much sooner (catchUpRounds).
const preFenceCatchUp = 2 * time.Minute

// beforeFence bounds what the fence step (and the rehearsal's drain) does before the fence
// request: connecting to the etcd of up to two sides for the window's auth steps, catching up,
// whose last read of blue's revision may begin just before the catch-up's bound, and the
// proxies' prepare of the switch's apiserver.
const beforeFence = preFenceCatchUp + 3*revisionReadBound + prepareTimeout

// catchUpRound is how short a catch-up round must be for green to count as caught up.
const catchUpRound = 50 * time.Millisecond

// catchUpRounds decides, round after round, whether catching up before the fence goes on: a
// round waits until green applied blue's revision read at its start, so it lasts as long as
// green needs for the lag it began with. While green gains on blue the rounds get shorter;
// two rounds in a row no shorter than the shortest so far, and not clearly shorter than the
// one before (by gainingBy), mean green only keeps pace (or falls behind), and waiting longer
// would not shrink the drain. A round clearly shorter than the one before is a gain, however
// long it still is (a burst of writes after green had caught up).
type catchUpRounds struct {
	shortest time.Duration
	stalls   int
	// rounds counts the rounds so far, last is the latest's duration, and caughtUp says
	// whether it was catchUpRound or shorter.
	rounds   int
	last     time.Duration
	caughtUp bool
	// to and from name the sides for the detail: green and blue, or blue and green in a
	// rollback.
	to, from string
}

// next takes a round's duration and says whether to go on.
func (c *catchUpRounds) next(took time.Duration) (goOn bool) {
	prev := c.last
	c.rounds, c.last = c.rounds+1, took
	if took <= catchUpRound {
		c.caughtUp = true
		return false
	}
	switch {
	case c.shortest > 0 && took >= c.shortest && float64(took) > gainingBy*float64(prev):
		c.stalls++
		return c.stalls < 2
	case c.shortest > 0 && took >= c.shortest: // shorter than the round before: gaining
		c.stalls = 0
		return true
	}
	c.shortest, c.stalls = took, 0
	return true
}

// gainingBy is how much shorter than the one before a round must be to count as a gain (a
// tenth shorter): rounds wobbling at one pace do not.
const gainingBy = 0.9

// String says how the catch-up ended, for the step's detail.
func (c *catchUpRounds) String() string {
	last := c.last.Round(time.Millisecond)
	switch {
	case c.rounds == 0:
		return fmt.Sprintf("%s did not catch up with %s in the time allowed (no round ended)", c.to, c.from)
	case c.caughtUp:
		return fmt.Sprintf("%s caught up with %s in %d round(s), the last %s", c.to, c.from, c.rounds, last)
	case c.stalls >= 2:
		return fmt.Sprintf("%s did not gain on %s in its last 2 of %d round(s), the last %s", c.to, c.from, c.rounds, last)
	}
	return fmt.Sprintf("%s did not catch up with %s in the time allowed: %d round(s), the last %s", c.to, c.from, c.rounds, last)
}

// revisionReadBound bounds a read of an etcd's revision before the fence (blue's while catching
// up, either side's while connecting for the window's auth steps). etcd answers it in
// milliseconds; the etcd client retries an unavailable member within the bound, so a leader
// election or a short stall is ridden out, while an etcd that has not answered in this long is
// down or cut off, which waiting longer would not help with.
const revisionReadBound = 30 * time.Second

// catchUpBound is how long the catch-up before the fence may take: preFenceCatchUp unless the
// runner says otherwise.
func (r *runner) catchUpBound() time.Duration {
	if r.preFence > 0 {
		return r.preFence
	}
	return preFenceCatchUp
}

// readBound bounds each read of an etcd's revision before the fence: revisionReadBound, or the
// catch-up's whole bound if that is shorter.
func (r *runner) readBound() time.Duration { return min(revisionReadBound, r.catchUpBound()) }

// catchUpBeforeFence lets green catch up with blue right before the fence, so that the window
// drains only what blue takes between this and the fence's barrier, not whatever lag
// replication had at that moment (catchUpRounds, whose String says how it ended). Under a
// writer as fast as green, or after preFenceCatchUp, the fence goes on anyway and the drain is
// bounded by timeouts.window as always. A blue whose revision cannot be read (within
// readBound), or a replicator that stopped, fails the step before anything is fenced.
func (r *runner) catchUpBeforeFence(ctx context.Context) (*catchUpRounds, error) {
	began := time.Now()
	deadline := began.Add(r.catchUpBound())
	rounds := &catchUpRounds{to: r.to.name, from: r.from.name}
	atStart := r.repl.rep.Progress()
	var target int64
	for time.Now().Before(deadline) {
		start := time.Now()
		var err error
		target, err = r.blueRevision(ctx)
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithDeadline(ctx, deadline)
		err = r.repl.rep.WaitFor(wctx, target)
		cancel()
		if err == nil {
			if !rounds.next(time.Since(start)) {
				return rounds, nil
			}
			continue
		}
		if stopped := r.catchUpStopped(ctx); stopped != nil {
			return nil, stopped
		}
		if time.Now().Before(deadline) {
			return nil, fmt.Errorf("catching up with %s before the fence: %w", r.from.name, err)
		}
	}
	if err := r.catchUpStalled(atStart, r.repl.rep.Progress(), target, time.Since(began)); err != nil {
		return nil, err
	}
	return rounds, nil
}

// catchUpStalled is why a catch-up that ended on its bound must not lead to the fence:
// replication applied nothing in it (over) while green was behind blue (at blue, the revision
// last read), so the window's drain could only wait out its budget and abort. A stalled
// replicator is not a stopped one: replicationAlive passes it. It says which side stalled, from
// what the feed received: green applying none of what blue's watch delivered, or blue's watch
// delivering nothing (Progress.Received). nil when replication applied something, or green is
// at blue's revision.
func (r *runner) catchUpStalled(atStart, now replicate.Progress, blue int64, over time.Duration) error {
	if now.Applied != atStart.Applied || now.Applied >= blue {
		return nil
	}
	return fmt.Errorf("replication applied nothing while catching up before the fence (%s): %s stayed at revision %d while %s is at %d; %w; nothing is fenced",
		over.Round(time.Millisecond), r.to.name, now.Applied, r.from.name, blue, stalledError(now, r.from, r.to))
}

// replicationStalled is stalledSide's finding as an error, so that the abort's advice fits the
// side that stalled (adviseAfterAbort).
type replicationStalled struct {
	onSource bool // the source's watch delivered nothing past what was applied
	msg      string
}

func (e *replicationStalled) Error() string { return e.msg }

// stalledError is stalledSide as a replicationStalled.
func stalledError(p replicate.Progress, src, dst side) *replicationStalled {
	return &replicationStalled{onSource: p.Received <= p.Applied, msg: stalledSide(p, src, dst)}
}

// stalledSide says which side of a replication from src into dst that stands still is the
// cause, from what its feed received (p): dst applying none of the revisions src's watch
// delivered, or src's watch delivering nothing past a revision (dst then has nothing to apply,
// and its etcd is not the cause), and which etcd to look at.
func stalledSide(p replicate.Progress, src, dst side) string {
	if p.Received > p.Applied {
		return fmt.Sprintf("%s applied none of the revisions %d-%d received from %s's watch: check %s etcd%s: its health, its log, its disk",
			dst.name, p.Applied+1, p.Received, src.name, dst.name, endpointsNote(dst))
	}
	return fmt.Sprintf("nothing from %s's watch past revision %d (the last received %.1fs ago; %d watch stall(s) found and the watch opened again): check %s etcd%s: its health, its log, the network to it",
		src.name, p.Received, p.ReceivedAge, p.WatchStalls, src.name, endpointsNote(src))
}

// endpointsNote is " (endpoints)" for sd's etcd, "" when they are not known.
func endpointsNote(sd side) string {
	if len(sd.etcd.Endpoints) == 0 {
		return ""
	}
	return " (" + strings.Join(sd.etcd.Endpoints, ", ") + ")"
}

// catchUpStopped is why catching up cannot go on, whatever a read or wait answered: the
// replicator stopped, or ctx ended; nil otherwise.
func (r *runner) catchUpStopped(ctx context.Context) error {
	if err := r.replicationAlive(); err != nil {
		return err
	}
	return ctx.Err()
}

// readRevision reads the revision of cli's etcd before the fence, within readBound.
func (r *runner) readRevision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, r.readBound())
	defer cancel()
	return replicate.Revision(rctx, cli)
}

// blueRevision reads the revision of the side replication reads (blue in a cutover) for the
// catch-up before the fence, within readBound.
func (r *runner) blueRevision(ctx context.Context) (int64, error) {
	rev, err := r.readRevision(ctx, r.repl.src)
	if err == nil {
		return rev, nil
	}
	if stopped := r.catchUpStopped(ctx); stopped != nil {
		return 0, stopped
	}
	return 0, fmt.Errorf("reading %s's revision before the fence (%s at most): %w; nothing is fenced. Check %s etcd (%s): its health, its log, the network to it; then run again",
		r.from.name, r.readBound(), err, r.from.name, strings.Join(r.from.etcd.Endpoints, ", "))
}
