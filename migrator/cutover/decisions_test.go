package cutover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// funcProxy is a proxyAdmin made of functions.
type funcProxy struct {
	status     func(context.Context) (admin.Status, error)
	fence      func(context.Context, admin.FenceRequest) (admin.FenceResponse, error)
	setBackend func(context.Context, admin.BackendRequest) (admin.BackendResponse, error)
	// prepare is nil for a proxy from before admin.PrepareRequest: it answers 404.
	prepare func(context.Context, admin.PrepareRequest) (admin.PrepareResponse, error)
}

func (f funcProxy) Status(ctx context.Context) (admin.Status, error) { return f.status(ctx) }
func (f funcProxy) Fence(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
	return f.fence(ctx, req)
}
func (f funcProxy) SetBackend(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
	return f.setBackend(ctx, req)
}
func (f funcProxy) PrepareBackend(ctx context.Context, req admin.PrepareRequest) (admin.PrepareResponse, error) {
	if f.prepare == nil {
		return admin.PrepareResponse{}, &admin.APIError{Code: 404, Message: "404 page not found"}
	}
	return f.prepare(ctx, req)
}

// speaking is st as a proxy of this build reports it, unless st names a version (the tests of
// older proxies do).
func speaking(st admin.Status) admin.Status {
	if st.Version == "" {
		st.APILevel = admin.APILevel
	}
	return st
}

// unreachable is a proxy that does not answer.
func unreachable() funcProxy {
	refused := errors.New("connection refused")
	return funcProxy{
		status: func(context.Context) (admin.Status, error) { return admin.Status{}, refused },
		fence: func(context.Context, admin.FenceRequest) (admin.FenceResponse, error) {
			return admin.FenceResponse{}, refused
		},
		setBackend: func(context.Context, admin.BackendRequest) (admin.BackendResponse, error) {
			return admin.BackendResponse{}, refused
		},
	}
}

// memProxy is a funcProxy over st; calls lists the changes asked of it. A call on a context
// that has ended fails, as the admin client's does.
func memProxy(st *admin.Status, calls *[]string) funcProxy {
	return funcProxy{
		status: func(ctx context.Context) (admin.Status, error) { return speaking(*st), ctx.Err() },
		fence: func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
			if err := ctx.Err(); err != nil {
				return admin.FenceResponse{}, err
			}
			*calls = append(*calls, "fence "+map[bool]string{true: "on", false: "off"}[req.Fenced])
			if !req.Fenced && req.ExpectBackend != "" && sameURL(req.ExpectBackend) != sameURL(st.Backend) {
				return admin.FenceResponse{Status: *st}, fmt.Errorf("409: on %s, not %s", st.Backend, req.ExpectBackend)
			}
			st.Fenced = req.Fenced
			st.Generation++
			return admin.FenceResponse{Status: speaking(*st), Barrier: &admin.Barrier{Complete: true}}, nil
		},
		setBackend: func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
			if err := ctx.Err(); err != nil {
				return admin.BackendResponse{}, err
			}
			*calls = append(*calls, "backend "+req.URL)
			if req.ExpectGeneration != 0 && req.ExpectGeneration != st.Generation {
				return admin.BackendResponse{Status: *st}, fmt.Errorf("409: at generation %d, not %d", st.Generation, req.ExpectGeneration)
			}
			prev := st.Backend
			st.Backend = req.URL
			st.Generation++
			return admin.BackendResponse{Status: speaking(*st), Previous: prev}, nil
		},
	}
}

// fakeProcesses runs nothing: running is the set of live pids; stop ends one and records it.
func fakeProcesses(running map[int]bool, stopped *[]int) processes {
	return processes{
		start: func([]string, string) (int, error) { return 0, errors.New("fake: no processes started") },
		alive: func(pid int, _ []string) bool { return running[pid] },
		find:  func([]string) int { return 0 },
		stop: func(pid int, _ []string, _ time.Duration) {
			*stopped = append(*stopped, pid)
			delete(running, pid)
		},
	}
}

// fakeStep is a step that runs do and, with switches, points the proxy at green as the real
// switch does.
type fakeStep struct {
	n    string
	past bool
	do   func(ctx context.Context, r *runner) (string, error)
}

func (s fakeStep) name() string                                       { return s.n }
func (s fakeStep) describe(*runner, bool) string                      { return "fake " + s.n }
func (s fakeStep) timeout(*Plan) time.Duration                        { return time.Minute }
func (s fakeStep) pastNoReturn() bool                                 { return s.past }
func (s fakeStep) run(ctx context.Context, r *runner) (string, error) { return s.do(ctx, r) }

// decisionWorld is a runner over fakes: a proxy in memory, green processes 101 (etcd g0) and
// 102 (apiserver), and a copy of the real step table whose steps only record that they ran,
// except that fence and switch change the proxy (the switch as the real ones send it:
// sendSwitch), and the step named fail fails; a switch that fails with switched set reaches the
// proxy, whose answer is lost.
type decisionWorld struct {
	r       *runner
	st      *admin.Status
	calls   []string
	stopped []int
	ran     []string
	events  []Event
}

func newDecisionWorld(t *testing.T, resume bool, fail string, switched bool) *decisionWorld {
	t.Helper()
	p, _ := validPlan(t)
	p.hash = "plan-hash"
	w := &decisionWorld{st: &admin.Status{Backend: p.Blue.APIServer.URL, Generation: 1}}
	var table []step
	for _, s := range steps {
		name := s.name()
		table = append(table, fakeStep{n: name, past: s.pastNoReturn(), do: func(ctx context.Context, r *runner) (string, error) {
			w.ran = append(w.ran, name)
			r.j.GreenPIDs["g0"], r.j.GreenPIDs["apiserver"] = 101, 102
			switch {
			case name == StepFence:
				r.j.FencedAt = time.Now().UTC() // write-ahead, as the real step does
				resp, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: true})
				r.j.FenceGeneration = resp.Status.Generation
				return "", err
			case name == StepSwitch && (name != fail || switched):
				_, _, err := r.sendSwitch(ctx, admin.BackendRequest{URL: r.p.Green.APIServer.URL})
				return "", err
			case name == StepUnfence && name != fail:
				_, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: false})
				return "", err
			case name == fail:
				return "", errors.New(name + " broke")
			}
			return "", nil
		}})
	}
	px := memProxy(w.st, &w.calls)
	if fail == StepSwitch && switched { // the proxy switches, and its answer is lost
		inner := px.setBackend
		px.setBackend = func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
			if _, err := inner(ctx, req); err != nil {
				return admin.BackendResponse{}, err
			}
			return admin.BackendResponse{}, errors.New("the answer to backend set was lost")
		}
	}
	w.r = (&runner{
		o:     Options{Plan: p, Resume: resume, Emit: func(e Event) { w.events = append(w.events, e) }},
		p:     p,
		adm:   px,
		procs: fakeProcesses(map[int]bool{101: true, 102: true}, &w.stopped),
		steps: table,
	}).forward()
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *decisionWorld) eventTypes() []string {
	var out []string
	for _, e := range w.events {
		out = append(out, string(e.Type)+" "+e.Step)
	}
	return out
}

