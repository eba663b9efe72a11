package replicate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
)

const bigTxn = 100000 // blue's --max-txn-ops where a test makes revisions of many operations; greens keep etcd's default

func put(t *testing.T, m *member, k, v string, opts ...clientv3.OpOption) int64 {
	t.Helper()
	resp, err := m.cli.Put(t.Context(), k, v, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func grant(t *testing.T, m *member, ttl int64) clientv3.LeaseID {
	t.Helper()
	l, err := m.cli.Grant(t.Context(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return l.ID
}

// TestReplicateExactRevisions: puts, updates, deletes, multi-key txns, a range delete, a lease
// revoke and a lease expiry that each delete hundreds of keys in one revision all reach green,
// and at every revision green holds what blue holds (keys, values, create/mod revisions,
// versions, leases), green's revision equal to blue's.
func TestReplicateExactRevisions(t *testing.T) {
	ctx := t.Context()
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	// Before the snapshot: plain keys, and a short lease holding 300 keys that blue will let
	// expire during replication; green restores it and must not expire it by itself.
	for i := range 20 {
		put(t, blue, fmt.Sprintf("/registry/configmaps/default/cm-%02d", i), "v1")
	}
	expiring := grant(t, blue, 4)
	for i := range 300 {
		put(t, blue, fmt.Sprintf("/registry/events/default/ev-%03d", i), "event", clientv3.WithLease(expiring))
	}
	green, s := greenFrom(t, blue, etcdOpts{})

	var mu sync.Mutex
	var seen []Progress
	run := start(t, blue, green, s, func(c *Config) {
		c.LeaseCheckInterval = 200 * time.Millisecond
		c.OnApplied = func(p Progress) { mu.Lock(); seen = append(seen, p); mu.Unlock() }
	})

	put(t, blue, "/registry/configmaps/default/cm-00", "v2") // update
	put(t, blue, "/registry/configmaps/default/new", "v1")   // create
	if _, err := blue.cli.Delete(ctx, "/registry/configmaps/default/cm-01"); err != nil {
		t.Fatal(err)
	}
	// a multi-key txn: two puts and a delete in one revision
	_, err := blue.cli.Txn(ctx).Then(
		clientv3.OpPut("/registry/pods/a", "pa"),
		clientv3.OpPut("/registry/configmaps/default/cm-02", "v3"),
		clientv3.OpDelete("/registry/configmaps/default/cm-03"),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	// a range delete: 10 keys in one revision
	if _, err := blue.cli.Delete(ctx, "/registry/configmaps/default/cm-1", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	// a lease granted after the snapshot, 200 keys on it, revoked: 200 deletes in one revision
	revoked := grant(t, blue, 60)
	for i := range 200 {
		put(t, blue, fmt.Sprintf("/registry/events/kube-system/ev-%03d", i), "event", clientv3.WithLease(revoked))
	}
	if _, err := blue.cli.Revoke(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	// blue expires `expiring`: 300 deletes in one revision; wait for it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := blue.cli.Get(ctx, "/registry/events/default/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("blue has not expired its 4 s lease in 20 s (%d keys left)", resp.Count)
		}
		time.Sleep(100 * time.Millisecond)
	}
	put(t, blue, "/registry/configmaps/default/last", "v1")
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)

	mu.Lock()
	for i, p := range seen {
		if p.Applied != s+int64(i)+1 {
			t.Fatalf("OnApplied call %d reported revision %d, want %d", i, p.Applied, s+int64(i)+1)
		}
	}
	if int64(len(seen)) != last-s {
		t.Fatalf("OnApplied called %d times for %d revisions", len(seen), last-s)
	}
	mu.Unlock()
	if p := run.r.Progress(); p.Applied != last || p.LagRevisions != 0 || p.LagSeconds != 0 || p.Revisions != last-s {
		t.Fatalf("caught up, Progress says %+v (blue at %d, %d revisions)", p, last, last-s)
	}

	// Both leases are gone on blue; the replicator revokes green's copies once they hold no
	// key, and that moves no revision.
	deadline = time.Now().Add(10 * time.Second)
	for _, id := range []clientv3.LeaseID{expiring, revoked} {
		for {
			l, err := green.cli.TimeToLive(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if l.TTL == -1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("green still has lease %x, which blue no longer has", id)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := revision(t, green); got != last {
		t.Fatalf("revoking leases moved green from revision %d to %d", last, got)
	}
	run.stop()
	if err := run.wait(t, 10*time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel = %v, want context.Canceled", err)
	}
}

// TestLeases: a lease blue grants after the snapshot reaches green with the same ID and blue's
// TTL, and is kept alive on green past its TTL; a lease granted on green (green's gated
// apiserver does that) does not move green's revision and replication goes on.
func TestLeases(t *testing.T) {
	ctx := t.Context()
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, nil)

	// blue keeps its lease alive; green's copy is kept alive by the replicator alone.
	id := grant(t, blue, 3)
	ka, err := blue.cli.KeepAlive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range ka {
		}
	}()
	put(t, blue, "leased", "x", clientv3.WithLease(id))
	catchUp(t, run, blue)
	l, err := green.cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL == -1 || l.GrantedTTL != 3 || len(l.Keys) != 1 || string(l.Keys[0]) != "leased" {
		t.Fatalf("green's lease %x: ttl %d granted %d keys %q; want blue's ID, granted TTL 3, key leased", id, l.TTL, l.GrantedTTL, l.Keys)
	}

	before := revision(t, green)
	g, err := pb.NewLeaseClient(green.cli.ActiveConnection()).LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 0x5eed, TTL: 30})
	if err != nil {
		t.Fatal(err)
	}
	if g.Header.Revision != before || revision(t, green) != before {
		t.Fatalf("granting a lease moved green from revision %d to %d", before, g.Header.Revision)
	}

	time.Sleep(5 * time.Second) // past the 3 s TTL
	put(t, blue, "b", "2")
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
	if l, err := green.cli.TimeToLive(ctx, id); err != nil || l.TTL == -1 {
		t.Fatalf("green let lease %x expire (ttl %v, err %v)", id, l.TTL, err)
	}
	if p := run.r.Progress(); p.Leases != 1 {
		t.Fatalf("Progress().Leases = %d, want 1", p.Leases)
	}
}

// TestWriteToGreenStops: a write made straight to green makes the next apply fail with an
// error that names blue's revision and green's.
func TestWriteToGreenStops(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, nil)
	put(t, blue, "b", "1")
	catchUp(t, run, blue)

	put(t, green, "intruder", "x")
	rev := put(t, blue, "c", "1")
	err := run.wait(t, 30*time.Second)
	if !errors.Is(err, ErrRevisionMismatch) {
		t.Fatalf("Run = %v, want ErrRevisionMismatch", err)
	}
	want := fmt.Sprintf("blue's revision %d (1 operations) green is at revision %d", rev, rev+1)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
	if p := run.r.Progress(); p.Applied != rev-1 {
		t.Fatalf("Progress().Applied = %d, want %d", p.Applied, rev-1)
	}
}

// TestStartRefusesMovedGreen: green not at FromRevision is refused before anything is applied.
func TestStartRefusesMovedGreen(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	put(t, green, "intruder", "x")
	err := Run(t.Context(), Config{Source: blue.cli, Dest: green.cli, FromRevision: s})
	if !errors.Is(err, ErrRevisionMismatch) || !strings.Contains(err.Error(), fmt.Sprintf("green is at revision %d", s+1)) {
		t.Fatalf("Run = %v, want ErrRevisionMismatch naming green's revision %d", err, s+1)
	}
}

// TestNames: a replicator running the other way (green into blue) names its sides as they are
// in its errors and logs, and errors.Is still sees the sentinel.
func TestNames(t *testing.T) {
	src := startEtcd(t, "green", t.TempDir(), etcdOpts{})
	put(t, src, "a", "1")
	dst, s := greenFrom(t, src, etcdOpts{})
	put(t, dst, "intruder", "x")
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	r, err := New(Config{Source: src.cli, Dest: dst.cli, FromRevision: s, Log: log, SourceName: "green", DestName: "blue"})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(t.Context())
	want := fmt.Sprintf("blue is at revision %d, replication must start", s+1)
	if !errors.Is(err, ErrRevisionMismatch) || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "blue's revision does not match green's") {
		t.Errorf("Run = %v, want ErrRevisionMismatch saying %q", err, want)
	}
	if werr := r.WaitFor(t.Context(), s+5); werr == nil || !strings.Contains(werr.Error(), fmt.Sprintf("(blue at %d): blue's revision", s)) {
		t.Errorf("WaitFor = %v", werr)
	}
	if got := Rename(errors.New("green is past blue"), "green", "blue").Error(); got != "blue is past green" {
		t.Errorf("Rename: %q", got)
	}
	// Quoted text is data (keys, values), not a side: a key naming a team "blue" stays.
	keyErr := Rename(errors.New(`change 7 differs: blue put "/registry/configmaps/blue-team/x", green put "/registry/configmaps/blue-team/x\"green\""`), "green", "blue").Error()
	if want := `change 7 differs: green put "/registry/configmaps/blue-team/x", blue put "/registry/configmaps/blue-team/x\"green\""`; keyErr != want {
		t.Errorf("Rename of an error with quoted keys:\n got %s\nwant %s", keyErr, want)
	}
	if got := Rename(errors.New(`blue says "unterminated green`), "green", "blue").Error(); got != `green says "unterminated green` {
		t.Errorf("Rename with an unbalanced quote: %q", got)
	}
	rp := renamer("green", "blue")
	l := slog.New(&renamingHandler{h: slog.NewTextHandler(&logs, nil), rp: rp}).With("side", "blue")
	l.Info("watching blue", "err", errors.New("green's lease"))
	if !strings.Contains(logs.String(), `msg="watching green" side=green err="blue's lease"`) {
		t.Errorf("renamed log: %s", logs.String())
	}
}

// TestCompacted: blue compacted past green's revision stops replication with ErrCompacted.
func TestCompacted(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	var rev int64
	for i := range 5 {
		rev = put(t, blue, "a", fmt.Sprint(i))
	}
	if _, err := blue.cli.Compact(t.Context(), rev); err != nil {
		t.Fatal(err)
	}
	run := start(t, blue, green, s, nil)
	err := run.wait(t, 30*time.Second)
	if !errors.Is(err, ErrCompacted) || !strings.Contains(err.Error(), "new snapshot") {
		t.Fatalf("Run = %v, want ErrCompacted asking for a new snapshot", err)
	}
	if got := revision(t, green); got != s {
		t.Fatalf("green moved from %d to %d", s, got)
	}
}

// TestRevisionsOfManyOps: blue revisions with more operations than etcd's default
// --max-txn-ops (a range delete, big txns, and a put-then-delete revision whose sibling
// sub-txns are each larger than that) reach a green run with the default, each as one
// revision with the same changes in the same order: the operations are nested, never split.
func TestRevisionsOfManyOps(t *testing.T) {
	ctx := t.Context()
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	put(t, blue, "/old", "0")
	green, s := greenFrom(t, blue, etcdOpts{}) // etcd's default --max-txn-ops, 128
	run := start(t, blue, green, s, nil)
	keys := func(prefix string, n int) []clientv3.Op {
		ops := make([]clientv3.Op, n)
		for i := range ops {
			ops[i] = clientv3.OpPut(fmt.Sprintf("%s/%05d", prefix, i), "v")
		}
		return ops
	}
	for _, ops := range [][]clientv3.Op{
		keys("/big", 20000), // three levels of 128
		keys("/small", 200),
		{clientv3.OpTxn(nil, append(keys("/first", 200), clientv3.OpPut("/old", "1")), nil),
			clientv3.OpTxn(nil, append([]clientv3.Op{clientv3.OpDelete("/old")}, keys("/second", 200)...), nil)},
	} {
		if _, err := blue.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := blue.cli.Delete(ctx, "/big/", clientv3.WithPrefix()); err != nil { // 20,000 deletes
		t.Fatal(err)
	}
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
	sameEvents(t, blue, green, s+1, last)
}

// TestTooManyOpsForGreen: a green whose --max-txn-ops is far below etcd's default (TxnOps) may
// refuse a revision of many operations even nested; Run stops with ErrTooManyOps naming the
// revision, its size and the flag, green untouched.
func TestTooManyOpsForGreen(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	for i := range 200 {
		put(t, blue, fmt.Sprintf("k/%03d", i), "v")
	}
	green, s := greenFrom(t, blue, etcdOpts{maxTxnOps: 16})
	run := start(t, blue, green, s, nil)
	del, err := blue.cli.Delete(t.Context(), "k/", clientv3.WithPrefix()) // one op on blue, 200 deletes
	if err != nil {
		t.Fatal(err)
	}
	err = run.wait(t, 30*time.Second)
	if !errors.Is(err, ErrTooManyOps) {
		t.Fatalf("Run = %v, want ErrTooManyOps", err)
	}
	for _, want := range []string{fmt.Sprintf("revision %d holds 200 operations", del.Header.Revision), "--max-txn-ops 128"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run = %v, want it to say %q", err, want)
		}
	}
	if got := revision(t, green); got != s {
		t.Fatalf("green moved from %d to %d", s, got)
	}
}

// TestWaitFor: WaitFor returns once the revision is applied, not before; it returns ctx's error
// when ctx ends first and Run's error when Run stopped before the revision.
func TestWaitFor(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, nil)

	if err := run.r.WaitFor(t.Context(), s); err != nil { // already applied
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := run.r.WaitFor(short, s+1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitFor a revision blue does not have = %v, want a deadline error", err)
	}
	got := make(chan error, 1)
	go func() { got <- run.r.WaitFor(t.Context(), s+3) }()
	put(t, blue, "b", "1")
	put(t, blue, "c", "1")
	select {
	case err := <-got:
		t.Fatalf("WaitFor(%d) returned %v with blue at %d", s+3, err, s+2)
	case <-time.After(300 * time.Millisecond):
	}
	put(t, blue, "d", "1")
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("WaitFor(%d) has not returned 10 s after blue reached it", s+3)
	}
	if got := revision(t, green); got < s+3 {
		t.Fatalf("WaitFor(%d) returned with green at %d", s+3, got)
	}

	run.stop()
	if err := run.r.WaitFor(t.Context(), s+100); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitFor after Run stopped = %v, want Run's error (context.Canceled)", err)
	}
}

