package replicate

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"
)

// stallingStreams stands for an etcd member that keeps its connection and answers keepalive
// pings but has stopped applying entries (a defrag holding its backend's locks, a stalled
// disk): once stall is called, every watch stream opened before it delivers nothing more,
// while streams opened later (the client's round robin sends a new stream to the next member)
// deliver as usual.
type stallingStreams struct {
	mu      sync.Mutex
	stalled bool
	opened  int // watch streams opened, in all
	atStall int // watch streams opened before stall
}

func (s *stallingStreams) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled, s.atStall = true, s.opened
}

func (s *stallingStreams) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" {
		return cs, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opened++
	return &stallingStream{ClientStream: cs, s: s, n: s.opened}, nil
}

type stallingStream struct {
	grpc.ClientStream
	s *stallingStreams
	n int // this stream's number, from 1
}

// RecvMsg withholds what the member sends once the stream is stalled, until the stream ends.
func (cs *stallingStream) RecvMsg(m any) error {
	err := cs.ClientStream.RecvMsg(m)
	cs.s.mu.Lock()
	stuck := cs.s.stalled && cs.n <= cs.s.atStall
	cs.s.mu.Unlock()
	if stuck {
		<-cs.Context().Done()
		return cs.Context().Err()
	}
	return err
}

// stallingClient is a client of m whose watch streams stall on s.stall.
func stallingClient(t *testing.T, m *member) (*clientv3.Client, *stallingStreams) {
	t.Helper()
	s := &stallingStreams{}
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.cli.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(s.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, s
}

// stallWorld is a replication of blue (holding one key) to green from s, whose source client
// cli watches on streams that stall on command, its watchdog paced for a test: blue's revision
// read every 100 ms, a watch behind and quiet for 1 s counted as stalled.
func stallWorld(t *testing.T) (blue, green *member, s int64, cli *clientv3.Client, streams *stallingStreams, run *running) {
	t.Helper()
	blue = startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "0")
	green, s = greenFrom(t, blue, etcdOpts{})
	cli, streams = stallingClient(t, blue)
	run = start(t, blue, green, s, func(c *Config) {
		c.Source = cli
		c.ProgressInterval = 100 * time.Millisecond
		c.WatchStall = time.Second
	})
	return blue, green, s, cli, streams, run
}