// TestFailureDecisions: what a failed step leads to. Before the point of no return: abort
// (green stopped, blue unfenced, journal aborted). From the switch on: abort only while the
// proxy still points at blue; once it points at green, the run stops with the journal still
// running and advice to --resume.
func TestFailureDecisions(t *testing.T) {
	cases := []struct {
		name        string
		fail        string
		switched    bool // the failing switch changed the proxy before it failed
		wantResult  string
		wantState   string
		wantStopped []int
		wantCalls   []string
		wantNext    string
	}{
		{"copy fails: abort", StepCopy, false, ResultAborted, StateAborted, []int{102, 101}, []string{"fence on", "fence off"}, "blue serves as before"},
		{"verify fails: abort", StepVerify, false, ResultAborted, StateAborted, []int{102, 101}, []string{"fence on", "fence off"}, "blue serves as before"},
		{"switch fails on blue: abort", StepSwitch, false, ResultAborted, StateAborted, []int{102, 101}, []string{"fence on", "fence off"}, "blue serves as before"},
		// The switch reached the proxy, its answer lost: looked at again, it is finished (the
		// run stopped with writes fenced on green until --resume).
		{"switch's answer lost after switching: finished", StepSwitch, true, ResultDone, StateDone, nil, []string{"fence on", "backend https://10.0.0.2:6443", "fence off"}, "green serves"},
		{"unfence fails: resume", StepUnfence, false, ResultFailed, StateRunning, nil, []string{"fence on", "backend https://10.0.0.2:6443"}, "--resume"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, false, tc.fail, tc.switched)
			if err := w.r.openJournal(); err != nil {
				t.Fatal(err)
			}
			rep, err := w.r.run(t.Context())
			if done := tc.wantResult == ResultDone; done != (err == nil) || !done && !strings.Contains(err.Error(), tc.fail+" broke") {
				t.Fatalf("error %v, want the step's (none when done)", err)
			}
			if rep.Result != tc.wantResult || !strings.Contains(rep.Next, tc.wantNext) {
				t.Errorf("report %s, next %q; want %s, %q", rep.Result, rep.Next, tc.wantResult, tc.wantNext)
			}
			if j, err := LoadJournal(w.r.p.StateDir); err != nil || j.State != tc.wantState {
				t.Errorf("journal %+v, %v; want state %s", j, err, tc.wantState)
			}
			if !slices.Equal(w.stopped, tc.wantStopped) {
				t.Errorf("stopped %v, want %v", w.stopped, tc.wantStopped)
			}
			if !slices.Equal(w.calls, tc.wantCalls) {
				t.Errorf("proxy calls %q, want %q", w.calls, tc.wantCalls)
			}
			if i := slices.Index(w.ran, tc.fail); i != len(w.ran)-1 && tc.wantResult != ResultDone {
				t.Errorf("steps run %v: want none after %s", w.ran, tc.fail)
			}
		})
	}
}

// TestAbortFailsAndSaysSo: an abort that cannot complete (the proxy does not answer) leaves the
// journal running and says to check and abort again, in the report and in the error the command
// ends with (it said "cutover aborted", the abort's failure only in the report).
func TestAbortFailsAndSaysSo(t *testing.T) {
	w := newDecisionWorld(t, false, StepCopy, false)
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	down := w.r.adm.(funcProxy)
	w.r.steps[stepIndex(t, StepCopy)] = fakeStep{n: StepCopy, do: func(context.Context, *runner) (string, error) {
		down.status = func(context.Context) (admin.Status, error) { return admin.Status{}, errors.New("connection refused") }
		down.fence = func(context.Context, admin.FenceRequest) (admin.FenceResponse, error) {
			return admin.FenceResponse{}, errors.New("connection refused")
		}
		w.r.adm = down
		return "", errors.New("copy broke")
	}}
	rep, err := w.r.run(t.Context())
	if err == nil || rep.Result != ResultFailed || !strings.Contains(rep.Error, "abort: unfence: connection refused") || !strings.Contains(rep.Next, "run 'kubefence cutover abort' again") {
		t.Fatalf("report %+v, err %v", rep, err)
	}
	if j, _ := LoadJournal(w.r.p.StateDir); j.State != StateRunning {
		t.Errorf("journal %s, want running", j.State)
	}
	if msg := err.Error(); strings.Contains(msg, "cutover aborted") || !strings.Contains(msg, "copy broke") || !strings.Contains(msg, "the abort did not complete") || !strings.Contains(msg, "connection refused") {
		t.Errorf("error %q: want the step's failure and the abort's, not 'aborted'", msg)
	}
}

// stepIndex is the index of the named step in the table.
func stepIndex(t *testing.T, name string) int {
	t.Helper()
	i := slices.Index(Steps, name)
	if i < 0 {
		t.Fatalf("no step %s", name)
	}
	return i
}

