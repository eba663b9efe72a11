package replicate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
)

// backoffDrops is how many watches the backoff-reset tests drop at once before one delivers:
// blue is watched again after 100+200+400+800 ms of backoff, and the backoff without a reset
// would then be 1.6 s.
const backoffDrops = 4

// resetGapBound separates a backoff that started over after a watch that delivered (the next
// watch 100 ms after) from one that did not (at least 1.6 s after). The 1.1 s above 100 ms is
// for scheduling on a loaded 2-core machine under -race; with 3 drops (800 ms without a reset)
// the bound had to be 400 ms, which such a machine overshoots.
const resetGapBound = 1200 * time.Millisecond

// droppingWatcher ends blue's first drops watches at once, without a response; the next one
// ends after its first response; the ones after are blue's own. It records when each watch was
// opened and when the one with a response ended.
type droppingWatcher struct {
	clientv3.Watcher
	drops int

	mu         sync.Mutex
	opened     []time.Time
	ended      time.Time
	delivering chan struct{} // closed when the watch that delivers is opened
}

func (w *droppingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.opened = append(w.opened, time.Now())
	n := len(w.opened)
	if n > w.drops+1 {
		return w.Watcher.Watch(ctx, key, opts...)
	}
	ch := make(chan clientv3.WatchResponse)
	if n <= w.drops {
		close(ch)
		return ch
	}
	real := w.Watcher.Watch(ctx, key, opts...)
	close(w.delivering)
	go func() {
		defer close(ch)
		select {
		case resp := <-real:
			select {
			case ch <- resp:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
		w.mu.Lock()
		w.ended = time.Now()
		w.mu.Unlock()
	}()
	return ch
}

// TestRewatchBackoffReset: the wait before watching blue again grows while watches end without
// delivering anything, and starts over after a watch that delivered: early blips must not make
// every later drop wait the longest backoff (5 s, the cutover's whole window budget).
func TestRewatchBackoffReset(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	cli, w := droppingClient(t, blue, backoffDrops)
	run := start(t, blue, green, s, func(c *Config) { c.Source = cli })
	select {
	case <-w.delivering: // after 100 + 200 + 400 + 800 ms of backoff; the next would be 1.6 s
	case <-time.After(30 * time.Second):
		t.Fatal("blue not watched again after four drops")
	}
	put(t, blue, "a", "1") // the watch delivers it, then ends
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
	if gap := w.reopenedAfter(t); gap > resetGapBound {
		t.Fatalf("blue watched again %s after a watch that delivered ended, want the first backoff (100 ms; at most %s)", gap, resetGapBound)
	}
}

// droppingClient is a client of m whose first drops watches end at once (droppingWatcher).
func droppingClient(t *testing.T, m *member, drops int) (*clientv3.Client, *droppingWatcher) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.cli.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	w := &droppingWatcher{Watcher: cli.Watcher, drops: drops, delivering: make(chan struct{})}
	cli.Watcher = w
	return cli, w
}

// reopenedAfter is how long after the watch that delivered ended the next one was opened (it
// waits up to 10 s for it).
func (w *droppingWatcher) reopenedAfter(t *testing.T) time.Duration {
	t.Helper()
	var gap time.Duration
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.opened) > w.drops+1 {
			gap = w.opened[w.drops+1].Sub(w.ended)
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("blue not watched again after the watch that delivered ended: %v", err)
	}
	return gap
}

// TestDefiniteRefusals: green refusing a txn as an invalid request (a key twice in one txn,
// or any other InvalidArgument) stops Run at once, wrapping ErrRefused, where sending it again
// would fail the same way; an error whose outcome is unknown is not definite.
func TestDefiniteRefusals(t *testing.T) {
	evs := []*clientv3.Event{{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte("/k"), ModRevision: 7}}}
	for _, err := range []error{
		rpctypes.ErrDuplicateKey,
		rpctypes.ErrGRPCDuplicateKey,
		fmt.Errorf("sending: %w", rpctypes.ErrEmptyKey),
		status.Error(codes.InvalidArgument, "etcdserver: something new"),
	} {
		got := definite(err, 7, evs)
		if !errors.Is(got, ErrRefused) || !strings.Contains(got.Error(), "revision 7") || !strings.Contains(got.Error(), "invalid request") {
			t.Errorf("definite(%v) = %v, want ErrRefused naming revision 7 and an invalid request", err, got)
		}
	}
	// Green refusing the replicator's credentials is no invalid revision (rebuilding green
	// would not help): definite, but not ErrRefused's advice. etcd's client makes these
	// InvalidArgument errors too.
	for _, err := range []error{rpctypes.ErrUserEmpty, rpctypes.ErrAuthFailed, rpctypes.Error(rpctypes.ErrGRPCPermissionNotGiven), rpctypes.ErrPermissionDenied} {
		got := definite(err, 7, evs)
		if got == nil || errors.Is(got, ErrRefused) || strings.Contains(got.Error(), "invalid request") {
			t.Errorf("definite(%v) = %v, want a definite error about green's auth, not an invalid revision", err, got)
		}
	}
	// An auth token older than green's auth store is renewed by the client: not definite.
	for _, err := range []error{context.DeadlineExceeded, rpctypes.ErrTimeout, status.Error(codes.Unavailable, "down"), rpctypes.ErrAuthOldRevision} {
		if got := definite(err, 7, evs); got != nil {
			t.Errorf("definite(%v) = %v, want nil (the outcome is unknown)", err, got)
		}
	}
}

