package replicate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCheckerFollowsReplication: with the replicator applying blue's changes (puts, a multi-key
// txn, deletes, a leased key), the check keeps up with blue's revision and finds nothing.
func TestCheckerFollowsReplication(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	put(t, blue, "/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, nil)
	c := StartCheck(blue.cli, green.cli, s, testLog(t))
	t.Cleanup(c.Stop)
	lease := grant(t, blue, 60)
	for i := range 20 {
		put(t, blue, fmt.Sprintf("/k%d", i), fmt.Sprint(i), clientv3.WithLease(lease))
	}
	if _, err := blue.cli.Txn(t.Context()).Then(clientv3.OpPut("/x", "1"), clientv3.OpPut("/y", "2"), clientv3.OpDelete("/a")).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := blue.cli.Delete(t.Context(), "/k", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	rev := catchUp(t, run, blue)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.WaitFor(ctx, rev); err != nil {
		t.Fatalf("WaitFor(%d) = %v", rev, err)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("Err() = %v after an exact replication", err)
	}
}

// TestCheckerFindsDifferences: green's changes after the start differ from blue's with the same
// number of revisions (so no revision count can tell): a value, a lease, an extra key, a
// different revision order. Each is ErrRevisionMismatch naming the revision; what came before it
// counts as checked.
func TestCheckerFindsDifferences(t *testing.T) {
	type ops func(m *member) // applied to blue, then to green
	same := func(k, v string) ops { return func(m *member) { put(t, m, k, v) } }
	cases := []struct {
		name        string
		blue, green []ops
		want        string
	}{
		{"a value", []ops{same("/a", "1"), same("/b", "1")}, []ops{same("/a", "1"), same("/b", "2")}, "change 0 differs"},
		{"one more key in a revision", []ops{same("/a", "1")}, []ops{func(m *member) {
			if _, err := m.cli.Txn(t.Context()).Then(clientv3.OpPut("/a", "1"), clientv3.OpPut("/z", "1")).Commit(); err != nil {
				t.Fatal(err)
			}
		}}, "blue has 1 change(s), green 2"},
		{"a deleted key kept", []ops{same("/a", "1"), func(m *member) {
			if _, err := m.cli.Delete(t.Context(), "/a"); err != nil {
				t.Fatal(err)
			}
		}}, []ops{same("/a", "1"), same("/a", "1")}, "change 0 differs"},
		{"the order of two revisions", []ops{same("/a", "1"), same("/b", "1")}, []ops{same("/b", "1"), same("/a", "1")}, "change 0 differs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
			put(t, blue, "/seed", "0")
			green, s := greenFrom(t, blue, etcdOpts{})
			c := StartCheck(blue.cli, green.cli, s, testLog(t))
			t.Cleanup(c.Stop)
			for _, op := range tc.blue {
				op(blue)
			}
			for _, op := range tc.green {
				op(green)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := c.WaitFor(ctx, revision(t, blue))
			if !errors.Is(err, ErrRevisionMismatch) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("WaitFor = %v, want ErrRevisionMismatch saying %q", err, tc.want)
			}
			if !errors.Is(c.Err(), ErrRevisionMismatch) {
				t.Fatalf("Err() = %v after a difference", c.Err())
			}
			t.Log(err)
		})
	}
}

// TestCheckerRevisionGap: a revision on one side only (green expiring a lease by itself, say)
// is a mismatch at that revision, whichever side has it: the revisions after it pair up
// differently.
func TestCheckerRevisionGap(t *testing.T) {
	for _, extraOnGreen := range []bool{true, false} {
		blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
		put(t, blue, "/seed", "0")
		green, s := greenFrom(t, blue, etcdOpts{})
		c := StartCheck(blue.cli, green.cli, s, testLog(t))
		put(t, blue, "/a", "1")
		put(t, green, "/a", "1")
		extra, other := green, blue
		if !extraOnGreen {
			extra, other = blue, green
		}
		put(t, extra, "/lease-expiry", "x")
		put(t, extra, "/b", "1")
		put(t, other, "/b", "1")
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		err := c.WaitFor(ctx, revision(t, blue))
		cancel()
		c.Stop()
		if want := fmt.Sprintf("at revision %d", s+2); !errors.Is(err, ErrRevisionMismatch) || !strings.Contains(err.Error(), want) {
			t.Fatalf("extra revision on green %v: WaitFor = %v, want ErrRevisionMismatch", extraOnGreen, err)
		}
		t.Log(err)
	}
}

// TestCheckerCompacted: history compacted past the start cannot be compared: ErrCompacted,
// never a pass.
func TestCheckerCompacted(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, nil)
	for i := range 3 {
		put(t, blue, "/a", fmt.Sprint(i))
	}
	rev := catchUp(t, run, blue)
	if _, err := blue.cli.Compact(t.Context(), rev); err != nil {
		t.Fatal(err)
	}
	c := StartCheck(blue.cli, green.cli, s, testLog(t))
	t.Cleanup(c.Stop)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.WaitFor(ctx, rev); !errors.Is(err, ErrCompacted) {
		t.Fatalf("WaitFor over compacted history = %v, want ErrCompacted", err)
	}
}

