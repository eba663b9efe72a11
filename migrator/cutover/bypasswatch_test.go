package cutover

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startTestEtcd starts a single-member in-process etcd (no fsync) on ports the kernel picks and
// returns a client of it; both end with the test.
func startTestEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "blue", t.TempDir()
	cfg.Logger, cfg.LogLevel = "zap", "error"
	cfg.LogOutputs = []string{filepath.Join(t.TempDir(), "etcd.log")}
	c, p := url.URL{Scheme: "http", Host: "127.0.0.1:0"}, url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{c}, []url.URL{c}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{p}, []url.URL{p}
	cfg.InitialCluster = "blue=" + p.String()
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready in 30 s")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Clients[0].Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestWatchBlueWritesReachesTheEnd: every write blue acknowledged before the bypass watch's end
// is in what it saw, however late etcd delivers the last events: the watch runs until it has
// seen the revision blue was at when its time was up, not just until a timer fires. Each write
// goes to a namespace of its own, so the last writes acknowledged before its end can be looked for.
func TestWatchBlueWritesReachesTheEnd(t *testing.T) {
	cli := startTestEtcd(t)
	for round := range 5 {
		ctx, stop := context.WithCancel(t.Context())
		var mu sync.Mutex
		acked := map[string]time.Time{}
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					ns := fmt.Sprintf("ns-%d-%d-%d", round, w, i)
					if _, err := cli.Put(ctx, "/registry/configmaps/"+ns+"/cm", "v"); err == nil {
						at := time.Now()
						mu.Lock()
						acked[ns] = at
						mu.Unlock()
					}
				}
			})
		}
		seen, _, end, err := watchBlueWrites(t.Context(), cli, 300*time.Millisecond)
		stop()
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, w := range seen {
			got[w.namespace] = true
		}
		// The last writes acknowledged before the end (by count, not by time: on loaded cores
		// 100 ms may hold none).
		var before []string
		for ns, at := range acked {
			if !at.After(end) {
				before = append(before, ns)
			}
		}
		slices.SortFunc(before, func(a, b string) int { return acked[a].Compare(acked[b]) })
		tail := before[max(0, len(before)-20):]
		missed := 0
		for _, ns := range tail {
			if !got[ns] {
				missed++
			}
		}
		if missed > 0 || len(tail) == 0 {
			t.Fatalf("round %d: of the %d writes acknowledged last before the watch's end, %d are not in what it saw", round, len(tail), missed)
		}
	}
}
