package cutover

import (
	"bufio"
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// bakePlan is replicatePlan with bake.enabled and what it needs of blue.
func bakePlan(t *testing.T) *Plan {
	t.Helper()
	p := replicatePlan(t)
	p.Bake.Enabled = true
	p.Blue.APIServer.EtcdUser = DefaultGreenEtcdUser
	f := p.Green.Etcd.TLS.CAFile
	p.Blue.Etcd.CAFile, p.Blue.Etcd.CertFile, p.Blue.Etcd.KeyFile = f, f, f
	for i, e := range p.Blue.Etcd.Endpoints {
		p.Blue.Etcd.Endpoints[i] = strings.Replace(e, "http:", "https:", 1)
	}
	return p
}

// TestBakePlan: bake.enabled needs a replicating cutover, blue's apiserver etcd user and blue
// etcd with TLS client certificates; it runs its own table of steps, in which every step from
// the switch on is past the point of no return.
func TestBakePlan(t *testing.T) {
	parse := func(p *Plan) (*Plan, error) {
		data, err := yaml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		return ParsePlan(data)
	}
	got, err := parse(bakePlan(t))
	if err != nil {
		t.Fatalf("bake plan refused: %v", err)
	}
	var names []string
	for _, s := range DryRun(got) {
		names = append(names, s.Step)
	}
	want := []string{StepPreflight, StepCopy, StepMigrate, StepGreenEtcd, StepGreenAuth, StepBlueAuth, StepReplicate, StepGreenAPIServer, StepVerify, StepFence, StepDrain, StepSwitch, StepGateBlue, StepHandOver, StepUngateGreen, StepUnfence}
	if !slices.Equal(names, want) {
		t.Errorf("steps %v, want %v", names, want)
	}
	for _, table := range [][]step{bakeSteps, rollbackSteps} {
		past := false
		for _, s := range table {
			past = past || s.name() == StepSwitch
			if s.pastNoReturn() != past {
				t.Errorf("%s: pastNoReturn %v, want %v", s.name(), s.pastNoReturn(), past)
			}
		}
	}
	cases := []struct {
		name   string
		change func(*Plan)
		want   string
	}{
		{"fenced copy", func(p *Plan) { p.Migration.Mode = "snapshot" }, "bake.enabled needs a replicating cutover"},
		{"no blue etcd user", func(p *Plan) { p.Blue.APIServer.EtcdUser = "" }, "bake.enabled needs blue.apiserver.etcdUser"},
		{"no client certificate for blue", func(p *Plan) { p.Blue.Etcd.CertFile, p.Blue.Etcd.KeyFile = "", "" }, "bake.enabled needs blue.etcd.caFile, certFile and keyFile"},
		{"plain blue etcd", func(p *Plan) { p.Blue.Etcd.Endpoints = []string{"http://10.0.0.1:2379"} }, "bake.enabled needs blue etcd with TLS"},
		{"blue's apiserver is etcd's root", func(p *Plan) { p.Blue.APIServer.EtcdUser = "root" }, "blue.apiserver.etcdUser is etcd's root user"},
		{"green's apiserver is etcd's root", func(p *Plan) { p.Green.APIServer.EtcdUser = "root" }, "green.apiserver.etcdUser is etcd's root user"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := bakePlan(t)
			tc.change(p)
			if _, err := parse(p); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestBakeJournalStates: a baking cutover is only picked up again with --resume; a rolled-back
// one may be followed by a new cutover (its journal kept beside the new one); a rollback runs
// only during a bake and is resumed only while one is in progress.
func TestBakeJournalStates(t *testing.T) {
	cases := []struct {
		name, state string
		resume      bool
		wantErr     string
		planHash    string
	}{
		{"run over a bake", StateBaking, false, "is baking (green serves)", ""},
		{"resume a bake", StateBaking, true, "", ""},
		// An edited plan (bake.enabled: false) would walk another table of steps and end the
		// bake without a finish.
		{"resume a bake with another plan", StateBaking, true, "the plan changed", "another-plan"},
		{"run over a rollback", StateRollingBack, false, "finish the rollback first", ""},
		{"new cutover after a rollback", StateRolledBack, false, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, tc.resume, "", false)
			j := &Journal{ID: "x", State: tc.state, PlanHash: cmp.Or(tc.planHash, "plan-hash")}
			if err := j.save(w.r.p.StateDir); err != nil {
				t.Fatal(err)
			}
			err := w.r.openJournal()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
	rollbacks := []struct {
		name, state string
		resume      bool
		want        string
	}{
		{"rollback after the bake", StateDone, false, "a rollback goes back to blue during the bake only"},
		{"resume without a rollback", StateBaking, true, "no rollback of cutover x is in progress"},
		{"rollback over a rollback", StateRollingBack, false, "rollback --resume"},
	}
	for _, tc := range rollbacks {
		t.Run(tc.name, func(t *testing.T) {
			p := bakePlan(t)
			_, err := newRollbackRunner(Options{Plan: p, Resume: tc.resume}, &Journal{ID: "x", State: tc.state, Bake: &BakeRecord{Revision: 5}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestFlockHolder: the holder of the state dir's lock is found by pid and inode in /proc/locks,
// blocked waiters ("->") and other files are not it; and a lock this process holds is found.
func TestFlockHolder(t *testing.T) {
	locks := "1: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF\n1: -> FLOCK  ADVISORY  WRITE 77 00:2d:1234 0 EOF\n2: POSIX  ADVISORY  WRITE 99 fd:01:1234 0 EOF\n3: FLOCK  ADVISORY  WRITE 5 fd:01:999 0 EOF\n"
	cases := []struct {
		pid  int
		ino  uint64
		want bool
	}{{4242, 1234, true}, {77, 1234, false}, {99, 1234, false}, {5, 1234, false}, {5, 999, true}}
	for _, tc := range cases {
		if got := flockHolder(locks, tc.ino, tc.pid); got != tc.want {
			t.Errorf("pid %d inode %d: %v, want %v", tc.pid, tc.ino, got, tc.want)
		}
	}
	dir := t.TempDir()
	lock, err := lockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.unlock()
	if !holdsLock(dir, os.Getpid()) || holdsLock(dir, os.Getpid()+1) {
		t.Errorf("this process holds the lock on %s: not found in /proc/locks", dir)
	}
	// Only a holder marked as baking may be stopped by rollback or finish.
	if pid, role := holder(dir); pid != os.Getpid() || role != "" {
		t.Errorf("holder before the bake: %d %q", pid, role)
	}
	if _, err := stopHolder(t.Context(), dir, errors.New("busy")); err == nil || err.Error() != "busy" {
		t.Errorf("stopHolder on a holder that does not bake: %v, want the lock's own error", err)
	}
	lock.markBaking()
	if pid, role := holder(dir); pid != os.Getpid() || role != bakeRole {
		t.Errorf("holder while baking: %d %q", pid, role)
	}
}

// TestRollbackResumeAfterItsSwitch: a rollback killed after its switch reached the proxies, but
// before the switch was journaled, is finished by --resume. The switch is recognised before
// replication is picked up again, which cannot be: once nothing kept green's leases alive on
// blue, blue expired them itself and is no longer green change for change.
func TestRollbackResumeAfterItsSwitch(t *testing.T) {
	p := bakePlan(t) // its TLS files are no PEM: replication cannot be picked up again
	p.hash = "plan-hash"
	const gen = 7
	rj := &Journal{Version: 1, ID: "r", PlanHash: p.hash, State: StateRunning, FenceGeneration: gen,
		Done: []StepRecord{{Step: StepFence}, {Step: StepDrain}}, GreenPIDs: map[string]int{}}
	r := resumedRollback(t, p, rj)
	var calls []string
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: gen + 1}
	r.adm = memProxy(st, &calls)
	i := slices.IndexFunc(r.steps, func(s step) bool { return s.name() == StepSwitch })
	detail, err := r.steps[i].run(t.Context(), r)
	if err != nil || !strings.Contains(detail, "was switched to blue before") {
		t.Fatalf("resumed switch: %q, %v; want it recognised as done", detail, err)
	}
	if len(calls) != 0 {
		t.Errorf("proxy calls %v, want none", calls)
	}
}

// TestBlueNotReadyWithAuth: when blue's apiserver is not ready with etcd auth on, auth is
// turned off again only if this cutover turned it on (an operator's, or a rolled-back
// cutover's, stays on), and even when the step's own time ran out.
func TestBlueNotReadyWithAuth(t *testing.T) {
	for _, ours := range []bool{true, false} {
		t.Run(fmt.Sprintf("turned on by this cutover %v", ours), func(t *testing.T) {
			cli := startTestEtcd(t)
			ctx := t.Context()
			if _, err := cli.RoleAdd(ctx, "root"); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.UserAdd(ctx, "root", "pw"); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.AuthEnable(ctx); err != nil {
				t.Fatal(err)
			}
			root, err := clientv3.New(clientv3.Config{Endpoints: cli.Endpoints(), Username: "root", Password: "pw", DialTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			_, dir := validPlan(t)
			kubeconfig := writeKubeconfig(t, dir, "blue.kubeconfig", "https://"+closedAddr(t))
			sctx, cancel := context.WithTimeout(ctx, time.Second) // the step's time runs out
			defer cancel()
			err = blueReadyWithAuth(sctx, root, kubeconfig, "kube-apiserver-etcd-client", ours)
			if err == nil || !strings.Contains(err.Error(), "not ready with etcd auth on") {
				t.Fatalf("error %v, want blue's apiserver not ready", err)
			}
			st, err := root.AuthStatus(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Enabled == ours {
				t.Errorf("auth enabled %v after the failure, want %v", st.Enabled, !ours)
			}
		})
	}
}

// budgetPlan is bakePlan for the window-budget tests: the etcd of side answers ("blue" or
// "green") is a plain test etcd with the apiservers' etcd user and the read-write role (not
// granted yet), the other side's etcd a port nothing listens on; timeouts.window is 1 s and
// timeouts.switch 30 s, what the budget must not wait out.
func budgetPlan(t *testing.T, answers string) *Plan {
	t.Helper()
	cli := startTestEtcd(t)
	if _, err := cli.RoleAdd(t.Context(), readWriteRole); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserAdd(t.Context(), DefaultGreenEtcdUser, "pw"); err != nil {
		t.Fatal(err)
	}
	url, closed := "http://"+cli.Endpoints()[0], "http://"+closedAddr(t)
	blueURL, greenURL := closed, url
	if answers == "blue" {
		blueURL, greenURL = url, closed
	}
	p := bakePlan(t)
	p.hash = "plan-hash"
	p.Blue.Etcd.EtcdClientSpec = datadir.ConnSpec{Endpoints: []string{blueURL}}
	p.Green.Etcd.TLS = nil
	p.Green.Etcd.Members = p.Green.Etcd.Members[:1]
	p.Green.Etcd.Members[0].ClientURL = greenURL
	p.Blue.APIServer.EtcdUser, p.Green.APIServer.EtcdUser = DefaultGreenEtcdUser, DefaultGreenEtcdUser
	p.Timeouts.Window, p.Timeouts.Switch = Duration(time.Second), Duration(30*time.Second)
	return p
}

// TestBakeStepsKeepTheWindowBudget: past the switch, the bake's own steps (gate-blue,
// reverse-replication) are bounded by timeouts.window from the fence. A blue etcd that does
// not answer then costs the way back, not writes fenced for timeouts.switch: the cutover goes
// on without a bake, green ungated, writes open.
func TestBakeStepsKeepTheWindowBudget(t *testing.T) {
	p := budgetPlan(t, "green")
	var done []StepRecord
	for _, s := range bakeSteps {
		done = append(done, StepRecord{Step: s.name()})
		if s.name() == StepSwitch {
			break
		}
	}
	j := &Journal{Version: 1, ID: "x", PlanHash: p.hash, State: StateRunning, Done: done, FencedAt: time.Now().UTC(), GreenPIDs: map[string]int{}}
	var calls []string
	st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
	r := (&runner{o: Options{Plan: p}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: bakeSteps}).forward()
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := r.run(t.Context())
	took := time.Since(start)
	if err != nil || rep.Result != ResultDone {
		t.Fatalf("after %s: report %+v, %v; want done without a bake", took, rep, err)
	}
	if st.Fenced || took > 10*time.Second {
		t.Errorf("proxy %+v after %s: want unfenced within the window's budget (1s), not timeouts.switch (30s)", *st, took)
	}
	if !strings.Contains(rep.Next, "NO WAY BACK") || !strings.Contains(rep.Next, "could not be gated") {
		t.Errorf("report's next %q, want it to say there is no way back, and why", rep.Next)
	}
	j, err = LoadJournal(p.StateDir)
	if err != nil || j.NoBake == "" || j.Bake != nil {
		t.Fatalf("journal %+v, %v; want noBake said, no bake", j, err)
	}
	if rec, ok := j.record(StepHandOver); !ok || !strings.HasPrefix(rec.Detail, "skipped") {
		t.Errorf("reverse-replication %+v, want it skipped", rec)
	}
}

// TestRollbackGateKeepsTheWindowBudget: past the rollback's switch, gating green's apiserver
// only keeps the side left behind from writing. A green etcd that does not answer costs that,
// within the window's budget (at least 2 s), not writes fenced on blue for timeouts.switch:
// the rollback goes on, blue's apiserver may write, writes open.
func TestRollbackGateKeepsTheWindowBudget(t *testing.T) {
	p := budgetPlan(t, "blue")
	main := &Journal{ID: "x", State: StateBaking, PlanHash: p.hash, Bake: &BakeRecord{Revision: 5}}
	r, err := newRollbackRunner(Options{Plan: p}, main)
	if err != nil {
		t.Fatal(err)
	}
	r.j.Done = []StepRecord{{Step: StepFence}, {Step: StepDrain}, {Step: StepSwitch}}
	r.j.FencedAt = time.Now().UTC()
	var calls []string
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 3}
	r.adm = memProxy(st, &calls)
	start := time.Now()
	err = r.walk(t.Context())
	took := time.Since(start)
	if err != nil || st.Fenced || took > 10*time.Second {
		t.Fatalf("after %s: %v, proxy %+v; want the rollback finished, writes open on blue, within the budget (1s, at least 2s a step), not timeouts.switch (30s)", took, err, *st)
	}
	if rec, ok := r.j.record(StepGateGreen); !ok || !strings.Contains(rec.Detail, "could not be gated") {
		t.Errorf("gate-green %+v, want it to say green's apiserver could not be gated", rec)
	}
}

// TestRollbackResumeLeavesTheBake: 'rollback --resume' with no rollback to resume is refused
// before the baking process is asked to stop: nothing else keeps blue in step with green.
func TestRollbackResumeLeavesTheBake(t *testing.T) {
	p := bakePlan(t)
	_, sock := startFakeProxy(t, admin.Status{Backend: strings.TrimSuffix(p.Green.APIServer.URL, "/"), Generation: 3})
	p.Proxy.AdminSocket = sock
	p.hash = "plan-hash"
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	j := &Journal{Version: 1, ID: "c1", State: StateBaking, PlanHash: p.hash, GreenPIDs: map[string]int{}}
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	exited := startBakingHolder(ctx, t, p.StateDir)
	var err error
	_, err = Rollback(ctx, Options{Plan: p, Resume: true})
	if err == nil || !strings.Contains(err.Error(), "nothing to resume") {
		t.Fatalf("rollback --resume without a rollback: %v", err)
	}
	stillBaking(t, exited)
}

// startBakingHolder starts this test binary as a baking process holding stateDir's lock (as
// the cutover does while it bakes); the channel gets its exit.
func startBakingHolder(ctx context.Context, t *testing.T, stateDir string) chan error {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "KUBEFENCE_TEST_BAKING_HOLDER="+stateDir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	line, _ := bufio.NewReader(out).ReadString('\n')
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	if line != "holding\n" {
		t.Fatalf("helper said %q", line)
	}
	return exited
}

// stillBaking fails the test if the baking process exited (a refusal must not stop it).
func stillBaking(t *testing.T, exited chan error) {
	t.Helper()
	select {
	case err := <-exited:
		exited <- err // for the cleanup's wait
		t.Fatalf("the baking process was stopped (%v) by a command that then refused", err)
	case <-time.After(200 * time.Millisecond):
	}
}

// newBakeRollback is a rollback's runner of a baking cutover (its journal in memory only).
func newBakeRollback(t *testing.T) *runner {
	t.Helper()
	p := bakePlan(t)
	p.hash = "plan-hash"
	main := &Journal{ID: "x", State: StateBaking, PlanHash: p.hash, Bake: &BakeRecord{Revision: 5}}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r, err := newRollbackRunner(Options{Plan: p}, main)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestFailedRollbackAbortAdvice: a rollback whose abort cannot complete advises what works from
// there, never 'cutover abort' (it refuses a rolling-back cutover) nor a plain fence off (it
// could open one proxy on blue while the others write green), and says by when blue must follow
// green again (PickupHorizon). One that could not put a proxy back on green left every proxy
// fenced and the cutover rolling back: 'rollback --resume' once every proxy answers. One whose
// proxy does not answer its unfence ended the rollback all the same (the others would be open on
// green): 'cutover --resume' to keep blue following, and the checked fence off once it answers.
func TestFailedRollbackAbortAdvice(t *testing.T) {
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name  string
		proxy func(r *runner) proxyAdmin
		want  string
	}{
		{"the proxy does not answer", func(*runner) proxyAdmin {
			return funcProxy{
				status: func(context.Context) (admin.Status, error) { return admin.Status{}, down },
				fence: func(context.Context, admin.FenceRequest) (admin.FenceResponse, error) {
					return admin.FenceResponse{}, down
				},
			}
		}, "kubefence cutover --resume"},
		{"a proxy on blue cannot be put back", func(r *runner) proxyAdmin {
			var calls []string
			stray := memProxy(&admin.Status{Backend: r.p.Blue.APIServer.URL, Fenced: true, Generation: 3}, &calls)
			stray.setBackend = func(context.Context, admin.BackendRequest) (admin.BackendResponse, error) {
				return admin.BackendResponse{}, down
			}
			green := memProxy(&admin.Status{Backend: greenURLOf(r), Fenced: true, Generation: 3}, &calls)
			return &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: green}, {Name: "b", Client: stray}}}
		}, "rollback --resume"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newBakeRollback(t)
			r.adm = tc.proxy(r)
			i := slices.IndexFunc(r.steps, func(s step) bool { return s.name() == StepDrain })
			r.j.FencedAt = time.Now().UTC() // the drain comes after the rollback's fence
			rep, _ := r.fail(t.Context(), r.steps[i], errors.New("drain missed the window"))
			if rep == nil || strings.Contains(rep.Next+rep.Error, "cutover abort") || strings.Contains(rep.Next+rep.Error, "'kubefence fence off'") || !strings.Contains(rep.Next, tc.want) || !strings.Contains(rep.Next, PickupHorizon) {
				t.Fatalf("report %+v: want the advice %q, by when blue must follow again", rep, tc.want)
			}
		})
	}
}

// fakeAuth is etcd's auth API answering userDelete's error.
type fakeAuth struct {
	clientv3.Auth
	disabled  bool
	deleteErr error
}

func (f *fakeAuth) AuthDisable(context.Context) (*clientv3.AuthDisableResponse, error) {
	f.disabled = true
	return &clientv3.AuthDisableResponse{}, nil
}

func (f *fakeAuth) UserDelete(context.Context, string) (*clientv3.AuthUserDeleteResponse, error) {
	return &clientv3.AuthUserDeleteResponse{}, f.deleteErr
}

// TestAuthOff: kubefence's own user (root role) must not stay on blue after an abort: a failed
// delete fails the abort (run again); a user already gone does not.
func TestAuthOff(t *testing.T) {
	cases := []struct {
		name      string
		deleteErr error
		wantErr   string
	}{
		{"deleted", nil, ""},
		{"already gone", rpctypes.ErrGRPCUserNotFound, ""},
		{"delete failed", errors.New("etcdserver: request timed out"), "run the abort again"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeAuth{deleteErr: tc.deleteErr}
			err := authOff(t.Context(), f, "kubefence")
			if !f.disabled || tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("auth off: disabled %v, err %v; want %q", f.disabled, err, tc.wantErr)
			}
		})
	}
}

// grantAuth is etcd's auth API whose UserGrantRole fails with errs, one per call, then succeeds.
type grantAuth struct {
	clientv3.Auth
	errs  []error
	calls int
}

func (g *grantAuth) UserGrantRole(context.Context, string, string) (*clientv3.AuthUserGrantRoleResponse, error) {
	g.calls++
	if len(g.errs) > 0 {
		err := g.errs[0]
		g.errs = g.errs[1:]
		return nil, err
	}
	return &clientv3.AuthUserGrantRoleResponse{}, nil
}

// TestGrantRetried: the ungate comes after the switch, writes fenced until it is done; a leader
// change or a timeout on green must not end it (the grant is idempotent), a refusal must.
func TestGrantRetried(t *testing.T) {
	cases := []struct {
		name      string
		errs      []error
		wantCalls int
		wantErr   string
	}{
		{"at once", nil, 1, ""},
		{"after a leader change and a timeout", []error{rpctypes.ErrGRPCLeaderChanged, rpctypes.ErrGRPCTimeout}, 3, ""},
		{"permission denied", []error{rpctypes.ErrGRPCPermissionDenied}, 1, "permission denied"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := &grantAuth{errs: tc.errs}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err := grantRole(ctx, g, "kube-apiserver-etcd-client", readWriteRole)
			if g.calls != tc.wantCalls || tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("%d call(s), %v; want %d, %q", g.calls, err, tc.wantCalls, tc.wantErr)
			}
		})
	}
}

// statusAuth is etcd 3.4's auth API (no AuthStatus) with auth on or off and kubefence's user
// present either way.
type statusAuth struct {
	clientv3.Auth
	enabled bool
}

func (statusAuth) AuthStatus(context.Context) (*clientv3.AuthStatusResponse, error) {
	return nil, status.Error(codes.Unimplemented, "unknown method AuthStatus")
}

func (a statusAuth) Authenticate(context.Context, string, string) (*clientv3.AuthenticateResponse, error) {
	if !a.enabled {
		return nil, rpctypes.ErrGRPCAuthNotEnabled
	}
	return nil, rpctypes.ErrGRPCAuthFailed
}

func (statusAuth) UserGet(context.Context, string) (*clientv3.AuthUserGetResponse, error) {
	return &clientv3.AuthUserGetResponse{}, nil // kubefence's user was left behind
}

func (statusAuth) RoleList(context.Context) (*clientv3.AuthRoleListResponse, error) {
	return &clientv3.AuthRoleListResponse{}, nil
}

// TestAuthOnWithoutAuthStatus: on etcd 3.4 a user left behind (an operator turned auth off and
// kept the users) does not make auth count as on: the next run would not journal that it turned
// auth on, and its abort would leave it on.
func TestAuthOnWithoutAuthStatus(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		on, err := authOn(t.Context(), statusAuth{enabled: enabled})
		if err != nil || on != enabled {
			t.Errorf("auth enabled %v: authOn = %v, %v", enabled, on, err)
		}
	}
}

// TestNewerJournalRefusedByEveryCommand: a journal a newer kubefence wrote (a version or state
// this one does not know) is refused by every command that acts on it, not only by a run: a
// rollback or a finish taking it for a bake would stop the process baking and act on a
// cutover whose steps it does not know.
func TestNewerJournalRefusedByEveryCommand(t *testing.T) {
	for _, j := range []*Journal{
		{Version: 2, ID: "v2", State: StateBaking, PlanHash: "plan-hash"},
		{Version: 1, ID: "s", State: "promoting", PlanHash: "plan-hash"},
	} {
		for name, cmd := range map[string]func(context.Context, Options) (*Report, error){
			"rollback": Rollback, "finish": Finish, "abort": Abort,
		} {
			p := bakePlan(t)
			p.hash = "plan-hash"
			if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := j.save(p.StateDir); err != nil {
				t.Fatal(err)
			}
			_, err := cmd(t.Context(), Options{Plan: p})
			if err == nil || !strings.Contains(err.Error(), "newer kubefence") {
				t.Errorf("%s over journal version %d, state %q: %v; want it refused as a newer kubefence's", name, j.Version, j.State, err)
			}
		}
	}
}

// TestBlueBakeCertChecked: with a bake, kubefence's client certificate for blue etcd becomes
// blue etcd's root user, so its CN must be neither empty nor blue's apiserver etcd user (the
// sample plan's apiserver-etcd-client would be both): the preflight says so, before the copy
// and green's start, not the blue-etcd-auth step after them.
func TestBlueBakeCertChecked(t *testing.T) {
	for _, tc := range []struct {
		name, cn string
		bake     bool
		want     string // "" for none
	}{
		{"kubeadm's healthcheck-client", "kube-etcd-healthcheck-client", true, ""},
		{"the apiserver's own certificate", DefaultGreenEtcdUser, true, "the same as blue.apiserver.etcdUser"},
		{"the apiserver's certificate without a bake", DefaultGreenEtcdUser, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := bakePlan(t)
			p.Bake.Enabled = tc.bake
			dir := t.TempDir()
			ca := newTestCA(t, dir, "ca")
			p.Blue.Etcd.CertFile, p.Blue.Etcd.KeyFile = ca.issue(t, dir, "client", tc.cn, nil, x509.ExtKeyUsageClientAuth)
			err := checkBlueBakeCert(p)
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkBlueBakeCert = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCheckTxnLimits: a bake needs blue to take any green revision as one txn: requests of
// blueMinRequestSize, and replication's nested txns, which fit etcd's default --max-txn-ops;
// the check names the flag to raise, and changes nothing in blue.
func TestCheckTxnLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*embed.Config)
		want string
	}{
		{"etcd's defaults", func(*embed.Config) {}, "--max-request-bytes 10485760"},
		{"as the runbook asks", func(c *embed.Config) { c.MaxRequestBytes = 10 << 20 }, ""},
		// Green takes requests of 10 MiB: a blue that takes 8 refuses green's larger revisions
		// during the bake, and the way back is lost.
		{"8 MiB, below green's", func(c *embed.Config) { c.MaxRequestBytes = 8 << 20 }, "--max-request-bytes 10485760"},
		{"max-txn-ops lowered", func(c *embed.Config) { c.MaxRequestBytes, c.MaxTxnOps = 10<<20, 64 }, "--max-txn-ops 128 (etcd's default)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, err := newEtcdClient(datadir.ConnSpec{Endpoints: startTestEtcd(t, tc.cfg).Endpoints()}) // as the bake's steps connect
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			before, err := cli.Get(t.Context(), "x")
			if err != nil {
				t.Fatal(err)
			}
			err = checkTxnLimits(t.Context(), cli)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkTxnLimits = %v, want %q", err, tc.want)
			}
			if after, err := cli.Get(t.Context(), "x"); err != nil || after.Header.Revision != before.Header.Revision {
				t.Fatalf("the check moved blue's revision: %d -> %d (%v)", before.Header.Revision, after.Header.Revision, err)
			}
		})
	}
}

// bakingCutover is a plan whose cutover bakes (its journal saved, no process baking), one fake
// proxy on green, and blue's apiserver answering with readyz.
func bakingCutover(t *testing.T, readyz http.HandlerFunc) (*Plan, *fakeProxy) {
	t.Helper()
	p := bakePlan(t)
	blue := httptest.NewTLSServer(readyz)
	t.Cleanup(blue.Close)
	p.Blue.APIServer.Kubeconfig = writeKubeconfig(t, t.TempDir(), "blue.kubeconfig", blue.URL)
	fp, sock := startFakeProxy(t, admin.Status{Backend: strings.TrimSuffix(p.Green.APIServer.URL, "/"), Generation: 3})
	p.Proxy.AdminSocket = sock
	p.hash = "plan-hash"
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	j := &Journal{Version: 1, ID: "c1", State: StateBaking, PlanHash: p.hash, GreenPIDs: map[string]int{}, Bake: &BakeRecord{Revision: 5}}
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	return p, fp
}

// TestRollbackRefusesABlueApiserverNotReady: a rollback switches every proxy to blue's apiserver
// and opens writes there, past the switch for good; one that does not answer /readyz (restarted
// during a bake of days, not ready) is refused before anything is asked of the baking process or
// the proxies.
func TestRollbackRefusesABlueApiserverNotReady(t *testing.T) {
	was := readyPatience
	readyPatience = time.Second
	t.Cleanup(func() { readyPatience = was })
	p, fp := bakingCutover(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	_, err := Rollback(ctx, Options{Plan: p})
	if err == nil || !strings.Contains(err.Error(), "/readyz") || !strings.Contains(err.Error(), "500") {
		t.Fatalf("rollback onto a blue apiserver that is not ready: %v", err)
	}
	if got, _ := LoadJournal(p.StateDir); got == nil || got.State != StateBaking {
		t.Fatalf("the cutover's journal after the refusal: %+v", got)
	}
	if fp.st.Fenced || fp.st.Generation != 3 {
		t.Fatalf("the proxy was changed: %+v", fp.st)
	}
}

// TestResumedRollbackChecksBlue: a rollback killed before its switch is resumed with 'rollback
// --resume', the only way on from "rolling-back"; blue's apiserver may have gone not ready
// meanwhile (the guard before a new rollback skips a resume, which may be past its switch). The
// resumed run looks again before it fences (its fence step; nothing fenced yet, so with the
// usual patience) or, when the run that stopped had fenced, before its switch, within the
// window's budget: the step fails and the rollback goes back to green, rather than send every
// proxy to a blue that does not serve and open writes there.
func TestResumedRollbackChecksBlue(t *testing.T) {
	was := readyPatience
	readyPatience = time.Second
	t.Cleanup(func() { readyPatience = was })
	for _, tc := range []struct {
		name   string
		fenced bool // the run that stopped had fenced (and drained)
		step   string
		not    string // the call the step must not have made
	}{
		{"before its fence", false, StepFence, "fence on"},
		{"inside its window", true, StepSwitch, "backend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := bakingCutover(t, func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
			})
			p.Timeouts.Window = Duration(5 * time.Second)
			const gen = 7
			rj := &Journal{Version: 1, ID: "r", PlanHash: p.hash, State: StateRunning, GreenPIDs: map[string]int{}}
			if tc.fenced {
				rj.FenceGeneration, rj.FencedAt, rj.Done = gen, time.Now().UTC(), []StepRecord{{Step: StepFence}, {Step: StepDrain}}
			}
			r := resumedRollback(t, p, rj)
			var calls []string
			r.adm = memProxy(&admin.Status{Backend: strings.TrimSuffix(p.Green.APIServer.URL, "/"), Fenced: tc.fenced, Generation: gen}, &calls)
			i := slices.IndexFunc(r.steps, func(s step) bool { return s.name() == tc.step })
			_, err := r.steps[i].run(t.Context(), r)
			if err == nil || !strings.Contains(err.Error(), "/readyz") || slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, tc.not) }) {
				t.Fatalf("resumed rollback's %s with a blue apiserver that is not ready: %v (proxy asked %q); want it refused first", tc.step, err, calls)
			}
		})
	}
}