// TestStalledWatchReopened: blue's watch stream goes quiet (its member delivers nothing more,
// but the connection lives) while blue takes writes through another client: Run notices that
// blue's revision read from the cluster is ahead of what the watch delivered, watches again on
// a new stream from the first revision not received, and applies the new revisions. Writes
// paced over more than the bound before it count no stall.
func TestStalledWatchReopened(t *testing.T) {
	blue, green, s, _, streams, run := stallWorld(t)
	for i := range 10 {
		put(t, blue, "a", string(rune('0'+i)))
		time.Sleep(150 * time.Millisecond) // pacing: the watch is read often while blue moves
	}
	catchUp(t, run, blue)
	if p := run.r.Progress(); p.WatchStalls != 0 {
		t.Fatalf("a watch that delivers counted %d stalls", p.WatchStalls)
	}
	streams.stall()
	var last int64
	for i := range 5 {
		last = put(t, blue, "b", string(rune('0'+i)))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := run.r.WaitFor(ctx, last); err != nil {
		t.Fatalf("blue's watch stalled, blue written up to %d: %v", last, err)
	}
	sameHistory(t, blue, green, s, last)
	if p := run.r.Progress(); p.WatchStalls != 1 {
		t.Fatalf("WatchStalls %d, want 1", p.WatchStalls)
	}
	streams.mu.Lock()
	defer streams.mu.Unlock()
	if streams.opened <= streams.atStall {
		t.Fatalf("blue watched again on the stalled stream (%d watch streams opened, %d before the stall)", streams.opened, streams.atStall)
	}
}

// blockingReads is a unary interceptor that holds every Range (the linearizable read of blue's
// revision) once block is set, until its context ends: a member that stopped applying never
// answers one (etcd 3.6 linearizableReadLoop waits for its applied index).
type blockingReads struct{ block atomic.Bool }

func (b *blockingReads) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == "/etcdserverpb.KV/Range" && b.block.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// recordingHandler keeps the messages logged at Warn or above, and hands every record on.
type recordingHandler struct {
	slog.Handler
	mu    sync.Mutex
	warns []string
}

func (h *recordingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.mu.Lock()
		h.warns = append(h.warns, r.Message)
		h.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h *recordingHandler) warned(part string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.ContainsFunc(h.warns, func(m string) bool { return strings.Contains(m, part) })
}

// TestSourceReadBounded: the read of blue's revision for the lag stops answering (its member
// stopped applying) while blue's watch goes on: within 3 ProgressIntervals the read is reported
// failing and the revision read as stale, its age growing, instead of the read hanging with
// the lag frozen; what the feed received is reported; Run still stops when asked.
func TestSourceReadBounded(t *testing.T) {
	const interval = 200 * time.Millisecond
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	reads := &blockingReads{}
	cli, err := clientv3.New(clientv3.Config{Endpoints: blue.cli.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(reads.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	logs := &recordingHandler{Handler: testLog(t).Handler()}
	run := start(t, blue, green, s, func(c *Config) {
		c.Source, c.ProgressInterval, c.Log = cli, interval, slog.New(logs)
	})
	put(t, blue, "a", "1")
	catchUp(t, run, blue)
	var fresh Progress
	err = wait.PollUntilContextTimeout(t.Context(), interval/10, 3*interval, true, func(context.Context) (bool, error) {
		fresh = run.r.Progress()
		return !fresh.SourceReadAt.IsZero(), nil
	})
	if err != nil || fresh.SourceReadFailures != 0 || fresh.SourceReadAge > interval.Seconds() {
		t.Fatalf("reads answering: %+v, want a read within %s and no failure", fresh, 3*interval)
	}

	reads.block.Store(true)
	blocked := time.Now()
	var stale Progress
	err = wait.PollUntilContextTimeout(t.Context(), interval/10, 3*interval, true, func(context.Context) (bool, error) {
		stale = run.r.Progress()
		return stale.SourceReadAge > interval.Seconds(), nil
	})
	if err != nil {
		t.Fatalf("no stale read of blue's revision shown within %s of reads hanging: %+v", 3*interval, stale)
	}
	// The first read after the block started within a ProgressInterval and ends at its bound,
	// two more: failing shows within 3 of them (4 with the scheduler's slack).
	var failing Progress
	err = wait.PollUntilContextTimeout(t.Context(), interval/10, 4*interval-time.Since(blocked), true, func(context.Context) (bool, error) {
		failing = run.r.Progress()
		return failing.SourceReadFailures > 0 && logs.warned("reading blue's revision"), nil
	})
	if err != nil || !strings.Contains(failing.SourceReadError, "deadline") || failing.SourceReadAge <= stale.SourceReadAge {
		t.Fatalf("reads hanging %s: %+v (%v), want failures counted and logged, a deadline error, the age growing past %.2f s", time.Since(blocked), failing, err, stale.SourceReadAge)
	}

	// The watch goes on: what it received is reported, the lag still counted from it.
	last := put(t, blue, "a", "2")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := run.r.WaitFor(ctx, last); err != nil {
		t.Fatal(err)
	}
	if p := run.r.Progress(); p.Received != last || p.ReceivedAt.Before(blocked) || p.ReceivedAge > time.Since(blocked).Seconds() || p.Source != last {
		t.Fatalf("%+v: want revision %d received after the block, and seen", p, last)
	}

	run.stop()
	if err := run.wait(t, 5*time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run stopped with %v, want context.Canceled", err)
	}
}

// TestStalledCheckWatchReopened: the delta check watches blue on the replicator's client, on a
// stream of its own or the replicator's; blue's member stops delivering on the streams open
// (its connection alive) while blue takes writes. The replicator's watchdog watches blue again
// on a new stream; the check's must too, or the switch's wait for the check (cutover's
// deltaChecked) runs out with writes fenced while replication goes on.
func TestStalledCheckWatchReopened(t *testing.T) {
	blue, green, s, cli, streams, run := stallWorld(t)
	check := StartCheck(cli, green.cli, s, testLog(t))
	t.Cleanup(check.Stop)
	first := put(t, blue, "a", "1")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := check.WaitFor(ctx, first); err != nil { // the check's watches open and current
		t.Fatal(err)
	}
	streams.stall()
	var last int64
	for i := range 5 {
		last = put(t, blue, "b", string(rune('0'+i)))
	}
	if err := run.r.WaitFor(ctx, last); err != nil {
		t.Fatalf("blue's watch stalled, blue written up to %d: the replicator: %v", last, err)
	}
	// The check's bound is the replicator's default (5 s), read every second.
	if err := check.WaitFor(ctx, last); err != nil {
		t.Fatalf("blue's watch stalled, blue written up to %d: the check: %v", last, err)
	}
	if err := check.Err(); err != nil {
		t.Fatalf("the check found %v", err)
	}
	if n := check.WatchStalls(); n != 1 {
		t.Fatalf("the check's WatchStalls %d, want 1 (blue's)", n)
	}
	if p := run.r.Progress(); p.WatchStalls != 1 {
		t.Fatalf("the replicator's WatchStalls %d, want 1", p.WatchStalls)
	}
}
