package cutover

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubefence/kubefence/internal/testnet"
	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// replicatePlan is validPlan in mode replicate, green with TLS files.
func replicatePlan(t *testing.T) *Plan {
	t.Helper()
	p, dir := validPlan(t)
	f := writeFile(t, dir, "pem", "x")
	p.Green.Etcd.Insecure = false
	p.Green.Etcd.TLS = &GreenEtcdTLS{CAFile: f, ServerCertFile: f, ServerKeyFile: f, PeerCertFile: f, PeerKeyFile: f, ClientCertFile: f, ClientKeyFile: f}
	for i := range p.Green.Etcd.Members {
		m := &p.Green.Etcd.Members[i]
		m.ClientURL = strings.Replace(m.ClientURL, "http:", "https:", 1)
		m.PeerURL = strings.Replace(m.PeerURL, "http:", "https:", 1)
	}
	p.Migration.Mode = ModeReplicate
	return p
}

// TestReplicatePlan: mode replicate is opt-in, needs green TLS, restores without a bump, starts
// green with room for one revision per txn, and runs its own table of steps.
func TestReplicatePlan(t *testing.T) {
	p := replicatePlan(t)
	data, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePlan(data)
	if err != nil {
		t.Fatalf("replicate plan refused: %v", err)
	}
	if got.revisionBump() != 0 || got.Green.APIServer.EtcdUser != DefaultGreenEtcdUser || got.Timeouts.Window.D().Seconds() != 5 {
		t.Errorf("defaults: bump %d, etcd user %q, window %s", got.revisionBump(), got.Green.APIServer.EtcdUser, got.Timeouts.Window.D())
	}
	cmd := strings.Join(etcdCommand(got, got.Green.Etcd.Members[0]), " ")
	if !strings.Contains(cmd, "--max-request-bytes 10485760") || strings.Contains(cmd, "--max-txn-ops") {
		t.Errorf("green etcd command lacks the replication flags: %s", cmd)
	}
	var names []string
	for _, s := range DryRun(got) {
		names = append(names, s.Step)
	}
	want := []string{StepPreflight, StepCopy, StepMigrate, StepGreenEtcd, StepGreenAuth, StepReplicate, StepGreenAPIServer, StepVerify, StepFence, StepDrain, StepSwitch, StepStopReplication, StepUngateGreen, StepUnfence}
	if !slices.Equal(names, want) {
		t.Errorf("steps %v, want %v", names, want)
	}
	// The default, auto: the fenced copy for an insecure green or a blue member dir to look
	// for v2 content in, replication in hold mode for v3 data onto a TLS green.
	def, _ := validPlan(t)
	if def.Migration.Mode = ""; len(DryRun(def)) != len(Steps) {
		t.Errorf("default plan (insecure green) has %d steps, want %d", len(DryRun(def)), len(Steps))
	}
	tlsDefault := replicatePlan(t)
	tlsDefault.Migration.Mode, tlsDefault.Proxy.FenceMode = "", ""
	data, _ = yaml.Marshal(tlsDefault)
	if got, err := ParsePlan(data); err != nil || !got.Replicating() || got.Proxy.FenceMode != admin.ModeHold || len(DryRun(got)) != len(replicateSteps) {
		t.Errorf("default plan (TLS green, no blue data dir): %v; want replication in hold mode", err)
	}
	insecure, _ := validPlan(t)
	insecure.Migration.Mode = ModeReplicate
	data, _ = yaml.Marshal(insecure)
	if _, err := ParsePlan(data); err == nil || !strings.Contains(err.Error(), "migration.mode replicate needs green.etcd.tls") {
		t.Errorf("insecure green in mode replicate: %v", err)
	}
}

// TestReplicateResumeAborts: a --resume after the cutover process died during replication
// picks replication up again only once it has checked green against blue; when it cannot (here
// green and blue etcd are gone), the next step fails and the cutover goes back to blue.
func TestReplicateResumeAborts(t *testing.T) {
	p := replicatePlan(t)
	p.hash = "plan-hash"
	p.Timeouts.GreenAPIServer = Duration(time.Second)
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Generation: 1}
	var calls []string
	var stopped []int
	r := (&runner{o: Options{Plan: p, Resume: true}, p: p, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{101: true}, &stopped), steps: replicateSteps}).forward()
	j := &Journal{ID: "x", State: StateRunning, PlanHash: "plan-hash", GreenPIDs: map[string]int{}}
	for _, s := range []string{StepPreflight, StepCopy, StepMigrate, StepGreenEtcd, StepGreenAuth, StepReplicate} {
		j.Done = append(j.Done, StepRecord{Step: s})
	}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	if err := r.openJournal(); err != nil {
		t.Fatal(err)
	}
	rep, err := r.run(context.Background())
	if err == nil || rep.Result != ResultAborted || !strings.Contains(err.Error(), "aborted at step "+StepGreenAPIServer) {
		t.Fatalf("resume without the replicator: %+v, %v", rep, err)
	}
	if st.Fenced || st.Backend != p.Blue.APIServer.URL {
		t.Errorf("proxy after the abort: %+v", st)
	}
}

