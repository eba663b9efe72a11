package replicate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errRewatch: the watch ended for a reason worth watching again from the next revision.
var errRewatch = errors.New("watch ended")

// replicate watches blue from the revision after green's and applies what arrives, watching
// again (from green's revision + 1) when the watch ends for a transient reason.
func (r *Replicator) replicate(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for {
		err := r.watch(ctx, r.appliedRev()+1)
		if !errors.Is(err, errRewatch) {
			return err
		}
		if cerr := r.cfg.Source.Ctx().Err(); cerr != nil {
			return fmt.Errorf("replicate: blue's client is closed (%w) with green at %d", cerr, r.appliedRev())
		}
		r.cfg.Log.Warn("blue's watch ended; watching again", "from", r.appliedRev()+1, "err", err, "after", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (r *Replicator) appliedRev() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress.applied
}

// watch applies blue's revisions from rev on, one txn each. etcd's watch guarantees that the
// events of one revision are never split across responses (API guarantee "atomic"), and a
// response may carry several revisions, their events consecutive.
func (r *Replicator) watch(ctx context.Context, from int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	r.cfg.Log.Info("watching blue", "from", from)
	for resp := range r.cfg.Source.Watch(wctx, "", clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			green := r.appliedRev()
			return fmt.Errorf("%w: blue is compacted at revision %d, green is at %d and needs %d onwards: take a new snapshot of blue and restore green from it", ErrCompacted, resp.CompactRevision, green, green+1)
		}
		if err := resp.Err(); err != nil {
			return fmt.Errorf("%w: %w", errRewatch, err)
		}
		r.sawSource(resp.Header.Revision)
		evs := resp.Events
		for len(evs) > 0 {
			rev, n := evs[0].Kv.ModRevision, 1
			for n < len(evs) && evs[n].Kv.ModRevision == rev {
				n++
			}
			if err := r.apply(ctx, rev, evs[:n]); err != nil {
				return err
			}
			evs = evs[n:]
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: the watch channel closed", errRewatch)
}

// apply applies the events of blue's revision rev to green as one txn and checks that green is
// then at rev.
func (r *Replicator) apply(ctx context.Context, rev int64, evs []*clientv3.Event) error {
	prev := r.appliedRev()
	if rev != prev+1 {
		return fmt.Errorf("%w: blue's stream holds revision %d next but green is at %d: a revision would be skipped or applied twice", ErrRevisionMismatch, rev, prev)
	}
	ops := make([]clientv3.Op, 0, len(evs))
	for _, ev := range evs {
		switch ev.Type {
		case mvccpb.PUT:
			if id := clientv3.LeaseID(ev.Kv.Lease); id != clientv3.NoLease {
				if err := r.leases.ensure(ctx, id, prev); err != nil {
					return fmt.Errorf("replicate: revision %d: %w", rev, err)
				}
			}
			ops = append(ops, clientv3.OpPut(string(ev.Kv.Key), string(ev.Kv.Value), clientv3.WithLease(clientv3.LeaseID(ev.Kv.Lease))))
		case mvccpb.DELETE:
			ops = append(ops, clientv3.OpDelete(string(ev.Kv.Key)))
		default:
			return fmt.Errorf("replicate: revision %d: unknown event type %v for key %q", rev, ev.Type, ev.Kv.Key)
		}
	}
	got, err := r.commit(ctx, rev, evs, ops)
	if err != nil {
		return err
	}
	if got != rev {
		return fmt.Errorf("%w: after applying blue's revision %d (%d operations) green is at revision %d: something else wrote to green, or green expired a lease by itself; green no longer equals blue", ErrRevisionMismatch, rev, len(ops), got)
	}
	r.applied(rev)
	return nil
}

// commit sends the txn and returns green's revision after it. An error that leaves it unknown
// whether green applied the txn (a timeout, a lost connection, a leader change) is settled by
// reading green: at rev-1 it was not applied (sent again); at rev or beyond, green's revision rev
// must hold exactly blue's events (green may have moved by itself, e.g. a lease it expired while
// the replicator could not reach it, and a revision number alone would not show that).
func (r *Replicator) commit(ctx context.Context, rev int64, evs []*clientv3.Event, ops []clientv3.Op) (int64, error) {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		got, err := r.try(ctx, rev, evs, ops)
		if err == nil {
			return got, nil
		}
		if err := definite(err, rev, len(ops)); err != nil {
			return 0, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if attempt == 10 {
			return 0, fmt.Errorf("replicate: applying blue's revision %d to green failed %d times: %w", rev, attempt, err)
		}
		r.cfg.Log.Warn("applying a revision to green failed; trying again", "revision", rev, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// try sends the txn once, within ApplyTimeout, and returns green's revision after it. After an
// error it reads green's revision: rev-1 returns the error (send again); rev returns rev if green's
// revision rev is blue's, else a mismatch; anything else is returned as green's revision.
func (r *Replicator) try(ctx context.Context, rev int64, evs []*clientv3.Event, ops []clientv3.Op) (int64, error) {
	tctx, cancel := context.WithTimeout(ctx, r.cfg.ApplyTimeout)
	resp, err := r.cfg.Dest.Txn(tctx).Then(ops...).Commit()
	cancel()
	if err == nil {
		return resp.Header.Revision, nil
	}
	if definite(err, rev, len(ops)) != nil || ctx.Err() != nil {
		return 0, err
	}
	gctx, cancel := context.WithTimeout(ctx, r.cfg.ApplyTimeout)
	defer cancel()
	g, gerr := r.cfg.Dest.Get(gctx, probeKey, clientv3.WithCountOnly())
	switch {
	case gerr != nil || g.Header.Revision == rev-1:
		return 0, err
	case g.Header.Revision != rev:
		return g.Header.Revision, nil
	}
	diff, cerr := r.compareRevision(gctx, rev, evs)
	if cerr != nil {
		return 0, fmt.Errorf("%w (then reading green's revision %d: %w)", err, rev, cerr)
	}
	if diff != "" {
		return 0, fmt.Errorf("%w: applying blue's revision %d failed (%v) and green's revision %d is not blue's: %s", ErrRevisionMismatch, rev, err, rev, diff)
	}
	r.cfg.Log.Warn("a txn failed but green holds it", "revision", rev, "err", err)
	return rev, nil
}

// compareRevision says how green's revision rev differs from blue's events of it ("" if not).
func (r *Replicator) compareRevision(ctx context.Context, rev int64, evs []*clientv3.Event) (string, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got []*clientv3.Event
	for resp := range r.cfg.Dest.Watch(wctx, "", clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if err := resp.Err(); err != nil {
			return "", err
		}
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision == rev {
				got = append(got, ev)
			}
		}
		if len(resp.Events) > 0 {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if len(got) != len(evs) {
		return fmt.Sprintf("green's holds %d events, blue's %d", len(got), len(evs)), nil
	}
	for i, g := range got {
		b := evs[i]
		if g.Type != b.Type || string(g.Kv.Key) != string(b.Kv.Key) || string(g.Kv.Value) != string(b.Kv.Value) || g.Kv.Lease != b.Kv.Lease {
			return fmt.Sprintf("event %d: green %v %q (%d bytes, lease %x), blue %v %q (%d bytes, lease %x)", i, g.Type, g.Kv.Key, len(g.Kv.Value), g.Kv.Lease, b.Type, b.Kv.Key, len(b.Kv.Value), b.Kv.Lease), nil
		}
	}
	return "", nil
}

// definite turns the errors that sending again cannot fix into what to do about them; nil for
// the others.
func definite(err error, rev int64, n int) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%w: blue's revision %d holds %d operations, more than green's --max-txn-ops allows (default 128; a lease expiry alone deletes up to 1,000 event keys in one revision). One revision cannot be split without breaking exact revisions: run green etcd with --max-txn-ops 100000: %v", ErrTooManyOps, rev, n, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge), status.Code(err) == codes.ResourceExhausted:
		return fmt.Errorf("replicate: blue's revision %d (%d operations) is larger than green accepts in one request: run green etcd with --max-request-bytes at least blue's, and give the green client a MaxCallSendMsgSize above it: %w", rev, n, err)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: applying blue's revision %d: green lost a lease the replicator keeps alive: %v", ErrRevisionMismatch, rev, err)
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrUserEmpty),
		errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrNoSpace):
		return fmt.Errorf("replicate: applying blue's revision %d to green: %w", rev, err)
	}
	return nil
}
