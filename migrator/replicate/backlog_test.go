package replicate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"
)

// newClient is a client of m of its own, closed when the test ends, for a test to wrap its KV
// or its Watcher.
func newClient(t *testing.T, m *member) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.cli.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// bufferingWatcher makes visible what etcd's client does unseen (clientv3 watch.go: "TODO pause
// channel if buffer gets too large"): each watch takes blue's responses off the stream as soon
// as they arrive and holds them until the replicator reads them, without a bound, and drops
// what it holds when the watch is cancelled. It counts the bytes of blue's changes in this
// process that green has not applied: those it holds, and those the replicator read.
type bufferingWatcher struct {
	clientv3.Watcher

	mu       sync.Mutex
	buffered int       // bytes taken off blue's stream, not yet read by the replicator
	read     []revSize // read by the replicator and not applied to green, oldest first
	readSum  int
	// peak is the most of buffered + readSum at once, peakRead the most of readSum; largest is
	// the largest response taken off the stream.
	peak, peakRead, largest int
	lastTaken               time.Time
}

type revSize struct {
	rev   int64
	bytes int
}

func bufferingClient(t *testing.T, m *member) (*clientv3.Client, *bufferingWatcher) {
	t.Helper()
	cli := newClient(t, m)
	w := &bufferingWatcher{Watcher: cli.Watcher}
	cli.Watcher = w
	return cli, w
}

func (w *bufferingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	out := make(chan clientv3.WatchResponse)
	go w.serve(ctx, w.Watcher.Watch(ctx, key, opts...), out)
	return out
}

// serve takes responses off in as they come and hands them to out in order.
func (w *bufferingWatcher) serve(ctx context.Context, in clientv3.WatchChan, out chan<- clientv3.WatchResponse) {
	defer close(out)
	var buf []clientv3.WatchResponse
	for ctx.Err() == nil && (in != nil || len(buf) > 0) {
		var send chan<- clientv3.WatchResponse
		var head clientv3.WatchResponse
		if len(buf) > 0 {
			send, head = out, buf[0]
		}
		select {
		case resp, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			w.took(resp)
			buf = append(buf, resp)
		case send <- head:
			w.handed(head)
			buf = buf[1:]
		case <-ctx.Done():
		}
	}
	for _, resp := range buf { // cancelled: dropped, as etcd's client drops its buffer
		w.count(-respBytes(resp), nil)
	}
}

// respBytes is the size of a response's changes: keys, values and previous ones.
func respBytes(resp clientv3.WatchResponse) int {
	n := 0
	for _, ev := range resp.Events {
		n += len(ev.Kv.Key) + len(ev.Kv.Value)
		if ev.PrevKv != nil {
			n += len(ev.PrevKv.Key) + len(ev.PrevKv.Value)
		}
	}
	return n
}

func (w *bufferingWatcher) took(resp clientv3.WatchResponse) {
	w.mu.Lock()
	w.largest = max(w.largest, respBytes(resp))
	w.lastTaken = time.Now()
	w.mu.Unlock()
	w.count(respBytes(resp), nil)
}

// handed moves a response from the buffer to what the replicator read, per revision.
func (w *bufferingWatcher) handed(resp clientv3.WatchResponse) {
	var revs []revSize
	for _, ev := range resp.Events {
		n := respBytes(clientv3.WatchResponse{Events: []*clientv3.Event{ev}})
		if k := len(revs); k > 0 && revs[k-1].rev == ev.Kv.ModRevision {
			revs[k-1].bytes += n
		} else {
			revs = append(revs, revSize{ev.Kv.ModRevision, n})
		}
	}
	w.count(-respBytes(resp), revs)
}

func (w *bufferingWatcher) count(buffered int, read []revSize) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buffered += buffered
	for _, r := range read {
		w.read = append(w.read, r)
		w.readSum += r.bytes
	}
	w.peak = max(w.peak, w.buffered+w.readSum)
	w.peakRead = max(w.peakRead, w.readSum)
}

// applied forgets what green has applied, up to rev.
func (w *bufferingWatcher) applied(rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.read) > 0 && w.read[0].rev <= rev {
		w.readSum -= w.read[0].bytes
		w.read = w.read[1:]
	}
}

// quiet waits until nothing has come off blue's stream for d.
func (w *bufferingWatcher) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, false, func(context.Context) (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return !w.lastTaken.IsZero() && time.Since(w.lastTaken) > d, nil
	})
	if err != nil {
		t.Fatalf("blue's stream did not go quiet: %v", err)
	}
}

func (w *bufferingWatcher) peaks() (total, read, largest int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak, w.peakRead, w.largest
}

// heldClient is a client of m whose txns wait until release is called (heldKV); the test must
// call release (also when it fails: register it with t.Cleanup after start, so that it runs
// before Run is waited for).
func heldClient(t *testing.T, m *member) (cli *clientv3.Client, release func()) {
	t.Helper()
	cli = newClient(t, m)
	var kv *heldKV
	cli.KV, kv = holding(cli.KV)
	var once sync.Once
	return cli, func() { once.Do(func() { close(kv.release) }) }
}

