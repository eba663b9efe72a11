package cutover

import (
	"context"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// liveWorld is a runner resumed after the verify whose replicator really runs, in this process,
// from blue (an etcd) into green (another), with the delta check started at the verify's
// revision 1 (both etcds new: equal there); the proxy is in memory, green's processes fake.
type liveWorld struct {
	r           *runner
	blue, green *clientv3.Client
	st          *admin.Status
	calls       []string
	stopped     []int
}

func newLiveWorld(t *testing.T, steps []step, cfg replicate.Config) *liveWorld {
	t.Helper()
	return newLiveWorldOn(t, steps, cfg, startTestEtcd(t))
}

// newLiveWorldOn is newLiveWorld with blue's etcd given.
func newLiveWorldOn(t *testing.T, steps []step, cfg replicate.Config, blue *clientv3.Client) *liveWorld {
	t.Helper()
	w := &liveWorld{blue: blue, green: startTestEtcd(t)}
	p := replicatePlan(t)
	p.hash = "plan-hash"
	w.st = &admin.Status{Backend: p.Blue.APIServer.URL, Generation: 1}
	w.r = (&runner{o: Options{Plan: p, Rehearse: sameSteps(steps, rehearseSteps)}, p: p, adm: memProxy(w.st, &w.calls),
		procs: fakeProcesses(map[int]bool{101: true}, &w.stopped), steps: steps}).forward()
	w.r.authClients = map[string]*clientv3.Client{"green": w.green}
	j := &Journal{ID: "x", State: StateRunning, PlanHash: "plan-hash", Rehearse: w.r.o.Rehearse, SnapshotRevision: 1,
		GreenPIDs: map[string]int{"g0": 101}, Verified: &VerifyReport{Revision: 1}}
	for _, s := range []string{StepPreflight, StepCopy, StepMigrate, StepGreenEtcd, StepGreenAuth, StepReplicate, StepGreenAPIServer, StepVerify} {
		j.Done = append(j.Done, StepRecord{Step: s})
	}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	w.r.j = j
	if cfg.Source == nil {
		cfg.Source = w.blue
	}
	cfg.Dest, cfg.FromRevision = w.green, 1
	rep, err := replicate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp := &replication{rep: rep, src: cfg.Source, dst: w.green, cancel: cancel, done: make(chan struct{}), srcName: "blue", dstName: "green"}
	go func() { rp.err = rep.Run(ctx); close(rp.done) }()
	w.r.repl = rp
	w.r.startDeltaCheck(1)
	t.Cleanup(func() {
		if w.r.repl == rp { // not stopped by the run
			cancel()
			<-rp.done
			rp.check.Stop()
		}
	})
	return w
}

// sameSteps says whether a and b are the same table (by names).
func sameSteps(a, b []step) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].name() != b[i].name() {
			return false
		}
	}
	return true
}

// put writes k=v to cli, failing the test on an error.
func put(t *testing.T, cli *clientv3.Client, k, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
}

// caughtUpTo waits until the replicator has applied rev (and the delta check compared it).
func (w *liveWorld) caughtUpTo(t *testing.T, rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.r.repl.rep.WaitFor(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := w.r.deltaChecked(ctx, rev); err != nil {
		t.Fatal(err)
	}
}