// TestConfig: a config that cannot work is refused with every reason at once.
func TestConfig(t *testing.T) {
	cli := &clientv3.Client{}
	for name, tc := range map[string]struct {
		cfg  Config
		want []string
	}{
		"empty":       {Config{}, []string{"Source", "Dest", "FromRevision 0"}},
		"same client": {Config{Source: cli, Dest: cli, FromRevision: 5}, []string{"the same client"}},
		"ok":          {Config{Source: cli, Dest: &clientv3.Client{}, FromRevision: 5}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestThroughput logs how many revisions per second green takes (fsync on, as in production),
// with writers on blue at full speed; it asserts only that every revision arrived exactly.
func TestThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("throughput in -short")
	}
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn, fsync: true})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{fsync: true})
	run := start(t, blue, green, s, func(c *Config) { c.Log = nil })

	const writers, each = 8, 250
	value := strings.Repeat("x", 2048)
	begin := time.Now()
	var wg sync.WaitGroup
	var maxRevs int64
	var maxSecs float64
	var lagMu sync.Mutex
	// The writers report errors over errs: t.Fatal in their goroutines would end only those.
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := blue.cli.Put(t.Context(), fmt.Sprintf("/registry/configmaps/bench/cm-%d-%d", w, i%50), value); err != nil {
					errs <- fmt.Errorf("writer %d, put %d: %w", w, i, err)
					return
				}
				if i%25 == 0 {
					p := run.r.Progress()
					lagMu.Lock()
					maxRevs, maxSecs = max(maxRevs, p.LagRevisions), max(maxSecs, p.LagSeconds)
					lagMu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	wrote := time.Since(begin)
	last := catchUp(t, run, blue)
	took := time.Since(begin)
	n := last - s
	t.Logf("%d revisions (2 KiB values, %d writers): blue took them in %s (%.0f/s); green applied all %.0f revisions/s, caught up %s after the last write; largest lag seen %d revisions, %.2f s; Progress %.0f revisions/s, %d txns sent again, %d resyncs",
		n, writers, wrote.Round(time.Millisecond), float64(n)/wrote.Seconds(), float64(n)/took.Seconds(), (took - wrote).Round(time.Millisecond),
		maxRevs, maxSecs, run.r.Progress().RevisionsPerSecond, run.r.Progress().Resent, run.r.Progress().Resyncs)
	if got := revision(t, green); got != last {
		t.Fatalf("green at %d, blue at %d", got, last)
	}
	if a, b := all(t, blue, last), all(t, green, last); a != b {
		t.Fatal("blue and green differ at the last revision")
	}
}