// TestBacklogBounded: green takes no txn while blue takes a burst 25 times the bound. etcd's
// client reads a watch ahead without a bound, so unless the replicator stops reading blue the
// whole burst ends up in this process; the replicator must hold no more than the bound and one
// response (the rest waits in blue's history), count the pause, and once green takes txns again
// every revision must arrive exactly.
func TestBacklogBounded(t *testing.T) {
	const bound = 64 << 10
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/seed", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	src, w := bufferingClient(t, blue)
	dst, release := heldClient(t, green)
	run := start(t, blue, green, s, func(c *Config) {
		c.Source, c.Dest, c.MaxBacklog, c.ApplyTimeout = src, dst, bound, time.Minute
		c.OnApplied = func(p Progress) { w.applied(p.Applied) }
	})
	t.Cleanup(release)
	put(t, blue, "/first", "0")
	w.quiet(t, 300*time.Millisecond) // the watch is open and current: one response per revision
	total, read, largest := burstAgainstBound(t, blue, w, bound, "the replicator")
	if p := run.r.Progress(); p.BacklogBytes > int64(bound+largest) || p.BacklogPauses < 1 {
		t.Fatalf("Progress: backlog %s, %d pauses; want at most the bound %s and one response (%s), and a pause", byteSize(int(p.BacklogBytes)), p.BacklogPauses, byteSize(bound), byteSize(largest))
	}
	release()
	last := catchUp(t, run, blue)
	if b, g := all(t, blue, last), all(t, green, last); b != g {
		t.Fatalf("blue and green differ at revision %d", last)
	}
	if g := revision(t, green); g != last {
		t.Fatalf("green at revision %d, blue at %d", g, last)
	}
	t.Logf("held at most %s (the replicator %s, largest response %s), %d pauses", byteSize(total), byteSize(read), byteSize(largest), run.r.Progress().BacklogPauses)
}

// slowed makes green slower than blue's writers: kv's txns commit one at a time, each after d.
func slowed(kv clientv3.KV, d time.Duration) clientv3.KV {
	var mu sync.Mutex
	return &commitKV{KV: kv, around: func(commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		time.Sleep(d)
		return commit()
	}}
}

// TestBacklogRewatchExact: green slower than three writers on blue, and a bound of a few
// revisions: blue's watch is cancelled at the bound and opened again, from the first revision
// not received, again and again, while revisions of several keys, deletes, range deletes and
// leased puts arrive. Every revision must reach green once and whole: blue and green equal at
// every revision, green's revision blue's.
func TestBacklogRewatchExact(t *testing.T) {
	const bound = 16 << 10
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{maxTxnOps: bigTxn})
	put(t, blue, "/seed", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	dst := newClient(t, green)
	dst.KV = slowed(dst.KV, 3*time.Millisecond)
	run := start(t, blue, green, s, func(c *Config) { c.Dest, c.MaxBacklog = dst, bound })
	lease := grant(t, blue, 60)
	value := strings.Repeat("v", 1000)
	// A burst of 60 writes each, then, until blue's watch was cancelled at the bound twice, one
	// write each per 10 ms (faster than the slowed green applies, slow enough for it to catch up
	// in time): how many pauses the burst alone makes depends on the machine's speed.
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := 0; i < 60 || run.r.Progress().BacklogPauses < 2 && i < 3000; i++ {
				if i >= 60 {
					time.Sleep(10 * time.Millisecond)
				}
				if err := mixedWrite(t.Context(), blue.cli, fmt.Sprintf("/w%d/k%02d", w, i%20), i, value, lease); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	last := catchUp(t, run, blue)
	sameHistory(t, blue, green, s, last)
	if p := run.r.Progress(); p.BacklogPauses < 2 {
		t.Fatalf("%d pauses at the bound; want blue's watch cancelled and opened again more than once", p.BacklogPauses)
	}
	t.Logf("%d revisions, %d pauses", last-s, run.r.Progress().BacklogPauses)
}

// mixedWrite is the i-th write of a writer on key k: a put, a txn of three changes, a leased
// put, or a range delete, each one revision.
func mixedWrite(ctx context.Context, cli *clientv3.Client, k string, i int, value string, lease clientv3.LeaseID) error {
	var err error
	switch i % 4 {
	case 0:
		_, err = cli.Put(ctx, k, value)
	case 1:
		_, err = cli.Txn(ctx).Then(clientv3.OpPut(k+"/a", value), clientv3.OpPut(k+"/b", value), clientv3.OpDelete(k)).Commit()
	case 2:
		_, err = cli.Put(ctx, k, value, clientv3.WithLease(lease))
	case 3:
		_, err = cli.Txn(ctx).Then(clientv3.OpPut(k, "short"), clientv3.OpDelete(k+"/", clientv3.WithPrefix())).Commit()
	}
	return err
}

// TestBacklogCompactedWhilePaused: blue compacts past the revision the replicator would watch
// from while its watch is cancelled at the bound. Watching again finds that revision gone: Run
// must end with ErrCompacted (the cutover rebuilds green from a new snapshot), not wait, and not
// report a mismatch; green holds exactly what Run counted as applied.
func TestBacklogCompactedWhilePaused(t *testing.T) {
	const bound = 64 << 10
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/seed", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	dst, release := heldClient(t, green)
	run := start(t, blue, green, s, func(c *Config) { c.Dest, c.MaxBacklog, c.ApplyTimeout = dst, bound, time.Minute })
	t.Cleanup(release)
	value := strings.Repeat("x", 4<<10)
	for i := range 100 { // 400 KiB
		put(t, blue, fmt.Sprintf("/burst/%03d", i), value)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return run.r.Progress().BacklogPauses > 0, nil
	})
	if err != nil {
		t.Fatalf("blue's watch not paused at the bound with green held: %v", err)
	}
	// Revisions written while the watch is cancelled: the watch has not received them, so the
	// replicator must watch from one of them again (the burst may have been received whole
	// before the pause, on a fast machine).
	for i := range 5 {
		put(t, blue, fmt.Sprintf("/paused/%d", i), "x")
	}
	compacted := revision(t, blue)
	if _, err := blue.cli.Compact(t.Context(), compacted); err != nil {
		t.Fatal(err)
	}
	release()
	err = run.wait(t, 30*time.Second)
	if !errors.Is(err, ErrCompacted) || errors.Is(err, ErrRevisionMismatch) || !strings.Contains(err.Error(), "new snapshot") {
		t.Fatalf("Run = %v, want ErrCompacted asking for a new snapshot", err)
	}
	applied := run.r.Progress().Applied
	if g := revision(t, green); g != applied || g >= compacted {
		t.Fatalf("green at revision %d, Progress().Applied %d; want them equal and below blue's compaction at %d", g, applied, compacted)
	}
}