// TestCompareExact: at one revision of one history, every difference is a mismatch.
func TestCompareExact(t *testing.T) {
	cms := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	rep := &VerifyReport{}
	var changed, mismatched int
	blue := map[string]rawObject{"ns/same": obj("u1", "50", "a"), "ns/differs": obj("u2", "60", "a"), "ns/blue-only": obj("u3", "70", "a")}
	green := map[string]rawObject{"ns/same": obj("u1", "50", "a"), "ns/differs": obj("u2", "61", "b"), "ns/green-only": obj("u4", "80", "a")}
	compareExact(rep, cms, blue, green, &changed, &mismatched)
	if rep.Objects != 1 || mismatched != 3 || changed != 0 {
		t.Errorf("objects %d, mismatched %d, changed %d: %v", rep.Objects, mismatched, changed, rep.Mismatches)
	}
}

// TestReplicateWindowBudget: a drain not done within timeouts.window of the fence aborts: the
// replicator is stopped, green stopped, blue unfenced, and the proxy was never switched.
func TestReplicateWindowBudget(t *testing.T) {
	r, calls, stopped, ctx := stuckReplicator(t, true)
	rep2, err := r.run(context.Background())
	if err == nil || rep2.Result != ResultAborted || !strings.Contains(rep2.Error, "within the window") {
		t.Fatalf("drain past the window: %+v, %v", rep2, err)
	}
	if want := []string{"fence off"}; !slices.Equal(*calls, want) {
		t.Errorf("proxy calls %v, want %v", *calls, want)
	}
	if r.repl != nil || ctx.Err() == nil {
		t.Error("the replicator was not stopped by the abort")
	}
	if !slices.Equal(*stopped, []int{101}) {
		t.Errorf("green processes stopped: %v", *stopped)
	}
}

// TestReplicateCatchUpBeforeFence: the catch-up right before the fence fails the step before
// anything is fenced when the replicator has stopped or applied nothing while blue was ahead,
// blue's revision cannot be read or green etcd (which the ungate changes in the window) cannot
// be reached.
func TestReplicateCatchUpBeforeFence(t *testing.T) {
	t.Run("replicator stopped", func(t *testing.T) {
		r, calls, _, _ := stuckReplicator(t, false)
		r.repl.cancel()
		<-r.repl.done
		rep, err := r.run(context.Background())
		if err == nil || rep.Result != ResultAborted || !strings.Contains(rep.Error, "replication stopped") {
			t.Fatalf("stopped replicator at the fence: %+v, %v", rep, err)
		}
		if len(*calls) != 0 {
			t.Errorf("proxy calls %v, want none (never fenced)", *calls)
		}
	})
	t.Run("blue unreadable", func(t *testing.T) {
		// Its blue client reaches nothing; the catch-up's bound also bounds each read of blue.
		r, calls, _, _ := stuckReplicator(t, false)
		r.authClients = map[string]*clientv3.Client{"green": startTestEtcd(t)} // the ungate's green etcd answers
		r.preFence = time.Second
		rep, err := r.run(context.Background())
		if err == nil || rep.Result != ResultAborted || !strings.Contains(rep.Error, "reading blue's revision before the fence") {
			t.Fatalf("unreadable blue at the fence: %+v, %v", rep, err)
		}
		if len(*calls) != 0 {
			t.Errorf("proxy calls %v, want none (never fenced)", *calls)
		}
	})
	t.Run("nothing applied in time", func(t *testing.T) {
		// A replicator that applies nothing while blue is ahead is refused before the fence
		// (catchUpStalled); one that applies, only not fast enough, is fenced anyway
		// (TestFenceRefusedAfterAStalledCatchUp).
		r, calls, _, _ := stuckReplicator(t, false)
		r.repl.src = aheadOfReplicator(t)
		// The ungate's green etcd answers; the catch-up's bound also bounds each read of blue's
		// revision, so it is long enough for one under -race.
		r.authClients = map[string]*clientv3.Client{"green": r.repl.src}
		r.preFence = time.Second
		rep, err := r.run(context.Background())
		if err == nil || rep.Result != ResultAborted || !strings.Contains(rep.Error, "replication applied nothing") {
			t.Fatalf("stalled replicator at the fence: %+v, %v", rep, err)
		}
		if len(*calls) != 0 {
			t.Errorf("proxy calls %v, want none (never fenced)", *calls)
		}
	})
	for _, tc := range []struct {
		name string
		etcd func(*testing.T) datadir.ConnSpec // green etcd as the ungate reaches it; nil: the plan's
		why  string                            // in the error, after the step's own words
	}{
		// The plan's green etcd client certificate is no PEM.
		{name: "green etcd client certificate unreadable", why: "etcd TLS"},
		{name: "green etcd out of reach", etcd: func(t *testing.T) datadir.ConnSpec {
			return datadir.ConnSpec{Endpoints: []string{closedAddr(t)}}
		}, why: "deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, calls, _, _ := stuckReplicator(t, false)
			if tc.etcd != nil {
				r.to.etcd = tc.etcd(t)
			}
			r.preFence = time.Second // also bounds the read of the ungate's etcd
			start := time.Now()
			rep, err := r.run(context.Background())
			if err == nil || rep.Result != ResultAborted || !strings.Contains(rep.Error, "connecting to green etcd for the ungate-green step, before the fence") || !strings.Contains(rep.Error, tc.why) {
				t.Fatalf("green etcd at the fence: %+v, %v", rep, err)
			}
			if len(*calls) != 0 {
				t.Errorf("proxy calls %v, want none (never fenced)", *calls)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("failed after %s, past the catch-up's bound of 1s", took)
			}
		})
	}
}

