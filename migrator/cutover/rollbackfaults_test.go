package cutover

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// rollbackPastItsSwitch is a rollback's runner (budgetPlan: blue etcd answers, green's does not)
// journaled, on disk too, through its switch: one proxy in memory, fenced on blue at the
// switch's generation.
func rollbackPastItsSwitch(t *testing.T) (*runner, *admin.Status) {
	t.Helper()
	p := budgetPlan(t, "blue")
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	main := &Journal{Version: 1, ID: "x", State: StateBaking, PlanHash: p.hash, Bake: &BakeRecord{Revision: 5}, GreenPIDs: map[string]int{}}
	if err := main.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	r, err := newRollbackRunner(Options{Plan: p}, main)
	if err != nil {
		t.Fatal(err)
	}
	r.j.Done = []StepRecord{{Step: StepFence}, {Step: StepDrain}, {Step: StepSwitch}}
	r.j.FencedAt, r.j.FenceGeneration = time.Now().UTC(), 2
	if err := r.saveJournal(); err != nil {
		t.Fatal(err)
	}
	var calls []string
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 3}
	r.adm = memProxy(st, &calls)
	return r, st
}

// TestRollbackJournalLostPastItsSwitchFinishes: a rollback whose journal cannot be written from
// its switch on (a full disk, EIO; here its journal dir replaced by a file: ENOTDIR, as root
// too) does not stop with every proxy fenced on blue, blue's apiserver gated: the window's last
// steps are safe to repeat, so it finishes, writes open on blue, and its report says loudly that
// the journal was not written and what to do. Once the dir is writable again, 'rollback
// --resume' on the journal as last written finishes the journal, the proxy left open on blue.
func TestRollbackJournalLostPastItsSwitchFinishes(t *testing.T) {
	for _, at := range []string{StepGateGreen, StepUnfence} {
		t.Run("from "+at, func(t *testing.T) {
			r, st := rollbackPastItsSwitch(t)
			var onDisk []byte
			breakDir := func() {
				if onDisk != nil {
					return
				}
				var err error
				if onDisk, err = os.ReadFile(journalPath(r.journalDir)); err != nil {
					t.Fatal(err)
				}
				if err := os.RemoveAll(r.journalDir); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(r.journalDir, []byte("not a dir"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if at == StepGateGreen {
				breakDir()
			}
			px := r.adm.(funcProxy)
			fence := px.fence
			px.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
				if !req.Fenced {
					breakDir()
				}
				return fence(ctx, req)
			}
			r.adm = px
			rep, err := r.rollBack(t.Context())
			if st.Fenced || sameURL(st.Backend) != sameURL(r.p.Blue.APIServer.URL) {
				t.Fatalf("rollback: %v; proxy %+v: want open on blue", err, *st)
			}
			if rep == nil || err == nil {
				t.Fatalf("report %+v, %v: want a report, and an error saying the journal was not written", rep, err)
			}
			said := rep.Error + " " + rep.Next
			// Green's etcd does not answer (budgetPlan): gate-green failed, and the report says
			// green's apiserver was not gated on this path too.
			for _, want := range []string{"journal", "not a directory", "writes are open on blue", "rollback --resume", "Green's apiserver was NOT gated"} {
				if !strings.Contains(said, want) {
					t.Errorf("report %s: %q; want %q", rep.Result, said, want)
				}
			}
			if rep.Result != ResultRolledBack || rep.WriteUnavailability == 0 {
				t.Errorf("report %s, window %s: want rolled-back, the window measured", rep.Result, rep.WriteUnavailability)
			}
			resumeRollbackOnceWritable(t, r, onDisk)
		})
	}
}

// resumeRollbackOnceWritable does what the report of a rollback whose journal could not be
// written says: its dir fixed, its journal as last written (onDisk), 'rollback --resume'
// finishes it, the proxy left open on blue.
func resumeRollbackOnceWritable(t *testing.T, r *runner, onDisk []byte) {
	t.Helper()
	if err := os.Remove(r.journalDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(r.journalDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(journalPath(r.journalDir), onDisk, 0o600); err != nil {
		t.Fatal(err)
	}
	main, err := LoadJournal(r.p.StateDir)
	if err != nil || main.State != StateRollingBack {
		t.Fatalf("the cutover's journal %+v, %v: want it rolling back still", main, err)
	}
	again, err := newRollbackRunner(Options{Plan: r.p, Resume: true}, main)
	if err != nil {
		t.Fatal(err)
	}
	again.adm = r.adm
	rep, err := again.rollBack(t.Context())
	if err != nil || rep.Result != ResultRolledBack {
		t.Fatalf("rollback --resume once the dir is writable: %+v, %v", rep, err)
	}
	st, err := again.adm.Status(t.Context())
	if err != nil || st.Fenced || sameURL(st.Backend) != sameURL(r.p.Blue.APIServer.URL) {
		t.Errorf("proxy after the resume %+v, %v: want open on blue", st, err)
	}
	if j, err := LoadJournal(filepath.Join(r.p.StateDir, "rollback")); err != nil || j.State != StateDone {
		t.Errorf("rollback journal %+v, %v: want done", j, err)
	}
}

// silentRollbackWorld is a rollback (newBakeRollback) fenced and drained on green over two
// proxies: a, in memory, fenced on green at the journaled generation, and b, which takes calls
// and never answers (hanging). opened is when a's fence was lifted (zero until then); looks
// counts b's status calls since failed was set.
type silentRollbackWorld struct {
	r      *runner
	a      *admin.Status
	failed time.Time
	opened time.Time
	looks  int
}

func newSilentRollbackWorld(t *testing.T) *silentRollbackWorld {
	t.Helper()
	w := &silentRollbackWorld{r: newBakeRollback(t)}
	w.r.j.Done = []StepRecord{{Step: StepFence}, {Step: StepDrain}}
	w.r.j.FencedAt, w.r.j.FenceGeneration = time.Now().UTC(), 2
	w.a = &admin.Status{Backend: greenURLOf(w.r), Fenced: true, Generation: 2}
	var calls []string
	a := memProxy(w.a, &calls)
	fence := a.fence
	a.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
		resp, err := fence(ctx, req)
		if !req.Fenced && err == nil {
			w.opened = time.Now()
		}
		return resp, err
	}
	b := hanging()
	hangs := b.status
	b.status = func(ctx context.Context) (admin.Status, error) {
		if !w.failed.IsZero() && w.opened.IsZero() {
			w.looks++
		}
		return hangs(ctx)
	}
	w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: a}, {Name: "b", Client: b}}}
	return w
}

