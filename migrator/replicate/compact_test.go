package replicate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// apiserverCompact compacts m as kube-apiserver's compactor does (k8s.io/apiserver
// storage/etcd3/compact.go): a txn puts compact_rev_key with the revision to compact to, then
// Compact(rev) unless rev is 0 (its first round only records the key). It returns the put's
// revision.
func apiserverCompact(t *testing.T, m *member, rev int64) int64 {
	t.Helper()
	resp, err := m.cli.Txn(t.Context()).Then(clientv3.OpPut("compact_rev_key", strconv.FormatInt(rev, 10))).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if rev != 0 {
		if _, err := m.cli.Compact(t.Context(), rev); err != nil {
			t.Fatal(err)
		}
	}
	return resp.Header.Revision
}

// compactedAt says whether a read of m at revision rev fails because m is compacted past it.
func compactedAt(t *testing.T, m *member, rev int64) bool {
	t.Helper()
	_, err := m.cli.Get(t.Context(), "a", clientv3.WithRev(rev))
	if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("reading at revision %d: %v", rev, err)
	}
	return err != nil
}

// TestCompactsDest: green's apiserver cannot compact green while it is replicated into (it is
// write-gated), and blue's compaction is no watch event; so the replicator compacts green to
// the revision in every compact_rev_key put it applies, as blue's apiserver did blue. Green's
// history before it is gone, its revision still blue's. A first-round value (0), a value that is
// not a revision and one past the put's own revision compact nothing.
func TestCompactsDest(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, nil)
	apiserverCompact(t, blue, 0)
	if _, err := blue.cli.Put(t.Context(), "compact_rev_key", "not a revision"); err != nil {
		t.Fatal(err)
	}
	if _, err := blue.cli.Put(t.Context(), "compact_rev_key", "1000000"); err != nil {
		t.Fatal(err)
	}
	var to int64
	for i := range 5 {
		to = put(t, blue, "a", fmt.Sprint(i+1))
	}
	put(t, blue, "a", "6")
	catchUp(t, run, blue) // blue compacts only what green has
	apiserverCompact(t, blue, to)
	catchUp(t, run, blue)
	waitCompacted(t, green, to)
	second := put(t, blue, "a", "7")
	put(t, blue, "b", "1")
	apiserverCompact(t, blue, second)
	last := catchUp(t, run, blue)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	waitCompacted(t, green, second)
	if !compactedAt(t, blue, second-1) {
		t.Fatalf("blue not compacted to %d", second)
	}
	sameHistory(t, blue, green, second, last)
	for run.r.Progress().Compactions != 2 { // counted once Compact returns
		if err := ctx.Err(); err != nil {
			t.Fatalf("%d compactions counted, want 2", run.r.Progress().Compactions)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// green compacted further by someone else: a compaction to a revision below is no failure
	if _, err := green.cli.Compact(t.Context(), last); err != nil {
		t.Fatal(err)
	}
	run.r.compact.compact(ctx, second+1)
	c := run.r.compact
	c.mu.Lock()
	n, done := c.compactions, c.done
	c.mu.Unlock()
	if n != 2 || done != second+1 {
		t.Fatalf("after a compaction to a revision compacted already: %d compactions, done %d; want 2, %d", n, done, second+1)
	}
}

// waitCompacted waits until m is compacted exactly to rev: a read at rev-1 fails, one at rev
// does not.
func waitCompacted(t *testing.T, m *member, rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for !compactedAt(t, m, rev-1) {
		if ctx.Err() != nil {
			t.Fatalf("%s not compacted to %d", m.name, rev)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if compactedAt(t, m, rev) {
		t.Fatalf("%s compacted past %d", m.name, rev)
	}
}
