package replicate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Checker compares, revision by revision, what blue and green changed after a revision at
// which both held the same content (the full verify's): each of green's revisions must hold
// exactly blue's changes of the same revision (type, key, value, create and mod revision,
// version and lease of each, in order), and neither side may have a revision the other lacks.
// Equal at the start and equal change for change after it, the two are equal at every revision
// checked: the delta since the full verify, verified from both etcds' own histories rather
// than from what the replicator believes it sent, and without listing everything again.
//
// It reads a watch on each side; the revisions one side has and the other has not shown yet
// wait in memory (green trails blue by the replication's lag). etcd's client reads a watch
// ahead into a buffer without a bound, read or not, so past maxCheckPending bytes ahead the
// check cancels that side's watch, as the replicator's feed does at its backlog bound (feed.go),
// keeps what it received, and watches that side again from its first revision not received once
// the other has caught up to within half the bound: the rest waits in that side's history, and
// if it is compacted meanwhile the check ends with ErrCompacted.
//
// Each side's watch has the replicator's watchdog (watchdog.go): that side's revision, read
// linearizably every defaultProgressInterval, ahead of what its watch delivered, and nothing
// delivered for defaultWatchStall (Config.WatchStall's default), watches that side again at
// once on a new stream (WatchStalls). Otherwise a watch whose member stopped applying (a defrag
// on it) would hold the check, and a switch waiting for it, while replication goes on.
type Checker struct {
	blue, green *clientv3.Client
	from        int64
	maxPending  int // maxCheckPending when it started
	log         *slog.Logger
	dogs        [2]*watchdog // blue's watch's, green's
	cancel      context.CancelFunc
	stopped     chan struct{}

	mu      sync.Mutex
	checked int64
	err     error // why the check stopped, once done
	done    bool
	cond    chan struct{} // closed and replaced whenever checked or done changes
}

// maxCheckPending bounds the changes a Checker keeps per side while the other side has not
// shown the same revisions yet.
var maxCheckPending = defaultMaxBacklog // a variable for tests; a Checker reads it when it starts

// StartCheck starts comparing blue's and green's changes after revision from, which both must
// hold with the same content, until Stop. log may be nil.
func StartCheck(blue, green *clientv3.Client, from int64, log *slog.Logger) *Checker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Checker{blue: blue, green: green, from: from, maxPending: maxCheckPending, log: log, cancel: cancel, stopped: make(chan struct{}), checked: from, cond: make(chan struct{}),
		dogs: [2]*watchdog{newWatchdog("check-blue", defaultWatchStall), newWatchdog("check-green", defaultWatchStall)}}
	go func() {
		defer close(c.stopped)
		var polls sync.WaitGroup
		pctx, stopPolls := context.WithCancel(ctx)
		for i, cli := range []*clientv3.Client{blue, green} {
			polls.Go(func() { pollRevision(pctx, cli, defaultProgressInterval, c.dogs[i]) })
		}
		c.finish(c.run(ctx))
		stopPolls()
		polls.Wait()
	}()
	return c
}

// WatchStalls is how many times the check found a side's watch stalled (that side's revision,
// read from the cluster, ahead of what the watch delivered, and nothing delivered for the
// bound) and watched that side again on a new stream.
func (c *Checker) WatchStalls() int64 {
	return c.dogs[0].count() + c.dogs[1].count()
}

// From is the revision the check started after.
func (c *Checker) From() int64 { return c.from }

// Stop ends the check and waits for it.
func (c *Checker) Stop() {
	c.cancel()
	<-c.stopped
}

// Err is why the check stopped by itself (a difference, a compaction), nil while it runs or
// after Stop.
func (c *Checker) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(c.err, context.Canceled) {
		return nil
	}
	return c.err
}

