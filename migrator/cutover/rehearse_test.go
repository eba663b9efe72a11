package cutover

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/testetcd"
	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// TestRehearsalPrediction: the predicted window adds up what the window does besides the drain
// — the writes in flight at the fence (blue's median latency), a journal save per step from the
// fence to the unfence and a state save per proxy change (fence, switch, unfence), the round
// trips — so that it is not a tenth of the window that follows (4 ms predicted against 94 ms
// in `make demo` before).
func TestRehearsalPrediction(t *testing.T) {
	if n := windowSteps(replicateSteps); n != 6 {
		t.Errorf("replicate: %d steps from the fence to the unfence, want 6 (fence, drain, switch, stop-replication, ungate-green, unfence)", n)
	}
	if n := windowSteps(bakeSteps); n != 7 {
		t.Errorf("bake: %d steps from the fence to the unfence, want 7 (fence, drain, switch, gate-blue, hand-over, ungate-green, unfence)", n)
	}
	cases := []struct {
		took []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{5 * time.Millisecond}, 5 * time.Millisecond},
		{[]time.Duration{40 * time.Millisecond, 2 * time.Millisecond, 9 * time.Millisecond, 600 * time.Millisecond, 7 * time.Millisecond}, 9 * time.Millisecond},
	}
	for _, tc := range cases {
		var ws []admin.ForwardedWrite
		for _, d := range tc.took {
			ws = append(ws, admin.ForwardedWrite{Took: admin.Duration(d)})
		}
		if got := medianTook(ws); got != tc.want {
			t.Errorf("median of %v: %s, want %s", tc.took, got, tc.want)
		}
	}
	m := Rehearsal{Barrier: 9 * time.Millisecond, Drain: 2 * time.Millisecond, Check: time.Millisecond, DeltaCheck: 5 * time.Millisecond, ProxyRoundTrip: time.Millisecond,
		EtcdRoundTrip: 4 * time.Millisecond, StateSave: 2 * time.Millisecond, WindowSteps: 6, WatchMove: 100 * time.Millisecond}
	m.predict()
	// The moved watches ask green once the fence has lifted: outside the window.
	if want := (9 + 2 + 1 + 5 + 3 + 4 + 9*2) * time.Millisecond; m.PredictedWindow != want {
		t.Errorf("predicted %s, want %s", m.PredictedWindow, want)
	}
	// A bake's window also gates blue and hands replication over.
	m.WindowSteps, m.GateRoundTrip, m.HandOver = 7, 3*time.Millisecond, 12*time.Millisecond
	m.predict()
	if want := (9 + 2 + 1 + 5 + 3 + 4 + 10*2 + 3 + 12) * time.Millisecond; m.PredictedWindow != want {
		t.Errorf("bake: predicted %s, want %s", m.PredictedWindow, want)
	}
	m.WatchMoveError = "forbidden"
	if got := m.WatchMoveText(); got != "not timed, left out (forbidden)" {
		t.Errorf("watch move %q, want it said as left out, with why", got)
	}
}