// TestResumeDecisions: which journals a run or a resume continues, and what a resume runs.
func TestResumeDecisions(t *testing.T) {
	cases := []struct {
		name     string
		journal  *Journal // nil: none
		resume   bool
		wantErr  string
		wantRan  []string
		wantSkip int
	}{
		{"resume after copy", &Journal{State: StateRunning, PlanHash: "plan-hash", Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}, {Step: StepCopy}}}, true, "",
			[]string{StepMigrate, StepGreenEtcd, StepGreenAPIServer, StepVerify, StepSwitch, StepUnfence}, 3},
		{"resume after the switch", &Journal{State: StateRunning, PlanHash: "plan-hash", Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}, {Step: StepCopy}, {Step: StepMigrate}, {Step: StepGreenEtcd}, {Step: StepGreenAPIServer}, {Step: StepVerify}, {Step: StepSwitch}}}, true, "",
			[]string{StepUnfence}, 8},
		{"fresh run", nil, false, "", Steps, 0},
		{"run over a running cutover", &Journal{State: StateRunning, PlanHash: "plan-hash"}, false, "--resume to continue", nil, 0},
		{"resume with another plan", &Journal{State: StateRunning, PlanHash: "other"}, true, "the plan changed", nil, 0},
		{"resume without a journal", nil, true, "nothing to resume: no journal", nil, 0},
		{"resume a finished cutover", &Journal{State: StateDone}, true, "nothing to resume: cutover x is done", nil, 0},
		{"run again after an abort", &Journal{State: StateAborted}, false, "", Steps, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, tc.resume, "", false)
			if tc.journal != nil {
				tc.journal.ID = "x"
				if err := tc.journal.save(w.r.p.StateDir); err != nil {
					t.Fatal(err)
				}
			}
			// The proxy as the interrupted run left it.
			if tc.journal != nil && tc.journal.done(StepFence) {
				w.st.Fenced = true
			}
			if tc.journal != nil && tc.journal.done(StepSwitch) {
				w.st.Backend = w.r.p.Green.APIServer.URL
			}
			err := w.r.openJournal()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rep, err := w.r.run(t.Context())
			if err != nil || rep.Result != ResultDone {
				t.Fatalf("report %+v, %v", rep, err)
			}
			if !slices.Equal(w.ran, tc.wantRan) {
				t.Errorf("ran %v, want %v", w.ran, tc.wantRan)
			}
			skips := 0
			for _, e := range w.events {
				if e.Type == EventStepSkip {
					skips++
				}
			}
			if skips != tc.wantSkip {
				t.Errorf("events %v: %d skips, want %d", w.eventTypes(), skips, tc.wantSkip)
			}
			if w.st.Fenced || w.st.Backend != w.r.p.Green.APIServer.URL {
				t.Errorf("proxy %+v, want open on green", *w.st)
			}
		})
	}
}

// TestAbortDecisions: `kubefence cutover abort` goes back to blue only while the proxy points
// at blue and the switch is not journaled.
func TestAbortDecisions(t *testing.T) {
	cases := []struct {
		name        string
		onGreen     bool
		done        []StepRecord
		state       string
		wantErr     string
		wantStopped []int
	}{
		{"before the switch", false, []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, StateRunning, "", []int{102, 101}},
		{"the proxy already points at green", true, []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, StateRunning, "the switch reached the proxy before it was journaled", nil},
		{"after the switch is journaled", true, []StepRecord{{Step: StepSwitch, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}, StateRunning, "switched to green at 2026-01-02T03:04:05Z", nil},
		// The refusal names the way that works from there: finish with --resume.
		{"after the switch, the way on", true, []StepRecord{{Step: StepSwitch}}, StateRunning, "'kubefence cutover --resume --plan PLAN'", nil},
		{"an aborted cutover", false, nil, StateAborted, "nothing to abort", nil},
		// A fence this run never placed (an operator's, around a rehearsal) stays on.
		{"a fence not this run's", false, []StepRecord{{Step: StepPreflight}, {Step: StepCopy}}, StateRunning, "", []int{102, 101}},
		{"a baking cutover", true, nil, StateBaking, "'kubefence cutover rollback' goes back to blue", nil},
		{"a rolling-back cutover", true, nil, StateRollingBack, "'kubefence cutover rollback --resume'", nil},
		// Green's processes are found by the command lines the plan gives: an edited plan
		// finds none, and the abort would report green stopped while it runs.
		{"the plan changed", false, []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, StateRunning, "the plan changed", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, false, "", false)
			w.st.Fenced = true
			if tc.onGreen {
				w.st.Backend = w.r.p.Green.APIServer.URL
			}
			hash := w.r.p.hash
			if tc.name == "the plan changed" {
				hash = "other-plan"
			}
			w.r.j = &Journal{ID: "x", State: tc.state, Done: tc.done, GreenPIDs: map[string]int{"g0": 101, "apiserver": 102}, PlanHash: hash}
			if slices.ContainsFunc(tc.done, func(s StepRecord) bool { return s.Step == StepFence }) {
				w.r.j.FencedAt = time.Now().UTC()
			}
			rep, err := w.r.abortByOperator(t.Context())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				if !w.st.Fenced || len(w.calls) > 0 {
					t.Errorf("a refused abort changed the proxy: %+v, calls %q", *w.st, w.calls)
				}
			} else if err != nil || rep.Result != ResultAborted || w.st.Fenced != w.r.j.FencedAt.IsZero() || w.r.j.State != StateAborted {
				t.Fatalf("report %+v, err %v, proxy %+v (want fenced only if the run never fenced), journal %s", rep, err, *w.st, w.r.j.State)
			}
			if !slices.Equal(w.stopped, tc.wantStopped) {
				t.Errorf("stopped %v, want %v", w.stopped, tc.wantStopped)
			}
		})
	}
}

// TestStepTable: every step of the table has a name of the journal's, a description in both
// forms and a positive timeout; names are unique, and the point of no return is the switch:
// every step from it on is past it, none before.
func TestStepTable(t *testing.T) {
	p, _ := validPlan(t)
	p.setDefaults()
	r := (&runner{p: p, j: &Journal{}}).forward()
	want := []string{"preflight", "fence", "copy", "migrate", "start-green-etcd", "start-green-apiserver", "verify", "switch", "unfence"}
	if !slices.Equal(Steps, want) {
		t.Fatalf("steps %v: the journal's names are %v (an old journal resumes by them)", Steps, want)
	}
	past := false
	for _, s := range steps {
		past = past || s.name() == StepSwitch
		if s.pastNoReturn() != past {
			t.Errorf("%s: pastNoReturn %v, want %v", s.name(), s.pastNoReturn(), past)
		}
		if s.describe(r, false) == "" || s.describe(r, true) == "" || s.timeout(p) <= 0 {
			t.Errorf("%s: description %q / %q, timeout %s", s.name(), s.describe(r, false), s.describe(r, true), s.timeout(p))
		}
	}
	sw := (switchStep{}).timeout(p)
	p.Timeouts.Unfence = Duration(7 * time.Second)
	if got := (unfenceStep{}).timeout(p); got != 7*time.Second || (switchStep{}).timeout(p) != sw {
		t.Errorf("unfence timeout %s, want its own (7s), the switch's staying %s", got, sw)
	}
}