// WaitFor returns nil once every revision up to rev has been compared and found equal, the
// check's error if it stopped first, ctx's if ctx ends first.
func (c *Checker) WaitFor(ctx context.Context, rev int64) error {
	for {
		c.mu.Lock()
		checked, done, err, cond := c.checked, c.done, c.err, c.cond
		c.mu.Unlock()
		if checked >= rev {
			return nil
		}
		if done {
			if err == nil || errors.Is(err, context.Canceled) {
				err = errors.New("the check was stopped")
			}
			return fmt.Errorf("replicate: green's changes compared with blue's up to revision %d, not %d: %w", checked, rev, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replicate: green's changes compared with blue's up to revision %d, waiting for %d: %w", checked, rev, context.Cause(ctx))
		case <-cond:
		}
	}
}

func (c *Checker) finish(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done, c.err = true, err
	close(c.cond)
	c.cond = make(chan struct{})
	if err != nil && !errors.Is(err, context.Canceled) {
		c.log.Error("comparing green's changes with blue's stopped", "checked", c.checked, "err", err)
	}
}

func (c *Checker) passed(rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checked = rev
	close(c.cond)
	c.cond = make(chan struct{})
}

func (c *Checker) checkedRev() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checked
}

// run compares until ctx ends or a round finds what watching again cannot fix.
func (c *Checker) run(ctx context.Context) error {
	c.log.Info("comparing green's changes with blue's, revision by revision", "after", c.from)
	backoff := 100 * time.Millisecond
	for {
		delivered, err := c.round(ctx)
		if !errors.Is(err, errRewatch) {
			return err
		}
		if delivered { // watches that worked start the waits over
			backoff = 100 * time.Millisecond
		}
		c.log.Warn("a watch of the check ended; watching again", "from", c.checkedRev()+1, "err", err, "after", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// round watches both sides from the revision after the last one compared, and compares each
// revision once both have shown it; delivered says whether a watch delivered changes.
func (c *Checker) round(ctx context.Context) (delivered bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	from := c.checkedRev() + 1
	sides := [2]*checkSide{{side: "blue", cli: c.blue, next: from, dog: c.dogs[0]}, {side: "green", cli: c.green, next: from, dog: c.dogs[1]}}
	for _, s := range sides {
		s.watch(wctx)
		defer s.dog.closed()
	}
	for {
		// compare leaves at most one side with revisions pending, so at most one is paused
		// and one is always read.
		for _, s := range sides {
			c.bound(wctx, s)
		}
		var resp clientv3.WatchResponse
		var ok bool
		side := sides[0]
		select {
		case resp, ok = <-sides[0].ch:
		case resp, ok = <-sides[1].ch:
			side = sides[1]
		case <-sides[0].dog.stall:
			c.stalled(wctx, sides[0])
			continue
		case <-sides[1].dog.stall:
			c.stalled(wctx, sides[1])
			continue
		}
		if err := side.take(ctx, resp, ok); err != nil {
			return delivered, err
		}
		delivered = delivered || len(resp.Events) > 0
		if err := c.compare(sides[0], sides[1]); err != nil {
			return delivered, err
		}
	}
}

// bound cancels the watch of a side more than the bound ahead of the other (etcd's client
// drops what it buffered for it; what the check received is kept), and watches it again from
// its first revision not received once the other has caught up to within half the bound. A
// revision compacted meanwhile fails the new watch: ErrCompacted, as any compaction.
func (c *Checker) bound(ctx context.Context, s *checkSide) {
	switch {
	case s.ch != nil && s.bytes > c.maxPending:
		s.stop()
		c.log.Info("one side is ahead of the other by more than the check's bound: stopped watching it until the other has caught up to half of it; the rest waits in its history",
			"side", s.side, "pending", byteSize(s.bytes), "bound", byteSize(c.maxPending), "received", s.next-1, "checked", c.checkedRev())
	case s.ch == nil && s.bytes <= c.maxPending/2:
		c.log.Info("the other side has caught up to half the check's bound: watching again", "side", s.side, "from", s.next, "pending", byteSize(s.bytes))
		s.watch(ctx)
	}
}

// stalled takes the watchdog's signal for a side: a stalled watch is cancelled and the side
// watched again at once, from its first revision not received, on a new stream.
func (c *Checker) stalled(ctx context.Context, s *checkSide) {
	attrs, err := s.dog.stalled(s.delivered)
	if err == nil || s.ch == nil {
		return
	}
	c.log.Warn("a watch of the check delivered nothing while its side's revision, read from the cluster, is ahead of it (its member may have stopped applying: a defrag, a stalled disk): watching it again on a new stream",
		append([]any{"side", s.side, "watched from", s.from}, attrs...)...)
	s.stop()
	s.watch(ctx)
}

// compare takes the revisions both sides have shown, oldest first.
func (c *Checker) compare(blue, green *checkSide) error {
	for len(blue.revs) > 0 && len(green.revs) > 0 {
		b, g := blue.pop(), green.pop()
		switch {
		case g.rev < b.rev:
			return fmt.Errorf("%w: green has a revision %d that blue has not (blue's next is %d): something other than the replicator wrote to green, or green expired a lease by itself", ErrRevisionMismatch, g.rev, b.rev)
		case g.rev > b.rev:
			return fmt.Errorf("%w: green has no revision %d, blue's next change (green's next is %d)", ErrRevisionMismatch, b.rev, g.rev)
		}
		if diff := diffEvents(b.evs, g.evs); diff != "" {
			return fmt.Errorf("%w: at revision %d %s", ErrRevisionMismatch, b.rev, diff)
		}
		c.passed(b.rev)
	}
	return nil
}

// checkSide is one side's watch of the check and its revisions not compared yet, oldest first.
type checkSide struct {
	side  string
	cli   *clientv3.Client
	revs  []revChanges
	bytes int
	next  int64 // the first revision not received
	dog   *watchdog

	ch        clientv3.WatchChan // nil while paused at the bound
	cancel    context.CancelFunc
	from      int64 // where the open watch started
	delivered bool  // the open watch delivered revisions
}

// watch watches the side from its first revision not received (on the stream its watchdog
// says).
func (p *checkSide) watch(ctx context.Context) {
	wctx, cancel := context.WithCancel(p.dog.opened(ctx, p.next))
	p.ch, p.cancel, p.from, p.delivered = p.cli.Watch(wctx, "", clientv3.WithPrefix(), clientv3.WithRev(p.next)), cancel, p.next, false
}

// stop cancels the side's watch: etcd's client drops what it buffered for it.
func (p *checkSide) stop() {
	p.cancel()
	p.dog.closed()
	p.ch, p.cancel = nil, nil
}

type revChanges struct {
	rev   int64
	evs   []*clientv3.Event
	bytes int
}

func (p *checkSide) pop() revChanges {
	r := p.revs[0]
	p.revs = p.revs[1:]
	p.bytes -= r.bytes
	return r
}

// take adds a watch response's revisions (etcd never splits one revision's events across
// responses), or says why the watch cannot go on.
func (p *checkSide) take(ctx context.Context, resp clientv3.WatchResponse, ok bool) error {
	switch {
	case !ok && ctx.Err() != nil:
		return ctx.Err()
	case !ok:
		return fmt.Errorf("%w: %s's watch channel closed", errRewatch, p.side)
	case resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted):
		return fmt.Errorf("%w: %s is compacted at revision %d, and the check needs its revisions from %d on: its changes since the full verify can no longer be compared", ErrCompacted, p.side, resp.CompactRevision, p.next)
	case refused(resp.Err()):
		return fmt.Errorf("%w: %s refuses the check's watch of every key from revision %d: %w. %s", ErrRefused, p.side, p.next, resp.Err(), readAll)
	case resp.Err() != nil:
		return fmt.Errorf("%w: %s: %w", errRewatch, p.side, resp.Err())
	}
	err := eachRevision(resp.Events, func(rev int64, evs []*clientv3.Event) error {
		rc := revChanges{rev: rev, evs: evs, bytes: heldBytes(evs)}
		p.revs = append(p.revs, rc)
		p.bytes += rc.bytes
		p.next = rev + 1
		return nil
	})
	if len(resp.Events) > 0 {
		p.delivered = true
		p.dog.received(p.next)
	}
	return err
}