// closedAddr is a loopback address nothing listens on, for as long as the test runs: its port
// is bound by a socket that never listens, so a connection is refused and no other listener
// can take the port meanwhile (a port freed after a listen could be).
func closedAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// aheadOfReplicator is an etcd at a revision past stuckReplicator's, which never moves.
func aheadOfReplicator(t *testing.T) *clientv3.Client {
	t.Helper()
	cli := startTestEtcd(t)
	for i := range 10 {
		if _, err := cli.Put(t.Context(), fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	return cli
}

// stuckReplicator is a runner resumed after the verify (and, with fenced, after the fence: the
// window's budget already spent) whose replicator runs but reaches nothing.
func stuckReplicator(t *testing.T, fenced bool) (*runner, *[]string, *[]int, context.Context) {
	t.Helper()
	p := replicatePlan(t)
	p.hash = "plan-hash"
	p.Timeouts.Window = Duration(time.Nanosecond)
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Generation: 1, Fenced: fenced}
	calls, stopped := new([]string), new([]int)
	r := (&runner{o: Options{Plan: p, Resume: true}, p: p, adm: memProxy(st, calls), procs: fakeProcesses(map[int]bool{101: true}, stopped), steps: replicateSteps}).forward()
	j := &Journal{ID: "x", State: StateRunning, PlanHash: "plan-hash", SnapshotRevision: 5, GreenPIDs: map[string]int{"g0": 101}}
	for _, s := range []string{StepPreflight, StepCopy, StepMigrate, StepGreenEtcd, StepGreenAuth, StepReplicate, StepGreenAPIServer, StepVerify} {
		j.Done = append(j.Done, StepRecord{Step: s})
	}
	if fenced {
		j.Done = append(j.Done, StepRecord{Step: StepFence})
		j.FencedAt, j.FenceGeneration = time.Now().Add(-time.Second), 1
	}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	r.j = j // this process verified and replicates (a resume would verify again)
	// A replicator that runs (nothing answers its clients: the drain cannot finish).
	blue, _ := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	green, _ := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2"}, DialTimeout: time.Second})
	t.Cleanup(func() { blue.Close(); green.Close() })
	rep, err := replicate.New(replicate.Config{Source: blue, Dest: green, FromRevision: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp := &replication{rep: rep, src: blue, dst: green, cancel: cancel, done: make(chan struct{})}
	go func() { <-ctx.Done(); rp.err = ctx.Err(); close(rp.done) }()
	r.repl = rp
	return r, calls, stopped, ctx
}

// TestCheckFenceHeld: the switch goes on only from the state the fence left the proxy in, and
// knows a switch a crash left unjournaled (the proxy on green, one generation on).
func TestCheckFenceHeld(t *testing.T) {
	p := replicatePlan(t)
	blue, green := p.Blue.APIServer.URL, p.Green.APIServer.URL
	// proxies is how many proxies the plan names; the status is their sum, as proxyGroup's.
	tests := []struct {
		name     string
		proxies  int
		st       admin.Status
		switched bool
		err      string
	}{
		{"held", 1, admin.Status{Backend: blue, Fenced: true, Generation: 7}, false, ""},
		{"switched before a crash", 1, admin.Status{Backend: green, Fenced: true, Generation: 8}, true, ""},
		{"unfenced", 1, admin.Status{Backend: blue, Fenced: false, Generation: 8}, false, "not fenced"},
		{"changed by hand", 1, admin.Status{Backend: blue, Fenced: true, Generation: 9}, false, "changed since it was fenced"},
		{"on green, changed since", 1, admin.Status{Backend: green, Fenced: true, Generation: 10}, false, "changed since it was fenced"},
		{"three proxies switched before a crash", 3, admin.Status{Backend: green, Fenced: true, Generation: 10}, true, ""},
		{"three proxies on green, one generation on", 3, admin.Status{Backend: green, Fenced: true, Generation: 8}, false, "changed since it was fenced"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, p := tt.st, *p
			p.Proxies = nil
			for i := range tt.proxies {
				p.Proxies = append(p.Proxies, ProxyRef{AdminSocket: fmt.Sprintf("/run/kubefence/%d.sock", i)})
			}
			r := (&runner{p: &p, j: &Journal{FenceGeneration: 7}, adm: memProxy(&st, new([]string))}).forward()
			switched, err := r.checkFenceHeld(t.Context())
			if switched != tt.switched || (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("switched %v, err %v; want %v, %q", switched, err, tt.switched, tt.err)
			}
		})
	}
}

// TestAbortUnfencesBeforeReplicationStops: stopping the replicator waits for the txns it has in
// flight (up to their timeout each); an abort inside the window must open writes on blue first,
// not hold them past the budget for green's sake.
func TestAbortUnfencesBeforeReplicationStops(t *testing.T) {
	r, calls, _, _ := stuckReplicator(t, true)
	unfenced := make(chan struct{})
	px := r.adm.(funcProxy)
	fence := px.fence
	px.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
		resp, err := fence(ctx, req)
		if !req.Fenced && err == nil {
			close(unfenced)
		}
		return resp, err
	}
	r.adm = px
	old := r.repl
	old.cancel()
	<-old.done
	ctx, cancel := context.WithCancel(context.Background())
	slow := &replication{rep: old.rep, src: old.src, dst: old.dst, cancel: cancel, done: make(chan struct{})}
	go func() {
		<-ctx.Done()
		select { // a txn in flight on a stalled green
		case <-unfenced:
		case <-time.After(5 * time.Second):
		}
		slow.err = ctx.Err()
		close(slow.done)
	}()
	r.repl = slow
	start := time.Now()
	if err := r.abort(t.Context(), "drain missed the window", nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the abort took %s: it waited for replication to stop before it unfenced (calls %q)", took, *calls)
	}
}

// TestPickupAdvice: a revision mismatch or a compaction means blue no longer follows green, and
// a revision green cannot take or an etcd refusing replication means picking it up again fails
// the same way; an etcd that did not answer in time does not make a bake or a rollback give up
// the way back.
func TestPickupAdvice(t *testing.T) {
	r := &runner{noPickup: "finish", retryPickup: "try again"}
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("at revision 9: %w", replicate.ErrRevisionMismatch), "finish"},
		{fmt.Errorf("blue's revision 9: %w", replicate.ErrCompacted), "finish"},
		// a revision green cannot take, or a refusal, fails the same way when picked up again
		{fmt.Errorf("%w: blue's revision 9 holds 200 operations", replicate.ErrTooManyOps), "finish"},
		{fmt.Errorf("%w: green refuses blue's revision 9 as an invalid request", replicate.ErrRefused), "finish"},
		{fmt.Errorf("%w: blue refuses the replicator's watch: permission denied", replicate.ErrRefused), "finish"},
		{fmt.Errorf("replicate: reading blue's revision: %w", context.DeadlineExceeded), "try again"},
	}
	for _, tc := range cases {
		if got := r.pickupAdvice(tc.err); got != tc.want {
			t.Errorf("%v: advice %q, want %q", tc.err, got, tc.want)
		}
	}
	if got := (&runner{noPickup: "abort"}).pickupAdvice(context.DeadlineExceeded); got != "abort" {
		t.Errorf("a forward cutover's advice %q, want its only one", got)
	}
}