// newFenceWorld is a decision world with the real fence step, whose proxy answers fence
// requests through fence, given the in-memory proxy to pass them on to.
func newFenceWorld(t *testing.T, fence func(inner funcProxy, ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error)) *decisionWorld {
	t.Helper()
	w := newDecisionWorld(t, false, "", false)
	for i, s := range w.r.steps {
		if s.name() == StepFence {
			w.r.steps[i] = fenceStep{}
		}
	}
	inner := memProxy(w.st, &w.calls)
	adm := inner
	adm.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
		return fence(inner, ctx, req)
	}
	w.r.adm = adm
	return w
}

// TestFencePreparesTheSwitch: a replicating cutover asks the proxies to prepare green's
// apiserver just before it fences (connections open before the window, not dialled by the
// switch inside it); a proxy that cannot (one from before the request) does not stop it, and
// the fence step says which it was.
func TestFencePreparesTheSwitch(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prepares   bool
		wantDetail string
	}{
		{"the proxy prepares", true, "connections to green's apiserver opened ahead of the switch (2,"},
		{"an older proxy", false, "connections to green's apiserver not opened ahead of the switch (404 page not found): the switch opens them"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newFenceWorld(t, func(inner funcProxy, ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
				return inner.fence(ctx, req)
			})
			w.r.p.Migration.Mode = ModeReplicate
			fp := w.r.adm.(funcProxy)
			if tc.prepares {
				fp.prepare = func(_ context.Context, req admin.PrepareRequest) (admin.PrepareResponse, error) {
					w.calls = append(w.calls, "prepare "+req.URL)
					return admin.PrepareResponse{Backend: req.URL, Connections: 2}, nil
				}
			}
			w.r.adm = fp
			if err := w.r.openJournal(); err != nil {
				t.Fatal(err)
			}
			rep, err := w.r.run(t.Context())
			if err != nil || rep.Result != ResultDone {
				t.Fatalf("report %+v, %v", rep, err)
			}
			want := []string{"fence on", "backend " + w.r.p.Green.APIServer.URL}
			if tc.prepares {
				want = append([]string{"prepare " + w.r.p.Green.APIServer.URL}, want...)
			}
			if !slices.Equal(w.calls[:len(want)], want) {
				t.Fatalf("proxy calls %q, want them to begin %q", w.calls, want)
			}
			rec, _ := w.r.j.record(StepFence)
			if !strings.Contains(rec.Detail, tc.wantDetail) {
				t.Fatalf("fence step: %q, want it to say %q", rec.Detail, tc.wantDetail)
			}
		})
	}
}

