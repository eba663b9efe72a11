package replicate

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// replicate applies blue's revisions as the feed receives them, one txn each, through the
// pipeline; the oldest txn in flight is settled as soon as it ends, so progress is current when
// blue is quiet. It returns when the feed stops (ctx ended, blue compacted what is needed, its
// client closed) or the pipeline fails.
func (r *Replicator) replicate(ctx context.Context) (err error) {
	p := &pipeline{r: r}
	defer func() { err = stopped(ctx, err, p.stop()) }() // no txn may reach green after Run returns, and each that did is counted
	for {
		var head <-chan struct{}
		if len(p.flight) > 0 {
			head = p.flight[0].done
		}
		select {
		case <-head:
			if err := p.settle(ctx); err != nil {
				return err
			}
		case <-r.feed.wake:
			if err := r.submitReceived(ctx, p); err != nil {
				return err
			}
		}
	}
}

// submitReceived submits the revisions the feed has received, in order, or returns why the
// feed stopped once it has submitted all it received. It submits no new revision once ctx has
// ended (a flush under way may still send again a txn whose guards failed; stopping waits).
func (r *Replicator) submitReceived(ctx context.Context, p *pipeline) error {
	revs, err := r.feed.received()
	if err != nil && ctx.Err() == nil {
		// Blue's watch is over but green is not: settle every txn in flight, those that
		// failed their guards sent again, so that each revision received reaches green
		// (stopping only waits for the txns in flight).
		return errors.Join(err, p.flush(ctx))
	}
	if err != nil {
		return err
	}
	for _, rc := range revs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := p.submit(ctx, rc.rev, rc.evs); err != nil {
			return err
		}
	}
	return nil
}

// stopped is why replication stopped: err, and serr if stopping the pipeline failed (green's
// revision unknown, or not blue's). When ctx ended, err is only that: serr replaces it, so that
// a caller that takes a cancellation for a clean stop does not miss it.
func stopped(ctx context.Context, err, serr error) error {
	switch {
	case serr == nil:
		return err
	case ctx.Err() != nil:
		return serr
	}
	return errors.Join(err, serr)
}

func (r *Replicator) appliedRev() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress.applied
}

// eachRevision calls do with each revision's events of a watch response, oldest first (a
// response may carry several revisions, their events consecutive; etcd never splits one).
func eachRevision(evs []*clientv3.Event, do func(rev int64, evs []*clientv3.Event) error) error {
	for len(evs) > 0 {
		rev, n := evs[0].Kv.ModRevision, 1
		for n < len(evs) && evs[n].Kv.ModRevision == rev {
			n++
		}
		if err := do(rev, evs[:n:n]); err != nil {
			return err
		}
		evs = evs[n:]
	}
	return nil
}

// ops turns blue's revision rev (its events evs) into the operations of one txn, granting on
// green (with blue's ID and TTL) any lease a put names that green does not keep yet; the caller
// has nothing in flight then (pipeline.needsLease).
func (r *Replicator) ops(ctx context.Context, rev int64, evs []*clientv3.Event) ([]clientv3.Op, error) {
	ops := make([]clientv3.Op, 0, len(evs))
	for _, ev := range evs {
		switch ev.Type {
		case mvccpb.PUT:
			if id := clientv3.LeaseID(ev.Kv.Lease); id != clientv3.NoLease {
				if err := r.leases.ensure(ctx, id, r.appliedRev()); err != nil {
					return nil, fmt.Errorf("replicate: revision %d: %w", rev, err)
				}
			}
			ops = append(ops, clientv3.OpPut(string(ev.Kv.Key), string(ev.Kv.Value), clientv3.WithLease(clientv3.LeaseID(ev.Kv.Lease))))
		case mvccpb.DELETE:
			ops = append(ops, clientv3.OpDelete(string(ev.Kv.Key)))
		default:
			return nil, fmt.Errorf("replicate: revision %d: unknown event type %v for key %q", rev, ev.Type, ev.Kv.Key)
		}
	}
	return fitted(evs, ops), nil
}

// siblings makes ops, one per event of evs (one revision), the operations of one txn. etcd
// refuses a txn that names a key twice at one level ("duplicate key given in txn request"),
// but blue takes a put of a key and a later delete of it in one txn when they are in sibling
// sub-txns (etcd's checkIntervals: a sub-txn's puts may not meet a delete of an earlier
// sibling or of its parent's level, while its deletes may meet earlier siblings' puts; a key
// put twice, or put after a delete, it refuses at any depth, so no revision holds either).
// So when a key comes again, the ops are cut there into sibling sub-txns, in order, which etcd
// applies as one revision with the same changes in the same order. Each level then holds at
// most width ops (nested): a revision's ops are never split across txns.
func siblings(evs []*clientv3.Event, ops []clientv3.Op, width int) []clientv3.Op {
	var txns []clientv3.Op
	seen := make(map[string]bool, len(evs))
	begin := 0
	for i, ev := range evs {
		if seen[string(ev.Kv.Key)] {
			txns = append(txns, clientv3.OpTxn(nil, nested(ops[begin:i:i], width), nil))
			clear(seen)
			begin = i
		}
		seen[string(ev.Kv.Key)] = true
	}
	if txns == nil {
		return nested(ops, width)
	}
	return nested(append(txns, clientv3.OpTxn(nil, nested(ops[begin:], width), nil)), width)
}