// TestResumeAfterTheWindowAbortsAtOnce: a resume after the cutover process died inside the
// window, its budget spent by then, must not hold writes fenced while it tries to pick
// replication up from etcds that hang (30 s): the budget bounds that too.
func TestResumeAfterTheWindowAbortsAtOnce(t *testing.T) {
	p := replicatePlan(t)
	p.Timeouts.Window = Duration(5 * time.Second)
	var calls []string
	proxies := &admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true}
	r := (&runner{o: Options{Plan: p, Resume: true}, p: p, adm: memProxy(proxies, &calls), j: &Journal{FencedAt: time.Now().Add(-time.Minute)}}).forward()
	silent := testnet.Silent(t)
	r.from.etcd = datadir.ConnSpec{Endpoints: []string{silent}}
	r.to.etcd = datadir.ConnSpec{Endpoints: []string{silent}}
	start := time.Now()
	_, err := r.ensureReplication(t.Context())
	if took := time.Since(start); err == nil || took > 3*time.Second || !strings.Contains(err.Error(), "timeouts.window") {
		t.Fatalf("picking replication up after the window: %v after %s; want a failure naming the window, at once", err, took)
	}
	// Not bounded by it where no window is open: the fence was journaled (write-ahead) but no
	// proxy holds it (the run died before sending it, or someone lifted it): the fence step
	// starts a new window then. Nor in a bake, whose journal holds the window it baked after.
	for name, change := range map[string]func(){
		"a fence journaled, not held": func() { proxies.Fenced = false },
		"a bake":                      func() { proxies.Fenced, r.j.UnfencedAt = true, r.j.FencedAt.Add(time.Second) },
	} {
		change()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		if _, err := r.ensureReplication(ctx); err == nil || strings.Contains(err.Error(), "timeouts.window") {
			t.Errorf("%s: picking replication up: %v; want the caller's deadline, not the window's", name, err)
		}
		cancel()
	}
}

