package cutover

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// bothSidesPlan is budgetPlan with both etcds answering, at the same revision with the same
// key (as replication leaves them), each with the apiserver's etcd user and kubefence's two
// roles; green is closed instead when greenDown. It returns blue's client too.
func bothSidesPlan(t *testing.T, greenDown bool) (*Plan, *clientv3.Client) {
	t.Helper()
	var urls []string
	var clis []*clientv3.Client
	for range 2 {
		cli := startTestEtcd(t)
		clis = append(clis, cli)
		for _, role := range []string{readWriteRole, readOnlyRole} {
			if _, err := cli.RoleAdd(t.Context(), role); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cli.UserAdd(t.Context(), DefaultGreenEtcdUser, "pw"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(t.Context(), "k", "v"); err != nil {
			t.Fatal(err)
		}
		urls = append(urls, "http://"+cli.Endpoints()[0])
	}
	if greenDown {
		urls[1] = "http://" + closedAddr(t)
	}
	p := bakePlan(t)
	p.hash = "plan-hash"
	p.Blue.Etcd.EtcdClientSpec = datadir.ConnSpec{Endpoints: []string{urls[0]}}
	p.Green.Etcd.TLS = nil
	p.Green.Etcd.Members = p.Green.Etcd.Members[:1]
	p.Green.Etcd.Members[0].ClientURL = urls[1]
	p.Blue.APIServer.EtcdUser, p.Green.APIServer.EtcdUser = DefaultGreenEtcdUser, DefaultGreenEtcdUser
	p.Timeouts.Window, p.Timeouts.Switch = Duration(2*time.Second), Duration(30*time.Second)
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return p, clis[0]
}

// journalThrough is a running journal with steps done up to and including last.
func journalThrough(p *Plan, steps []step, last string, fencedAt time.Time) *Journal {
	var done []StepRecord
	for _, s := range steps {
		done = append(done, StepRecord{Step: s.name()})
		if s.name() == last {
			break
		}
	}
	return &Journal{Version: 1, ID: "x", PlanHash: p.hash, State: StateRunning, Done: done, FencedAt: fencedAt, SnapshotRevision: 2, GreenPIDs: map[string]int{}}
}

// TestResumedHandOverKeepsTheBake: a --resume after the process died between gate-blue and
// reverse-replication picks replication up within the time the bake's steps are given (at
// least one more timeouts.window on a resume), however long after the fence it comes: the
// window's own budget bounds picking up only before the switch. Green not answering costs the
// bake, with advice for where the cutover stands (green serves), not the advice of a run
// before its switch (abort, remove green's data dirs).
func TestResumedHandOverKeepsTheBake(t *testing.T) {
	for _, tc := range []struct {
		name      string
		late      time.Duration
		greenDown bool
	}{
		{"resumed at once", 0, false},
		{"resumed a minute after the fence", time.Minute, false},
		{"green down", time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := bothSidesPlan(t, tc.greenDown)
			j := journalThrough(p, bakeSteps, StepGateBlue, time.Now().UTC().Add(-tc.late))
			var calls []string
			st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
			r := (&runner{o: Options{Plan: p, Resume: true}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: bakeSteps}).forward()
			detail, err := handOverStep{}.run(t.Context(), r)
			_, _ = r.stopReplication()
			if err != nil {
				t.Fatalf("reverse-replication: %v", err)
			}
			if tc.greenDown {
				if !strings.Contains(detail, "NO WAY BACK") || strings.Contains(detail, "data dirs") || strings.Contains(detail, "abort") {
					t.Errorf("detail %q: want the bake given up, without the advice of a run before its switch", detail)
				}
				return
			}
			if r.j.Bake == nil || strings.Contains(detail, "NO WAY BACK") {
				t.Errorf("detail %q, bake %+v: a resumed hand-over gave the bake up", detail, r.j.Bake)
			}
		})
	}
}

// TestResumedRollbackPicksReplicationUp: the rollback's stop-replication, resumed after its
// switch a minute after its fence, picks replication up to bring over what the gated side's
// apiserver wrote, instead of giving up because the window's budget is spent.
func TestResumedRollbackPicksReplicationUp(t *testing.T) {
	p, _ := bothSidesPlan(t, false)
	main := &Journal{ID: "x", State: StateBaking, PlanHash: p.hash, Bake: &BakeRecord{Revision: 2}}
	r, err := newRollbackRunner(Options{Plan: p}, main)
	if err != nil {
		t.Fatal(err)
	}
	r.o.Resume = true
	r.j.Done = []StepRecord{{Step: StepFence}, {Step: StepDrain}, {Step: StepSwitch}, {Step: StepGateGreen}}
	r.j.FencedAt = time.Now().UTC().Add(-time.Minute)
	var calls []string
	r.adm = memProxy(&admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 3}, &calls)
	detail, err := stopFollowingStep{}.run(t.Context(), r)
	_, _ = r.stopReplication()
	if err != nil || strings.Contains(detail, "could not be picked up") {
		t.Errorf("stop-replication: %q, %v; want replication picked up", detail, err)
	}
}

