package replicate

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Green is never compacted by its own apiserver while it is replicated into: that apiserver
// may only read green (a write-gated etcd role), and blue's compaction is no watch event. Left
// alone, green keeps every revision since the snapshot, and a destination that follows for days
// (blue during a bake) grows to its quota (NOSPACE), the way back gone with it.
//
// kube-apiserver compacts (k8s.io/apiserver storage/etcd3/compact.go, Compact) with a txn that
// puts compactRevKey, its value the revision it compacts to in decimal, and then Compact(rev)
// (its first round puts "0" and compacts nothing). That put is a blue revision like any other,
// so green gets it: once it is applied, the compactor compacts green to the same revision. A
// compaction changes no revision, so green's revision stays blue's; it runs in its own
// goroutine, never in the way of applying; one that fails is logged and left to the next
// compact_rev_key put (kube-apiserver's next round, 5 minutes later).

// compactRevKey is the key kube-apiserver's compactor puts (no prefix: its client's raw KV).
const compactRevKey = "compact_rev_key"

// compactor compacts green to the revisions the compact_rev_key puts applied to it name.
type compactor struct {
	cfg  *Config
	wake chan struct{} // holds a signal when want has moved

	mu sync.Mutex
	// want is the newest revision to compact to that an applied put named; done is the one
	// green was last compacted to (or found compacted at already).
	want, done int64
	// compactions counts the compactions made (Progress.Compactions).
	compactions int64
}

func newCompactor(cfg *Config) *compactor {
	return &compactor{cfg: cfg, wake: make(chan struct{}, 1)}
}

// applied notes blue's revision rev (its events evs), just applied to green: a put of
// compactRevKey whose value is a revision above 0 and not past rev asks for green to be
// compacted to it. It does not wait for the compaction.
func (c *compactor) applied(rev int64, evs []*clientv3.Event) {
	to := compactTarget(rev, evs)
	if to == 0 {
		return
	}
	c.mu.Lock()
	if to <= c.want {
		c.mu.Unlock()
		return
	}
	c.want = to
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // the compactor has a wake-up pending; it reads want then
	}
}

// compactTarget is the revision a put of compactRevKey among evs (blue's revision rev) names,
// 0 if none does or it names none that green could be compacted to.
func compactTarget(rev int64, evs []*clientv3.Event) int64 {
	var to int64
	for _, ev := range evs {
		if ev.Type != mvccpb.PUT || string(ev.Kv.Key) != compactRevKey {
			continue
		}
		v, err := strconv.ParseInt(string(ev.Kv.Value), 10, 64)
		if err == nil && v > 0 && v <= rev {
			to = v
		}
	}
	return to
}

// run compacts green whenever an applied put asked for a newer revision, until ctx ends.
func (c *compactor) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		c.mu.Lock()
		to, done := c.want, c.done
		c.mu.Unlock()
		if to > done {
			c.compact(ctx, to)
		}
	}
}

// compact compacts green to rev, within ApplyTimeout; a failure is logged, never fatal.
func (c *compactor) compact(ctx context.Context, rev int64) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.ApplyTimeout)
	defer cancel()
	_, err := c.cfg.Dest.Compact(cctx, rev)
	switch {
	case err == nil:
		c.cfg.Log.Info("compacted green, as blue's apiserver compacted blue", "revision", rev)
	case errors.Is(err, rpctypes.ErrCompacted):
		c.cfg.Log.Debug("green is compacted past the revision blue's apiserver compacted blue to already", "revision", rev)
	default:
		if ctx.Err() == nil {
			c.cfg.Log.Warn("compacting green failed; replication goes on, and the next compaction of blue tries again", "revision", rev, "err", err)
		}
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = max(c.done, rev)
	if err == nil {
		c.compactions++
	}
}

// count is how many compactions were made.
func (c *compactor) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.compactions
}
