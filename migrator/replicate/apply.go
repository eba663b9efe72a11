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
			return fmt.Errorf("%w: blue is compacted at revision %d, green is at %d and needs %d onwards: take a new snapshot of blue and restore green from it", ErrCompacted, resp.CompactRevision, from-1, from)
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
	got, err := r.commit(ctx, rev, ops)
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
// reading green's revision: rev means applied, rev-1 means not applied (sent again), anything
// else is returned for apply to report.
func (r *Replicator) commit(ctx context.Context, rev int64, ops []clientv3.Op) (int64, error) {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		resp, err := r.cfg.Dest.Txn(ctx).Then(ops...).Commit()
		if err == nil {
			return resp.Header.Revision, nil
		}
		if err := definite(err, rev, len(ops)); err != nil {
			return 0, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		g, gerr := r.cfg.Dest.Get(ctx, probeKey, clientv3.WithCountOnly())
		if gerr == nil && g.Header.Revision != rev-1 {
			r.cfg.Log.Warn("txn failed but green's revision says whether it was applied", "revision", rev, "green", g.Header.Revision, "err", err)
			return g.Header.Revision, nil
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