// TestResumeBeforeTheFenceVerifiesAgain: the changes since the full verify were compared by the
// process that stopped; a resume before the fence verifies again (a new delta check from a new
// revision: the old one may be compacted away by now), one inside the window keeps the verify
// and compares the delta from its revision.
func TestResumeBeforeTheFenceVerifiesAgain(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		p := replicatePlan(t)
		p.hash = "plan-hash"
		if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		j := &Journal{Version: 1, ID: "x", State: StateRunning, PlanHash: p.hash, GreenPIDs: map[string]int{}, Verified: &VerifyReport{Revision: 7}}
		for _, s := range []string{StepPreflight, StepCopy, StepMigrate, StepGreenEtcd, StepGreenAuth, StepReplicate, StepGreenAPIServer, StepVerify} {
			j.Done = append(j.Done, StepRecord{Step: s})
		}
		if fenced {
			j.FencedAt = time.Now().UTC()
		}
		if err := j.save(p.StateDir); err != nil {
			t.Fatal(err)
		}
		r := (&runner{o: Options{Plan: p, Resume: true}, p: p, steps: replicateSteps}).forward()
		if err := r.openJournal(); err != nil {
			t.Fatal(err)
		}
		if verified := r.j.done(StepVerify) && r.j.Verified != nil; verified != fenced {
			t.Errorf("fenced %v: verify kept %v (verified %+v); want it kept only inside the window", fenced, verified, r.j.Verified)
		}
		if !r.j.done(StepGreenAPIServer) {
			t.Errorf("fenced %v: the steps before the verify were forgotten: %v", fenced, r.j.Done)
		}
	}
}

// TestProgressLineSaysBacklogPauses: the progress note says when blue's watch paused at the
// backlog bound (green fell behind by more than it), and says nothing of it otherwise.
func TestProgressLineSaysBacklogPauses(t *testing.T) {
	cases := []struct {
		p    replicate.Progress
		want string
	}{
		{replicate.Progress{Applied: 10, Source: 12}, ""},
		{replicate.Progress{Applied: 10, Source: 5000, BacklogPauses: 2, BacklogBytes: 1 << 20}, "blue's watch paused 2 times: green fell behind by more than the backlog bound (1048576 bytes waiting now)"},
	}
	for _, tc := range cases {
		line := progressLine(tc.p, "blue", "green")
		if tc.want == "" && strings.Contains(line, "paused") || tc.want != "" && !strings.Contains(line, tc.want) {
			t.Errorf("progressLine(%+v) = %q, want %q", tc.p, line, tc.want)
		}
	}
}