// TestRollbackFailingAfterTheBakeStoppedSaysResume: a rollback that fails once it has stopped
// the baking process (its journal cannot be written: a full or read-only disk) says how to keep
// blue in step again, 'cutover --resume': nothing does meanwhile, and a bare error left the
// operator with a bake nobody runs.
func TestRollbackFailingAfterTheBakeStoppedSaysResume(t *testing.T) {
	p, _ := bakingCutover(t, func(http.ResponseWriter, *http.Request) {})
	if err := os.WriteFile(filepath.Join(p.StateDir, "rollback"), nil, 0o600); err != nil { // not a dir
		t.Fatal(err)
	}
	_, err := Rollback(t.Context(), Options{Plan: p})
	if err == nil || !strings.Contains(err.Error(), "kubefence cutover --resume") {
		t.Fatalf("rollback failing after the bake stopped: %v; want the way to keep blue in step named", err)
	}
}

// TestRollbackAbortOnALastingMismatchSaysFinish: a rollback that aborts because blue no longer
// follows green change for change (a lasting error) advises 'cutover finish', not the usual
// 'cutover --resume' to keep blue following, which would fail the same way.
func TestRollbackAbortOnALastingMismatchSaysFinish(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("picking replication up: %w", replicate.ErrRevisionMismatch), "cutover finish"},
		{errors.New("drain missed the window"), "cutover --resume"},
	} {
		r := newBakeRollback(t)
		var calls []string
		r.adm = memProxy(&admin.Status{Backend: strings.TrimSuffix(r.p.Green.APIServer.URL, "/"), Generation: 3}, &calls)
		i := slices.IndexFunc(r.steps, func(s step) bool { return s.name() == StepFence })
		rep, _ := r.fail(t.Context(), r.steps[i], tc.err)
		if rep == nil || !strings.Contains(rep.Next, tc.want) {
			t.Errorf("%v: report %+v, want the advice %q", tc.err, rep, tc.want)
		}
	}
}

