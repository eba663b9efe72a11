package replicate

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Tip says where a green that was replicated by a process that is gone can be picked up from:
// green's current revision, after checking that green made none of its revisions by itself.
//
// While nobody keeps green's leases alive, green may expire one; if it held keys, green writes
// a revision of its own (the deletes), which is then green's newest. So it is enough to compare
// green's newest revision with blue's revision of the same number: the same changes (keys,
// values, create and mod revisions, versions, leases) mean green's history is blue's up to it,
// and replication may start again from there. Anything else wraps ErrRevisionMismatch (green
// must be rebuilt) or ErrCompacted (blue no longer has that revision to compare with).
func Tip(ctx context.Context, blue, green *clientv3.Client) (int64, error) {
	rev, err := Revision(ctx, green)
	if err != nil {
		return 0, fmt.Errorf("replicate: reading green's revision: %w", err)
	}
	blueRev, err := Revision(ctx, blue)
	if err != nil {
		return 0, fmt.Errorf("replicate: reading blue's revision: %w", err)
	}
	if rev > blueRev {
		return 0, fmt.Errorf("%w: green is at revision %d, past blue's %d: something wrote to green", ErrRevisionMismatch, rev, blueRev)
	}
	be, err := eventsAt(ctx, blue, rev)
	if err != nil {
		return 0, fmt.Errorf("blue's revision %d: %w", rev, err)
	}
	ge, err := eventsAt(ctx, green, rev)
	if err != nil {
		return 0, fmt.Errorf("green's revision %d: %w", rev, err)
	}
	if diff := diffEvents(be, ge); diff != "" {
		return 0, fmt.Errorf("%w: at revision %d (green's newest) %s: green changed something by itself (a lease expired there while nobody kept it alive?)", ErrRevisionMismatch, rev, diff)
	}
	return rev, nil
}

// eventsAt returns the events of revision rev, read with a watch from rev. etcd never splits
// one revision's events across watch responses (the client joins fragments), so the first
// response with events holds all of them.
func eventsAt(ctx context.Context, c *clientv3.Client, rev int64) ([]*clientv3.Event, error) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range c.Watch(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if err := resp.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return nil, fmt.Errorf("%w (compacted at %d)", ErrCompacted, resp.CompactRevision)
			}
			return nil, err
		}
		if len(resp.Events) == 0 {
			continue
		}
		var out []*clientv3.Event
		for _, e := range resp.Events {
			if e.Kv.ModRevision == rev {
				out = append(out, e)
			}
		}
		return out, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("the watch ended before the revision's changes arrived")
}

// diffEvents says how green's events of one revision differ from blue's ("" if they do not):
// type, key, value, create and mod revision, version and lease of each, in order.
func diffEvents(blue, green []*clientv3.Event) string {
	if len(blue) != len(green) {
		return fmt.Sprintf("blue has %d change(s), green %d", len(blue), len(green))
	}
	for i, b := range blue {
		g := green[i]
		if b.Type != g.Type || !sameKV(b.Kv, g.Kv) {
			return fmt.Sprintf("change %d differs: blue %v %q (%d bytes, revisions %d/%d, version %d, lease %x), green %v %q (%d bytes, revisions %d/%d, version %d, lease %x)",
				i, b.Type, b.Kv.Key, len(b.Kv.Value), b.Kv.CreateRevision, b.Kv.ModRevision, b.Kv.Version, b.Kv.Lease,
				g.Type, g.Kv.Key, len(g.Kv.Value), g.Kv.CreateRevision, g.Kv.ModRevision, g.Kv.Version, g.Kv.Lease)
		}
	}
	return ""
}

func sameKV(x, y *mvccpb.KeyValue) bool {
	return bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value) && x.CreateRevision == y.CreateRevision &&
		x.ModRevision == y.ModRevision && x.Version == y.Version && x.Lease == y.Lease
}
