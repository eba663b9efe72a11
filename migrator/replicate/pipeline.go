package replicate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Pipelining: one txn per revision, sent one after the other, is bounded by green's commit
// latency (a WAL fsync each), which under load is below the write rate of a busy cluster. So
// several txns may be in flight at once, and etcd commits them together. Concurrent requests may
// be proposed in any order, so each txn carries guards that make it apply only on top of its
// predecessor and only once:
//
//   - "revision N-1 is applied": a key N-1 put (and kept) has mod revision N-1 (or a key it
//     deleted is gone; appliedGuard);
//   - "revision N is not applied": that key of N (telling) has a mod revision below N (or, one
//     it deletes, still exists).
//
// A txn whose guards fail changes nothing (no revision), but it still cost green a raft entry
// (on every member, the values included). How often a burst is proposed out of order depends on
// green: etcd starts a goroutine per request and on a loaded member the newest often runs first;
// a three-member green on shared cores proposed most bursts so, and sending every failed txn of
// a burst again at once made a new burst proposed out of order (bench-cutover: 34,686 txns sent
// again in a run with 2,504 writes). So the number of txns in flight is a window that adapts as
// TCP's congestion window does: it grows by one per window of txns applied in order while it was
// full, and halves (down to one, the txns sent one after the other) when a txn sent since the
// last cut failed its guards.
//
// When the oldest txn in flight failed its guards (its predecessor is applied, so it was
// proposed too early), it is sent again at once, without the predecessor's guard, with the later
// txns whose guards failed too, as many as the window allows; the rest stays in flight and is
// sent again when it is the oldest, and no new txn goes out behind a failed one (it could only
// fail too): a revision never has two attempts in flight, and the guards keep each attempt
// exact. Only when the oldest failed its guards maxHeadRetries times in a row, or its outcome is
// unknown (a timeout, a lost connection), does the pipeline resync: it waits for every txn in
// flight, reads green's revision g, checks that green's revision g is blue's change for change,
// counts everything up to g as applied, and sends the rest again. Txns are never cancelled in
// flight: Run waits for them, and when one ended with its outcome unknown (it timed out, and
// green may still commit it), Run learns green's revision through green's raft log after it
// (pipeline.stop), so that none reaches green after Run returns.

// pipelineDepth is the most txns in flight at once (the window's ceiling).
const pipelineDepth = 64

// maxHeadRetries is how many guard failures in a row of the oldest txn are sent again at once
// before the pipeline resyncs (reads green's revision): with its predecessor applied, the
// oldest can keep failing only if something else changed green.
const maxHeadRetries = 3

// sentTxn is a txn in flight.
type sentTxn struct {
	rev int64
	// seq numbers the attempts (pipeline.seq), so that one burst proposed out of order cuts
	// the window once.
	seq  uint64
	evs  []*clientv3.Event
	ops  []clientv3.Op
	done chan struct{}
	resp *clientv3.TxnResponse
	err  error
}

// pipeline holds the txns in flight, oldest first.
type pipeline struct {
	r      *Replicator
	flight []*sentTxn
	// resyncs counts resyncs since the last revision applied, to give up on a green that
	// keeps failing.
	resyncs int
	// headRetries counts the oldest txn's guard failures sent again since it was last applied.
	headRetries int
	// window is how many txns may be in flight (the congestion window, see above); 0 counts
	// as 1. credit counts the txns applied in order while it was full, since it last changed.
	window, credit int
	// seq is the next attempt's number; attempts numbered below cutSeq were sent before the
	// window was last cut.
	seq, cutSeq uint64
}

// limit is how many txns may be in flight now.
func (p *pipeline) limit() int {
	return min(pipelineDepth, max(1, p.window))
}

// canSend says whether a new txn may go out: the window has room, and no txn in flight has
// failed its guards without being sent again yet (a new txn behind it would fail too, and its
// failure would cut the window although green reordered nothing).
func (p *pipeline) canSend() bool {
	return len(p.flight) < p.limit() && !slices.ContainsFunc(p.flight, guardsFailed)
}

