package replicate

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kubefence/kubefence/internal/proc"
)

// member is one in-process etcd and a client of it.
type member struct {
	e    *embed.Etcd
	cli  *clientv3.Client
	name string
	dir  string
	o    etcdOpts
}

type etcdOpts struct {
	maxTxnOps uint // 0: etcd's default (128)
	maxReq    uint // --max-request-bytes; 0: etcd's default (1.5 MiB)
	fsync     bool // false: --unsafe-no-fsync, for speed
}

// startEtcd starts a single-member etcd on dir (restored data is used as it is), and stops it
// when the test ends. Its ports are outside the kernel's ephemeral range (proc.FreePorts): a
// member restarted on them finds them free, where one the kernel picked may meanwhile have been
// handed to another test's listener.
func startEtcd(t *testing.T, name, dir string, o etcdOpts) *member {
	t.Helper()
	ports, err := proc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	e := launch(t, name, dir, o, fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1]))
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{e.Clients[0].Addr().String()},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		// reconnect within half a second of a restart (gRPC's default backoff grows to 120 s):
		// green must be renewing its leases again within their TTL
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	m := &member{e: e, cli: cli, name: name, dir: dir, o: o}
	t.Cleanup(func() {
		cli.Close()
		m.e.Close()
	})
	return m
}

// restart stops m's etcd and starts it again on the same data dir and ports; m's client
// reconnects by itself.
func (m *member) restart(t *testing.T, down time.Duration) {
	t.Helper()
	if err := m.restartIn(t.TempDir(), down); err != nil {
		t.Fatal(err)
	}
}

// restartIn is restart for a goroutine other than the test's (where t.Fatal would end only that
// goroutine): it returns its error, and etcd logs to logDir.
func (m *member) restartIn(logDir string, down time.Duration) error {
	client := "http://" + m.e.Clients[0].Addr().String()
	peer := "http://" + m.e.Peers[0].Addr().String()
	m.e.Close()
	time.Sleep(down)
	e, err := startEmbedded(m.name, m.dir, logDir, m.o, client, peer)
	if err != nil {
		return err
	}
	m.e = e
	return nil
}

func launch(t *testing.T, name, dir string, o etcdOpts, client, peer string) *embed.Etcd {
	t.Helper()
	e, err := startEmbedded(name, dir, t.TempDir(), o, client, peer)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// startEmbedded starts an in-process etcd on dir, logging to logDir, and returns it once it is
// ready (within 30 s).
func startEmbedded(name, dir, logDir string, o etcdOpts, client, peer string) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = name, dir
	cfg.Logger, cfg.LogLevel = "zap", "error"
	cfg.LogOutputs = []string{filepath.Join(logDir, "etcd.log")}
	c, err := url.Parse(client)
	if err != nil {
		return nil, err
	}
	p, err := url.Parse(peer)
	if err != nil {
		return nil, err
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*c}, []url.URL{*c}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*p}, []url.URL{*p}
	cfg.InitialCluster = name + "=" + p.String()
	cfg.InitialClusterToken = name
	cfg.UnsafeNoFsync = !o.fsync
	if o.maxReq > 0 {
		cfg.MaxRequestBytes = o.maxReq
	}
	if o.maxTxnOps > 0 {
		cfg.MaxTxnOps = o.maxTxnOps
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting etcd %s: %w", name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd %s: %w", name, err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcd %s not ready in 30 s", name)
	}
	return e, nil
}

// greenFrom snapshots blue, restores the snapshot into a new data dir without a revision bump
// (as etcdutl snapshot restore does) and starts green on it; it returns green and the
// snapshot's revision S.
func greenFrom(t *testing.T, blue *member, o etcdOpts) (*member, int64) {
	t.Helper()
	ctx := t.Context()
	rc, err := blue.cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "blue.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "green")
	u := "http://127.0.0.1:0"
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        path,
		Name:                "green",
		OutputDataDir:       dir,
		PeerURLs:            []string{u},
		InitialCluster:      "green=" + u,
		InitialClusterToken: "green",
	})
	if err != nil {
		t.Fatal(err)
	}
	green := startEtcd(t, "green", dir, o)
	if got := revision(t, green); got != st.Revision {
		t.Fatalf("green restored from a snapshot at revision %d is at %d", st.Revision, got)
	}
	return green, st.Revision
}

func revision(t *testing.T, m *member) int64 {
	t.Helper()
	resp, err := m.cli.Get(t.Context(), "x", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// running is a replicator started in the background.
type running struct {
	r    *Replicator
	done chan error
	stop context.CancelFunc
}

// start runs a replicator from blue to green from revision from until the test ends.
func start(t *testing.T, blue, green *member, from int64, edit func(*Config)) *running {
	t.Helper()
	cfg := Config{Source: blue.cli, Dest: green.cli, FromRevision: from, Log: testLog(t)}
	if edit != nil {
		edit(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{r: r, done: make(chan error, 1), stop: cancel}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-run.done
	})
	return run
}

// wait returns Run's error, failing the test if Run does not stop within d.
func (run *running) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-run.done:
		run.done <- err // for the cleanup
		return err
	case <-time.After(d):
		t.Fatalf("replication still running after %s", d)
		return nil
	}
}

// catchUp waits until green has applied blue's current revision.
func catchUp(t *testing.T, run *running, blue *member) int64 {
	t.Helper()
	rev := revision(t, blue)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := run.r.WaitFor(ctx, rev); err != nil {
		t.Fatal(err)
	}
	return rev
}

// sameHistory checks that blue and green hold the same keys, values, create and mod revisions,
// versions and leases at every revision from..to: what a client reading either would see.
func sameHistory(t *testing.T, blue, green *member, from, to int64) {
	t.Helper()
	for rev := from; rev <= to; rev++ {
		b := all(t, blue, rev)
		g := all(t, green, rev)
		if b != g {
			t.Fatalf("at revision %d blue and green differ:\nblue:  %s\ngreen: %s", rev, b, g)
		}
	}
	if b, g := revision(t, blue), revision(t, green); b != g {
		t.Fatalf("blue is at revision %d, green at %d", b, g)
	}
}

// sameEvents checks that each revision from..to holds the same events, in the same order, on
// blue and on green.
func sameEvents(t *testing.T, blue, green *member, from, to int64) {
	t.Helper()
	for rev := from; rev <= to; rev++ {
		b, err := eventsAt(t.Context(), blue.cli, rev)
		if err != nil {
			t.Fatal(err)
		}
		g, err := eventsAt(t.Context(), green.cli, rev)
		if err != nil {
			t.Fatal(err)
		}
		if diff := diffEvents(b, g); diff != "" {
			t.Fatalf("revision %d: %s", rev, diff)
		}
	}
}

func all(t *testing.T, m *member, rev int64) string {
	t.Helper()
	resp, err := m.cli.Get(t.Context(), "", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatalf("reading at revision %d: %v", rev, err)
	}
	var b bytes.Buffer
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%s=%q c%d m%d v%d l%x; ", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	}
	return b.String()
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