// TestRestarts: green restarted for longer than a mirrored lease's TTL (the client drops that
// keepalive; the replicator starts it again) and blue restarted (the watch is opened again from
// green's revision), a writer on blue throughout: every revision arrives exactly and green still
// has the lease.
func TestRestarts(t *testing.T) {
	ctx := t.Context()
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, func(c *Config) { c.ApplyTimeout = 2 * time.Second })

	id := grant(t, blue, 3)
	ka, err := blue.cli.KeepAlive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range ka {
		}
	}()
	put(t, blue, "leased", "x", clientv3.WithLease(id))
	catchUp(t, run, blue)

	stop := make(chan struct{})
	stopWriter := sync.OnceFunc(func() { close(stop) })
	defer stopWriter() // a restart's t.Fatal below must not leave the writer running
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			blue.cli.Put(wctx, fmt.Sprintf("w/%d", i%20), fmt.Sprint(i)) // fails while blue is down
			cancel()
		}
	})
	time.Sleep(300 * time.Millisecond)
	green.restart(t, 4*time.Second) // past the lease's 3 s TTL
	time.Sleep(time.Second)
	blue.restart(t, 500*time.Millisecond)
	time.Sleep(time.Second)
	stopWriter()
	wg.Wait()

	put(t, blue, "last", "1")
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
	// A restarted etcd gives every lease its TTL again from its start (plus an election
	// timeout): green still has it for seconds whatever the replicator does. Alive for twice
	// that longer, the replicator kept it alive after the restart.
	for deadline := time.Now().Add(2 * (3*time.Second + time.Second)); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if l, err := green.cli.TimeToLive(ctx, id); err != nil || l.TTL == -1 {
			t.Fatalf("green lost lease %x after its restart (ttl %v, err %v): the replicator did not keep it alive again", id, l.TTL, err)
		}
	}
	t.Logf("%d revisions across a green and a blue restart", last-s)
}