// TestCheckerStop: Stop ends the check; a WaitFor after it fails rather than waiting, and Err
// stays nil (nothing was found).
func TestCheckerStop(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	c := StartCheck(blue.cli, green.cli, s, testLog(t))
	c.Stop()
	if err := c.WaitFor(t.Context(), s+1); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("WaitFor after Stop = %v", err)
	}
	if err := c.WaitFor(t.Context(), s); err != nil {
		t.Fatalf("WaitFor(the start) = %v", err)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("Err() after Stop = %v", err)
	}
}

// TestCheckerWaitsForALaggingSide: one side further ahead than the check keeps in memory is no
// difference: it lets go and watches both again until the other side has caught up, then
// compares (green trails blue by the replication's lag, a burst after the verify can be large).
func TestCheckerWaitsForALaggingSide(t *testing.T) {
	defer func(n int) { maxCheckPending = n }(maxCheckPending)
	maxCheckPending = 1 << 10
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/seed", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	c := StartCheck(blue.cli, green.cli, s, testLog(t))
	t.Cleanup(c.Stop)
	value := strings.Repeat("x", 300)
	for i := range 8 { // 2.4 KiB ahead on blue
		put(t, blue, fmt.Sprintf("/k%d", i), value)
	}
	time.Sleep(300 * time.Millisecond) // the check sees blue far ahead
	for i := range 8 {
		put(t, green, fmt.Sprintf("/k%d", i), value)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.WaitFor(ctx, revision(t, blue)); err != nil {
		t.Fatalf("WaitFor = %v; want the lagging side waited for", err)
	}
}

// TestCheckerBackoffReset: the wait before watching again grows while watches end having
// compared nothing, and starts over after one that compared: early blips must not make a drop
// right before the switch wait the longest backoff (5 s, the window's whole budget).
func TestCheckerBackoffReset(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/seed", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	put(t, blue, "/a", "1")
	put(t, green, "/a", "1")
	cli, w := droppingClient(t, blue, backoffDrops)
	c := StartCheck(cli, green.cli, s, testLog(t))
	t.Cleanup(c.Stop)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.WaitFor(ctx, s+1); err != nil { // compared by the watch that delivers, after 100+200+400+800 ms
		t.Fatal(err)
	}
	if gap := w.reopenedAfter(t); gap > resetGapBound {
		t.Fatalf("blue watched again %s after a watch that delivered ended, want the first backoff (100 ms; at most %s)", gap, resetGapBound)
	}
}

// TestCheckerBoundsALeadingSide: blue takes a burst 25 times the check's bound while green
// stays behind. etcd's client reads a watch ahead without a bound whether the check reads it or
// not, so unless the check cancels the leading side's watch the whole burst ends up in this
// process; the check must hold no more than the bound and one response of it, and watch blue
// again from the first revision it did not receive once green has caught up: every revision
// compared, no difference. If blue compacts what the check has not received meanwhile, the
// check ends with ErrCompacted, never a pass, a hang or a mismatch.
func TestCheckerBoundsALeadingSide(t *testing.T) {
	for _, tc := range []struct {
		name    string
		compact bool
	}{{"caught up", false}, {"compacted while paused", true}} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(n int) { maxCheckPending = n }(maxCheckPending)
			const bound = 64 << 10
			maxCheckPending = bound
			blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
			put(t, blue, "/seed", "0")
			green, s := greenFrom(t, blue, etcdOpts{})
			src, w := bufferingClient(t, blue)
			c := StartCheck(src, green.cli, s, testLog(t))
			t.Cleanup(c.Stop)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			put(t, blue, "/first", "0")
			put(t, green, "/first", "0")
			if err := c.WaitFor(ctx, s+1); err != nil { // both watches open and current
				t.Fatal(err)
			}
			total, read, largest := burstAgainstBound(t, blue, w, bound, "the check")
			last := revision(t, blue)
			if tc.compact {
				if _, err := blue.cli.Compact(t.Context(), last); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 400 {
				put(t, green, fmt.Sprintf("/burst/%03d", i), burstValue)
			}
			err := c.WaitFor(ctx, last)
			switch {
			case tc.compact && (!errors.Is(err, ErrCompacted) || errors.Is(err, ErrRevisionMismatch)):
				t.Fatalf("WaitFor with blue compacted past what the check received = %v, want ErrCompacted", err)
			case !tc.compact && err != nil:
				t.Fatalf("WaitFor = %v; want every revision compared once green caught up", err)
			}
			t.Logf("held at most %s (the check %s, largest response %s); WaitFor: %v", byteSize(total), byteSize(read), byteSize(largest), err)
		})
	}
}
