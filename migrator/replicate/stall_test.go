package replicate

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
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

// TestStalledWatchReopened: blue's watch stream goes quiet (its member delivers nothing more,
// but the connection lives) while blue takes writes through another client: Run notices that
// blue's revision read from the cluster is ahead of what the watch delivered, watches again on
// a new stream from the first revision not received, and applies the new revisions. Writes
// paced over more than the bound before it count no stall.
func TestStalledWatchReopened(t *testing.T) {
	blue := startEtcd(t, "blue", t.TempDir(), etcdOpts{})
	put(t, blue, "a", "0")
	green, s := greenFrom(t, blue, etcdOpts{})
	cli, streams := stallingClient(t, blue)
	run := start(t, blue, green, s, func(c *Config) {
		c.Source = cli
		c.ProgressInterval = 100 * time.Millisecond
		c.WatchStall = time.Second
	})
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
