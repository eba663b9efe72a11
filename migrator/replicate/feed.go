package replicate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The feed reads blue's watch for the apply, in a goroutine of its own, so that blue's changes
// received and not yet applied to green are counted here, and bounded. etcd's client reads a
// watch's stream as it arrives into a buffer without a bound (clientv3 watch.go: "TODO pause
// channel if buffer gets too large"), whether anyone reads the watch or not: with green applying
// slower than blue is written (green restored slowly, a heavy writer on blue) the whole backlog
// would pile up in this process (1,000 revisions/s of 5 KB: 300 MB a minute). So once the
// backlog passes MaxBacklog the feed cancels blue's watch (the client drops what it buffered
// for it), keeps the revisions it received, and waits until green has applied it down to half
// the bound; then it watches blue again from the first revision it has not received. The rest
// of the backlog waits in blue's history meanwhile; if blue compacted it, the new watch fails as
// any watch from a compacted revision does (ErrCompacted: green is rebuilt from a new snapshot).
//
// etcd never splits a revision's events across watch responses, and the feed stops only
// between responses, so each revision is received whole and once: the next watch starts after
// the last revision of the last response kept (and pipeline.submit refuses a revision that is
// not the one after the last sent). The backlog is at most the bound and one response; a
// response that catches a watch up (one opened behind blue's head, as after a pause) carries up
// to 1,000 revisions (etcd's watchBatchMaxRevs), whatever their size.

// defaultMaxBacklog is Config.MaxBacklog's default, and the delta check's bound per side
// (maxCheckPending): 64 MiB, at 1,000 revisions/s of 5 KB about 13 s of blue's writes, so that a
// green that stalls for a few seconds (a leader election, a restart) makes no pause; each pause
// costs blue a watch read from its history rather than from its latest writes.
const defaultMaxBacklog = 64 << 20

// The feed's watch of blue has a watchdog (watchdog.go): blue's revision from the
// linearizable read every ProgressInterval (Replicator.readSource) ahead of what the watch
// delivered, and nothing delivered for Config.WatchStall, watches blue again at once on a new
// stream (Progress.WatchStalls).

// errRewatch: the watch ended for a reason worth watching again from the next revision.
var errRewatch = errors.New("watch ended")

// Watching blue again waits rewatchBackoff, doubled after each watch that ended without
// delivering anything, up to maxRewatchBackoff; a watch that delivered starts it over, so that
// early blips do not make every later drop wait the longest (the cutover's window is 5 s).
const (
	rewatchBackoff    = 100 * time.Millisecond
	maxRewatchBackoff = 5 * time.Second
)

// errBacklogFull: the feed cancelled blue's watch because the backlog passed the bound.
var errBacklogFull = errors.New("the backlog passed the bound")

// feed is blue's revisions received for the apply (Replicator.replicate) and not yet applied.
type feed struct {
	r     *Replicator
	max   int           // Config.MaxBacklog
	wake  chan struct{} // holds a signal when revisions were queued or the feed stopped
	drain chan struct{} // holds a signal when the backlog went down to half the bound
	dog   *watchdog     // the open watch's (feed's stalls)

	mu    sync.Mutex
	queue []revChanges // received, not yet taken by the apply, oldest first
	// bytes counts the revisions received and not yet applied (heldBytes): queued, or taken
	// by the apply and not applied yet (in the pipeline).
	bytes  int
	next   int64 // the first revision not received
	err    error // why the feed stopped, once it has
	pauses int64 // Progress.BacklogPauses

	// receivedAt is when the watch last delivered a revision (Progress.ReceivedAt).
	receivedAt time.Time
}

func newFeed(r *Replicator) *feed {
	return &feed{r: r, max: r.cfg.MaxBacklog, next: r.cfg.FromRevision + 1, dog: newWatchdog("feed", r.cfg.WatchStall),
		wake: make(chan struct{}, 1), drain: make(chan struct{}, 1)}
}