// TestCompareRevision: after a failed txn, whether green's revision r is blue's r is decided by
// its events, not its number.
func TestCompareRevision(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	r, err := New(Config{Source: blue.cli, Dest: green.cli, FromRevision: s})
	if err != nil {
		t.Fatal(err)
	}
	events := func(m *member, rev int64) []*clientv3.Event {
		t.Helper()
		resp := <-m.cli.Watch(t.Context(), "", clientv3.WithPrefix(), clientv3.WithRev(rev))
		return resp.Events
	}
	for _, m := range []*member{blue, green} { // the same write on both: the same revision
		if _, err := m.cli.Txn(t.Context()).Then(clientv3.OpPut("b", "2"), clientv3.OpDelete("a")).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if diff, err := r.compareRevision(t.Context(), s+1, events(blue, s+1)); err != nil || diff != "" {
		t.Fatalf("the same revision on both: diff %q, err %v", diff, err)
	}
	put(t, blue, "c", "blue")
	put(t, green, "c", "green") // the same number, another write
	if diff, err := r.compareRevision(t.Context(), s+2, events(blue, s+2)); err != nil || !strings.Contains(diff, `"c"`) {
		t.Fatalf("different writes at revision %d: diff %q, err %v", s+2, diff, err)
	}
}

// TestRequestTooLarge: a blue revision bigger than green's --max-request-bytes stops Run with
// ErrRefused and an error that names the revision and its size, and the ways out: a new snapshot, or the flag if
// it is below what the cutover sets (not a client setting no operator can reach); green is left
// untouched.
func TestRequestTooLarge(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxReq: 8 << 20})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{}) // 1.5 MiB
	run := start(t, blue, green, s, nil)
	big := strings.Repeat("x", 900<<10)
	resp, err := blue.cli.Txn(t.Context()).Then(clientv3.OpPut("big/1", big), clientv3.OpPut("big/2", big)).Commit()
	if err != nil {
		t.Fatal(err)
	}
	err = run.wait(t, 30*time.Second)
	if !errors.Is(err, ErrRefused) { // picking replication up again would fail the same way
		t.Fatalf("Run = %v, want ErrRefused", err)
	}
	want := []string{fmt.Sprintf("revision %d (2 operations, 1.8 MiB", resp.Header.Revision), "new snapshot", "--max-request-bytes", "below 10 MiB"}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Run = %v, want it to say %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "MaxCallSendMsgSize") {
		t.Errorf("Run = %v: names a client setting no operator can reach", err)
	}
	if got := revision(t, green); got != s {
		t.Fatalf("green moved from %d to %d", s, got)
	}
}

// TestTip: after a replicator stops, green's newest revision is picked up again when green
// changed nothing by itself; a lease green expired on its own (nobody kept it alive) is found.
func TestTip(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	put(t, blue, "/a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	if rev, err := Tip(t.Context(), blue.cli, green.cli); err != nil || rev != s {
		t.Fatalf("Tip of a fresh restore = %d, %v; want %d", rev, err, s)
	}
	run := start(t, blue, green, s, nil)
	put(t, blue, "/b", "2")
	// Kept alive on blue throughout; on green only by the replicator, and after it stops green
	// expires it within its TTL: long enough for the Tip below to come first on a loaded machine.
	short := grant(t, blue, 6)
	ka, err := blue.cli.KeepAlive(t.Context(), short)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range ka {
		}
	}()
	put(t, blue, "/leased", "x", clientv3.WithLease(short))
	caught := catchUp(t, run, blue)
	run.stop()
	run.done <- <-run.done // stopped; the test's cleanup reads it again
	if rev, err := Tip(t.Context(), blue.cli, green.cli); err != nil || rev != caught {
		t.Fatalf("Tip after replication = %d, %v; want %d", rev, err, caught)
	}
	// Blue moves on, and green, left alone, expires the short lease: its own revision.
	put(t, blue, "/c", "3")
	deadline := time.Now().Add(20 * time.Second)
	for revision(t, green) == caught && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	_, err = Tip(t.Context(), blue.cli, green.cli)
	if !errors.Is(err, ErrRevisionMismatch) {
		t.Fatalf("Tip after green expired a lease by itself = %v, want ErrRevisionMismatch", err)
	}
	t.Log(err)
}

// TestGuards: a pipelined txn applies only on top of its predecessor and only once: sent
// before its predecessor, or sent twice, it changes nothing (green's revision stays).
func TestGuards(t *testing.T) {
	ctx := t.Context()
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/del", "x")
	green, s := greenFrom(t, blue, etcdOpts{})
	r1 := put(t, blue, "/a", "1")                           // s+1: a put
	if _, err := blue.cli.Delete(ctx, "/del"); err != nil { // s+2: only a delete
		t.Fatal(err)
	}
	r3 := put(t, blue, "/b", "2")                         // s+3
	r4 := put(t, blue, "/del", "y")                       // s+4: the deleted key again
	r5 := put(t, blue, "/a", "3")                         // s+5: an update of /a
	if _, err := blue.cli.Delete(ctx, "/a"); err != nil { // s+6: /a deleted
		t.Fatal(err)
	}
	r6 := r5 + 1
	evs := revisionEvents(t, blue, s+1, 6)
	txn := func(rev int64) bool {
		t.Helper()
		var ops []clientv3.Op
		for _, e := range evs[rev] {
			if e.Type == clientv3.EventTypePut {
				ops = append(ops, clientv3.OpPut(string(e.Kv.Key), string(e.Kv.Value)))
			} else {
				ops = append(ops, clientv3.OpDelete(string(e.Kv.Key)))
			}
		}
		resp, err := green.cli.Txn(ctx).If(append(notAppliedGuard(evs[rev], rev), appliedGuard(evs[rev-1], rev-1, nil))...).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	// s+1 goes without the predecessor's guard, as the pipeline sends when nothing is in flight.
	if _, err := green.cli.Txn(ctx).If(notAppliedGuard(evs[r1], r1)...).Then(clientv3.OpPut("/a", "1")).Commit(); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		rev  int64
		want bool
	}{{r3, false}, {s + 2, true}, {s + 2, false}, {r3, true}, {r3, false}, {r4, true},
		{s + 2, false}, // a late copy of the delete (a timed-out txn green commits after all) must not delete the key again
		{r5, true}, {r6, true},
		{r5, false}} // nor a late copy of an update put the key back
	for _, st := range steps {
		before := revision(t, green)
		if got := txn(st.rev); got != st.want {
			t.Errorf("revision %d sent with green at %d: applied %v, want %v", st.rev, before, got, st.want)
		}
	}
	if got := revision(t, green); got != r6 {
		t.Fatalf("green at %d, want %d", got, r6)
	}
	if a, b := all(t, blue, r6), all(t, green, r6); a != b {
		t.Fatal("blue and green differ")
	}
}

// revisionEvents reads blue's events of the n revisions from from on, by revision.
func revisionEvents(t *testing.T, blue *member, from int64, n int) map[int64][]*clientv3.Event {
	t.Helper()
	evs := map[int64][]*clientv3.Event{}
	for resp := range blue.cli.Watch(t.Context(), "", clientv3.WithPrefix(), clientv3.WithRev(from)) {
		for _, e := range resp.Events {
			evs[e.Kv.ModRevision] = append(evs[e.Kv.ModRevision], e)
		}
		if len(evs) >= n {
			break
		}
	}
	return evs
}