// TestReportKeepsTheFenceBarrier: the time the fence waited for the writes admitted before it
// (the slowest proxy's) is journaled and reported, so that a window can be split into blue's
// own write latency and kubefence's steps. A cutover done removes blue's snapshot from the
// state dir (a copy of blue's data, Secrets included, needed no more past the switch), and
// says so; cleanup, which removed it, refuses a cutover done.
func TestReportKeepsTheFenceBarrier(t *testing.T) {
	w := newFenceWorld(t, func(inner funcProxy, ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
		resp, err := inner.fence(ctx, req)
		if req.Fenced {
			resp.Barrier.Waited = admin.Duration(12 * time.Millisecond)
		}
		return resp, err
	})
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.r.snapshotPath(), []byte("blue"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(w.r.memberCopyPath(), "member", "snap"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(w.r.memberCopyPath(), "member", "snap"), "db", "blue")
	rep, err := w.r.run(t.Context())
	if err != nil || rep.Result != ResultDone {
		t.Fatalf("report %+v, %v", rep, err)
	}
	for _, c := range []string{w.r.snapshotPath(), w.r.memberCopyPath()} {
		if _, err := os.Stat(c); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(rep.Next, c) {
			t.Errorf("blue's copy %s after a cutover done: %v; next %q: want it removed, and said", c, err, rep.Next)
		}
	}
	for _, rec := range rep.Steps {
		if strings.Contains(rec.Detail, "by hand") {
			t.Errorf("step %s of a run nobody touched: %s", rec.Step, rec.Detail)
		}
	}
	// Green for good: what the operator still has to change (runbook), not only blue to stop.
	for _, want := range []string{"--upstream", "what starts the control plane"} {
		if !strings.Contains(rep.Next, want) {
			t.Errorf("the done report's next step %q does not say %q", rep.Next, want)
		}
	}
	if rep.FenceBarrier != 12*time.Millisecond {
		t.Errorf("report's fence barrier %s, want 12ms", rep.FenceBarrier)
	}
	j, err := LoadJournal(w.r.p.StateDir)
	if err != nil || j.FenceBarrier != 12*time.Millisecond {
		t.Errorf("journal's fence barrier %v (%v), want 12ms", j, err)
	}
}

// TestFenceJournaledBeforeItIsSent: the journal on disk says a fence may be on before the
// proxies get the request. A run killed after the proxies fenced but before the fence step was
// journaled must not resume as if nothing were fenced: not rebuild green from a new snapshot
// (minutes with writes fenced) and not start the window's budget again.
func TestFenceJournaledBeforeItIsSent(t *testing.T) {
	var onDisk *Journal
	var w *decisionWorld
	w = newFenceWorld(t, func(inner funcProxy, ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
		if req.Fenced && onDisk == nil {
			j, err := LoadJournal(w.r.p.StateDir)
			if err != nil {
				t.Fatal(err)
			}
			onDisk = j
		}
		return inner.fence(ctx, req)
	})
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	rep, err := w.r.run(t.Context())
	if err != nil || rep.Result != ResultDone {
		t.Fatalf("report %+v, %v", rep, err)
	}
	if onDisk == nil {
		t.Fatal("the proxy was never fenced")
	}
	if onDisk.FencedAt.IsZero() || onDisk.FencedAt.Before(before.Add(-time.Second)) {
		t.Fatalf("journal on disk when the fence request arrived: fencedAt %v, want the time the fence was about to be sent", onDisk.FencedAt)
	}
	if final, err := LoadJournal(w.r.p.StateDir); err != nil || onDisk.FencedAt.After(final.FencedAt) {
		t.Errorf("fencedAt journaled before the request %v, after it %v (%v): the window's budget must count from no later than the real fence", onDisk.FencedAt, final, err)
	}
	// A resume of that journal is inside a window: compacted history aborts, it does not rebuild.
	w.r.j = onDisk
	w.r.p.Migration.Mode = ModeReplicate
	if w.r.rebuildable(fmt.Errorf("replication: %w", replicate.ErrCompacted)) {
		t.Error("a run killed after the fence request would rebuild green with writes fenced")
	}
}

// TestOldJournalKept: a new cutover over an ended one keeps the old journal beside it, and
// refuses to start when it could not (its place taken: a rename that fails would have the new
// journal overwrite it).
func TestOldJournalKept(t *testing.T) {
	for _, blocked := range []bool{false, true} {
		t.Run(fmt.Sprintf("rename blocked %v", blocked), func(t *testing.T) {
			w := newDecisionWorld(t, false, "", false)
			dir := w.r.p.StateDir
			if err := (&Journal{ID: "x", State: StateAborted, PlanHash: "plan-hash"}).save(dir); err != nil {
				t.Fatal(err)
			}
			kept := filepath.Join(dir, "journal-x.json")
			if blocked { // a non-empty directory where the old journal goes: even root cannot rename over it
				if err := os.MkdirAll(filepath.Join(kept, "keep"), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			err := w.r.openJournal()
			if blocked {
				if err == nil || !strings.Contains(err.Error(), "journal-x.json") {
					t.Fatalf("error %v, want a refusal naming where the old journal goes", err)
				}
				if j, lerr := LoadJournal(dir); lerr != nil || j.ID != "x" {
					t.Fatalf("the old journal was overwritten: %+v, %v", j, lerr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Moved aside at the new run's first save, once its preflight passed
			// (TestRunKilledInItsPreflightKeepsTheOldJournal).
			if err := w.r.saveJournal(); err != nil {
				t.Fatal(err)
			}
			if j, lerr := LoadJournal(dir); lerr != nil || j.ID == "x" {
				t.Fatalf("new journal %+v, %v", j, lerr)
			}
			if _, err := os.Stat(kept); err != nil {
				t.Fatalf("old journal not kept: %v", err)
			}
		})
	}
}

// TestFenceJournaledButNeverSent: a run that journaled the fence and died before any proxy got
// it left no window: the resumed fence step starts one afresh (its budget from the new fence),
// rather than fence writes only for a drain that is already past the budget.
func TestFenceJournaledButNeverSent(t *testing.T) {
	w := newFenceWorld(t, func(inner funcProxy, ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
		return inner.fence(ctx, req)
	})
	w.r.o.Resume = true
	stale := time.Now().Add(-time.Hour).UTC()
	j := &Journal{ID: "x", State: StateRunning, PlanHash: "plan-hash", FencedAt: stale, RefusedAtFence: 9,
		Done: []StepRecord{{Step: StepPreflight}}}
	if err := j.save(w.r.p.StateDir); err != nil {
		t.Fatal(err)
	}
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := w.r.run(t.Context())
	if err != nil || rep.Result != ResultDone {
		t.Fatalf("report %+v, %v", rep, err)
	}
	if final, err := LoadJournal(w.r.p.StateDir); err != nil || final.FencedAt.Before(start) || final.RefusedAtFence != 0 {
		t.Errorf("journal after the resume: %+v, %v; want the fence journaled afresh", final, err)
	}
	// The window is this run's own: its bake steps get no window more, and a change by hand
	// during it is counted (resumedFenced).
	if w.r.resumedFenced {
		t.Error("the run that fenced afresh still counts as resumed inside a window")
	}
}

// TestPreflightFailureChangesNothing: the preflight changes nothing, so its failure must not
// abort: a proxy fenced by someone else stays fenced, and processes with green's command line
// (another run of the same plan, say) are not stopped.
func TestPreflightFailureChangesNothing(t *testing.T) {
	p, _ := validPlan(t)
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Generation: 3, Fenced: true, Reason: "someone else's"}
	var calls []string
	var stopped []int
	procs := fakeProcesses(map[int]bool{555: true}, &stopped)
	procs.find = func([]string) int { return 555 }
	r := (&runner{o: Options{Plan: p}, p: p, adm: memProxy(st, &calls), procs: procs, steps: replicateSteps}).forward()
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.openJournal(); err != nil {
		t.Fatal(err)
	}
	rep, err := r.fail(t.Context(), preflightStep{}, errors.New("the proxy is fenced"))
	if err == nil || !strings.Contains(rep.Next, "nothing was changed") {
		t.Fatalf("report %+v, %v: want a failure saying nothing was changed", rep, err)
	}
	if len(calls) > 0 || len(stopped) > 0 || !st.Fenced {
		t.Fatalf("proxy calls %v, stopped %v, fenced %v: want none, none, still fenced", calls, stopped, st.Fenced)
	}
}

// TestAbortUnfencesBeforeGreenStops: in the fenced copy too, an abort opens writes on blue
// before it stops green (up to 30 s of grace per process, and a green apiserver whose etcd
// failed is the slow kind): blue serves either way, and writes must not wait for green.
func TestAbortUnfencesBeforeGreenStops(t *testing.T) {
	w := newDecisionWorld(t, false, StepVerify, false)
	stop := w.r.procs.stop
	w.r.procs.stop = func(pid int, argv []string, grace time.Duration) {
		w.calls = append(w.calls, fmt.Sprintf("stop %d", pid))
		stop(pid, argv, grace)
	}
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	rep, _ := w.r.run(t.Context())
	if rep == nil || rep.Result != ResultAborted {
		t.Fatalf("report %+v, want an abort", rep)
	}
	want := []string{"fence on", "fence off", "stop 102", "stop 101"}
	if !slices.Equal(w.calls, want) {
		t.Fatalf("calls %q, want %q: writes were fenced while green was stopped", w.calls, want)
	}
}

// TestAnInterruptedAbortIsFinishedByAbort: an abort journals that it is under way before it
// changes anything, so a run killed partway through it (green stopped, "aborted" not yet
// saved) is not resumed as a cutover whose steps would wait for a green nobody restarts:
// --resume and a new run refuse and name 'cutover abort', status says so, and the abort
// finishes with the first reason kept.
func TestAnInterruptedAbortIsFinishedByAbort(t *testing.T) {
	w := newDecisionWorld(t, false, StepVerify, false)
	stop := w.r.procs.stop
	var atStop *Journal
	w.r.procs.stop = func(pid int, argv []string, grace time.Duration) {
		if atStop == nil {
			atStop, _ = LoadJournal(w.r.p.StateDir)
		}
		stop(pid, argv, grace)
	}
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	if rep, _ := w.r.run(t.Context()); rep == nil || rep.Result != ResultAborted {
		t.Fatalf("report %+v, want an abort", rep)
	}
	if atStop == nil || atStop.State != StateRunning || !strings.Contains(atStop.AbortReason, "step verify failed") {
		t.Fatalf("journal when green was stopped: %+v, want running with the abort's reason", atStop)
	}
	// What a kill -9 at that moment leaves behind.
	if err := atStop.save(w.r.p.StateDir); err != nil {
		t.Fatal(err)
	}
	for _, resume := range []bool{true, false} {
		again := newDecisionWorld(t, resume, "", false)
		again.r.p, again.r.o.Plan = w.r.p, w.r.p
		again.r.forward()
		err := again.r.openJournal()
		if err == nil || !strings.Contains(err.Error(), "going back to blue") || !strings.Contains(err.Error(), "cutover abort") {
			t.Errorf("resume=%v: %v, want a refusal naming 'cutover abort'", resume, err)
		}
	}
	st, err := Status(t.Context(), w.r.p)
	if err != nil || st.Aborting == "" {
		t.Errorf("status %+v, %v: want the abort under way", st, err)
	}
	j, err := LoadJournal(w.r.p.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	fin := newDecisionWorld(t, false, "", false)
	fin.r.p, fin.r.o.Plan, fin.r.j = w.r.p, w.r.p, j
	fin.r.forward()
	if _, err := fin.r.abortByOperator(t.Context()); err != nil {
		t.Fatal(err)
	}
	j, _ = LoadJournal(w.r.p.StateDir)
	if j.State != StateAborted || !strings.HasPrefix(j.AbortReason, "step verify failed") {
		t.Errorf("journal %s, reason %q: want aborted with the first reason", j.State, j.AbortReason)
	}
}

// TestRebuildNamesExternalLearners: rebuilding green from a new snapshot makes a new green
// cluster; an external learner's host still runs the member that joined the old one, which
// kubefence neither stops nor empties. The rebuild's note says so, naming it.
func TestRebuildNamesExternalLearners(t *testing.T) {
	w := newDecisionWorld(t, false, "", false)
	m := w.r.p.Green.Etcd.Members[0]
	m.Name, m.Learner, m.External = "far", true, true
	w.r.p.Green.Etcd.Members = append(w.r.p.Green.Etcd.Members, m)
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	if err := w.r.rebuildGreen(errors.New("compacted")); err != nil {
		t.Fatal(err)
	}
	var note string
	for _, e := range w.events {
		if e.Type == EventNote && strings.Contains(e.Detail, "rebuilding green") {
			note = e.Detail
		}
	}
	if !strings.Contains(note, "far") || !strings.Contains(note, "empty its data dir") {
		t.Fatalf("rebuild note %q: want it to name the external learner far and say to empty its data dir", note)
	}
}

// TestAbortFinishesWithTheProxyFencedOnGreen: a switch whose answer was lost while the proxies
// then went away leaves them fenced on green with no switch journaled; the run's abort found no
// proxy, stopped green and could not unfence. With the abort journaled as under way, --resume
// is refused, so 'cutover abort' must finish it. In mode replicate green is blue, revision for
// revision, and its apiserver was gated: the proxies go back to blue and writes open there (one
// open on green, gated, took no write: it is fenced again first). Not in a mode that restored
// green with revisions above blue's, which clients reading through the proxies may have seen;
// nor without an abort under way (a switch before a crash: --resume finishes it).
func TestAbortFinishesWithTheProxyFencedOnGreen(t *testing.T) {
	cases := []struct {
		name      string
		replicate bool
		aborting  bool
		bOpen     bool // proxy b unfenced on green
		want      string
	}{
		{"replicating, both fenced on green", true, true, false, ""},
		{"replicating, one open on green", true, true, true, ""},
		{"a copy with revisions bumped", false, true, false, "revisions above blue's"},
		{"no abort under way", true, false, false, "--resume"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, false, "", false)
			if tc.replicate {
				w.r.p.Migration.Mode = ModeReplicate
				gatedGreen(t, w.r)
			}
			green, blue := w.r.p.Green.APIServer.URL, w.r.p.Blue.APIServer.URL
			w.st.Backend, w.st.Fenced = green, true
			var callsB []string
			stB := &admin.Status{Backend: green, Fenced: !tc.bOpen, Generation: 5}
			w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: memProxy(w.st, &w.calls)}, {Name: "b", Client: memProxy(stB, &callsB)}}}
			w.r.j = &Journal{Version: 1, ID: "x", PlanHash: "plan-hash", State: StateRunning, PIDsWriteAhead: true,
				FencedAt: time.Now().UTC(), Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, GreenPIDs: map[string]int{}}
			if tc.aborting {
				w.r.j.AbortReason = "step switch failed: the answer to backend set was lost"
			}
			if err := w.r.saveJournal(); err != nil {
				t.Fatal(err)
			}
			_, err := w.r.abortByOperator(t.Context())
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("abort: %v, want a refusal naming %q", err, tc.want)
				}
				if w.st.Backend != green || !w.st.Fenced {
					t.Errorf("proxy a %+v after the refusal: want it left fenced on green", *w.st)
				}
				return
			}
			if err != nil {
				t.Fatalf("abort: %v", err)
			}
			for name, st := range map[string]*admin.Status{"a": w.st, "b": stB} {
				if st.Fenced || sameURL(st.Backend) != sameURL(blue) {
					t.Errorf("proxy %s %+v, want open on blue", name, *st)
				}
			}
			if tc.bOpen && !strings.HasPrefix(strings.Join(callsB, ","), "fence on") {
				t.Errorf("proxy b was asked %q; want it fenced again first", callsB)
			}
			if j, _ := LoadJournal(w.r.p.StateDir); j.State != StateAborted {
				t.Errorf("journal %s, want aborted", j.State)
			}
		})
	}
}