// grow counts the oldest txn, applied in order, towards widening the window by one per
// window's worth; only while the window is full of txns not known to have failed (the head
// still among them), so that a green keeping up with a txn or two in flight does not open it
// to the ceiling for the next burst.
func (p *pipeline) grow() {
	if len(p.flight)-countFunc(p.flight, guardsFailed) < p.limit() {
		return
	}
	if p.credit++; p.credit >= p.limit() {
		p.window, p.credit = min(pipelineDepth, p.limit()+1), 0
	}
}

// countFunc counts the elements of s that f holds for.
func countFunc[T any](s []T, f func(T) bool) int {
	n := 0
	for _, v := range s {
		if f(v) {
			n++
		}
	}
	return n
}

// cut halves the window after t failed its guards, once per burst: a failure of a txn sent
// before the last cut is that cut's burst still ending.
func (p *pipeline) cut(t *sentTxn) {
	if t.seq < p.cutSeq {
		return
	}
	p.window, p.credit = max(1, p.limit()/2), 0
	p.cutSeq = p.seq
}

// lastSent is the newest revision sent or applied.
func (p *pipeline) lastSent() int64 {
	if n := len(p.flight); n > 0 {
		return p.flight[n-1].rev
	}
	return p.r.appliedRev()
}

// submit sends blue's revision rev (its events evs) to green, keeping at most the window's
// txns in flight; revisions must come in order.
func (p *pipeline) submit(ctx context.Context, rev int64, evs []*clientv3.Event) error {
	if last := p.lastSent(); rev != last+1 {
		return fmt.Errorf("%w: blue's stream holds revision %d next but green is at %d: a revision would be skipped or applied twice", ErrRevisionMismatch, rev, last)
	}
	if p.needsLease(evs) {
		// A lease grant must see green at a known revision: nothing in flight (counted when
		// something was).
		if len(p.flight) > 0 {
			p.r.drained(false)
		}
		if err := p.flush(ctx); err != nil {
			return err
		}
	}
	ops, err := p.r.ops(ctx, rev, evs)
	if err != nil {
		return err
	}
	for !p.canSend() {
		if err := p.settle(ctx); err != nil {
			return err
		}
	}
	p.send(ctx, &sentTxn{rev: rev, evs: evs, ops: ops})
	return nil
}

// needsLease says whether a put of evs names a lease green does not keep yet.
func (p *pipeline) needsLease(evs []*clientv3.Event) bool {
	for _, ev := range evs {
		if id := clientv3.LeaseID(ev.Kv.Lease); ev.Type == mvccpb.PUT && id != clientv3.NoLease && !p.r.leases.has(id) {
			return true
		}
	}
	return false
}

// send appends t to the txns in flight and starts it.
func (p *pipeline) send(ctx context.Context, t *sentTxn) {
	p.flight = append(p.flight, t)
	p.attempt(ctx, len(p.flight)-1)
}

// attempt starts the txn flight[i] with its guards (the predecessor's only when that is in
// flight too). The request is not tied to ctx: once sent it is waited for, never abandoned.
func (p *pipeline) attempt(ctx context.Context, i int) {
	t := p.flight[i]
	var cmps []clientv3.Cmp
	if i > 0 {
		cmps = append(cmps, appliedGuard(p.flight[i-1].evs, t.rev-1, createdOrDeletedIn(p.flight[:i-1])))
	}
	cmps = append(cmps, notAppliedGuard(t.evs, t.rev)...)
	t.done, t.resp, t.err = make(chan struct{}), nil, nil
	t.seq = p.seq
	p.seq++
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.r.cfg.ApplyTimeout)
	go func() {
		defer close(t.done)
		defer cancel()
		t.resp, t.err = p.r.cfg.Dest.Txn(tctx).If(cmps...).Then(t.ops...).Commit()
	}()
}