// TxnOps is what a txn replication sends needs of an etcd's --max-txn-ops: etcd's default.
// etcd counts a txn's operations (or its comparisons, if more) against the flag, and a
// sub-txn's against what the levels above it left (the flag less their operations).
const TxnOps = 128

// maxGuards is the most comparisons a txn sent here holds (pipeline.attempt).
const maxGuards = 3

// fitted makes ops, one per event of evs (one revision), one txn that an etcd running with
// --max-txn-ops TxnOps takes: siblings nested, each level as wide as leaves every path from
// the top to an operation within the flag (a lease expiry deletes up to 1,000 keys in one
// revision; 64 levels of two ops would hold more than any etcd request can).
func fitted(evs []*clientv3.Event, ops []clientv3.Op) []clientv3.Op {
	for width := TxnOps; ; width /= 2 {
		txn := siblings(evs, ops, width)
		if width <= 2 || max(maxGuards, len(txn))+deepest(txn) <= TxnOps {
			return txn
		}
	}
}

// nested puts ops, in order, into sub-txns of at most width each, and those again, until a
// level holds at most width. etcd applies a sub-txn without comparisons as if its ops stood in
// its parent's place: the same revision with the same changes in the same order, and its
// checks of keys named twice (siblings) see the same puts and deletes.
func nested(ops []clientv3.Op, width int) []clientv3.Op {
	for len(ops) > width {
		level := make([]clientv3.Op, 0, (len(ops)+width-1)/width)
		for chunk := range slices.Chunk(ops, width) {
			level = append(level, clientv3.OpTxn(nil, chunk, nil))
		}
		ops = level
	}
	return ops
}

// deepest is what the sub-txns among ops count against --max-txn-ops at most: the ops of each
// level on the way down to an operation, summed, the largest such sum.
func deepest(ops []clientv3.Op) int {
	most := 0
	for _, op := range ops {
		if !op.IsTxn() {
			continue
		}
		_, then, _ := op.Txn()
		most = max(most, len(then)+deepest(then))
	}
	return most
}

// compareRevision says how green's revision rev differs from blue's events of it ("" if not).
func (r *Replicator) compareRevision(ctx context.Context, rev int64, evs []*clientv3.Event) (string, error) {
	got, err := eventsAt(ctx, r.cfg.Dest, rev)
	if err != nil {
		return "", err
	}
	return diffEvents(evs, got), nil
}

// definite turns the errors that sending again cannot fix into what to do about them; nil for
// the others. rev is the blue revision that failed, evs its events.
func definite(err error, rev int64, evs []*clientv3.Event) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%w: blue's revision %d holds %d operations (%s of keys and values), sent as one txn of nested sub-txns, and green refuses it (%v). Run green with --max-txn-ops %d (etcd's default) or more. %s",
			ErrTooManyOps, rev, len(evs), byteSize(eventBytes(evs)), err, TxnOps, tooBig(rev))
	case errors.Is(err, rpctypes.ErrRequestTooLarge), status.Code(err) == codes.ResourceExhausted:
		return fmt.Errorf("%w: blue's revision %d (%d operations, %s of keys and values) is larger than green takes in one request (--max-request-bytes). %s If green's --max-request-bytes is below 10 MiB (what the cutover runs it with), raising it is the other way: %w",
			ErrRefused, rev, len(evs), byteSize(eventBytes(evs)), tooBig(rev), err)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: applying blue's revision %d: green lost a lease the replicator keeps alive: %v", ErrRevisionMismatch, rev, err)
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrAuthFailed),
		errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrNoSpace), errors.Is(err, rpctypes.Error(rpctypes.ErrGRPCPermissionNotGiven)):
		// Green refusing the replicator's credentials, or full: not the revision's fault.
		return fmt.Errorf("replicate: applying blue's revision %d to green: %w", rev, err)
	case errors.Is(err, rpctypes.ErrAuthOldRevision):
		return nil // the client renews its token; the outcome is settled as an unknown one
	case invalidRequest(err):
		return fmt.Errorf("%w: green refuses blue's revision %d (%d operations) as an invalid request, and it would refuse it again: %v. %s",
			ErrRefused, rev, len(evs), err, tooBig(rev))
	}
	return nil
}

// invalidRequest says whether err is green refusing a request as invalid (gRPC's
// InvalidArgument, as the server sent it or as etcd's client turned it into an error of its
// own): a duplicate key in one txn, say. Such a refusal does not depend on green's state.
func invalidRequest(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.InvalidArgument
	}
	return status.Code(err) == codes.InvalidArgument
}

// tooBig is the way out of a blue revision rev that green cannot take as one txn.
func tooBig(rev int64) string {
	return fmt.Sprintf("Green cannot take that revision as one txn, and one revision cannot be split without breaking exact revisions; a snapshot of blue taken after revision %d holds it: rebuild green from a new snapshot (run the cutover again).", rev)
}

// eventBytes is the size of the keys and values of evs.
func eventBytes(evs []*clientv3.Event) int {
	n := 0
	for _, ev := range evs {
		n += len(ev.Kv.Key) + len(ev.Kv.Value)
	}
	return n
}

// byteSize says n bytes for a reader: "900 bytes", "12.5 KiB", "1.8 MiB".
func byteSize(n int) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