// TestSignalPastTheSwitchFinishesTheWindow: Ctrl-C or SIGTERM once the switch is journaled
// does not stop the window half-way: there is no way back to blue from there, so the steps left
// (milliseconds, each bounded by its own timeout) run to the unfence, and a bake is not given
// up for the signal.
func TestSignalPastTheSwitchFinishesTheWindow(t *testing.T) {
	for _, bake := range []bool{false, true} {
		t.Run(map[bool]string{false: "replicate", true: "bake"}[bake], func(t *testing.T) {
			p, _ := bothSidesPlan(t, false)
			p.Bake.Enabled = bake
			steps := replicateSteps
			if bake {
				steps = bakeSteps
			}
			j := journalThrough(p, steps, StepSwitch, time.Now().UTC())
			var calls []string
			st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
			r := (&runner{o: Options{Plan: p}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: steps}).forward()
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			rep, err := r.run(ctx)
			if st.Fenced {
				t.Fatalf("run: %+v, %v; the proxy is still fenced after a signal past the switch", rep, err)
			}
			j, err = LoadJournal(p.StateDir)
			if err != nil {
				t.Fatal(err)
			}
			if !j.done(StepUnfence) {
				t.Errorf("journal %v: want the window journaled to its unfence", j.Done)
			}
			if bake && (j.NoBake != "" || j.Bake == nil) {
				t.Errorf("journal: bake %+v, noBake %q; a signal cost the way back", j.Bake, j.NoBake)
			}
		})
	}
}