// heldBytes is what watch events hold in memory as the bounds count it (the backlog here, the
// delta check's per side): keys, values, and previous keys and values when the events carry them.
func heldBytes(evs []*clientv3.Event) int {
	n := 0
	for _, ev := range evs {
		n += len(ev.Kv.Key) + len(ev.Kv.Value)
		if ev.PrevKv != nil {
			n += len(ev.PrevKv.Key) + len(ev.PrevKv.Value)
		}
	}
	return n
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // a signal is pending; its reader reads the state then
	}
}

// run watches blue, from start on, until ctx ends or a watch ends in a way watching again
// cannot fix; received returns why from then on.
func (f *feed) run(ctx context.Context, start time.Time) {
	f.mu.Lock()
	f.receivedAt = start
	f.mu.Unlock()
	err := f.follow(ctx)
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
	signal(f.wake)
}

// follow watches blue from the first revision not received, again after a pause at the bound
// and, after a backoff, when a watch ends for a transient reason.
func (f *feed) follow(ctx context.Context) error {
	backoff := rewatchBackoff
	f.r.cfg.Log.Info("watching blue", "from", f.nextRev())
	for {
		delivered, err := f.watch(ctx)
		if errors.Is(err, errStalled) {
			backoff = rewatchBackoff
			continue // at once, on a stream of its own
		}
		if errors.Is(err, errBacklogFull) {
			if err := f.pause(ctx); err != nil {
				return err
			}
			backoff = rewatchBackoff
			continue
		}
		if !errors.Is(err, errRewatch) {
			return err
		}
		if delivered {
			backoff = rewatchBackoff
		}
		if cerr := f.r.cfg.Source.Ctx().Err(); cerr != nil {
			return fmt.Errorf("replicate: blue's client is closed (%w) with green at %d", cerr, f.r.appliedRev())
		}
		f.r.cfg.Log.Warn("blue's watch ended; watching again", "from", f.nextRev(), "err", err, "after", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxRewatchBackoff)
	}
}

// watch queues blue's revisions from the first not received until the watch ends, until the
// backlog passes the bound (errBacklogFull; returning cancels the watch), or until the watchdog
// finds it stalled (errStalled). It says whether the watch delivered a response (other than an
// error).
func (f *feed) watch(ctx context.Context) (delivered bool, err error) {
	from := f.nextRev()
	ctx = f.dog.opened(ctx, from)
	defer f.dog.closed()
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := f.r.cfg.Source.Watch(wctx, "", clientv3.WithPrefix(), clientv3.WithRev(from))
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case resp, ok = <-wch:
		case <-f.dog.stall:
			attrs, err := f.dog.stalled(delivered)
			if err != nil {
				f.r.cfg.Log.Warn("blue's watch delivered nothing while blue's revision, read from the cluster, is ahead of it (its member may have stopped applying: a defrag, a stalled disk): watching again on a new stream",
					append([]any{"watched from", from}, attrs...)...)
				return delivered, err
			}
			continue
		}
		if !ok {
			break
		}
		full, err := f.take(from, resp)
		if err != nil {
			return delivered, err
		}
		delivered = true
		if full {
			return delivered, errBacklogFull
		}
	}
	if err := ctx.Err(); err != nil {
		return delivered, err
	}
	return delivered, fmt.Errorf("%w: the watch channel closed", errRewatch)
}