// telling is the first event of evs (one revision) whose key shows on green whether the
// revision is applied: a key it puts and keeps, failing that a key it deletes that existed
// before it and that no revision before it still in flight creates or deletes (unsure, nil for
// none: such a revision may not be applied yet, and the key then gone before the delete too;
// one that only updates the key leaves it there all along); nil when no key tells (a put and a
// later delete in one txn leave none). exactly: the key must also tell "not applied yet"
// from "applied, and changed by a later revision" (notAppliedGuard): a put that creates its
// key cannot (deleted later, its mod revision is 0 again), so an update, or a delete of a key
// that existed, comes first, and a create only if there is neither.
func telling(evs []*clientv3.Event, exactly bool, unsure func(key string) bool) *clientv3.Event {
	last := make(map[string]mvccpb.Event_EventType, len(evs))
	created := make(map[string]bool)
	for _, ev := range evs {
		last[string(ev.Kv.Key)] = ev.Type
		if ev.Type == mvccpb.PUT && ev.Kv.Version == 1 {
			created[string(ev.Kv.Key)] = true
		}
	}
	kept := func(ev *clientv3.Event) bool { return ev.Type == mvccpb.PUT && last[string(ev.Kv.Key)] == mvccpb.PUT }
	for _, pick := range []func(*clientv3.Event) bool{
		func(ev *clientv3.Event) bool { return kept(ev) && (!exactly || !created[string(ev.Kv.Key)]) },
		func(ev *clientv3.Event) bool {
			k := string(ev.Kv.Key)
			return ev.Type == mvccpb.DELETE && !created[k] && (unsure == nil || !unsure(k))
		},
		kept,
	} {
		for _, ev := range evs {
			if pick(ev) {
				return ev
			}
		}
	}
	return nil
}

// appliedGuard holds once revision rev (whose events are evs) is applied on green: its telling
// key has mod revision rev (a put) or is gone (a delete of a key unsure does not name: one the
// revisions before rev still in flight create or delete). With no telling key the guard is one that
// never holds (the mod revision rev of a key gone after rev), and a txn sent behind it is sent
// again once it is applied.
func appliedGuard(evs []*clientv3.Event, rev int64, unsure func(key string) bool) clientv3.Cmp {
	ev := telling(evs, false, unsure)
	switch {
	case ev == nil:
		return clientv3.Compare(clientv3.ModRevision(string(evs[0].Kv.Key)), "=", rev)
	case ev.Type == mvccpb.PUT:
		return clientv3.Compare(clientv3.ModRevision(string(ev.Kv.Key)), "=", rev)
	}
	return clientv3.Compare(clientv3.Version(string(ev.Kv.Key)), "=", 0)
}

// createdOrDeletedIn says whether txns create or delete a key (the set is made on the first
// question).
func createdOrDeletedIn(txns []*sentTxn) func(key string) bool {
	var keys map[string]bool
	return func(key string) bool {
		if keys == nil {
			keys = make(map[string]bool)
			for _, t := range txns {
				for _, ev := range t.evs {
					if ev.Type == mvccpb.DELETE || ev.Kv.Version == 1 {
						keys[string(ev.Kv.Key)] = true
					}
				}
			}
		}
		return keys[key]
	}
}

// notAppliedGuard holds while revision rev (whose events are evs) is not applied on green: its
// telling key (else its first) was last changed before rev. A late copy of a txn (one that timed out and that
// green commits after all) must not apply again once later revisions changed that key: so a
// delete, or a put that updates the key, also needs the key to exist, or a key put again
// later would be deleted, or one deleted later put back. A put that creates the key cannot
// tell "not yet created" from "deleted since" by the key alone; the check of green's revision
// after every txn stops replication if that happens.
func notAppliedGuard(evs []*clientv3.Event, rev int64) []clientv3.Cmp {
	ev := telling(evs, true, nil)
	if ev == nil {
		ev = evs[0] // no key tells: the check of green's revision after the txn is the guard
	}
	key := string(ev.Kv.Key)
	before := clientv3.Compare(clientv3.ModRevision(key), "<", rev)
	if ev.Type == mvccpb.PUT && ev.Kv.Version == 1 {
		return []clientv3.Cmp{before}
	}
	return []clientv3.Cmp{clientv3.Compare(clientv3.Version(key), ">", 0), before}
}