// TestFinishRefusesBeforeStoppingTheBake: what a finish can refuse (a proxy's admin credentials
// that do not load) it refuses before it asks the baking process to stop: after, nothing keeps
// blue in step, and 'cutover --resume' would fail the same way.
func TestFinishRefusesBeforeStoppingTheBake(t *testing.T) {
	p, _ := bakingCutover(t, func(http.ResponseWriter, *http.Request) {})
	missing := filepath.Join(t.TempDir(), "missing.crt")
	p.Proxies = []ProxyRef{{AdminAddress: "https://10.0.0.11:9446", CertFile: missing, KeyFile: missing, CAFile: missing}}
	exited := startBakingHolder(t.Context(), t, p.StateDir)
	if _, err := Finish(t.Context(), Options{Plan: p}); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Fatalf("finish with a proxy's credentials missing: %v", err)
	}
	stillBaking(t, exited)
}

// TestBakeBudgetOfAWindowThisRunOpened: a resumed run gives the bake's steps a whole window
// more only when the run that stopped had opened the window (its crash kept writes fenced). A
// run resumed before the fence opens the window itself: its bake steps keep the budget of any
// run, at least bakeStepFloor from now, not timeouts.window.
func TestBakeBudgetOfAWindowThisRunOpened(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fenced   bool // the journal the resume found had the fence
		wantMost time.Duration
	}{
		{"resumed before the fence", false, bakeStepFloor + time.Second},
		{"resumed inside the window", true, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			p.Timeouts.Window = Duration(time.Minute)
			if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			j := journalThrough(p, bakeSteps, StepVerify, time.Time{})
			if tc.fenced {
				j = journalThrough(p, bakeSteps, StepSwitch, time.Now().UTC().Add(-59*time.Second))
			}
			if err := j.save(p.StateDir); err != nil {
				t.Fatal(err)
			}
			r := (&runner{o: Options{Plan: p, Resume: true}, p: p, steps: bakeSteps}).forward()
			if err := r.openJournal(); err != nil {
				t.Fatal(err)
			}
			r.j.FencedAt = time.Now().UTC().Add(-59 * time.Second) // this run's fence, then drain and switch
			ctx, cancel := r.bakeContext(t.Context())
			defer cancel()
			dl, _ := ctx.Deadline()
			left := time.Until(dl)
			if tc.fenced && left < 30*time.Second {
				t.Errorf("%s left for a bake step after a resume inside the window; want a window more", left)
			}
			if !tc.fenced && left > tc.wantMost {
				t.Errorf("%s left for a bake step of a window this run opened; want at most %s", left, tc.wantMost)
			}
		})
	}
}

