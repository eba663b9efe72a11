package cutover

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// TestFenceRefusedAfterAStalledCatchUp: a catch-up before the fence in which replication applied
// nothing while blue moved on (its bound spent in the first round) does not go on to fence: the
// window could only abort. The step fails before the fence, nothing fenced, and says which side
// stalled: green applying none of what blue's watch delivered, or blue's watch delivering
// nothing.
func TestFenceRefusedAfterAStalledCatchUp(t *testing.T) {
	for _, tc := range replicationStalls {
		t.Run(tc.name, func(t *testing.T) {
			w := stalledWorld(t, tc)
			w.r.preFence = 300 * time.Millisecond
			_, err := fenceStep{}.run(t.Context(), w.r)
			if err == nil || !strings.Contains(err.Error(), "applied nothing") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("fence step after a stalled catch-up: %v; want it refused, saying %q", err, tc.want)
			}
			if len(w.calls) != 0 || w.st.Fenced || !w.r.j.FencedAt.IsZero() {
				t.Errorf("proxy calls %v, fenced %v, FencedAt %v: want nothing fenced", w.calls, w.st.Fenced, w.r.j.FencedAt)
			}
		})
	}
}

// TestDrainSaysWhichSideStalled: a drain that runs out of the window's budget says whether
// blue's watch delivered nothing or green applied none of what it delivered, not only that it
// waited for a revision: the fix is on different sides.
func TestDrainSaysWhichSideStalled(t *testing.T) {
	for _, tc := range replicationStalls {
		t.Run(tc.name, func(t *testing.T) {
			w := stalledWorld(t, tc)
			w.r.p.Timeouts.Window = Duration(300 * time.Millisecond)
			w.r.fencedMono = time.Now()
			w.r.j.FencedAt = w.r.fencedMono.UTC()
			_, err := drainStep{}.run(t.Context(), w.r)
			if err == nil || !strings.Contains(err.Error(), "within the window") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("drain with replication stalled: %v; want it to say %q", err, tc.want)
			}
		})
	}
}

// replicationStall is a way replication stands still while blue moves on.
type replicationStall struct {
	name string
	// config sets the replicator up to stall once stop is closed (after revision 2).
	config func(t *testing.T, blue *clientv3.Client, stop <-chan struct{}) replicate.Config
	want   string // what the error says stalled
	held   int64  // green's revision once stalled
}

var replicationStalls = []replicationStall{
	{name: "green applies nothing", want: "green applied none", held: 3, config: func(t *testing.T, _ *clientv3.Client, stop <-chan struct{}) replicate.Config {
		return replicate.Config{OnApplied: func(p replicate.Progress) {
			select {
			case <-stop:
				<-t.Context().Done()
			default:
			}
		}}
	}},
	{name: "blue's watch delivers nothing", want: "nothing from blue's watch", held: 2, config: func(t *testing.T, blue *clientv3.Client, stop <-chan struct{}) replicate.Config {
		src, err := clientv3.New(clientv3.Config{Endpoints: blue.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		src.Watcher = &withholdingWatcher{Watcher: src.Watcher, stop: stop}
		return replicate.Config{Source: src}
	}},
}

// stalledWorld is a liveWorld whose replication has stalled as tc says, blue written since.
func stalledWorld(t *testing.T, tc replicationStall) *liveWorld {
	t.Helper()
	stop := make(chan struct{})
	blue := startTestEtcd(t) // the stall needs blue's client: started first, the world after
	w := newLiveWorldOn(t, replicateSteps, tc.config(t, blue, stop), blue)
	put(t, w.blue, "a", "1")
	w.caughtUpTo(t, 2)
	close(stop)
	for i := range 3 {
		put(t, w.blue, fmt.Sprintf("k%d", i), "v")
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return w.r.repl.rep.Progress().Applied >= tc.held, nil
	}); err != nil {
		t.Fatalf("green never reached revision %d", tc.held)
	}
	return w
}

// withholdingWatcher delivers nothing on the watches opened once stop is closed, and stops
// delivering on those opened before: blue's watch stalled, its stream open.
type withholdingWatcher struct {
	clientv3.Watcher
	stop <-chan struct{}
}

func (w *withholdingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			select {
			case <-w.stop:
				continue // withheld
			default:
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// TestFenceAfterASlowCatchUp: a replicator that applies, only slower than blue writes, is fenced
// after the catch-up's bound all the same: the window's budget then decides.
func TestFenceAfterASlowCatchUp(t *testing.T) {
	w := newLiveWorld(t, replicateSteps, replicate.Config{OnApplied: func(replicate.Progress) { time.Sleep(50 * time.Millisecond) }})
	for i := range 30 {
		put(t, w.blue, fmt.Sprintf("k%d", i), "v")
	}
	w.r.preFence = 300 * time.Millisecond
	if _, err := (fenceStep{}).run(t.Context(), w.r); err != nil {
		t.Fatalf("fence after a slow catch-up: %v", err)
	}
	if !w.st.Fenced || w.r.j.FencedAt.IsZero() {
		t.Errorf("proxy %+v, FencedAt %v: want it fenced", *w.st, w.r.j.FencedAt)
	}
}

// TestAbortAfterAStalledDrainAdvisesForItsCause: the abort after a drain that ran out of time
// because blue's watch delivered nothing advises to look at blue's etcd before running again:
// green is not the cause (its data dirs are not left "for inspection"), though the next cutover
// still needs them gone (its preflight wants green's data dirs absent or empty: it restores
// green afresh). (Green applying nothing keeps the advice to inspect green's data dirs; that
// fixture's applier never returns, so no abort can stop its replication here.)
func TestAbortAfterAStalledDrainAdvisesForItsCause(t *testing.T) {
	tc := replicationStalls[1]
	w := stalledWorld(t, tc)
	w.r.p.Timeouts.Window = Duration(300 * time.Millisecond)
	w.r.fencedMono = time.Now()
	w.r.j.FencedAt = w.r.fencedMono.UTC()
	_, err := drainStep{}.run(t.Context(), w.r)
	if err == nil || !strings.Contains(err.Error(), tc.want) {
		t.Fatalf("drain: %v; want it to say %q", err, tc.want)
	}
	rep, _ := w.r.fail(t.Context(), drainStep{}, err)
	if rep == nil || rep.Result != ResultAborted {
		t.Fatalf("report %+v: want aborted", rep)
	}
	if !strings.Contains(rep.Next, "check blue etcd") || strings.Contains(rep.Next, "for inspection") || !strings.Contains(rep.Next, "--remove-data-dirs") {
		t.Errorf("advice %q: want blue's etcd to check, green's data dirs not suspected but to be removed before the next cutover", rep.Next)
	}
}
