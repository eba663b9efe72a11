package replicate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
	"k8s.io/apimachinery/pkg/util/wait"
)

// A watch can go quiet without ending: its member keeps the connection and a leader, and
// answers the client's keepalive pings, but applies nothing (an `etcdctl defrag` on it holds its
// backend's locks for the whole defrag; a stalled backend disk with the WAL elsewhere), so it
// sends nothing. WithRequireLeader covers a member cut off from the leader and the keepalive
// pings a lost host; neither covers this one. So every watch of the package (the feed's of blue,
// the delta check's of blue and of green) has a watchdog: the etcd's revision as a
// linearizable read returns it (such a read is served only by a member that applied up to the
// leader's commit index, so it is the cluster's revision whichever member answers) is compared
// with the revisions received. Once a read finds the etcd ahead of what the open watch
// delivered, and the watch delivers no revision for the bound from then, the watch is
// cancelled and opened again at once from the first revision not received, on a gRPC stream of
// its own (etcd's client shares one stream among watches whose contexts carry the same
// metadata, and its round-robin balancer sends a new stream to the next endpoint), and the
// stall counted (Progress.WatchStalls, Checker.WatchStalls).
//
// etcd's progress notifications do not tell this: a member answers a progress request
// (clientv3 RequestProgress) with its own store's revision (server/v3 storage/mvcc
// watchable_store.go progressIfSync), so one that stopped applying says its watch is complete
// up to where it stopped; and WithProgressNotify's period is the etcd's server flag (10 minutes
// by default), not the client's. Only a linearizable read knows how far the etcd really is.
//
// defaultWatchStall is Config.WatchStall's default, and the delta check's bound. etcd sends a
// watch's events when the write ends, and tries again every 10 ms for a watcher whose buffer is
// full and every 100 ms for one catching up from history (watchable_store.go), so a healthy
// watch delivers within milliseconds of the read that finds the etcd ahead; 5 s is 50 times the
// slowest of these and above a leader election (1 s with etcd's defaults). A watch opened again
// that stalls before it delivers anything gets twice the bound, up to maxWatchStall, so that a
// watch slow to read a long history (a catch-up after a pause) is not cancelled again and again.
const (
	defaultWatchStall = 5 * time.Second
	maxWatchStall     = time.Minute
)

// errStalled: the watchdog cancelled a watch that delivered nothing while its etcd moved on.
var errStalled = errors.New("the watch delivered nothing while its etcd moved on")

// streamKey is the gRPC metadata that gives a watch opened after a stall a stream of its own.
const streamKey = "kubefence-replicate-watch"

// watchdog watches one watch, opened again and again (opened, closed), for stalls.
type watchdog struct {
	name  string        // whose watch: the stream metadata's value, so no two watchdogs share one
	base  time.Duration // the bound for a watch that delivered
	stall chan struct{} // holds a signal when the open watch is found stalled

	mu sync.Mutex
	// watching: a watch is open (not paused, not waiting to watch again); next: the first
	// revision it has not received; cluster: the etcd's revision last read; behind: when a read
	// first found the etcd ahead of next since the watch last delivered (zero: none did);
	// bound: the stall bound for the open watch.
	watching bool
	next     int64
	cluster  int64
	behind   time.Time
	bound    time.Duration
	stalls   int64
}

func newWatchdog(name string, bound time.Duration) *watchdog {
	return &watchdog{name: name, base: bound, bound: bound, stall: make(chan struct{}, 1)}
}

// opened starts watching a watch about to be opened from revision from, and returns ctx with
// the stream to open it on: the client's shared stream until the first stall, then a new one
// after each.
func (w *watchdog) opened(ctx context.Context, from int64) context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watching, w.next, w.behind = true, from, time.Time{}
	select {
	case <-w.stall: // a signal for the watch before
	default:
	}
	if w.stalls == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, streamKey, fmt.Sprintf("%s-%d", w.name, w.stalls))
}

// closed stops watching: no watch is open.
func (w *watchdog) closed() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watching, w.behind = false, time.Time{}
}

// received says the open watch delivered revisions up to next-1.
func (w *watchdog) received(next int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next, w.behind, w.bound = next, time.Time{}, w.base
}

// sawCluster is the watchdog: the etcd's revision rev, read from the cluster at now, is
// compared with what the open watch delivered; once the etcd has been ahead of it for the bound
// without a revision delivered, the watch is stalled.
func (w *watchdog) sawCluster(rev int64, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cluster = max(w.cluster, rev)
	switch {
	case !w.watching || rev < w.next:
		w.behind = time.Time{}
	case w.behind.IsZero():
		w.behind = now
	case now.Sub(w.behind) >= w.bound:
		signal(w.stall)
	}
}

// stalled takes the watchdog's signal for the open watch: it counts the stall, doubling the
// bound if the watch delivered nothing, and returns errStalled with what a log needs; nil if
// the watch delivered since the signal.
func (w *watchdog) stalled(delivered bool) ([]any, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.behind.IsZero() {
		return nil, nil
	}
	w.stalls++
	attrs := []any{"received", w.next - 1, "cluster", w.cluster,
		"quiet", time.Since(w.behind).Round(time.Millisecond), "bound", w.bound}
	if !delivered {
		w.bound = min(2*w.bound, maxWatchStall)
	}
	return attrs, errStalled
}

// count is the stalls found.
func (w *watchdog) count() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stalls
}

// pollRevision reads cli's revision every interval, each read bounded by two of them (a
// linearizable read that reaches a member that stopped applying waits for ever), and hands it
// to w, until ctx ends. A read that fails is skipped: w acts on the reads that answer.
func pollRevision(ctx context.Context, cli *clientv3.Client, interval time.Duration, w *watchdog) {
	_ = wait.PollUntilContextCancel(ctx, interval, false, func(ctx context.Context) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, 2*interval)
		rev, err := Revision(rctx, cli)
		cancel()
		if err == nil {
			w.sawCluster(rev, time.Now())
		}
		return false, nil // until ctx ends
	})
}