// unsentFlight is a replicator from blue's revision s to green and a pipeline holding blue's n
// revisions after s as txns not sent yet (the test attempts them in the order it wants).
func unsentFlight(t *testing.T, blue, green *member, s int64, n int) (*Replicator, *pipeline) {
	t.Helper()
	evs := revisionEvents(t, blue, s+1, n)
	r, err := New(Config{Source: blue.cli, Dest: green.cli, FromRevision: s, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := &pipeline{r: r}
	for rev := s + 1; rev <= s+int64(n); rev++ {
		ops, err := r.ops(t.Context(), rev, evs[rev])
		if err != nil {
			t.Fatal(err)
		}
		p.flight = append(p.flight, &sentTxn{rev: rev, evs: evs[rev], ops: ops})
	}
	return r, p
}

// TestOutOfOrderSentAgain: txns green proposed before their predecessor (their guards failed)
// are sent again at once, without a resync, and every revision still lands exactly.
func TestOutOfOrderSentAgain(t *testing.T) {
	cases := []struct {
		name   string
		writes func(t *testing.T, blue *member) // three revisions
	}{
		{name: "three new keys", writes: func(t *testing.T, blue *member) {
			for i := range 3 {
				put(t, blue, fmt.Sprintf("/k%d", i), "v")
			}
		}},
		// s+3's guard "s+2 is applied" is "/k is gone", which also holds before s+1 created it.
		{name: "a key created, deleted, then another put", writes: func(t *testing.T, blue *member) {
			put(t, blue, "/k", "v")
			if _, err := blue.cli.Delete(t.Context(), "/k"); err != nil {
				t.Fatal(err)
			}
			put(t, blue, "/x", "v")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
			put(t, blue, "/a", "0")
			green, s := greenFrom(t, blue, etcdOpts{})
			tc.writes(t, blue) // s+1 .. s+3
			r, p := unsentFlight(t, blue, green, s, 3)
			// Proposed newest first: s+3 and s+2 find their predecessor missing, s+1 applies.
			for i := 2; i >= 0; i-- {
				p.attempt(ctx, i)
				<-p.flight[i].done
			}
			if err := p.flush(ctx); err != nil {
				t.Fatal(err)
			}
			if got := revision(t, green); got != s+3 {
				t.Fatalf("green at %d, want %d", got, s+3)
			}
			if a, b := all(t, blue, s+3), all(t, green, s+3); a != b {
				t.Fatal("blue and green differ")
			}
			if pr := r.Progress(); pr.Applied != s+3 || pr.Resyncs != 0 || pr.Resent < 2 {
				t.Errorf("progress %+v: want revision %d applied, 0 resyncs, at least 2 txns sent again", pr, s+3)
			}
		})
	}
}

// TestUpdateThenDeleteInFlight: a key an earlier revision still in flight only updates existed
// all along, so its being gone still tells that the revision deleting it is applied (only a
// create or a delete in flight makes that unsure): an object's status updated, then the object
// deleted, then another write, proposed in order, apply at the first attempt.
func TestUpdateThenDeleteInFlight(t *testing.T) {
	ctx := t.Context()
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/k", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	put(t, blue, "/k", "1")                               // s+1
	if _, err := blue.cli.Delete(ctx, "/k"); err != nil { // s+2
		t.Fatal(err)
	}
	put(t, blue, "/x", "v") // s+3
	r, p := unsentFlight(t, blue, green, s, 3)
	for i := range 3 {
		p.attempt(ctx, i)
		<-p.flight[i].done
	}
	if err := p.flush(ctx); err != nil {
		t.Fatal(err)
	}
	if a, b := all(t, blue, s+3), all(t, green, s+3); a != b || revision(t, green) != s+3 {
		t.Fatal("blue and green differ")
	}
	if pr := r.Progress(); pr.Resent != 0 || pr.Resyncs != 0 {
		t.Errorf("progress %+v: want every txn applied at its first attempt", pr)
	}
}

// TestHoldLeases: while held, a lease holding a key outlives its TTL (no expiry, no revision);
// after release the cluster expires it by itself again.
func TestHoldLeases(t *testing.T) {
	m := startEtcd(t, "hold", t.TempDir(), etcdOpts{})
	// 4 s: the client renews at a third of the TTL, looking every 500 ms; a loaded machine's
	// late renewal must not pass for an expiry.
	id := grant(t, m, 4)
	put(t, m, "/held", "v", clientv3.WithLease(id))
	rev := revision(t, m)
	release, err := HoldLeases(t.Context(), t.Context(), m.cli, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second) // twice the TTL
	if got := revision(t, m); got != rev {
		t.Fatalf("revision %d while the lease was held, want %d (it expired)", got, rev)
	}
	release()
	err = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		resp, err := m.cli.Get(ctx, "/held")
		return err == nil && len(resp.Kvs) == 0, nil
	})
	if err != nil {
		t.Errorf("the lease did not expire after release: %v", err)
	}
}

// TestReversedProposals: a green that proposes every burst of concurrent txns newest first (a
// loaded etcd member can come close: its gRPC server starts a goroutine per request and the
// newest often runs first) still gets every revision exactly, and the pipeline backs off to
// one txn at a time instead of sending the same txns again and again: at most one txn sent
// again per revision applied.
func TestReversedProposals(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	const n = 300
	for i := range n { // a backlog, so that the first watch response holds a burst
		put(t, blue, fmt.Sprintf("/k%d", i%20), fmt.Sprint(i))
	}
	reversing := reversingClient(t, green)
	run := start(t, blue, green, s, func(c *Config) { c.Dest = reversing.cli })
	for i := range n { // and writes while it replicates
		put(t, blue, fmt.Sprintf("/k%d", i%20), fmt.Sprint(-i))
	}
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
	p := run.r.Progress()
	t.Logf("%d revisions applied with %d txns sent again (%d committed in %d reversed bursts), %d resyncs", last-s, p.Resent, reversing.committed.Load(), reversing.bursts.Load(), p.Resyncs)
	if p.Resent > last-s {
		t.Errorf("%d txns sent again for %d revisions: the pipeline kept sending bursts green proposes out of order", p.Resent, last-s)
	}
	if reversing.bursts.Load() < 2 {
		t.Errorf("only %d bursts of txns reached green: the test proposed nothing out of order", reversing.bursts.Load())
	}
}