// fencedBeforeSwitch gives w the proxies a (w.st), b and c, and a running journal fenced (at
// generation 15) whose switch is not journaled, with abortReason; with resume, every step
// before the switch is done and the real steps run from there.
func (w *decisionWorld) fencedBeforeSwitch(t *testing.T, resume bool, abortReason string, b, c proxyAdmin) {
	t.Helper()
	w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: memProxy(w.st, &w.calls)}, {Name: "b", Client: b}, {Name: "c", Client: c}}}
	w.r.j = &Journal{Version: 1, ID: "x", PlanHash: "plan-hash", State: StateRunning, PIDsWriteAhead: true, FenceGeneration: 15, AbortReason: abortReason,
		FencedAt: time.Now().UTC(), Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, GreenPIDs: map[string]int{"g0": 101, "apiserver": 102}}
	if resume {
		w.r.j.Done, w.r.steps = nil, steps
		for _, s := range Steps[:slices.Index(Steps, StepSwitch)] {
			w.r.j.Done = append(w.r.j.Done, StepRecord{Step: s})
		}
	}
	if err := w.r.saveJournal(); err != nil {
		t.Fatal(err)
	}
}

// TestNoWayBackOnceTheSwitchReachedAProxy: the switch reached proxies a (and b) before it was
// journaled (a kill -9 in the middle of it, or after it), and proxy c does not answer, or
// answers on blue. What the proxies that answer report decides, as with every proxy
// answering: a proxy on green means clients may have read green (in a copy, revisions above
// blue's), so neither 'cutover abort' nor a resume puts a proxy back on blue or opens one; the
// advice names the way on.
func TestNoWayBackOnceTheSwitchReachedAProxy(t *testing.T) {
	cases := []struct {
		name      string
		replicate bool
		aborting  bool
		cDown     bool // c does not answer; else c is fenced on blue, a and b on green
		resume    bool // a resume (the real steps from the switch on); else 'cutover abort'
		want      []string
		not       string
	}{
		{"c down, a copy, an abort under way", false, true, true, false, []string{"revisions above blue's"}, ""},
		{"c down, a copy, no abort under way", false, false, true, false, []string{"--resume", "proxy c"}, ""},
		{"c down, replicating, no abort under way", true, false, true, false, []string{"--resume", "proxy c"}, ""},
		{"c down, a resume", false, false, true, true, []string{"proxy c", "--resume", "fence off --expect-backend"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, tc.resume, "", false)
			if tc.replicate {
				w.r.p.Migration.Mode = ModeReplicate
			}
			green, blue := w.r.p.Green.APIServer.URL, w.r.p.Blue.APIServer.URL
			// Each proxy was at generation 4 before the fence, 5 after it; the switch makes 6.
			*w.st = admin.Status{Backend: green, Fenced: true, Generation: 6}
			stB, stC := &admin.Status{Backend: green, Fenced: true, Generation: 6}, &admin.Status{Backend: blue, Fenced: true, Generation: 5}
			var callsB, callsC []string
			c := memProxy(stC, &callsC)
			if tc.cDown {
				c = unreachable()
			}
			reason := ""
			if tc.aborting {
				reason = "step switch failed: the answer to backend set was lost"
			}
			w.fencedBeforeSwitch(t, tc.resume, reason, memProxy(stB, &callsB), c)
			var got string
			if tc.resume {
				rep, err := w.r.run(t.Context())
				if err == nil || rep == nil || rep.Result != ResultFailed {
					t.Fatalf("resume: report %+v, %v; want it failed, not aborted", rep, err)
				}
				got = err.Error() + "; next: " + rep.Next
			} else {
				_, err := w.r.abortByOperator(t.Context())
				if err == nil {
					t.Fatal("abort: went back to blue")
				}
				got = err.Error()
			}
			t.Log(got)
			for _, s := range tc.want {
				if !strings.Contains(got, s) {
					t.Errorf("%q lacks %q", got, s)
				}
			}
			if tc.not != "" && strings.Contains(got, tc.not) {
				t.Errorf("%q has %q", got, tc.not)
			}
			if len(w.calls)+len(callsB)+len(callsC) > 0 || w.st.Backend != green || stB.Backend != green || !w.st.Fenced || !stB.Fenced || !stC.Fenced || len(w.stopped) > 0 {
				t.Errorf("proxies a %+v (%q), b %+v (%q), c %+v (%q), green stopped %v: want them left as they were, green running", *w.st, w.calls, *stB, callsB, *stC, callsC, w.stopped)
			}
			if j, _ := LoadJournal(w.r.p.StateDir); j.State != StateRunning || j.AbortReason != w.r.j.AbortReason {
				t.Errorf("journal %s, abort reason %q: want it running, with no new abort", j.State, j.AbortReason)
			}
		})
	}
}