// TestBakeRidesOutAnOutage: the baking process keeps blue following green for days; an error
// that may pass (blue's etcd restarting, its host rebooting) is tried again, backing off, rather
// than end the process: once it has ended, green's apiserver compacts the history blue needs
// within minutes and the way back is lost. A lasting error (blue no longer green change for
// change, green compacted past blue) ends it at once; so does a signal, while it waits.
func TestBakeRidesOutAnOutage(t *testing.T) {
	was := bakeRetryBase
	bakeRetryBase = time.Millisecond
	t.Cleanup(func() { bakeRetryBase = was })
	blueDown := errors.New("dial tcp 10.0.0.1:2379: connect: connection refused")
	for _, tc := range []struct {
		name  string
		errs  []error // what each attempt to follow returns; then it follows until the signal
		tries int
		want  error
	}{
		{"blue down twice, then back", []error{blueDown, blueDown}, 3, nil},
		{"green compacted past blue", []error{blueDown, fmt.Errorf("picking replication up: %w", replicate.ErrCompacted)}, 2, replicate.ErrCompacted},
		{"no longer change for change", []error{replicate.ErrRevisionMismatch}, 1, replicate.ErrRevisionMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, signal := context.WithCancel(t.Context())
			defer signal()
			tries, notes := 0, 0
			once := func(ctx context.Context) error {
				if tries++; tries <= len(tc.errs) {
					return tc.errs[tries-1]
				}
				signal() // following, until 'cutover rollback' or 'finish' stops the process
				<-ctx.Done()
				return nil
			}
			err := followGreen(ctx, once, func(err error, _ time.Duration) { notes++ })
			if !errors.Is(err, tc.want) || err == nil && tc.want != nil || tries != tc.tries || notes != min(tries, len(tc.errs))-map[bool]int{true: 1}[tc.want != nil] {
				t.Errorf("followGreen = %v after %d tries, %d notes; want %v after %d tries, a note per error tried again", err, tries, notes, tc.want, tc.tries)
			}
		})
	}
	t.Run("a signal while it waits", func(t *testing.T) {
		bakeRetryBase = time.Hour
		ctx, signal := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- followGreen(ctx, func(context.Context) error { return blueDown }, func(error, time.Duration) { signal() })
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("signalled while waiting to try again: %v; want a clean stop", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the wait to try again did not end on the signal")
		}
	})
}