// reversingKV commits the txns that reach it within 2 ms of each other newest first.
type reversingKV struct {
	clientv3.KV
	cli               *clientv3.Client
	mu                sync.Mutex
	batch             []*reversedTxn
	committed, bursts atomic.Int64
}

// reversingClient is a second client of green whose txns go through a reversingKV.
func reversingClient(t *testing.T, green *member) *reversingKV {
	t.Helper()
	cli := newClient(t, green)
	kv := &reversingKV{KV: cli.KV, cli: cli}
	cli.KV = kv
	return kv
}

func (kv *reversingKV) Txn(ctx context.Context) clientv3.Txn {
	return &reversedTxn{Txn: kv.KV.Txn(ctx), kv: kv}
}

// flush commits the txns gathered so far, newest first.
func (kv *reversingKV) flush() {
	kv.mu.Lock()
	b := kv.batch
	kv.batch = nil
	kv.mu.Unlock()
	if len(b) > 1 {
		kv.bursts.Add(1)
	}
	for i := len(b) - 1; i >= 0; i-- {
		b[i].resp, b[i].err = b[i].Txn.Commit()
		kv.committed.Add(1)
		close(b[i].done)
	}
}

type reversedTxn struct {
	clientv3.Txn
	kv   *reversingKV
	done chan struct{}
	resp *clientv3.TxnResponse
	err  error
}

func (t *reversedTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *reversedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *reversedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *reversedTxn) Commit() (*clientv3.TxnResponse, error) {
	t.done = make(chan struct{})
	t.kv.mu.Lock()
	first := len(t.kv.batch) == 0
	t.kv.batch = append(t.kv.batch, t)
	t.kv.mu.Unlock()
	if first {
		time.AfterFunc(2*time.Millisecond, t.kv.flush)
	}
	<-t.done
	return t.resp, t.err
}

// TestWindow: the pipeline's window grows by one per window's worth of txns applied while it
// was full, not while green kept up with a txn or two in flight (else a quiet hour would open
// it to 64 and the next burst would be sent at once); it halves once per burst that failed its
// guards, never below one.
func TestWindow(t *testing.T) {
	const full = -1 // as many in flight as the window allows
	applied := func(p *pipeline, n, inFlight int) {
		for range n {
			n := inFlight
			if n == full {
				n = p.limit()
			}
			p.flight = p.flight[:0]
			for range n {
				p.flight = append(p.flight, &sentTxn{}) // in flight: done is nil
			}
			p.grow()
		}
	}
	t.Run("grows while full", func(t *testing.T) {
		p := &pipeline{}
		for want := 2; want <= 8; want++ {
			applied(p, want-1, full)
			if p.limit() != want {
				t.Fatalf("window %d after full rounds, want %d", p.limit(), want)
			}
		}
		applied(p, 10000, full)
		if p.limit() != pipelineDepth {
			t.Fatalf("window %d after 10,000 txns applied, want the ceiling %d", p.limit(), pipelineDepth)
		}
	})
	t.Run("does not grow while not full", func(t *testing.T) {
		p := &pipeline{window: 4}
		applied(p, 1000, 1)
		if p.limit() != 4 {
			t.Fatalf("window %d after 1,000 txns applied one at a time, want 4", p.limit())
		}
	})
	t.Run("failed txns are not in flight", func(t *testing.T) {
		p := &pipeline{window: 4}
		for range 100 {
			p.flight = []*sentTxn{{}, failedTxn(), failedTxn(), failedTxn()}
			p.grow()
		}
		if p.limit() != 4 {
			t.Fatalf("window %d after 100 txns applied with three failed ones behind them, want 4", p.limit())
		}
		if p.canSend() {
			t.Error("a new txn may be sent behind a failed one, which it would fail too")
		}
		p.flight = []*sentTxn{{done: make(chan struct{})}}
		if !p.canSend() {
			t.Error("no new txn may be sent with one in flight in a window of 4")
		}
	})
	t.Run("halves once per burst", func(t *testing.T) {
		p := &pipeline{window: 32}
		burst := make([]*sentTxn, 8)
		for i := range burst {
			burst[i] = &sentTxn{seq: p.seq}
			p.seq++
		}
		for _, tx := range burst {
			p.cut(tx)
		}
		if p.limit() != 16 {
			t.Fatalf("window %d after one burst failed, want 16", p.limit())
		}
		for range 10 {
			p.cut(&sentTxn{seq: p.seq})
			p.seq++
		}
		if p.limit() != 1 {
			t.Fatalf("window %d after ten bursts failed, want 1", p.limit())
		}
	})
}

// failedTxn is a txn whose attempt ended with its guards failed.
func failedTxn() *sentTxn {
	t := &sentTxn{done: make(chan struct{}), resp: &clientv3.TxnResponse{Succeeded: false}}
	close(t.done)
	return t
}

