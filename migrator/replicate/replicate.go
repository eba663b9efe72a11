// Package replicate keeps a green etcd at exactly the revision of a blue one while blue takes
// writes: it watches blue from the revision green was restored at and applies each blue revision
// to green as exactly one txn, then checks that green's revision is the blue revision it just
// applied (design invariant 9; invariant exact-revisions in docs/invariants.md). This is the
// exact-revision apply of Gardener's etcd-backup-restore restorer, done live.
//
// Leases are mirrored with blue's IDs and granted TTLs and kept alive from the replicator, so
// green never expires a lease by itself: key deletions reach green only from blue's stream.
//
// The package does not start or stop anything; the cutover owns the processes and decides what
// to do with the errors (ErrCompacted: take a new snapshot; ErrRevisionMismatch: abort).
package replicate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Errors Run stops with, for errors.Is. The returned error wraps one of them and says more.
var (
	// ErrCompacted: blue compacted past the revision to watch from; green cannot catch up by
	// replication and must be rebuilt from a new snapshot.
	ErrCompacted = errors.New("blue's history needed to replicate has been compacted")
	// ErrRevisionMismatch: green's revision is not blue's after an apply (or at the start), so
	// something other than the replicator wrote to green, or green expired a lease by itself.
	ErrRevisionMismatch = errors.New("green's revision does not match blue's")
	// ErrTooManyOps: green refuses a blue revision's txn for its operations: green runs with a
	// --max-txn-ops below etcd's default (TxnOps), which the nested txn is built for.
	ErrTooManyOps = errors.New("a blue revision holds more operations than green's --max-txn-ops")
	// ErrRefused: an etcd refuses what replication asks of it in a way that asking again
	// cannot change: green refuses a revision's txn as an invalid request or as too large for
	// one request, or blue refuses the watch (the source user may not read every key).
	ErrRefused = errors.New("an etcd refuses replication's requests")
)

// Config is what Run needs. Source is blue, Dest is green; both clients stay the caller's.
type Config struct {
	Source, Dest *clientv3.Client
	// FromRevision is the revision green was restored at (the snapshot's, S): green must be at
	// exactly this revision, and replication starts at S+1.
	FromRevision int64
	// Log receives what the replicator does; nil discards it.
	Log *slog.Logger
	// OnApplied, if set, is called after every applied revision, from the applying goroutine:
	// keep it short.
	OnApplied func(Progress)

	// ProgressInterval is how often blue's current revision is read for the lag when no
	// events arrive (default 1 s); each read is bounded by two of them.
	ProgressInterval time.Duration
	// LeaseCheckInterval is how often mirrored leases are checked against blue, so that leases
	// blue no longer has stop being kept alive on green (default 30 s).
	LeaseCheckInterval time.Duration
	// ApplyTimeout bounds one attempt to apply a revision to green (default 10 s); a revision is
	// attempted 10 times before Run gives up, so an unreachable green stops Run in minutes
	// rather than leaving it waiting for ever.
	ApplyTimeout time.Duration
	// MissingLeaseTTL is the TTL green grants a lease with when a replicated put names a lease
	// blue no longer has (it expired on blue after the put; its deletes follow in the stream).
	// Default 60 s.
	MissingLeaseTTL int64
	// SourceName and DestName are what errors and logs call the source and the destination
	// (default "blue" and "green"; names.go).
	SourceName, DestName string
	// MaxBacklog bounds the backlog: blue's changes received and not yet applied to green, in
	// bytes of keys, values and previous values as the watch events carry them. Past it blue's
	// watch is cancelled, what was received is kept, and blue is watched again from the first
	// revision not received once green has applied the backlog down to half the bound: the rest
	// waits in blue's history, not in this process (feed.go). Default 64 MiB.
	MaxBacklog int
	// WatchStall is how long blue's watch may deliver no revision while blue's revision, read
	// from the cluster every ProgressInterval, is ahead of what it delivered: then the watch is
	// cancelled and blue watched again at once on a new stream, from the first revision not
	// received (its member may have stopped applying: a defrag, a stalled disk; watchdog.go).
	// Default 5 s.
	WatchStall time.Duration
}

func (c *Config) validate() error {
	var errs []error
	if c.Source == nil {
		errs = append(errs, errors.New("replicate: Source (blue) client is required"))
	}
	if c.Dest == nil {
		errs = append(errs, errors.New("replicate: Dest (green) client is required"))
	}
	if c.Source != nil && c.Source == c.Dest {
		errs = append(errs, errors.New("replicate: Source and Dest are the same client"))
	}
	if c.FromRevision < 1 {
		errs = append(errs, fmt.Errorf("replicate: FromRevision %d: it must be the revision green was restored at (≥ 1)", c.FromRevision))
	}
	return errors.Join(errs...)
}

// defaultProgressInterval is Config.ProgressInterval's default, and how often the delta check
// reads each side's revision for its watchdogs.
const defaultProgressInterval = time.Second

func (c *Config) defaults() {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.ProgressInterval <= 0 {
		c.ProgressInterval = defaultProgressInterval
	}
	if c.LeaseCheckInterval <= 0 {
		c.LeaseCheckInterval = 30 * time.Second
	}
	if c.ApplyTimeout <= 0 {
		c.ApplyTimeout = 10 * time.Second
	}
	if c.MissingLeaseTTL <= 0 {
		c.MissingLeaseTTL = 60
	}
	if c.MaxBacklog <= 0 {
		c.MaxBacklog = defaultMaxBacklog
	}
	if c.WatchStall <= 0 {
		c.WatchStall = defaultWatchStall
	}
}