// failSwitch runs the rollback's switch step, which fails (b does not answer its status), and
// fail after it, as the walk does.
func (w *silentRollbackWorld) failSwitch(t *testing.T) (*Report, error) {
	t.Helper()
	s := tableStep(t, w.r.steps, StepSwitch)
	_, err := s.run(t.Context(), w.r)
	if err == nil {
		t.Fatal("the rollback's switch went on with proxy b silent")
	}
	w.failed = time.Now()
	return w.r.fail(t.Context(), s, err)
}

// TestRollbackSwitchFailureWaitsForASilentProxyOnce: a rollback's switch that fails because one
// of two proxies takes calls and never answers goes back to green with the silent proxy waited
// for once after the failure (one statusAnswerTimeout: fail's look, handed to the rollback's
// abort), not again by the abort's own look while the other proxy holds writes: it opens on
// green right after that one wait.
func TestRollbackSwitchFailureWaitsForASilentProxyOnce(t *testing.T) {
	const d = 200 * time.Millisecond
	shortProxyAnswers(t, d)
	w := newSilentRollbackWorld(t)
	_, _ = w.failSwitch(t)
	if w.a.Fenced || sameURL(w.a.Backend) != sameURL(w.r.p.Green.APIServer.URL) || w.opened.IsZero() {
		t.Fatalf("proxy a %+v: want open on green", *w.a)
	}
	if w.looks != 1 {
		t.Errorf("proxy b was asked its status %d times between the switch's failure and proxy a's unfence; one wait for a silent proxy is enough", w.looks)
	}
	if took := w.opened.Sub(w.failed); took > 2*d {
		t.Errorf("proxy a opened %s after the switch failed (a status answer is due within %s)", took, d)
	}
}