// TestBacklogAppliedBeforeFeedError: the feed stops for good (blue's client closed) while
// revisions it received wait in its queue, the apply busy with green (held). Everything received
// before the error must still reach green, as it did before the feed had a goroutine of its
// own: Run ends with the error, green at the last revision received, and no backlog counted.
func TestBacklogAppliedBeforeFeedError(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "/seed", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	src := newClient(t, blue)
	dst, release := heldClient(t, green)
	run := start(t, blue, green, s, func(c *Config) { c.Source, c.Dest, c.ApplyTimeout = src, dst, time.Minute })
	t.Cleanup(release)
	f := run.r.feed
	taken := func(rev int64) {
		t.Helper()
		err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.next > rev && len(f.queue) == 0, nil
		})
		if err != nil {
			t.Fatalf("the apply did not take revision %d: %v", rev, err)
		}
	}
	// The first revision goes to green and is held there; the apply takes the second and waits
	// for the first (one txn in flight at the start), so the rest stays in the feed's queue.
	taken(put(t, blue, "/k00", "v"))
	taken(put(t, blue, "/k01", "v"))
	var last int64
	for i := 2; i < 20; i++ {
		last = put(t, blue, fmt.Sprintf("/k%02d", i), "v")
	}
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return f.nextRev() > last, nil
	})
	if err != nil {
		t.Fatalf("the feed did not receive blue's revisions up to %d: %v", last, err)
	}
	src.Close()
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.err != nil && len(f.queue) > 0, nil
	})
	if err != nil {
		t.Fatalf("the feed did not stop with revisions queued: %v", err)
	}
	release()
	err = run.wait(t, 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "blue's client is closed") {
		t.Fatalf("Run = %v, want blue's client closed", err)
	}
	p := run.r.Progress()
	if g := revision(t, green); g != last || p.Applied != last || p.BacklogBytes != 0 {
		t.Fatalf("green at revision %d, Progress().Applied %d, BacklogBytes %d; want every revision received before the error applied (%d) and no backlog", g, p.Applied, p.BacklogBytes, last)
	}
	sameHistory(t, blue, green, s, last)
}

// burstValue is a value of burstAgainstBound's burst.
var burstValue = strings.Repeat("x", 4<<10)

// burstAgainstBound writes 1.6 MiB to blue (400 values of 4 KiB) while green is behind, and
// checks that what this process held of it ahead of green (clientv3's read-ahead included)
// stayed within twice bound, and what reader (the replicator, the check) read ahead within
// bound and one response. It returns the peaks (bufferingWatcher.peaks).
func burstAgainstBound(t *testing.T, blue *member, w *bufferingWatcher, bound int, reader string) (total, read, largest int) {
	t.Helper()
	for i := range 400 {
		put(t, blue, fmt.Sprintf("/burst/%03d", i), burstValue)
	}
	w.quiet(t, 300*time.Millisecond)
	total, read, largest = w.peaks()
	if total > 2*bound {
		t.Fatalf("this process held up to %s of blue's changes ahead of green (%s read %s, largest response %s), past twice the bound of %s: they grow in memory", byteSize(total), reader, byteSize(read), byteSize(largest), byteSize(bound))
	}
	if read > bound+largest {
		t.Fatalf("%s read up to %s of blue's changes ahead of green, past the bound %s and one response (%s)", reader, byteSize(read), byteSize(bound), byteSize(largest))
	}
	return total, read, largest
}