// Replicator replicates blue into green; Progress and WaitFor may be called from any goroutine
// while Run runs.
type Replicator struct {
	cfg     Config
	rename  *sideNames // nil: the default names
	leases  *leaseMirror
	compact *compactor
	feed    *feed
	started atomic.Bool

	mu       sync.Mutex
	cond     chan struct{} // closed and replaced whenever applied or done changes
	progress tracker
	done     bool
	err      error // why Run stopped, once done
}

// New checks cfg and returns a Replicator ready to Run.
func New(cfg Config) (*Replicator, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	r := &Replicator{cfg: cfg, cond: make(chan struct{}), rename: renamer(cfg.SourceName, cfg.DestName)}
	if r.rename != nil {
		r.cfg.Log = slog.New(&renamingHandler{h: cfg.Log.Handler(), rp: r.rename})
	}
	r.progress.applied = cfg.FromRevision
	r.progress.source = cfg.FromRevision
	r.leases = newLeaseMirror(r.cfg)
	r.compact = newCompactor(&r.cfg)
	r.feed = newFeed(r)
	return r, nil
}

// Run replicates until ctx is cancelled or replication cannot go on; see Replicator.Run.
func Run(ctx context.Context, cfg Config) error {
	r, err := New(cfg)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// Run checks that green is at FromRevision, keeps green's existing leases alive, then watches
// blue from FromRevision+1 and applies each revision as one txn until ctx is cancelled (it then
// returns ctx's error) or something breaks exact revisions (ErrRevisionMismatch,
// ErrTooManyOps), or blue compacted what is needed (ErrCompacted). What it has received from
// blue and not yet applied is bounded by MaxBacklog (feed.go). When Run returns, green's
// leases are no longer kept alive by it. Green is compacted as blue's apiserver compacts blue
// (compact.go). Run may be called once.
func (r *Replicator) Run(ctx context.Context) (err error) {
	if r.started.Swap(true) {
		return errors.New("replicate: Run called twice on one Replicator")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() { err = renameErr(r.rename, err); r.finish(err) }()
	defer r.leases.stopAll()

	// Green is read at the start within what a revision's tries would take (ApplyTimeout, 10
	// tries): an unreachable green stops Run rather than leaving it waiting for ever.
	sctx, scancel := context.WithTimeout(ctx, 10*r.cfg.ApplyTimeout)
	defer scancel()
	if err := r.checkStart(sctx); err != nil {
		return err
	}
	if err := r.leases.adoptDest(ctx, sctx); err != nil {
		return err
	}
	now := time.Now()
	r.mu.Lock()
	r.progress.started = now
	r.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(4)
	go func() { defer wg.Done(); r.feed.run(ctx, now) }()
	go func() { defer wg.Done(); r.pollSource(ctx) }()
	go func() { defer wg.Done(); r.leases.checkLoop(ctx, r.appliedRev) }()
	go func() { defer wg.Done(); r.compact.run(ctx) }()
	return r.replicate(ctx)
}

// checkStart refuses to start unless green is exactly at FromRevision.
func (r *Replicator) checkStart(ctx context.Context) error {
	got, err := Revision(ctx, r.cfg.Dest)
	if err != nil {
		return fmt.Errorf("replicate: reading green's revision: %w", err)
	}
	if got != r.cfg.FromRevision {
		return fmt.Errorf("%w: green is at revision %d, replication must start from the revision it was restored at, %d (restore without a revision bump, and let nothing write to green)", ErrRevisionMismatch, got, r.cfg.FromRevision)
	}
	return nil
}

// ProbeKey is read (never written) to learn a cluster's current revision, and named by
// read-only txns that check a cluster's limits and by the barrier (a txn whose guard never
// holds) that learns green's revision after its outcome was unknown.
const ProbeKey = "\x00kubefence-replicate-probe"

// Revision is a cluster's newest revision, by a linearizable read.
func Revision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	resp, err := cli.Get(ctx, ProbeKey, clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// finish records why Run stopped and wakes every WaitFor.
func (r *Replicator) finish(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done, r.err = true, err
	close(r.cond)
	r.cond = make(chan struct{})
}

// WaitFor returns nil once blue's revision rev has been applied to green (at once if it already
// has), ctx's error if ctx ends first, and Run's error if Run stopped before rev.
func (r *Replicator) WaitFor(ctx context.Context, rev int64) error {
	for {
		r.mu.Lock()
		applied, done, runErr, cond := r.progress.applied, r.done, r.err, r.cond
		r.mu.Unlock()
		if applied >= rev {
			return nil
		}
		if done {
			if runErr == nil {
				runErr = errors.New("replication stopped")
			}
			return fmt.Errorf("%s: %w", r.names(fmt.Sprintf("replicate: revision %d not applied (green at %d)", rev, applied)), runErr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", r.names(fmt.Sprintf("replicate: waiting for revision %d (green at %d)", rev, applied)), context.Cause(ctx))
		case <-cond:
		}
	}
}