// TestAbortPutsTheOneProxyBack: the plan's one proxy (no group) fenced on green with an abort
// under way in mode replicate (a switch whose answer was lost): the abort puts it back on blue
// before it unfences it, as it does a group's proxies; the unfence expecting blue would fail
// on green.
func TestAbortPutsTheOneProxyBack(t *testing.T) {
	w := newDecisionWorld(t, false, "", false)
	w.r.p.Migration.Mode = ModeReplicate
	green, blue := w.r.p.Green.APIServer.URL, w.r.p.Blue.APIServer.URL
	*w.st = admin.Status{Backend: green, Fenced: true, Generation: 6}
	w.r.j = &Journal{Version: 1, ID: "x", PlanHash: "plan-hash", State: StateRunning, PIDsWriteAhead: true, AbortReason: "step switch failed: the answer to backend set was lost",
		FencedAt: time.Now().UTC(), Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, GreenPIDs: map[string]int{}}
	if err := w.r.saveJournal(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.r.abortByOperator(t.Context()); err != nil {
		t.Fatalf("abort: %v (proxy asked %q)", err, w.calls)
	}
	if w.st.Fenced || sameURL(w.st.Backend) != sameURL(blue) {
		t.Errorf("proxy %+v (asked %q), want it open on blue", *w.st, w.calls)
	}
}

// TestAbortAgainAfterItsUnfence: an abort that unfenced and journaled it, then could not finish
// (a green process that would not stop), is run again: its fence is lifted already. A proxy
// fenced now is someone else's (an operator's 'fence on' since) and stays fenced; one that does
// not answer has no fence of this cutover's to lift and does not keep the abort from ending.
func TestAbortAgainAfterItsUnfence(t *testing.T) {
	for _, down := range []bool{false, true} {
		w := newDecisionWorld(t, false, "", false)
		blue := w.r.p.Blue.APIServer.URL
		*w.st = admin.Status{Backend: blue, Fenced: true, Generation: 9, Reason: "operator"}
		if down {
			w.st.Fenced = false
			w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: memProxy(w.st, &w.calls)}, {Name: "b", Client: unreachable()}}}
		}
		fenced := time.Now().UTC().Add(-time.Minute)
		w.r.j = &Journal{Version: 1, ID: "x", PlanHash: "plan-hash", State: StateRunning, PIDsWriteAhead: true, AbortReason: "step verify failed",
			FencedAt: fenced, UnfencedAt: fenced.Add(time.Second), Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, GreenPIDs: map[string]int{}}
		if err := w.r.saveJournal(); err != nil {
			t.Fatal(err)
		}
		if _, err := w.r.abortByOperator(t.Context()); err != nil {
			t.Errorf("down %v: abort again: %v (proxy asked %q)", down, err, w.calls)
		}
		if len(w.calls) > 0 || w.st.Fenced != !down {
			t.Errorf("down %v: proxy %+v, asked %q; want it left as it is", down, *w.st, w.calls)
		}
		if j, _ := LoadJournal(w.r.p.StateDir); j.State != StateAborted {
			t.Errorf("down %v: journal %s, want aborted", down, j.State)
		}
	}
}