// TestRolledBackReportSaysWhetherGreenIsGated: a rollback's report says green's apiserver may
// only read green etcd only when gate-green gated it. A gate that could not be done within the
// window's budget (green etcd not answering) is gone past (writes are not kept fenced for it),
// and then the report says green's apiserver may still write green etcd, and how to stop it,
// instead of the read-only the docs promise.
func TestRolledBackReportSaysWhetherGreenIsGated(t *testing.T) {
	for _, tc := range []struct {
		name      string
		runner    func(t *testing.T) *runner
		want, not string
	}{
		{"gated", func(t *testing.T) *runner { r, _ := gateWorld(t, StepGateGreen); return r }, "may only read green etcd", "NOT gated"},
		{"green etcd down", func(t *testing.T) *runner { r, _ := rollbackPastItsSwitch(t); return r }, "NOT gated", "may only read green etcd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.runner(t)
			rep, err := r.rollBack(t.Context())
			if err != nil || rep.Result != ResultRolledBack {
				t.Fatalf("rollback: %+v, %v", rep, err)
			}
			if !strings.Contains(rep.Next, tc.want) || strings.Contains(rep.Next, tc.not) {
				t.Errorf("report's next %q: want %q, not %q", rep.Next, tc.want, tc.not)
			}
		})
	}
}

// TestRollbackAbortWithASilentProxyLetsBlueFollow: a rollback's abort (its switch failed) that
// one silent proxy does not acknowledge reopens the others on green, where they take writes. It
// left the cutover 'rolling-back', which 'cutover --resume' refuses, so nothing could keep blue
// following green until that proxy answered again, and the advice named no deadline: once green's
// apiserver compacts, the way back is gone. The abort now ends the rollback all the same (the
// cutover bakes again, the proxy journaled as still fenced, named by status), and the report says
// to resume the bake within the pick-up horizon and how to reopen the silent proxy on green once
// it answers.
func TestRollbackAbortWithASilentProxyLetsBlueFollow(t *testing.T) {
	shortProxyAnswers(t, 200*time.Millisecond)
	w := newSilentRollbackWorld(t)
	rep, err := w.failSwitch(t)
	if err == nil || rep == nil || w.a.Fenced {
		t.Fatalf("report %+v, %v, proxy a %+v: want the abort incomplete, a open on green", rep, err, *w.a)
	}
	for _, want := range []string{PickupHorizon, "kubefence cutover --resume", "proxy b", "fence off --expect-backend " + greenURLOf(w.r)} {
		if !strings.Contains(rep.Next, want) {
			t.Errorf("report's next %q: want %q", rep.Next, want)
		}
	}
	main, err := LoadJournal(w.r.p.StateDir)
	if err != nil || main.State != StateBaking {
		t.Fatalf("the cutover's journal %+v, %v: want it baking, for 'cutover --resume' to keep blue following", main, err)
	}
	st, err := Status(t.Context(), w.r.p)
	if err != nil || !slices.Equal(st.StillFenced, []string{"b"}) {
		t.Errorf("status %+v, %v: want proxy b named as still fenced", st, err)
	}
}

// TestResumedRollbackPastItsWindowNamesTheBudget: a rollback resumed inside its window (fenced
// and drained by the run that stopped) whose window's budget is already spent goes back to
// green, rightly, but says why: the budget, not blue's apiserver, which serves. The look at
// blue's /readyz ran once on the expired context and blamed blue ("not ready: context deadline
// exceeded").
func TestResumedRollbackPastItsWindowNamesTheBudget(t *testing.T) {
	p, _ := bakingCutover(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	p.Timeouts.Window = Duration(5 * time.Second)
	const gen = 7
	rj := &Journal{Version: 1, ID: "r", PlanHash: p.hash, State: StateRunning, GreenPIDs: map[string]int{},
		FenceGeneration: gen, FencedAt: time.Now().UTC().Add(-time.Hour), Done: []StepRecord{{Step: StepFence}, {Step: StepDrain}}}
	r := resumedRollback(t, p, rj)
	var calls []string
	r.adm = memProxy(&admin.Status{Backend: strings.TrimSuffix(p.Green.APIServer.URL, "/"), Fenced: true, Generation: gen}, &calls)
	_, err := tableStep(t, r.steps, StepSwitch).run(t.Context(), r)
	if err == nil || !strings.Contains(err.Error(), "timeouts.window 5s") || strings.Contains(err.Error(), "not ready") || slices.Contains(calls, "backend "+p.Blue.APIServer.URL) {
		t.Fatalf("resumed switch an hour past its fence, blue ready: %v (proxy asked %q); want it refused naming the window's budget", err, calls)
	}
}

// startSlowStoppingBake starts this test binary as a baking process holding stateDir's lock that
// takes SIGTERM as a bake does and is slow to stop (TestMain); stopping is closed once it says it
// got the signal.
func startSlowStoppingBake(t *testing.T, stateDir string) (stopping chan struct{}) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "KUBEFENCE_TEST_BAKING_HOLDER="+stateDir, "KUBEFENCE_TEST_SLOW_STOP=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewReader(out)
	if line, _ := lines.ReadString('\n'); line != "holding\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper said %q", line)
	}
	stopping = make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		if line, _ := lines.ReadString('\n'); line == "stopping\n" {
			close(stopping)
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-read; _ = cmd.Wait() })
	return stopping
}

