package cutover

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
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

// TestDeltaCheckBeforeTheSwitch: the switch's wait for the delta check fails, naming the
// revision, when green's change differs from blue's at the same revision (no revision count
// can tell), and replication then counts as unreliable for every step that asks; without a
// check running, the switch refuses, except for a journal that never said where the full
// verify ran.
func TestDeltaCheckBeforeTheSwitch(t *testing.T) {
	blue, green := startTestEtcd(t), startTestEtcd(t)
	ctx := t.Context()
	r := &runner{from: side{name: "blue"}, to: side{name: "green"}, repl: &replication{src: blue, dst: green}, j: &Journal{Verified: &VerifyReport{Revision: 1}}}

	if _, err := r.deltaChecked(ctx, 1); err == nil || !strings.Contains(err.Error(), "not switching") {
		t.Fatalf("deltaChecked without a check = %v, want a refusal", err)
	}
	r.j.Verified.Revision = 0
	if note, err := r.deltaChecked(ctx, 1); err != nil || !strings.Contains(note, "not compared") {
		t.Fatalf("deltaChecked for an older journal = %q, %v", note, err)
	}

	r.startDeltaCheck(1)
	t.Cleanup(func() { r.repl.check.Stop() })
	if note, err := r.deltaChecked(ctx, 1); err != nil || !strings.Contains(note, "nothing changed") {
		t.Fatalf("deltaChecked at the verify's revision = %q, %v", note, err)
	}
	for _, w := range []struct {
		c    *clientv3.Client
		k, v string
	}{{blue, "a", "1"}, {green, "a", "1"}, {blue, "b", "1"}, {green, "b", "2"}} {
		if _, err := w.c.Put(ctx, w.k, w.v); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if note, err := r.deltaChecked(wctx, 2); err != nil || !strings.Contains(note, "revisions 2-2 identical") {
		t.Fatalf("deltaChecked(2) = %q, %v", note, err)
	}
	_, err := r.deltaChecked(wctx, 3)
	if !errors.Is(err, replicate.ErrRevisionMismatch) || !strings.Contains(err.Error(), "at revision 3") {
		t.Fatalf("deltaChecked(3) = %v, want ErrRevisionMismatch at revision 3", err)
	}
	if err := r.replicationAlive(); !errors.Is(err, replicate.ErrRevisionMismatch) {
		t.Fatalf("replicationAlive after the check failed = %v", err)
	}
}

// TestGreenLeasesHeldUntilReplication: from green's start until replication takes them over,
// green's restored leases are kept alive (learners joining or the auth step may take longer than
// a master lease's 15 s): an expiry green made by itself would be a revision of its own, and
// the cutover could only abort. Released, the lease expires as etcd would have it.
func TestGreenLeasesHeldUntilReplication(t *testing.T) {
	green := startTestEtcd(t)
	ctx := t.Context()
	l, err := green.Grant(ctx, 4) // renewed at a third of it: room for a loaded machine's late renewal
	if err != nil {
		t.Fatal(err)
	}
	put, err := green.Put(ctx, "/registry/masterleases/10.0.0.1", "x", clientv3.WithLease(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{to: side{name: "green"}}
	if err := r.holdGreenLeases(ctx, datadir.ConnSpec{Endpoints: green.Endpoints()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second) // twice the lease's TTL
	if got := revisionOf(t, green); got != put.Header.Revision {
		t.Fatalf("green moved from revision %d to %d while its leases were held", put.Header.Revision, got)
	}
	release := r.takeGreenHold()
	if release == nil || r.greenHold != nil {
		t.Fatal("the hold was not handed over")
	}
	release()
	deadline := time.Now().Add(15 * time.Second)
	for revisionOf(t, green) == put.Header.Revision {
		if time.Now().After(deadline) {
			t.Fatal("the lease did not expire once released")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func revisionOf(t *testing.T, c *clientv3.Client) int64 {
	t.Helper()
	rev, err := replicate.Revision(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestStopReplicationTakesBlueLastRevisions: after the switch, blue's apiserver may still have
// written to blue (its own leases) and delivered that revision on a watch the switch moved to
// green from there. Stopping the replicator before green has it would let green's own first
// write take that revision number, and the moved watch would never see it. The stop waits for
// blue's revision as read after the switch.
func TestStopReplicationTakesBlueLastRevisions(t *testing.T) {
	blue, green := startTestEtcd(t), startTestEtcd(t)
	ctx := t.Context()
	held := make(chan struct{})
	var once sync.Once
	rep, err := replicate.New(replicate.Config{Source: blue, Dest: green, FromRevision: 1,
		OnApplied: func(p replicate.Progress) {
			if p.Applied == 2 { // lagging behind blue's next revision for a moment
				once.Do(func() { close(held) })
				time.Sleep(300 * time.Millisecond)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	client := func(c *clientv3.Client) *clientv3.Client {
		cc, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		return cc
	}
	rctx, cancel := context.WithCancel(ctx)
	rp := &replication{rep: rep, src: client(blue), dst: client(green), cancel: cancel, done: make(chan struct{})}
	go func() { rp.err = rep.Run(rctx); close(rp.done) }()
	t.Cleanup(func() { cancel(); <-rp.done })
	if _, err := blue.Put(ctx, "k", "1"); err != nil { // revision 2
		t.Fatal(err)
	}
	<-held
	if _, err := blue.Put(ctx, "lease-of-blues-apiserver", "renewed"); err != nil { // revision 3, after the switch
		t.Fatal(err)
	}
	r := &runner{from: side{name: "blue"}, to: side{name: "green"}, repl: rp, j: &Journal{}}
	detail, err := stopReplicationStep{}.run(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if b, g := revisionOf(t, blue), revisionOf(t, green); g != b {
		t.Fatalf("after the stop green is at revision %d, blue at %d (%s)", g, b, detail)
	}
}

// TestFenceRechecksReplication: replication that became unreliable while green caught up with
// blue before the fence (here the delta check found a difference; blue compacting what it
// needs is the likelier case) stops the fence step before the fence is sent: the cutover aborts
// or rebuilds green with writes never fenced, not inside a window it opened for nothing.
func TestFenceRechecksReplication(t *testing.T) {
	ctx := t.Context()
	rp := replicationFoundDifferent(t)
	p, _ := validPlan(t)
	fp, sock := startFakeProxy(t, admin.Status{Backend: p.Blue.APIServer.URL, Generation: 7})
	r := testRunner(t, p, sock)
	r.repl = rp
	_, err := (fenceStep{}).run(ctx, r)
	if !errors.Is(err, replicate.ErrRevisionMismatch) || fp.status().Fenced || !r.j.FencedAt.IsZero() {
		t.Fatalf("fence step: %v, proxy fenced %v, fence journaled %v; want the mismatch, nothing fenced or journaled", err, fp.status().Fenced, !r.j.FencedAt.IsZero())
	}
}

// TestCaughtUpUnderSteadyWrites: with blue written steadily (the node heartbeats the fence
// policy lets through a window: 500 a second at 5,000 nodes) and blue's changes reaching green a
// while later (a green across hosts), green is always a few revisions behind: caught up is green
// having applied what blue had when asked, not an instant at which the two numbers are equal,
// which may never come before the window ends.
func TestCaughtUpUnderSteadyWrites(t *testing.T) {
	blue, green := startTestEtcd(t), startTestEtcd(t)
	ctx := t.Context()
	src, err := clientv3.New(clientv3.Config{Endpoints: blue.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	src.Watcher = delayedWatcher{src.Watcher, 30 * time.Millisecond}
	rep, err := replicate.New(replicate.Config{Source: src, Dest: green, FromRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	rp := &replication{rep: rep, src: blue, dst: green, cancel: cancel, done: make(chan struct{})}
	go func() { rp.err = rep.Run(rctx); close(rp.done) }()
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; wctx.Err() == nil; i++ {
				_, _ = blue.Put(wctx, fmt.Sprintf("/registry/leases/kube-node-lease/node-%d-%d", w, i%250), strconv.Itoa(i))
				time.Sleep(5 * time.Millisecond) // some hundreds a second in all
			}
		})
	}
	t.Cleanup(func() { stopWriters(); wg.Wait(); cancel(); <-rp.done })
	time.Sleep(500 * time.Millisecond) // the writers going, green behind
	asked := revisionOf(t, blue)
	r := &runner{from: side{name: "blue"}, to: side{name: "green"}, repl: rp}
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	rev, err := r.waitCaughtUp(cctx)
	if err != nil || rev < asked || rep.Progress().Applied < rev {
		t.Fatalf("caught up under steady writes = %d, %v (blue was at %d when asked, green applied %d); want blue's revision as asked, or later, applied", rev, err, asked, rep.Progress().Applied)
	}
}

// delayedWatcher hands each watch response on d after it arrived, in order: blue's changes
// reach the replicator late, but as fast as they come.
type delayedWatcher struct {
	clientv3.Watcher
	d time.Duration
}

func (w delayedWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse, 1024)
	type stamped struct {
		resp clientv3.WatchResponse
		at   time.Time
	}
	queue := make(chan stamped, 1<<16)
	go func() {
		defer close(queue)
		for resp := range in {
			queue <- stamped{resp, time.Now()}
		}
	}()
	go func() {
		defer close(out)
		for s := range queue {
			time.Sleep(time.Until(s.at.Add(w.d)))
			select {
			case out <- s.resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// TestStopReplicationReportsTheCheck: a difference the delta check found in blue's last
// revisions (those brought over after the switch, past the revision the switch checked) is
// reported by the stop, not only logged: after the switch it is the only word of it.
func TestStopReplicationReportsTheCheck(t *testing.T) {
	rp := replicationFoundDifferent(t)
	p, _ := validPlan(t)
	r := &runner{p: p, repl: rp}
	if _, err := r.stopReplication(); !errors.Is(err, replicate.ErrRevisionMismatch) {
		t.Fatalf("stopReplication = %v, want the check's mismatch", err)
	}
}

// TestWindowBudgetOnTheMonotonicClock: the window's budget runs from the fence on this
// process's monotonic clock: a wall clock stepped since (here a step forward of an hour, as the
// journal's wall time of the fence then reads) neither ends the window at once nor, stepped
// back, stretches it.
func TestWindowBudgetOnTheMonotonicClock(t *testing.T) {
	p, _ := validPlan(t)
	p.Timeouts.Window = Duration(5 * time.Second)
	_, sock := startFakeProxy(t, admin.Status{Backend: p.Blue.APIServer.URL, Generation: 7})
	r := testRunner(t, p, sock)
	if _, err := (fenceStep{}).run(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	window := p.Timeouts.Window.D()
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		r.j.FencedAt = r.j.FencedAt.Add(-step) // the wall clock moved step since the fence
		ctx, cancel := r.windowContext(t.Context())
		d, _ := ctx.Deadline()
		left := time.Until(d)
		cancel()
		r.j.FencedAt = r.j.FencedAt.Add(step)
		if left <= 0 || left > window {
			t.Errorf("wall clock stepped %s: %s of the %s window left, want what the monotonic clock says", step, left, window)
		}
	}
}

// replicationFoundDifferent runs replication of one test etcd into another while its delta check
// compares the first with a third that differs from it at revision 2: the check has found the
// difference when it returns, and replication goes on.
func replicationFoundDifferent(t *testing.T) *replication {
	t.Helper()
	blue, green, other := startTestEtcd(t), startTestEtcd(t), startTestEtcd(t)
	ctx := t.Context()
	rep, err := replicate.New(replicate.Config{Source: blue, Dest: green, FromRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	rp := &replication{rep: rep, src: blue, dst: green, cancel: cancel, done: make(chan struct{})}
	go func() { rp.err = rep.Run(rctx); close(rp.done) }()
	t.Cleanup(func() { cancel(); <-rp.done })
	rp.check = replicate.StartCheck(blue, other, 1, nil)
	t.Cleanup(rp.check.Stop)
	if _, err := blue.Put(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Put(ctx, "a", "2"); err != nil {
		t.Fatal(err)
	}
	if err := rp.check.WaitFor(ctx, 2); !errors.Is(err, replicate.ErrRevisionMismatch) {
		t.Fatalf("the check at revision 2: %v, want a mismatch", err)
	}
	return rp
}

// TestWriteUnavailabilityOnTheMonotonicClock: the window the unfence step and the report give
// is measured on the monotonic clock of the process that fenced and unfenced, not as the
// difference of the journal's wall times, which a clock stepped during the window (here an
// hour, as the journaled fence time then reads) would make an hour.
func TestWriteUnavailabilityOnTheMonotonicClock(t *testing.T) {
	p, _ := validPlan(t)
	p.Timeouts.Window = Duration(5 * time.Second)
	_, sock := startFakeProxy(t, admin.Status{Backend: p.Blue.APIServer.URL, Generation: 7})
	r := testRunner(t, p, sock)
	ctx := t.Context()
	if _, err := (fenceStep{}).run(ctx, r); err != nil {
		t.Fatal(err)
	}
	r.j.FencedAt = r.j.FencedAt.Add(-time.Hour) // the wall clock stepped an hour forward since
	detail, err := (unfenceStep{}).run(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(detail, "1h0m") {
		t.Errorf("unfence: %s; want the window as the monotonic clock measured it", detail)
	}
	if w := r.report("", nil).WriteUnavailability; w <= 0 || w > time.Minute {
		t.Errorf("the report's write unavailability is %s, want the monotonic clock's", w)
	}
}