// take queues a response of the watch opened at from, saying whether the backlog is past the
// bound now, or says why the watch cannot go on.
func (f *feed) take(from int64, resp clientv3.WatchResponse) (full bool, err error) {
	if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
		return false, fmt.Errorf("%w: blue is compacted at revision %d, and replication needs its revisions from %d on (green is at %d): take a new snapshot of blue and restore green from it", ErrCompacted, resp.CompactRevision, from, f.r.appliedRev())
	}
	if err := resp.Err(); refused(err) {
		return false, fmt.Errorf("%w: blue refuses the replicator's watch of every key from revision %d (green is at %d): %w. %s", ErrRefused, from, f.r.appliedRev(), err, readAll)
	}
	if err := resp.Err(); err != nil {
		return false, fmt.Errorf("%w: %w", errRewatch, err)
	}
	f.r.sawSource(resp.Header.Revision)
	f.mu.Lock()
	defer f.mu.Unlock()
	_ = eachRevision(resp.Events, func(rev int64, evs []*clientv3.Event) error {
		rc := revChanges{rev: rev, evs: evs, bytes: heldBytes(evs)}
		f.queue = append(f.queue, rc)
		f.bytes += rc.bytes
		f.next = rev + 1
		return nil
	})
	if len(resp.Events) > 0 {
		f.receivedAt = time.Now()
		f.dog.received(f.next)
		signal(f.wake)
	}
	return f.bytes > f.max, nil
}

// readAll is what a refused watch needs.
const readAll = "Watching again cannot change that: the user it connects as must be able to read every key (etcd's root role, or a role that may read the whole key space)"

// refused says whether err is an etcd refusing a watch for its user (one that may not read
// every key, or none at all on an etcd with auth on): watching again is refused the same way.
// etcd sends the reason of a cancelled watch as text (a gRPC status written out), which its
// client hands on as a plain error, so the reason is matched by etcd's description of it. An
// auth token that is no longer valid (expired, or issued before blue's users or roles changed)
// is not such a refusal: the client gets a new one on its next request to blue (the revision
// read for the lag, every ProgressInterval).
func refused(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range []error{rpctypes.ErrGRPCPermissionDenied, rpctypes.ErrGRPCUserEmpty} {
		if strings.Contains(err.Error(), rpctypes.ErrorDesc(e)) {
			return true
		}
	}
	return false
}

// pause waits, blue's watch cancelled, until green has applied the backlog down to half the
// bound.
func (f *feed) pause(ctx context.Context) error {
	f.mu.Lock()
	f.pauses++
	backlog, next := f.bytes, f.next
	f.mu.Unlock()
	f.r.cfg.Log.Info("green is behind blue by more than the backlog bound: stopped watching blue until green has applied half of it; the rest waits in blue's history",
		"backlog", byteSize(backlog), "bound", byteSize(f.max), "received", next-1, "green", f.r.appliedRev())
	begin := time.Now()
	for {
		f.mu.Lock()
		backlog = f.bytes
		f.mu.Unlock()
		if backlog <= f.max/2 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.drain:
		}
	}
	f.r.cfg.Log.Info("green has applied half the backlog: watching blue again", "from", next, "backlog", byteSize(backlog), "paused", time.Since(begin).Round(time.Millisecond))
	return nil
}

func (f *feed) nextRev() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

// received hands the apply the revisions queued, oldest first, or, once none is left, says why
// the feed stopped: revisions received before the feed stopped are applied before its error
// ends the apply (and leave the backlog), as when the apply read blue's watch itself. They
// count in the backlog until applied.
func (f *feed) received() ([]revChanges, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.queue) == 0 {
		return nil, f.err
	}
	q := f.queue
	f.queue = nil
	if f.err != nil {
		signal(f.wake) // the apply comes back for the error once it has submitted q
	}
	return q, nil
}

// applied takes a revision green has applied (its events evs) off the backlog.
func (f *feed) applied(evs []*clientv3.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bytes -= heldBytes(evs)
	if f.bytes <= f.max/2 {
		signal(f.drain)
	}
}

// fill sets Progress.BacklogBytes, BacklogPauses, WatchStalls and Received (its time and age
// at now).
func (f *feed) fill(p *Progress, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p.BacklogBytes, p.BacklogPauses, p.WatchStalls = int64(f.bytes), f.pauses, f.dog.count()
	p.Received, p.ReceivedAt = f.next-1, f.receivedAt
	if !f.receivedAt.IsZero() {
		p.ReceivedAge = now.Sub(f.receivedAt).Seconds()
	}
}
