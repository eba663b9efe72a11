package cutover

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startTestEtcd starts a single-member in-process etcd (no fsync) on ports the kernel picks and
// returns a client of it; both end with the test.
func startTestEtcd(t *testing.T, mutate ...func(*embed.Config)) *clientv3.Client {
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
	for _, m := range mutate {
		m(cfg)
	}
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
// seen the revision blue was at when its time was up, not just until a timer fires. Each
// writer writes one key after the other, each in a namespace of its own: from the first of a
// writer's writes the watch saw (the watch starts at a revision of its own choosing), every
// later one acknowledged before the end must be in what it saw.
func TestWatchBlueWritesReachesTheEnd(t *testing.T) {
	cli := startTestEtcd(t)
	const writers = 4
	for round := range 5 {
		ctx, stop := context.WithCancel(t.Context())
		var mu sync.Mutex
		acked := make([][]time.Time, writers) // per writer, when its i-th write was acknowledged
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					if _, err := cli.Put(ctx, fmt.Sprintf("/registry/configmaps/ns-%d-%d-%d/cm", round, w, i), "v"); err != nil {
						return
					}
					mu.Lock()
					acked[w] = append(acked[w], time.Now())
					mu.Unlock()
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
		checked, missed := 0, 0
		for w, ats := range acked {
			first := -1
			for i := range ats {
				if got[fmt.Sprintf("ns-%d-%d-%d", round, w, i)] {
					first = i
					break
				}
			}
			if first < 0 {
				continue
			}
			for i := first; i < len(ats) && !ats[i].After(end); i++ {
				checked++
				if !got[fmt.Sprintf("ns-%d-%d-%d", round, w, i)] {
					missed++
				}
			}
		}
		if missed > 0 || checked == 0 {
			t.Fatalf("round %d: of %d writes acknowledged after the watch's first and before its end, %d are not in what it saw", round, checked, missed)
		}
	}
}