// TestInterruptedWhileTheBakeStopsSaysResume: a rollback or finish that asked the baking process
// to stop (SIGTERM) and is interrupted (Ctrl-C) while it waits for it returned only "did not stop
// within a minute of SIGTERM: context canceled", although the bake is stopping and nothing will
// keep blue in step with green: the error now says the bake was asked to stop and how to keep
// blue following ('cutover --resume', within the pick-up horizon).
func TestInterruptedWhileTheBakeStopsSaysResume(t *testing.T) {
	for name, cmd := range map[string]func(context.Context, Options) (*Report, error){"rollback": Rollback, "finish": Finish} {
		t.Run(name, func(t *testing.T) {
			p, _ := bakingCutover(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
			stopping := startSlowStoppingBake(t, p.StateDir)
			ctx, interrupt := context.WithCancel(t.Context())
			defer interrupt()
			go func() {
				select {
				case <-stopping:
					interrupt() // Ctrl-C while the bake stops
				case <-ctx.Done():
				}
			}()
			_, err := cmd(ctx, Options{Plan: p})
			if err == nil || !strings.Contains(err.Error(), "SIGTERM") || !strings.Contains(err.Error(), "kubefence cutover --resume") || !strings.Contains(err.Error(), PickupHorizon) {
				t.Fatalf("%s interrupted while the bake stops: %v; want it to say the bake was asked to stop and to resume it in time", name, err)
			}
		})
	}
}

// TestRollbackAbortWithASilentProxyAndItsJournalLost: the same abort whose rollback journal
// cannot be written (its dir replaced by a file) still marked the cutover baking (the cutover's
// journal sits in the state dir): the advice is the bake's to resume, not 'rollback --resume',
// which refuses a baking cutover.
func TestRollbackAbortWithASilentProxyAndItsJournalLost(t *testing.T) {
	shortProxyAnswers(t, 200*time.Millisecond)
	w := newSilentRollbackWorld(t)
	if err := os.RemoveAll(w.r.journalDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.r.journalDir, []byte("not a dir"), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := w.failSwitch(t)
	if err == nil || rep == nil || w.a.Fenced {
		t.Fatalf("report %+v, %v, proxy a %+v: want the abort incomplete, a open on green", rep, err, *w.a)
	}
	main, lerr := LoadJournal(w.r.p.StateDir)
	if lerr != nil || main.State != StateBaking {
		t.Fatalf("the cutover's journal %+v, %v: want it baking", main, lerr)
	}
	if !strings.Contains(rep.Next, "kubefence cutover --resume") || strings.Contains(rep.Next, "rollback --resume") || !strings.Contains(rep.Error, "not a directory") {
		t.Errorf("report: error %q, next %q; want the bake to resume, and the journal's error said", rep.Error, rep.Next)
	}
}

// TestFinishRefusedWhileTheRollbackAbortLeftAProxyFenced: after a rollback's abort that left
// proxy b fenced (silent; b8eefb6 ends such an abort back to the bake), 'cutover finish' does not
// end the bake reporting that green serves while nothing would ever name b again: it refuses,
// naming b and how to reopen it, and status still names it.
func TestFinishRefusedWhileTheRollbackAbortLeftAProxyFenced(t *testing.T) {
	shortProxyAnswers(t, 200*time.Millisecond)
	w := newSilentRollbackWorld(t)
	// The plan names the two proxies by their sockets (b's answers nobody: silent since).
	p, dir := w.r.p, t.TempDir()
	a, b := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	p.Proxies = []ProxyRef{{AdminSocket: a}, {AdminSocket: b}}
	g := w.r.adm.(*proxyGroup)
	g.proxies[0].Name, g.proxies[1].Name = a, b
	if _, err := w.failSwitch(t); err == nil {
		t.Fatal("the rollback's abort completed with proxy b silent")
	}
	rep, err := Finish(t.Context(), Options{Plan: p})
	if err == nil || !strings.Contains(err.Error(), b) || !strings.Contains(err.Error(), "fence off") {
		t.Errorf("finish: %+v, %v; want it refused, naming proxy b and how to reopen it", rep, err)
	}
	st, err := Status(t.Context(), p)
	if err != nil || st.State != StateBaking || !slices.Equal(st.StillFenced, []string{b}) {
		t.Errorf("status after finish %+v, %v: want baking, proxy b named as still fenced", st, err)
	}
}

// breakDirAt replaces dir by a file (ENOTDIR on every write into it, as root too).
func breakDirAt(t *testing.T, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a dir"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRollbackAdviceFollowsTheCutoversJournal: when only the rollback's own journal (rollback/)
// cannot be written, the advice follows what the cutover's journal says, which decides: after an
// abort that reopened every proxy on green (the cutover baking again) it is 'cutover --resume',
// not 'rollback --resume' (which refuses a baking cutover: nothing to resume); at the end of a
// rollback (the cutover rolled back) it says the rollback is done and what its journal lacks.
func TestRollbackAdviceFollowsTheCutoversJournal(t *testing.T) {
	t.Run("abort", func(t *testing.T) {
		r := newBakeRollback(t)
		r.j.Done = []StepRecord{{Step: StepFence}, {Step: StepDrain}}
		r.j.FencedAt, r.j.FenceGeneration = time.Now().UTC(), 2
		var calls []string
		st := &admin.Status{Backend: greenURLOf(r), Fenced: true, Generation: 2}
		px := memProxy(st, &calls)
		fence := px.fence
		px.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
			if !req.Fenced {
				breakDirAt(t, r.journalDir)
			}
			return fence(ctx, req)
		}
		r.adm = px
		rep, err := r.fail(t.Context(), tableStep(t, r.steps, StepSwitch), errors.New("switch: refused"))
		if err == nil || rep == nil || st.Fenced {
			t.Fatalf("report %+v, %v, proxy %+v: want a failure, the proxy open on green", rep, err, *st)
		}
		if main, lerr := LoadJournal(r.p.StateDir); lerr != nil || main.State != StateBaking {
			t.Fatalf("the cutover's journal %+v, %v: want it baking", main, lerr)
		}
		if !strings.Contains(rep.Next, "kubefence cutover --resume") || strings.Contains(rep.Next, "rollback --resume") || !strings.Contains(rep.Error, "not a directory") {
			t.Errorf("report: error %q, next %q; want the bake to resume, and the journal's error said", rep.Error, rep.Next)
		}
	})
	t.Run("end", func(t *testing.T) {
		r := newBakeRollback(t)
		for _, s := range rollbackSteps {
			r.j.Done = append(r.j.Done, StepRecord{Step: s.name()})
		}
		now := time.Now().UTC()
		r.j.FencedAt, r.j.UnfencedAt = now.Add(-time.Second), now
		var calls []string
		r.adm = memProxy(&admin.Status{Backend: r.p.Blue.APIServer.URL}, &calls)
		breakDirAt(t, r.journalDir)
		rep, _ := r.rollBack(t.Context())
		if main, lerr := LoadJournal(r.p.StateDir); lerr != nil || main.State != StateRolledBack {
			t.Fatalf("the cutover's journal %+v, %v: want it rolled back", main, lerr)
		}
		if rep == nil || rep.Result != ResultRolledBack || strings.Contains(rep.Next, "rollback --resume") || !strings.Contains(rep.Next, "rolled back") || !strings.Contains(rep.Error+rep.Next, "not a directory") {
			t.Errorf("report %+v: want rolled back, the rollback's journal's error, no 'rollback --resume'", rep)
		}
	})
}
