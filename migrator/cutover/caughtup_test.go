package cutover

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// TestCaughtUpMeansReplicated: green at blue's revision is caught up only if the replicator put
// it there. Here blue moves on and something else writes to green, each once, right after
// caughtUp reads its target, while the replicator is held before that revision: green's and
// blue's revisions are equal, but green holds another write.
func TestCaughtUpMeansReplicated(t *testing.T) {
	blue, green := startTestEtcd(t), startTestEtcd(t)
	ctx := t.Context()
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := sync.OnceFunc(func() { close(release) })
	rep, err := replicate.New(replicate.Config{Source: blue, Dest: green, FromRevision: 1,
		OnApplied: func(p replicate.Progress) {
			if p.Applied == 2 {
				once.Do(func() { close(held) })
				<-release
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	rp := &replication{rep: rep, dst: green, cancel: cancel, done: make(chan struct{})}
	go func() { rp.err = rep.Run(rctx); close(rp.done) }()
	t.Cleanup(func() { cancel(); free(); <-rp.done })
	if _, err := blue.Put(ctx, "k", "1"); err != nil { // revision 2, applied, then held
		t.Fatal(err)
	}
	<-held

	// src reads blue; after its first read, blue gets revision 3 and green a write of its own.
	var reads sync.Once
	interfere := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		reads.Do(func() {
			_, e1 := blue.Put(ctx, "k", "2")
			_, e2 := green.Put(ctx, "stray", "x")
			if e := errors.Join(e1, e2); e != nil {
				t.Error(e)
			}
			time.AfterFunc(300*time.Millisecond, free) // the replicator goes on
		})
		return err
	}
	src, err := clientv3.New(clientv3.Config{Endpoints: blue.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(interfere)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	rp.src = src
	r := &runner{from: side{name: "blue"}, to: side{name: "green"}, repl: rp}

	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	rev, err := r.waitCaughtUp(wctx)
	if err == nil || !errors.Is(err, replicate.ErrRevisionMismatch) {
		t.Fatalf("waitCaughtUp = %d, %v; want ErrRevisionMismatch (green's revision 3 is not blue's)", rev, err)
	}
}