// commitKV runs every txn's Commit through around, which calls commit, later or not at all,
// as a test needs green to behave.
type commitKV struct {
	clientv3.KV
	around func(commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
}

func (kv *commitKV) Txn(ctx context.Context) clientv3.Txn {
	return &commitTxn{Txn: kv.KV.Txn(ctx), around: kv.around}
}

type commitTxn struct {
	clientv3.Txn
	around func(commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
}

func (t *commitTxn) If(cs ...clientv3.Cmp) clientv3.Txn     { t.Txn = t.Txn.If(cs...); return t }
func (t *commitTxn) Then(ops ...clientv3.Op) clientv3.Txn   { t.Txn = t.Txn.Then(ops...); return t }
func (t *commitTxn) Else(ops ...clientv3.Op) clientv3.Txn   { t.Txn = t.Txn.Else(ops...); return t }
func (t *commitTxn) Commit() (*clientv3.TxnResponse, error) { return t.around(t.Txn.Commit) }

// heldKV holds every txn that reaches kv until release is closed, and says when one arrives.
type heldKV struct {
	arrived chan struct{}
	release chan struct{}
}

// holding makes kv's txns wait on a new heldKV.
func holding(kv clientv3.KV) (clientv3.KV, *heldKV) {
	h := &heldKV{arrived: make(chan struct{}, 1), release: make(chan struct{})}
	return &commitKV{KV: kv, around: func(commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		select {
		case h.arrived <- struct{}{}:
		default:
		}
		<-h.release
		return commit()
	}}, h
}

// TestStopCountsWhatWasInFlight: a txn in flight when Run is stopped still commits on green,
// and Run returns only after it ended (none may reach green after Run returns, when the cutover
// may let green's apiserver write); Progress().Applied after Run returns must count it: the
// cutover compares it with the revision it caught up to, to catch a write made after that.
func TestStopCountsWhatWasInFlight(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	cli := newClient(t, green)
	var kv *heldKV
	cli.KV, kv = holding(cli.KV)
	run := start(t, blue, green, s, func(c *Config) { c.Dest = cli })
	rev := put(t, blue, "/a", "1")
	select {
	case <-kv.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("no txn reached green")
	}
	run.stop()
	var released atomic.Bool
	time.AfterFunc(200*time.Millisecond, func() { released.Store(true); close(kv.release) })
	<-run.done
	run.done <- nil // for the cleanup
	if !released.Load() {
		t.Fatal("Run returned while its txn was held in flight: it could reach green after Run returned")
	}
	if g, applied := revision(t, green), run.r.Progress().Applied; g != rev || applied != g {
		t.Fatalf("after Run returned green is at revision %d, Progress().Applied %d; want both at %d, the txn in flight", g, applied, rev)
	}
}

// lateKV makes the first txn that reaches it end with DeadlineExceeded once release is closed,
// while the txn itself commits on green after a while, as a request etcd had proposed when its
// client gave up does; every later txn commits after it, as etcd's raft log orders them.
type lateKV struct {
	clientv3.KV
	after   time.Duration
	arrived chan struct{} // gets a signal when the first txn arrives
	release chan struct{}
	landed  chan struct{} // closed once the first txn committed
	first   atomic.Bool
}

func (kv *lateKV) Txn(ctx context.Context) clientv3.Txn {
	return &lateTxn{Txn: kv.KV.Txn(context.WithoutCancel(ctx)), kv: kv}
}

type lateTxn struct {
	clientv3.Txn
	kv *lateKV
}

func (t *lateTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *lateTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *lateTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *lateTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.kv.first.CompareAndSwap(false, true) {
		t.kv.arrived <- struct{}{}
		<-t.kv.release
		go func() {
			defer close(t.kv.landed)
			time.Sleep(t.kv.after)
			_, _ = t.Txn.Commit()
		}()
		return nil, context.DeadlineExceeded
	}
	<-t.kv.landed
	return t.Txn.Commit()
}

// TestStopAdoptsLateCommit: a txn in flight when Run is stopped that ends with its outcome
// unknown (a timeout) may still commit on green; Run must not return before green's revision is
// known again (read through green's raft log, after that txn), and Progress().Applied must count
// it: no txn of Run's may reach green after Run returns.
func TestStopAdoptsLateCommit(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	cli := newClient(t, green)
	kv := &lateKV{KV: cli.KV, after: 300 * time.Millisecond, arrived: make(chan struct{}, 1), release: make(chan struct{}), landed: make(chan struct{})}
	cli.KV = kv
	run := start(t, blue, green, s, func(c *Config) { c.Dest = cli })
	rev := put(t, blue, "/a", "1")
	select {
	case <-kv.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("no txn reached green")
	}
	run.stop()
	close(kv.release)
	<-run.done
	run.done <- nil // for the cleanup
	applied := run.r.Progress().Applied
	select {
	case <-kv.landed:
	case <-time.After(10 * time.Second):
		t.Fatal("the late txn did not commit")
	}
	if g := revision(t, green); g != rev || applied != g {
		t.Fatalf("Run returned with Progress().Applied %d; green then reached revision %d; want both at %d, the late txn", applied, g, rev)
	}
}

// TestLeaseGrantRetried: a put that names a lease green does not keep yet makes the replicator
// grant it on green first. Green down then for longer than the grant's own backoff (about 9 s
// over its 10 tries: a grant that does not wait for the connection fails each try at once) is
// ridden out as for a txn (ApplyTimeout a try, each waiting for green), not the end of
// replication.
func TestLeaseGrantRetried(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, func(c *Config) { c.ApplyTimeout = time.Second })
	// A revision applied says Run is past its start (green's revision read, its leases listed,
	// within 10 ApplyTimeouts): catching up to s alone returns at once, and on a loaded machine
	// the restart below then took green down under Run's start, which rightly gave up.
	put(t, blue, "b", "1")
	catchUp(t, run, blue)
	id := grant(t, blue, 60)
	// The restart runs beside the put, so it reports over a channel: t.Fatal in its goroutine
	// would end only that goroutine and leave the test waiting for it.
	restarted := make(chan error, 1)
	logDir := t.TempDir()
	go func() { restarted <- green.restartIn(logDir, 12*time.Second) }()
	time.Sleep(200 * time.Millisecond) // green is down
	put(t, blue, "leased", "x", clientv3.WithLease(id))
	select {
	case err := <-restarted:
		if err != nil {
			t.Fatalf("restarting green: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("green did not restart within a minute")
	}
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
}

// TestStartBounded: Run reads green's revision and lists its leases before anything else; a
// green that does not answer stops Run within 10 ApplyTimeouts instead of leaving it waiting.
func TestStartBounded(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	client, peer := "http://"+green.e.Clients[0].Addr().String(), "http://"+green.e.Peers[0].Addr().String()
	green.e.Close()
	t.Cleanup(func() { green.e = launch(t, green.name, green.dir, green.o, client, peer) }) // closed again by startEtcd's cleanup
	run := start(t, blue, green, s, func(c *Config) { c.ApplyTimeout = 200 * time.Millisecond })
	if err := run.wait(t, 30*time.Second); err == nil || !strings.Contains(err.Error(), "green") {
		t.Fatalf("Run = %v, want an error about green", err)
	}
}

// TestPutThenDeleteInOneRevision: a blue revision that puts a key and then deletes it (sibling
// sub-txns, the only way etcd takes both in one txn), for a new key and for one that existed,
// reaches green as one revision with the same changes in the same order, and replication goes
// on past it.
func TestPutThenDeleteInOneRevision(t *testing.T) {
	ctx := t.Context()
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	put(t, blue, "/old", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, nil)
	txns := [][]clientv3.Op{
		{clientv3.OpPut("/new", "v")},                            // a new key put, then deleted
		{clientv3.OpPut("/old", "1"), clientv3.OpPut("/a", "a")}, // an existing key updated, then deleted
	}
	for _, first := range txns {
		key := first[0].KeyBytes()
		_, err := blue.cli.Txn(ctx).Then(
			clientv3.OpTxn(nil, first, nil),
			clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpDelete(string(key)), clientv3.OpPut("/b", string(key))}, nil),
		).Commit()
		if err != nil {
			t.Fatalf("blue refused a put and a delete of %q in one txn: %v", key, err)
		}
	}
	put(t, blue, "/last", "1")
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
	sameEvents(t, blue, green, s+1, last)
	select {
	case err := <-run.done:
		run.done <- err
		t.Fatalf("Run stopped: %v", err)
	default:
	}
}

// authedBlue enables auth on blue with a root user, and a user "reader" that may only read
// prefix; it returns clients of root, of reader, and of nobody (no credentials).
func authedBlue(t *testing.T, blue *member, prefix string) (root, reader, nobody *clientv3.Client) {
	t.Helper()
	ctx := t.Context()
	steps := []func() error{
		func() error { _, err := blue.cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := blue.cli.UserAdd(ctx, "root", "pw"); return err },
		func() error { _, err := blue.cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := blue.cli.RoleAdd(ctx, "prefix-reader"); return err },
		func() error {
			_, err := blue.cli.RoleGrantPermission(ctx, "prefix-reader", prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error { _, err := blue.cli.UserAdd(ctx, "reader", "pw"); return err },
		func() error { _, err := blue.cli.UserGrantRole(ctx, "reader", "prefix-reader"); return err },
		func() error { _, err := blue.cli.AuthEnable(ctx); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	client := func(user string) *clientv3.Client {
		t.Helper()
		cli, err := clientv3.New(clientv3.Config{Endpoints: blue.cli.Endpoints(), Username: user, Password: "pw", DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	return client("root"), client("reader"), client("")
}

// TestSourceRefusesWatch: blue refusing the watch (the source user may read only part of the
// keys, or has no credentials on a blue with auth) stops Run and the Checker at once with
// ErrRefused, naming the refusal; watching again cannot change it.
func TestSourceRefusesWatch(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	put(t, blue, "/registry/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	root, reader, nobody := authedBlue(t, blue, "/registry/")
	for _, tc := range []struct {
		name string
		cli  *clientv3.Client
		want string
	}{{"a reader of /registry/ only", reader, "permission denied"}, {"no credentials", nobody, "user name is empty"}} {
		run := start(t, blue, green, s, func(c *Config) { c.Source = tc.cli })
		if _, err := root.Put(t.Context(), "/registry/a", "1"); err != nil {
			t.Fatal(err)
		}
		err := run.wait(t, 10*time.Second)
		t.Log(err)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Run = %v, want ErrRefused saying %q", tc.name, err, tc.want)
		}
		c := StartCheck(tc.cli, green.cli, s, testLog(t))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err = c.WaitFor(ctx, s+1)
		cancel()
		c.Stop()
		t.Log(err)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: the check = %v, want ErrRefused saying %q", tc.name, err, tc.want)
		}
	}
}

// TestResyncBounded: a txn whose outcome is unknown (green answered Unavailable after applying
// it) makes the pipeline read green's revision and check green's events at it; a green whose
// watches then stall (unreachable, or hung with its connection open) stops Run with an error
// within a bounded time, as the rest of Run's reads of green do, instead of hanging for ever.
func TestResyncBounded(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	cli := newClient(t, green)
	var cut atomic.Bool
	// The first txn applies, then answers Unavailable: its outcome unknown to the replicator.
	cli.KV = &commitKV{KV: cli.KV, around: func(commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		resp, err := commit()
		if err == nil && cut.CompareAndSwap(false, true) {
			return nil, status.Error(codes.Unavailable, "connection reset after the txn was sent")
		}
		return resp, err
	}}
	cli.Watcher = &stalledWatcher{Watcher: cli.Watcher, cut: &cut}
	run := start(t, blue, green, s, func(c *Config) { c.Dest = cli; c.ApplyTimeout = 200 * time.Millisecond })
	put(t, blue, "/a", "1")
	if err := run.wait(t, 20*time.Second); err == nil {
		t.Fatal("Run ended without an error, green's events unread")
	}
}

// stalledWatcher's watches, once cut is set, never deliver anything until their context ends.
type stalledWatcher struct {
	clientv3.Watcher
	cut *atomic.Bool
}

func (w *stalledWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	if !w.cut.Load() {
		return w.Watcher.Watch(ctx, key, opts...)
	}
	ch := make(chan clientv3.WatchResponse)
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

// TestStopFindsAMismatch: Run stopped with a txn in flight that green applies after green moved
// on by itself (a foreign write) does not return as a clean stop: green's revision, read through
// its raft log, is not one replication made, and Run says so.
func TestStopFindsAMismatch(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	cli := newClient(t, green)
	var kv *heldKV
	cli.KV, kv = holding(cli.KV)
	run := start(t, blue, green, s, func(c *Config) { c.Dest = cli })
	put(t, blue, "/a", "1")
	select {
	case <-kv.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("no txn reached green")
	}
	put(t, green, "/foreign", "x")
	run.stop()
	close(kv.release)
	if err := run.wait(t, 30*time.Second); !errors.Is(err, ErrRevisionMismatch) {
		t.Fatalf("Run returned %v; want ErrRevisionMismatch: green went on by itself", err)
	}
}

// TestLeaseWaitsCountsDrains: LeaseWaits counts the pipeline drained for a lease grant, not
// every new lease: a put with a new lease while nothing is in flight waits for nothing.
func TestLeaseWaitsCountsDrains(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "1")
	green, s := greenFrom(t, blue, etcdOpts{})
	run := start(t, blue, green, s, nil)
	catchUp(t, run, blue)
	id := grant(t, blue, 60)
	put(t, blue, "leased", "x", clientv3.WithLease(id))
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
	if w := run.r.Progress().LeaseWaits; w != 0 {
		t.Errorf("LeaseWaits %d after one leased put with nothing in flight, want 0", w)
	}
}

// lockedBuf is a log sink goroutines share.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestHeldLeaseRevokedIsNoError: a lease the hold keeps alive that is then revoked (by the
// replication running beside it, which revokes what blue dropped) is let go without an ERROR:
// the hold keeps every lease it finds, and their end is the stream's to say, not a loss.
func TestHeldLeaseRevokedIsNoError(t *testing.T) {
	m := startEtcd(t, "hold", t.TempDir(), etcdOpts{})
	id := grant(t, m, 6) // renewed every 2 s: the hold learns of the revoke at the next renewal
	var logs lockedBuf
	release, err := HoldLeases(t.Context(), t.Context(), m.cli, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := m.cli.Revoke(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(logs.String(), "lease="), nil
	})
	if err != nil || strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("after a held lease was revoked (%v), the hold logged:\n%s", err, logs.String())
	}
}