// TestAppliedGuardAfterPutThenDelete: the guard "revision N is applied" that a txn sent behind
// revision N carries names a key whose state after N tells that N is applied: not a key N puts
// and then deletes (its mod revision is never N), but a key it puts and keeps, or failing that
// one it deletes that existed before N.
func TestAppliedGuardAfterPutThenDelete(t *testing.T) {
	ev := func(typ mvccpb.Event_EventType, key string, version int64) *clientv3.Event {
		return &clientv3.Event{Type: typ, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: 9, Version: version}}
	}
	put, del := mvccpb.PUT, mvccpb.DELETE
	cases := []struct {
		evs    []*clientv3.Event
		key    string
		target pb.Compare_CompareTarget
		// notAppliedKey (default key): "not applied" needs a key that tells exactly: a put
		// that creates its key cannot tell "not yet" from "deleted since", so a key updated or
		// deleted that existed before comes first there.
		notAppliedKey string
		// unsure: keys that revisions before N still in flight change; gone, they do not tell
		// that N is applied (an earlier revision not applied yet may create them).
		unsure []string
	}{
		{[]*clientv3.Event{ev(put, "/new", 1), ev(del, "/new", 0), ev(put, "/a", 2)}, "/a", pb.Compare_MOD, "", nil},
		{[]*clientv3.Event{ev(put, "/new", 1), ev(del, "/new", 0), ev(del, "/gone", 0)}, "/gone", pb.Compare_VERSION, "", nil},
		{[]*clientv3.Event{ev(put, "/old", 3), ev(del, "/old", 0)}, "/old", pb.Compare_VERSION, "", nil},
		// every key created and deleted: none tells; a guard that never holds (mod revision 9
		// of a key gone after 9) makes the txn behind wait until N is applied
		{[]*clientv3.Event{ev(put, "/new", 1), ev(del, "/new", 0)}, "/new", pb.Compare_MOD, "", nil},
		{[]*clientv3.Event{ev(put, "/a", 1), ev(put, "/b", 1)}, "/a", pb.Compare_MOD, "", nil},
		{[]*clientv3.Event{ev(del, "/a", 0), ev(put, "/b", 1)}, "/b", pb.Compare_MOD, "/a", nil},
		{[]*clientv3.Event{ev(put, "/b", 1), ev(put, "/c", 4)}, "/b", pb.Compare_MOD, "/c", nil},
		{[]*clientv3.Event{ev(del, "/a", 0), ev(del, "/b", 0)}, "/b", pb.Compare_VERSION, "/a", []string{"/a"}},
		{[]*clientv3.Event{ev(del, "/a", 0)}, "/a", pb.Compare_MOD, "", []string{"/a"}},
		{[]*clientv3.Event{ev(del, "/a", 0), ev(put, "/b", 2)}, "/b", pb.Compare_MOD, "", []string{"/a", "/b"}},
	}
	for i, tc := range cases {
		if tc.notAppliedKey == "" {
			tc.notAppliedKey = tc.key
		}
		g := appliedGuard(tc.evs, 9, func(k string) bool { return slices.Contains(tc.unsure, k) })
		if string(g.Key) != tc.key || g.Target != tc.target {
			t.Errorf("case %d: guard on %s of %q, want %s of %q", i, g.Target, g.Key, tc.target, tc.key)
		}
		// "not applied" looks at the same key: one created and deleted again in the revision is
		// gone whether or not it was applied, and would let a late copy apply it twice.
		for _, c := range notAppliedGuard(tc.evs, 9) {
			if string(c.Key) != tc.notAppliedKey {
				t.Errorf("case %d: not-applied guard on %q, want %q", i, c.Key, tc.notAppliedKey)
			}
		}
	}
}

// TestFitted: a revision of any size, with keys named twice or not, becomes one txn whose
// operations, read depth first, are the revision's in order, and that etcd with --max-txn-ops
// TxnOps takes (every path from the top, guards included, within the flag).
func TestFitted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		repeat int // every repeat-th event names the key of the one before (0: none)
	}{
		{"one", 1, 0},
		{"the flag's worth", TxnOps, 0},
		{"a lease expiry", 1000, 0},
		{"wider than two levels of 128", 20000, 0},
		{"a put and its delete", 2, 2},
		{"repeats in a large revision", 5000, 7},
		{"every key twice", 4000, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs := make([]*clientv3.Event, tc.n)
			ops := make([]clientv3.Op, tc.n)
			for i := range evs {
				key := fmt.Sprintf("k/%06d", i)
				if tc.repeat > 0 && i%tc.repeat == tc.repeat-1 {
					key = string(evs[i-1].Kv.Key)
				}
				evs[i] = &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key)}}
				ops[i] = clientv3.OpPut(key, "v")
			}
			txn := fitted(evs, ops)
			if cost := max(maxGuards, len(txn)) + deepest(txn); cost > TxnOps {
				t.Errorf("a path counts %d operations against --max-txn-ops %d", cost, TxnOps)
			}
			var got []string
			var walk func([]clientv3.Op)
			walk = func(ops []clientv3.Op) {
				for _, op := range ops {
					if op.IsTxn() {
						_, then, _ := op.Txn()
						walk(then)
						continue
					}
					got = append(got, string(op.KeyBytes()))
				}
			}
			walk(txn)
			if len(got) != tc.n {
				t.Fatalf("the txn holds %d operations, want %d", len(got), tc.n)
			}
			for i, ev := range evs {
				if got[i] != string(ev.Kv.Key) {
					t.Fatalf("operation %d names %q, want %q", i, got[i], ev.Kv.Key)
				}
			}
		})
	}
}