// TestUnfenceSaysWhichResumesGreenEnded: watches the switch resumed on green but green then
// ended at once (410: their resourceVersion older than its watch cache) are not reported as
// going on: the unfence says how many, and that their clients relist.
func TestUnfenceSaysWhichResumesGreenEnded(t *testing.T) {
	for _, tc := range []struct {
		ended, pending int64
		// pastExpiry: watches green answered 410 whose lists (pending again once none was)
		// let the proxy resume them from where green's cache begins.
		pastExpiry int64
		want       string
	}{
		{0, 0, 0, ""},
		{3, 0, 0, "; 3 watch(es) resumed on green were then ended by it"},
		// Watches the switch moved still wait for green's answer when writes reopen: the step
		// waits for them (after the window) before it counts.
		{3, 2, 0, "; 3 watch(es) resumed on green were then ended by it"},
		{3, 2, 2, "; 3 watch(es) resumed on green were then ended by it (refused, or their resourceVersion older than its apiserver's watch cache and their collection not shown unchanged since: those clients relist); 2 watch(es) green answered 410 (their resourceVersion older than its watch cache) resumed from where that cache begins"},
		{0, 1, 1, "; 1 watch(es) green answered 410 (their resourceVersion older than its watch cache) resumed from where that cache begins"},
	} {
		p := replicatePlan(t)
		if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		var calls []string
		st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, ResumedThenEnded: max(0, tc.ended-tc.pending), ResumesPending: tc.pending}
		adm := memProxy(st, &calls)
		status := adm.status
		proofs, listing := tc.pastExpiry, false
		adm.status = func(ctx context.Context) (admin.Status, error) {
			switch {
			case st.Fenced: // the unfence's look at the proxies before it opens them
			case st.ResumesPending > 0 && !listing: // green answers one more at each look
				st.ResumesPending--
				if st.ResumedThenEnded < tc.ended {
					st.ResumedThenEnded++
				}
			case st.ResumesPending > 0: // a proxy's lists end
				st.ResumesPending--
				st.ResumedPastExpiry++
			case proofs > 0: // they start after none waited
				st.ResumesPending, proofs, listing = proofs, 0, true
			}
			return status(ctx)
		}
		r := (&runner{o: Options{Plan: p}, p: p, j: &Journal{FencedAt: time.Now()}, adm: adm}).forward()
		detail, err := unfenceStep{}.run(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		if tc.want == "" && strings.Contains(detail, "resumed") || !strings.Contains(detail, tc.want) ||
			tc.pastExpiry == 0 && strings.Contains(detail, "answered 410") {
			t.Errorf("%d ended, %d past the expiry: unfence detail %q; want %q", tc.ended, tc.pastExpiry, detail, tc.want)
		}
	}
}

// TestUnfenceNoticesAHandMadeChange: a fence lifted by hand after the switch (the switch itself
// refuses one made before it) opened writes before green's apiserver could write; the unfence
// says the proxies changed more often than the cutover changed them, and that its window
// ends later than writes reopened. A run resumed inside the window, which may repeat a change,
// says nothing; nor does one resumed after an unfence that was journaled (killed while it
// waited for the moved watches): it sends the fence off again, and keeps the window's end
// journaled then.
func TestUnfenceNoticesAHandMadeChange(t *testing.T) {
	for _, tc := range []struct {
		name         string
		byHand       bool
		resume, want bool
		// journaled: an earlier run of the step unfenced (generation 12) and journaled it.
		journaled bool
		// fencedSince: an operator fenced the proxy after that (generation 13): it stays fenced.
		fencedSince bool
	}{
		{"nothing by hand", false, false, false, false, false},
		{"fence off by hand", true, false, true, false, false},
		{"resumed inside the window", true, true, false, false, false},
		{"resumed after the unfence was journaled", true, true, false, true, false},
		{"fenced by hand after the unfence was journaled", true, true, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := replicatePlan(t)
			var calls []string
			st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 11} // fenced at 10, switched: 11
			if tc.byHand {
				st.Fenced, st.Generation = false, 12
			}
			if tc.fencedSince {
				st.Fenced, st.Generation = true, 13
			}
			fenced := time.Now().Add(-time.Minute)
			j := &Journal{FencedAt: fenced, FenceGeneration: 10}
			if tc.journaled {
				j.UnfencedAt, j.UnfenceGeneration = fenced.Add(50*time.Millisecond), 12
			}
			r := (&runner{o: Options{Plan: p, Resume: tc.resume}, p: p, j: j, adm: memProxy(st, &calls), resumedFenced: tc.resume && !tc.journaled}).forward()
			detail, err := unfenceStep{}.run(t.Context(), r)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(detail, "by hand"); got != tc.want {
				t.Errorf("unfence detail %q: says a change by hand: %v, want %v", detail, got, tc.want)
			}
			if tc.journaled && (!r.j.UnfencedAt.Equal(fenced.Add(50*time.Millisecond)) || !strings.Contains(detail, "window 50ms")) {
				t.Errorf("unfence detail %q, journaled end %s: want the window journaled first (50ms) kept", detail, r.j.UnfencedAt.Sub(fenced))
			}
			if tc.journaled && (len(calls) > 0 || st.Fenced != tc.fencedSince) {
				t.Errorf("proxy %+v, asked %q: an unfence every proxy acknowledged is not sent again (a fence on since is someone else's)", *st, calls)
			}
		})
	}
}