// TestResumedStopReplicationBringsBlueLast: a --resume after the process died between the
// switch and stop-replication picks replication up (green is still blue change for change:
// its apiserver may not write yet) to bring over what blue's apiserver wrote after the drain
// (its own leases), which a watch the switch moved may have been sent, before green's
// apiserver takes those revisions' numbers; as the run that did not die does.
func TestResumedStopReplicationBringsBlueLast(t *testing.T) {
	p, blue := bothSidesPlan(t, false)
	p.Bake.Enabled = false
	put, err := blue.Put(t.Context(), "lease", "blue's apiserver, after the drain")
	if err != nil {
		t.Fatal(err)
	}
	j := journalThrough(p, replicateSteps, StepSwitch, time.Now().UTC().Add(-time.Minute))
	var calls []string
	st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
	r := (&runner{o: Options{Plan: p, Resume: true}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: replicateSteps}).forward()
	detail, err := stopReplicationStep{}.run(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	wantOnGreen(t, p, "lease", put.Header.Revision, "stop-replication "+detail)
}

// wantOnGreen fails unless green holds key at revision rev; what says what brought it.
func wantOnGreen(t *testing.T, p *Plan, key string, rev int64, what string) {
	t.Helper()
	green, err := newEtcdClient(p.greenConn())
	if err != nil {
		t.Fatal(err)
	}
	defer green.Close()
	got, err := green.Get(t.Context(), key)
	if err != nil || len(got.Kvs) != 1 || got.Kvs[0].ModRevision != rev {
		t.Errorf("%s; green has %v, %v: want blue's write of revision %d", what, got, err, rev)
	}
}

// TestResumedHandOverWithoutABakeBringsBlueLast: a bake given up (gate-blue failed) leaves the
// hand-over step to stop replication as stop-replication would; resumed in a process that does
// not replicate, it picks replication up first, so blue's revisions after the drain reach green
// as they do without a bake.
func TestResumedHandOverWithoutABakeBringsBlueLast(t *testing.T) {
	p, blue := bothSidesPlan(t, false)
	put, err := blue.Put(t.Context(), "lease", "blue's apiserver, after the drain")
	if err != nil {
		t.Fatal(err)
	}
	j := journalThrough(p, bakeSteps, StepGateBlue, time.Now().UTC().Add(-time.Minute))
	j.NoBake = "gate-blue failed"
	var calls []string
	st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
	r := (&runner{o: Options{Plan: p, Resume: true}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: bakeSteps}).forward()
	detail, err := handOverStep{}.run(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	wantOnGreen(t, p, "lease", put.Header.Revision, "reverse-replication "+detail)
}

// TestResumeAfterTheHandOverKeepsTheBake: a --resume after the process died once the hand-over
// was journaled (the bake's revision) but before the step was recorded does not hand over
// again: green has written since (its apiserver's master lease, no longer kept alive by blue's
// replicator), and a blue-into-green pick-up would find green past blue and give up a bake that
// blue, at green's revision, can follow.
func TestResumeAfterTheHandOverKeepsTheBake(t *testing.T) {
	p, _ := bothSidesPlan(t, false)
	green, err := newEtcdClient(p.greenConn())
	if err != nil {
		t.Fatal(err)
	}
	defer green.Close()
	j := journalThrough(p, bakeSteps, StepGateBlue, time.Now().UTC())
	rev, err := replicate.Revision(t.Context(), green)
	if err != nil {
		t.Fatal(err)
	}
	j.Bake = &BakeRecord{Revision: rev, Started: time.Now().UTC()}
	if _, err := green.Put(t.Context(), "/registry/masterleases/10.0.0.1", "x"); err != nil {
		t.Fatal(err)
	}
	var calls []string
	st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
	r := (&runner{o: Options{Plan: p, Resume: true}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: bakeSteps}).forward()
	detail, err := handOverStep{}.run(t.Context(), r)
	_, _ = r.stopReplication()
	if err != nil || r.j.Bake == nil || r.j.Bake.Revision != rev || strings.Contains(detail, "NO WAY BACK") {
		t.Fatalf("reverse-replication resumed after its hand-over: %q, %v, bake %+v; want the bake kept at revision %d", detail, err, r.j.Bake, rev)
	}
}

// TestHandOverWithoutABakeSaysHowReplicationStopped: with the bake given up, the hand-over
// stops replication as stop-replication does: an error the stop itself finds (a txn of unknown
// outcome, green's revision unknown) is in the step's detail and the stop's progress journaled
// (replication.atStop); it was dropped, and green's apiserver ungated with no word of it.
func TestHandOverWithoutABakeSaysHowReplicationStopped(t *testing.T) {
	p := bakePlan(t)
	r := (&runner{o: Options{Plan: p}, p: p, j: &Journal{ID: "x", NoBake: "gate-blue failed"}}).forward()
	blue, _ := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	green, _ := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2"}, DialTimeout: time.Second})
	rep, err := replicate.New(replicate.Config{Source: blue, Dest: green, FromRevision: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp := &replication{rep: rep, src: blue, dst: green, cancel: cancel, done: make(chan struct{})}
	go func() {
		<-ctx.Done()
		rp.err = errors.New("green's revision unknown after a txn of unknown outcome")
		close(rp.done)
	}()
	r.repl = rp
	detail, err := handOverStep{}.run(t.Context(), r)
	if err != nil || !strings.Contains(detail, "revision unknown") || r.j.ReplicationAtStop == nil {
		t.Fatalf("hand-over without a bake: %q, %v, atStop %v; want the stop's error in the detail and its progress journaled", detail, err, r.j.ReplicationAtStop)
	}
}