// settle waits for the oldest txn in flight: applied as its revision, it is counted; anything
// else but a definite error resyncs.
func (p *pipeline) settle(ctx context.Context) error {
	t := p.flight[0]
	<-t.done
	if t.err == nil && t.resp.Succeeded {
		if got := t.resp.Header.Revision; got != t.rev {
			return fmt.Errorf("%w: after applying blue's revision %d (%d operations) green is at revision %d: something else wrote to green, or green expired a lease by itself; green no longer equals blue", ErrRevisionMismatch, t.rev, len(t.evs), got)
		}
		p.grow()
		p.flight = p.flight[1:]
		p.resyncs, p.headRetries = 0, 0
		p.r.applied(t.rev, t.evs)
		return nil
	}
	if t.err == nil && p.headRetries < maxHeadRetries {
		p.cut(t)
		p.headRetries++
		p.resendFailed(ctx)
		return nil
	}
	if t.err != nil {
		if err := definite(t.err, t.rev, t.evs); err != nil {
			p.wait()
			return err
		}
	}
	return p.resync(ctx, t.err)
}

// resendFailed sends the oldest txn again (its guards failed), and the later ones after it
// whose guards failed too, in order, up to the first one still in flight or ended otherwise (a
// txn sent again behind one still in flight would fail again if that one does) and at most the
// window's worth.
func (p *pipeline) resendFailed(ctx context.Context) {
	resent := 0
	for i, t := range p.flight[:min(len(p.flight), p.limit())] {
		if i > 0 && !guardsFailed(t) {
			break
		}
		next := *t
		p.flight[i] = &next
		p.attempt(ctx, i)
		resent++
	}
	p.r.resent(resent)
}

// guardsFailed says whether t has ended with its guards failed (it changed nothing).
func guardsFailed(t *sentTxn) bool {
	select {
	case <-t.done:
		return t.err == nil && !t.resp.Succeeded
	default:
		return false
	}
}

// flush settles every txn in flight.
func (p *pipeline) flush(ctx context.Context) error {
	for len(p.flight) > 0 {
		if err := p.settle(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stop waits for every txn in flight to end (Run does before it returns) and counts as applied
// those green applied, oldest first, up to the first that did not: Progress().Applied is then
// green's revision as far as these txns go, also when Run was stopped with txns in flight. A
// txn that ended with its outcome unknown (a timeout, a lost connection) may still commit on
// green after it ended: then green's revision is learnt through green's raft log and adopted
// (settleUnknown), so that none commits after Run returns.
func (p *pipeline) stop() error {
	p.wait()
	for _, t := range p.flight {
		switch {
		case t.rev <= p.r.appliedRev():
			continue // counted already (a resync stopped half-way)
		case t.err == nil && t.resp.Succeeded && t.resp.Header.Revision == t.rev:
			p.r.applied(t.rev, t.evs)
		case t.err != nil && definite(t.err, t.rev, t.evs) == nil:
			return p.settleUnknown(t)
		case t.err != nil:
			// green refused it, so it changed nothing, and neither did a later one (each is
			// guarded on its predecessor)
			return nil
		default:
			// Applied as another revision (green moved on by itself), or its guards failed,
			// where a later txn may still have applied (sent again by a resync after this
			// one's first copy committed late): green's revision says which, and whether it
			// is blue's (no settle runs after Run stopped).
			return p.settleUnknown(t)
		}
	}
	return nil
}

// settleUnknown learns green's revision after Run stopped with t's outcome unknown, or t not
// applied at its revision, within one ApplyTimeout: a barrier (a txn that changes nothing,
// ordered in green's raft log after every request green had proposed, t included) answers with
// green's revision g once each of those is applied, and g is adopted (checked to be blue's
// revision g: one green made by itself is ErrRevisionMismatch).
func (p *pipeline) settleUnknown(t *sentTxn) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.r.cfg.ApplyTimeout)
	defer cancel()
	g, err := barrier(ctx, p.r.cfg.Dest)
	if err != nil {
		how := fmt.Sprintf("ended with %v and may still commit on green", t.err)
		if t.err == nil {
			how = fmt.Sprintf("did not apply as revision %d", t.rev)
		}
		return fmt.Errorf("replicate: stopped with green's revision unknown: blue's revision %d %s; reading green's revision through its raft log failed: %v", t.rev, how, err)
	}
	if err := p.adopt(ctx, g); err != nil {
		return err
	}
	p.r.cfg.Log.Info("stopped with a txn not known to be applied at its revision; green's revision read after it", "revision", t.rev, "err", t.err, "green", g)
	return nil
}

// barrier commits on cli, through its raft log, a txn that changes nothing (its guard never
// holds; one that could write is not served as a read), and returns the revision it answers
// with: every request proposed before it is applied by then.
func barrier(ctx context.Context, cli *clientv3.Client) (int64, error) {
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(ProbeKey), "<", 0)).Then(clientv3.OpPut(ProbeKey, "")).Commit()
	if err != nil {
		return 0, err
	}
	if resp.Succeeded {
		return 0, fmt.Errorf("the barrier's guard (version of %q below 0) held", ProbeKey)
	}
	return resp.Header.Revision, nil
}