// TestRehearsalNamesWhatHostsStarted: a rehearsal tears down what it started; a green
// apiserver another host starts keeps running against a green that is gone, so the report
// says to stop it there, as an abort's does.
func TestRehearsalNamesWhatHostsStarted(t *testing.T) {
	p, _ := validPlan(t)
	p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://10.0.0.12:7443", Kubeconfig: p.Green.APIServer.Kubeconfig}}}
	var calls []string
	var stopped []int
	r := (&runner{o: Options{Plan: p, Rehearse: true}, p: p, adm: memProxy(&admin.Status{Backend: p.Blue.APIServer.URL}, &calls), procs: fakeProcesses(map[int]bool{}, &stopped), steps: replicateSteps}).forward()
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.openJournal(); err != nil {
		t.Fatal(err)
	}
	// The snapshot of blue (Secrets included) goes with green.
	if err := os.WriteFile(r.snapshotPath(), []byte("blue"), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := r.finishRehearsal()
	if err != nil || !strings.Contains(rep.Next, "green apiserver https://10.0.0.12:7443, which kubefence does not stop") {
		t.Fatalf("report %+v, %v: want it to name the green apiserver its host started", rep, err)
	}
	if strings.Contains(rep.Next, StepBlueAuth) {
		t.Errorf("a rehearsal without a bake says what it did not rehearse of one: %s", rep.Next)
	}
	// With a bake, the report says the one step before the fence it does not rehearse.
	p.Bake.Enabled = true
	if rep, err := r.finishRehearsal(); err != nil || !strings.Contains(rep.Next, "Not rehearsed: "+StepBlueAuth) {
		t.Fatalf("report %+v, %v: want it to say %s was not rehearsed", rep, err, StepBlueAuth)
	}
	if _, err := os.Stat(r.snapshotPath()); !os.IsNotExist(err) {
		t.Errorf("the rehearsal left blue's snapshot %s (%v)", r.snapshotPath(), err)
	}
	// What an interrupted snapshot or restore left goes too (blue's data, Secrets included).
	partial := []string{r.snapshotPath() + ".part", p.Green.Etcd.Members[0].DataDir + ".kubefence-part"}
	if err := os.WriteFile(partial[0], []byte("blue, half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(partial[1]+"/member", 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := r.finishRehearsal(); err != nil {
		t.Fatal(err)
	}
	for _, c := range partial {
		if _, err := os.Stat(c); !os.IsNotExist(err) {
			t.Errorf("the rehearsal left the partial copy %s (%v)", c, err)
		}
	}
}

// TestReportBounded: a proxy that accepts and never answers does not hold the report (and the
// state dir's lock) for ever.
func TestReportBounded(t *testing.T) {
	p, _ := validPlan(t)
	hang := funcProxy{status: func(ctx context.Context) (admin.Status, error) { <-ctx.Done(); return admin.Status{}, ctx.Err() }}
	r := (&runner{p: p, j: &Journal{ID: "x"}, adm: hang}).forward()
	done := make(chan struct{})
	go func() { r.report(ResultFailed, nil); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("report waited more than 20 s for a proxy that does not answer")
	}
}

// TestStoppedRehearsalIsNotResumed: a rehearsal killed partway leaves a running journal; a
// --resume of it (or a new run over it) must not go on as a real cutover (fence, switch): it
// is refused, naming the abort that tears it down.
func TestStoppedRehearsalIsNotResumed(t *testing.T) {
	for _, resume := range []bool{true, false} {
		w := newDecisionWorld(t, resume, "", false)
		j := &Journal{Version: 1, ID: "x", State: StateRunning, PlanHash: "plan-hash", Rehearse: true, Done: []StepRecord{{Step: StepPreflight}}}
		if err := j.save(w.r.p.StateDir); err != nil {
			t.Fatal(err)
		}
		if err := w.r.openJournal(); err == nil || !strings.Contains(err.Error(), "cutover abort") || !strings.Contains(err.Error(), "rehearsal") {
			t.Errorf("resume %v over a stopped rehearsal: %v; want it refused, naming the abort", resume, err)
		}
	}
}

// TestJournalOfANewerKubefence: a state or version this kubefence does not know is refused, not
// taken for a finished cutover (set aside, a new one started over a green that may serve).
func TestJournalOfANewerKubefence(t *testing.T) {
	for _, j := range []*Journal{
		{Version: 1, ID: "x", State: "promoting", PlanHash: "plan-hash"},
		{Version: 2, ID: "y", State: StateAborted, PlanHash: "plan-hash"},
	} {
		w := newDecisionWorld(t, false, "", false)
		if err := j.save(w.r.p.StateDir); err != nil {
			t.Fatal(err)
		}
		if err := w.r.openJournal(); err == nil || !strings.Contains(err.Error(), "newer kubefence") {
			t.Errorf("journal %+v: %v; want it refused as a newer kubefence's", j, err)
		}
	}
}

// TestRehearsalTimesTheBakeSteps: for a bake plan the rehearsal times gate-blue's auth request
// to blue etcd (whose apiserver's user does not exist yet: blue's auth is set up only by the
// cutover) and the hand-over's clients and leases list, and changes nothing in blue.
func TestRehearsalTimesTheBakeSteps(t *testing.T) {
	url := testetcd.Start(t).URL
	p := &Plan{StateDir: t.TempDir()}
	p.Blue.Etcd.Endpoints = []string{url}
	p.Blue.APIServer.EtcdUser = "kube-apiserver-etcd-client"
	p.Green.Etcd.Members = []GreenMember{{ClientURL: url}}
	r := &runner{p: p, from: p.blueSide(), to: p.greenSide()}
	defer r.closeAuthClients()
	m := Rehearsal{Check: time.Millisecond, StateSave: time.Millisecond}
	if err := r.measureBakeCosts(t.Context(), &m); err != nil {
		t.Fatal(err)
	}
	if m.GateRoundTrip <= 0 || m.HandOver <= m.Check+m.StateSave {
		t.Errorf("gate round trip %s, hand-over %s: want both timed", m.GateRoundTrip, m.HandOver)
	}
}

// TestRehearsalFailsWhatTheSwitchWouldRefuse: a rehearsal runs the switch's checks (green at
// blue's revision, applied by the replicator, and every change since the full verify the same in
// both histories) and fails when they fail, naming the difference, rather than report
// "rehearsed" for a cutover whose switch would refuse it inside the window. Here green is
// written directly once the drain step starts (blue quiet, or written too).
func TestRehearsalFailsWhatTheSwitchWouldRefuse(t *testing.T) {
	for _, tc := range []struct {
		name       string
		blueWrites bool
	}{{"blue quiet", false}, {"blue written too", true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newLiveWorld(t, rehearseSteps, replicate.Config{})
			put(t, w.blue, "a", "1") // replicated: both at revision 2
			w.caughtUpTo(t, 2)
			w.r.o.Emit = func(e Event) {
				if e.Type == EventStepStart && e.Step == StepRehearseDrain {
					put(t, w.green, "stray", "x")
					if tc.blueWrites {
						put(t, w.blue, "b", "1")
					}
				}
			}
			rep, err := w.r.run(t.Context())
			if err == nil || rep == nil || rep.Result == ResultRehearsed || !strings.Contains(rep.Error, "revision") || !strings.Contains(rep.Error, "green") {
				t.Fatalf("rehearsal over a green written directly: %+v, %v; want it failed, naming the difference", rep, err)
			}
			if strings.Contains(rep.Next, "without --rehearse when ready") {
				t.Errorf("a failed rehearsal advises the cutover: %s", rep.Next)
			}
			if len(w.calls) != 0 {
				t.Errorf("proxy calls %v, want none", w.calls)
			}
		})
	}
}

// TestRehearsalTeardownSaysWhatTheDeltaCheckFound: a difference found once the drain step is
// over (the delta check runs on until the teardown stops it) fails the rehearsal too.
func TestRehearsalTeardownSaysWhatTheDeltaCheckFound(t *testing.T) {
	w := newLiveWorld(t, rehearseSteps, replicate.Config{})
	put(t, w.blue, "a", "1")
	w.caughtUpTo(t, 2)
	put(t, w.green, "stray", "x")
	put(t, w.blue, "b", "1")
	check := w.r.repl.check
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return check.Err() != nil, nil
	}); err != nil {
		t.Fatal("the delta check found no difference")
	}
	rep, err := w.r.finishRehearsal()
	if err == nil || rep.Result != ResultFailed || !strings.Contains(rep.Error, "revision 3") || strings.Contains(rep.Next, "without --rehearse when ready") {
		t.Fatalf("teardown after the delta check found a difference: %+v, %v; want it failed, naming the revision", rep, err)
	}
}