// resumedRollback is the runner of 'cutover rollback --resume' on the rollback journal rj
// (saved in the state dir's rollback/), the cutover rolling back.
func resumedRollback(t *testing.T, p *Plan, rj *Journal) *runner {
	t.Helper()
	if err := os.MkdirAll(p.StateDir+"/rollback", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := rj.save(p.StateDir + "/rollback"); err != nil {
		t.Fatal(err)
	}
	main := &Journal{ID: "x", State: StateRollingBack, PlanHash: p.hash, Bake: &BakeRecord{Revision: 5, Rollback: "r"}}
	r, err := newRollbackRunner(Options{Plan: p, Resume: true}, main)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestBakeDropsADeadReplicator: the replication the reverse-replication step started may stop
// before the bake begins (blue out of space as the held writes were released to green): each
// attempt of the baking process to keep blue following then found it stopped, and, not clearing
// it, never picked replication up again, however long it tried. An attempt that finds it
// stopped clears it, so that the next one picks up.
func TestBakeDropsADeadReplicator(t *testing.T) {
	cli := startTestEtcd(t)
	conn := func() *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: cli.Endpoints(), DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	src, dst := conn(), conn()
	rep, err := replicate.New(replicate.Config{Source: src, Dest: dst, FromRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	close(done)
	p := bakePlan(t)
	r := (&runner{o: Options{Plan: p}, p: p, j: &Journal{Bake: &BakeRecord{Revision: 1}}}).forward()
	r.repl = &replication{rep: rep, src: src, dst: dst, cancel: func() {}, done: done, err: errors.New("etcdserver: mvcc: database space exceeded")}
	if err := r.followOnce(t.Context()); err == nil || !strings.Contains(err.Error(), "space exceeded") {
		t.Fatalf("an attempt finding replication stopped: %v; want its error", err)
	}
	if r.repl != nil {
		t.Fatal("the stopped replication is kept: every later attempt finds it again instead of picking up")
	}
}

// TestResumedRollbackReadyAfterAFenceLifted: a rollback killed in its fence step, its fence then
// lifted by hand, is resumed later: no window is open (the fence step opens a fresh one), so
// the look at blue's apiserver is not bounded by the long-past window of the journaled fence,
// which failed it at once as "not ready" while blue served.
func TestResumedRollbackReadyAfterAFenceLifted(t *testing.T) {
	p, _ := bakingCutover(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	p.Timeouts.Window = Duration(5 * time.Second)
	rj := &Journal{Version: 1, ID: "r", PlanHash: p.hash, State: StateRunning, FencedAt: time.Now().UTC().Add(-time.Minute), GreenPIDs: map[string]int{}}
	r := resumedRollback(t, p, rj)
	var calls []string
	r.adm = memProxy(&admin.Status{Backend: strings.TrimSuffix(p.Green.APIServer.URL, "/"), Generation: 9}, &calls)
	if err := r.resumedRollbackReady(t.Context()); err != nil {
		t.Fatalf("blue ready, no fence held: %v", err)
	}
}