// wait waits for every txn in flight to end, whatever its outcome.
func (p *pipeline) wait() {
	for _, t := range p.flight {
		<-t.done
	}
}

// resync settles the pipeline after its oldest txn did not apply as expected (cause: its error,
// or nil when its guards failed): green's revision g is read, checked to be blue's revision g,
// everything up to g counted as applied, and the rest sent again.
func (p *pipeline) resync(ctx context.Context, cause error) error {
	p.wait()
	p.resyncs++
	p.r.drained(true)
	if p.resyncs > 10 {
		if cause == nil {
			cause = errors.New("its guards failed: green was not at the revision before it")
		}
		return fmt.Errorf("replicate: applying blue's revision %d to green failed 10 times: %w", p.flight[0].rev, cause)
	}
	if p.resyncs > 1 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(p.resyncs) * 50 * time.Millisecond):
		}
	}
	g, err := p.greenRevision(ctx)
	if err != nil {
		return err
	}
	if err := p.adopt(ctx, g); err != nil {
		return err
	}
	again := p.flight
	p.flight = nil
	for _, t := range again {
		if t.rev > g {
			p.send(ctx, &sentTxn{rev: t.rev, evs: t.evs, ops: t.ops})
		}
	}
	return nil
}

// greenRevision reads green's revision, trying for a while (green may be restarting).
func (p *pipeline) greenRevision(ctx context.Context) (int64, error) {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		gctx, cancel := context.WithTimeout(ctx, p.r.cfg.ApplyTimeout)
		rev, err := Revision(gctx, p.r.cfg.Dest)
		cancel()
		if err == nil {
			return rev, nil
		}
		if attempt == 10 || ctx.Err() != nil {
			return 0, fmt.Errorf("replicate: reading green's revision after a txn did not apply (%d in flight), %d attempts: %w", len(p.flight), attempt, err)
		}
		p.r.cfg.Log.Warn("reading green's revision failed; trying again", "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// adopt counts green's revisions up to g as applied, once green's revision g is checked to be
// blue's: the txns in flight are the only writers of green, each applied at most once.
func (p *pipeline) adopt(ctx context.Context, g int64) error {
	applied := p.r.appliedRev()
	switch {
	case g == applied:
		return nil
	case g < applied || g > p.lastSent():
		return fmt.Errorf("%w: green is at revision %d, replication had applied %d and sent up to %d: something else wrote to green", ErrRevisionMismatch, g, applied, p.lastSent())
	}
	var top *sentTxn
	for _, t := range p.flight {
		if t.rev == g {
			top = t
		}
	}
	// Within what a revision's tries would take (ApplyTimeout, 10 times): a watch on a green
	// that became unreachable waits for it without end.
	cctx, cancel := context.WithTimeout(ctx, 10*p.r.cfg.ApplyTimeout)
	defer cancel()
	diff, err := p.r.compareRevision(cctx, g, top.evs)
	if err != nil {
		return fmt.Errorf("replicate: reading green's revision %d: %w", g, err)
	}
	if diff != "" {
		return fmt.Errorf("%w: green's revision %d is not blue's: %s", ErrRevisionMismatch, g, diff)
	}
	for _, t := range p.flight { // applied+1 … the newest sent, in order
		if t.rev > applied && t.rev <= g {
			p.r.applied(t.rev, t.evs)
		}
	}
	p.resyncs = 0
	return nil
}
