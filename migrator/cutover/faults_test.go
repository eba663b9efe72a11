package cutover

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// hanging is a proxy that takes every call and never answers (its disk stalled in an fsync, its
// process stopped, its host gone without a reset): each call returns only when its context ends,
// as the admin client does.
func hanging() funcProxy {
	wait := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	return funcProxy{
		status: func(ctx context.Context) (admin.Status, error) { return admin.Status{}, wait(ctx) },
		fence: func(ctx context.Context, _ admin.FenceRequest) (admin.FenceResponse, error) {
			return admin.FenceResponse{}, wait(ctx)
		},
		setBackend: func(ctx context.Context, _ admin.BackendRequest) (admin.BackendResponse, error) {
			return admin.BackendResponse{}, wait(ctx)
		},
	}
}

// shortProxyAnswers makes one proxy's answer due within d for the test.
func shortProxyAnswers(t *testing.T, d time.Duration) {
	t.Helper()
	was, wasStatus, wasSlack := proxyAnswerTimeout, statusAnswerTimeout, switchSlack
	proxyAnswerTimeout, statusAnswerTimeout, switchSlack = d, d, d
	t.Cleanup(func() { proxyAnswerTimeout, statusAnswerTimeout, switchSlack = was, wasStatus, wasSlack })
}

// TestPartialSwitchGoesBackAfterATimeout: a switch that one proxy never answers, until the
// switch's own time is up, still puts the proxies that switched back on blue (the switch back
// ran on the expired context and failed at once, leaving them on green).
func TestPartialSwitchGoesBackAfterATimeout(t *testing.T) {
	shortProxyAnswers(t, 200*time.Millisecond)
	g, sts, _ := threeProxies(-1)
	for _, s := range sts {
		s.Fenced = true
	}
	g.proxies[1].Client = hanging()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := g.SetBackend(ctx, admin.BackendRequest{URL: greenURL})
	if err == nil || !strings.Contains(err.Error(), "proxy b") {
		t.Fatalf("partial switch: %v", err)
	}
	for _, i := range []int{0, 2} {
		if sts[i].Backend != blueURL {
			t.Errorf("proxy %d left on %s after a switch another proxy never answered", i, sts[i].Backend)
		}
	}
}

// TestAbortOpensTheOthersWhileAProxyHangs: an abort with one of two proxies taking calls and
// never answering still opens the other on blue, within a bound, and names the silent one (it
// spent the whole abort asking the silent proxy where it was, then unfenced on an expired
// context; an operator's abort, with no deadline, never ended).
func TestAbortOpensTheOthersWhileAProxyHangs(t *testing.T) {
	shortProxyAnswers(t, 200*time.Millisecond)
	w := newDecisionWorld(t, false, "", false)
	w.st.Fenced = true
	w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: w.r.adm}, {Name: "b", Client: hanging()}}}
	w.r.j = &Journal{ID: "x", State: StateRunning, Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, GreenPIDs: map[string]int{"g0": 101, "apiserver": 102}, PlanHash: w.r.p.hash, FencedAt: time.Now().UTC()}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := w.r.abortByOperator(ctx)
	if err == nil || !strings.Contains(err.Error(), "proxy b") {
		t.Fatalf("abort with proxy b silent: %v; want it incomplete, naming proxy b", err)
	}
	if w.st.Fenced || w.st.Backend != w.r.p.Blue.APIServer.URL {
		t.Fatalf("proxy a %+v after %s: want open on blue", *w.st, time.Since(start))
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the abort took %s with one proxy silent", took)
	}
}

// TestFenceStepBoundedWhileAProxyHangs: the fence step waits for a proxy that never answers
// only as long as the barrier may take and an answer after it, not its whole step timeout
// (minutes, with every other proxy holding or refusing writes all along).
func TestFenceStepBoundedWhileAProxyHangs(t *testing.T) {
	shortProxyAnswers(t, 200*time.Millisecond)
	w := newDecisionWorld(t, false, "", false)
	w.r.p.Proxy.WaitTimeout = Duration(300 * time.Millisecond)
	w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: w.r.adm}, {Name: "b", Client: hanging()}}}
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := fenceStep{}.run(ctx, w.r)
	if err == nil || !strings.Contains(err.Error(), "proxy b") {
		t.Fatalf("fence with proxy b silent: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the fence step waited %s for a silent proxy (barrier 300ms, answer 200ms)", took)
	}
}

// TestReplicatingFenceBoundedByTheWindow: in mode replicate the fence is part of the window's
// budget (timeouts.window, which bounds the barrier too): a proxy that never answers the fence
// (its status it does)
// fails the step once the budget is spent and a moment for an answer, not after the barrier and
// a whole proxyAnswerTimeout more (15 s with the defaults, three times a 5 s window) while every
// other proxy refuses or holds writes.
func TestReplicatingFenceBoundedByTheWindow(t *testing.T) {
	w := newDecisionWorld(t, false, "", false)
	w.r.p.Migration.Mode = ModeReplicate
	w.r.p.Timeouts.Window, w.r.p.Proxy.WaitTimeout = Duration(300*time.Millisecond), Duration(time.Minute)
	var callsB []string
	b := memProxy(&admin.Status{Backend: w.st.Backend, Generation: 1}, &callsB)
	b.fence = hanging().fence // it answers its status, and never its fence
	w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: w.r.adm}, {Name: "b", Client: b}}}
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	start := time.Now()
	_, err := fenceStep{}.run(ctx, w.r)
	if err == nil || !strings.Contains(err.Error(), "proxy b") {
		t.Fatalf("fence with proxy b silent: %v", err)
	}
	if took, bound := time.Since(start), 300*time.Millisecond+fenceAnswerSlack; took > bound+time.Second {
		t.Errorf("the fence step waited %s for a silent proxy (window 300ms, an answer %s after it)", took, fenceAnswerSlack)
	}
}

// TestUnfenceLooksAtEveryProxyFirst: past the switch, a proxy that restarted without its state
// file is put right before any proxy opens: fenced on blue (--start-fenced), it is switched to
// green and opened with the others; open on blue, writes through it reach an etcd nothing
// follows any more, and no proxy is opened on green beside it (both sides would take writes).
func TestUnfenceLooksAtEveryProxyFirst(t *testing.T) {
	for _, tc := range []struct {
		name         string
		bFenced      bool
		bOnGreen     string // b's backend as it reports it, when on green
		wantErr      string
		wantOpen     bool
		wantBOnGreen bool
	}{
		{"restarted fenced on blue", true, "", "", true, true},
		{"restarted open on blue", false, "", "proxy b", false, false},
		// A --resume after a partial unfence: b open on green already, its URL as its
		// --upstream gives it (a trailing /): not "open elsewhere".
		{"open on green already", false, "/", "", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, false, "", false)
			green := w.r.p.Green.APIServer.URL
			w.st.Backend, w.st.Fenced, w.st.Generation = green, true, 7
			var callsB []string
			stB := &admin.Status{Backend: w.r.p.Blue.APIServer.URL, Fenced: tc.bFenced}
			if tc.bOnGreen != "" {
				stB.Backend = strings.TrimSuffix(green, "/") + tc.bOnGreen
			}
			w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: w.r.adm}, {Name: "b", Client: memProxy(stB, &callsB)}}}
			w.r.j = &Journal{ID: "x", State: StateRunning, GreenPIDs: map[string]int{}, PlanHash: w.r.p.hash, FencedAt: time.Now().UTC(), FenceGeneration: 6}
			_, err := unfenceStep{}.run(t.Context(), w.r)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("unfence: %v, want error %q", err, tc.wantErr)
			}
			if w.st.Fenced == tc.wantOpen {
				t.Errorf("proxy a fenced %v, want open %v", w.st.Fenced, tc.wantOpen)
			}
			if (sameURL(stB.Backend) == sameURL(green)) != tc.wantBOnGreen || tc.wantOpen && stB.Fenced {
				t.Errorf("proxy b %+v", *stB)
			}
		})
	}
}

// TestFenceStepNamesTheWritesStillRunning: a barrier left incomplete on one of several proxies
// fails the fence step naming that proxy and each write still running there (invariant 2: it
// says which), not only how many.
func TestFenceStepNamesTheWritesStillRunning(t *testing.T) {
	w := newDecisionWorld(t, false, "", false)
	var callsB []string
	stB := &admin.Status{Backend: w.st.Backend}
	b := memProxy(stB, &callsB)
	fence := b.fence
	b.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
		resp, err := fence(ctx, req)
		resp.Barrier = &admin.Barrier{Remaining: []admin.InflightWrite{{Verb: "update", Resource: "configmaps", Namespace: "default", Name: "slow", User: "alice", Running: admin.Duration(31 * time.Second)}}}
		return resp, err
	}
	w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: w.r.adm}, {Name: "b", Client: b}}}
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	_, err := fenceStep{}.run(t.Context(), w.r)
	if err == nil || !strings.Contains(err.Error(), "proxy b: update configmaps -n default slow by alice") {
		t.Fatalf("fence step: %v; want the write still running named, with its proxy", err)
	}
}

// lostPromote is a cluster whose promote commits but whose answer is lost, then refused on
// every try after ("can only promote a learner member"), as etcd does.
type lostPromote struct {
	clientv3.Cluster
	learner bool
}

func (c *lostPromote) MemberPromote(context.Context, uint64) (*clientv3.MemberPromoteResponse, error) {
	if !c.learner {
		return nil, errors.New("etcdserver: can only promote a learner member")
	}
	c.learner = false
	return nil, errors.New("context deadline exceeded")
}

func (c *lostPromote) MemberList(context.Context, ...clientv3.OpOption) (*clientv3.MemberListResponse, error) {
	return &clientv3.MemberListResponse{Members: []*etcdserverpb.Member{{ID: 7, IsLearner: c.learner}}}, nil
}

// TestPromoteWhoseAnswerWasLost: a promote that committed but whose answer was lost is found
// done in the member list; retried blindly, etcd refuses it for good and the green-etcd step
// timed out into an abort.
func TestPromoteWhoseAnswerWasLost(t *testing.T) {
	c := &lostPromote{learner: true}
	var err error
	for range 3 { // as the step's poll tries again
		if err = promote(t.Context(), c, 7); err == nil {
			return
		}
	}
	t.Fatalf("promote after the first committed with its answer lost: %v", err)
}

// TestUnfenceOpensTheOthersAtOnceWhileAProxyHangs: the window's unfence, and an abort's, look at
// each proxy once before they open any: a silent one costs one wait for its status, not one
// per look (the unfence looked twice, the abort three times, each the whole wait, with every
// healthy proxy still fenced).
func TestUnfenceOpensTheOthersAtOnceWhileAProxyHangs(t *testing.T) {
	// Waits long enough that one of them plus a loaded machine's journal fsyncs stays well
	// apart from two (the bound below: 1.5 waits).
	const wait = 2 * time.Second
	shortProxyAnswers(t, wait)
	for _, abort := range []bool{false, true} {
		w := newDecisionWorld(t, false, "", false)
		target := w.r.p.Green.APIServer.URL
		if abort {
			target = w.r.p.Blue.APIServer.URL
		}
		w.st.Backend, w.st.Fenced = target, true
		a := w.r.adm.(funcProxy)
		fence, start := a.fence, time.Now()
		var openedAfter time.Duration
		a.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
			if !req.Fenced {
				openedAfter = time.Since(start)
			}
			return fence(ctx, req)
		}
		w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: a}, {Name: "b", Client: hanging()}}}
		w.r.j = &Journal{ID: "x", State: StateRunning, Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}}, GreenPIDs: map[string]int{}, PlanHash: w.r.p.hash, FencedAt: time.Now().UTC()}
		if abort {
			_, _ = w.r.abortByOperator(t.Context())
		} else {
			_, _ = unfenceStep{}.run(t.Context(), w.r)
		}
		if w.st.Fenced || openedAfter > wait*3/2 {
			t.Errorf("abort %v: proxy a fenced %v, opened %s after the start (one silent proxy's status waits %s)", abort, w.st.Fenced, openedAfter, wait)
		}
	}
}

// TestNoRebuildWithGreenAPIServersOnOtherHosts: a green rebuilt from a new snapshot runs
// without etcd auth until its auth step, and green apiservers their own hosts started (which
// kubefence does not stop) reconnect to it and write their leases first: the auth step then
// finds green written and aborts anyway, later and less clearly. Such a plan is not rebuilt:
// the compaction aborts the cutover at once.
func TestNoRebuildWithGreenAPIServersOnOtherHosts(t *testing.T) {
	p := replicatePlan(t)
	r := (&runner{o: Options{Plan: p}, p: p, j: &Journal{}}).forward()
	compacted := fmt.Errorf("replicating: %w", replicate.ErrCompacted)
	if !r.rebuildable(compacted) {
		t.Fatal("a plan whose green apiservers this host starts is not rebuilt")
	}
	p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://host2:6443"}}}
	if r.rebuildable(compacted) {
		t.Fatal("rebuilt with a green apiserver another host runs, which would write to the new green before its auth")
	}
}

// staticPodWorld is a decision world whose green apiserver is a static pod this cutover placed,
// answering at green (closed by the caller), with its journal open; a rebuild waits 300 ms for
// it to stop.
func staticPodWorld(t *testing.T) (*decisionWorld, *httptest.Server, string) {
	t.Helper()
	was := staticPodGone
	staticPodGone = 300 * time.Millisecond
	t.Cleanup(func() { staticPodGone = was })
	green := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(green.Close)
	w := newDecisionWorld(t, false, "", false)
	dir := t.TempDir()
	placed := writeFile(t, dir, "kube-apiserver-green.yaml", "x")
	w.r.p.Green.APIServer.URL = green.URL
	w.r.p.Green.APIServer.Command = nil
	w.r.p.Green.APIServer.StaticPod = &StaticPod{Manifest: placed, ManifestDir: dir}
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	return w, green, placed
}

// TestRebuildWaitsForTheStaticPodToStop: the rebuild removes green's static pod manifest and
// must not restore a new green while that apiserver still runs (the kubelet gives it its grace
// period): it would reconnect to the new green, which has no auth yet, and write. Still
// answering after the wait, the rebuild fails (an abort).
func TestRebuildWaitsForTheStaticPodToStop(t *testing.T) {
	w, green, placed := staticPodWorld(t)
	defer green.Close()
	w.r.j.StaticPodPlaced = placed
	err := w.r.rebuildGreen(errors.New("compacted"))
	if err == nil || !strings.Contains(err.Error(), green.URL) {
		t.Fatalf("rebuild with green's apiserver still answering: %v; want it refused, naming the URL", err)
	}
}

// TestStatusAfterAnAbortThatReopenedWrites: an abort that reopened writes on blue and then could
// not finish (a green process that outlives its stop) leaves the journal running; status must
// not say writes are fenced: the abort journals when it lifted the fence.
func TestStatusAfterAnAbortThatReopenedWrites(t *testing.T) {
	w := newDecisionWorld(t, false, StepCopy, false)
	stop := w.r.procs.stop
	w.r.procs.stop = func(pid int, argv []string, grace time.Duration) {
		if pid != 101 { // green etcd survives
			stop(pid, argv, grace)
		}
	}
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	if rep, _ := w.r.run(t.Context()); rep == nil || !strings.Contains(rep.Error, "still running") {
		t.Fatalf("report %+v; want the abort incomplete, an etcd still running", rep)
	}
	if w.st.Fenced {
		t.Fatal("the abort did not reopen writes")
	}
	st, err := Status(t.Context(), w.r.p)
	if err != nil {
		t.Fatal(err)
	}
	if !st.WindowOpenSince.IsZero() {
		t.Fatalf("status says writes fenced since %s after the abort reopened them", st.WindowOpenSince)
	}
}

// TestResumeFinishesARebuild: a rebuild stops green and removes its data dirs before it rewinds
// the journal; a run that died in between (here: green's static pod still answering past its
// wait) left a journal that says green is started. The rebuild is journaled before it begins,
// and --resume finishes it, starting again from the copy, not from a green that is gone.
func TestResumeFinishesARebuild(t *testing.T) {
	w, green, placed := staticPodWorld(t)
	for _, s := range []string{StepPreflight, StepCopy, StepMigrate, StepGreenEtcd} { // as replicating, before the fence
		w.r.j.Done = append(w.r.j.Done, StepRecord{Step: s})
	}
	w.r.j.StaticPodPlaced = placed
	if err := w.r.j.save(w.r.p.StateDir); err != nil {
		t.Fatal(err)
	}
	if err := w.r.rebuildGreen(errors.New("compacted")); err == nil {
		t.Fatal("the rebuild went through with green's apiserver answering")
	}
	green.Close() // the kubelet stopped it at last
	w.r.o.Resume, w.r.j, w.ran = true, nil, nil
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	if rep, err := w.r.run(t.Context()); err != nil || rep.Result != ResultDone {
		t.Fatalf("resumed: %+v, %v", rep, err)
	}
	if !slices.Contains(w.ran, StepCopy) || !slices.Contains(w.ran, StepGreenEtcd) || w.r.j.Rebuilds != 1 {
		t.Errorf("resumed run ran %v with %d rebuild(s); want it to copy and start green again, one rebuild", w.ran, w.r.j.Rebuilds)
	}
}

// TestSwitchBoundedWhileAProxyHangs: a proxy that answers its status but never its switch (its
// state file's fsync stalled, its host gone between the two calls) holds the switch only as long
// as that proxy's drain may take and an answer after it, not the switch step's whole timeout
// (a minute, every other proxy fenced, or switched and fenced, all along); the others go back.
func TestSwitchBoundedWhileAProxyHangs(t *testing.T) {
	shortProxyAnswers(t, 200*time.Millisecond)
	g, sts, _ := threeProxies(-1)
	for _, s := range sts {
		s.Fenced = true
		s.DrainTimeout = admin.Duration(300 * time.Millisecond)
	}
	b := g.proxies[1].Client.(funcProxy)
	b.setBackend = hanging().setBackend
	g.proxies[1].Client = b
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := g.SetBackend(ctx, admin.BackendRequest{URL: greenURL, ExpectGeneration: 10 + 20 + 30})
	if err == nil || !strings.Contains(err.Error(), "proxy b") {
		t.Fatalf("switch with proxy b silent: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the switch waited %s for a proxy that never answered (its drain 300ms, an answer 200ms)", took)
	}
	for _, i := range []int{0, 2} {
		if sts[i].Backend != blueURL {
			t.Errorf("proxy %d left on %s", i, sts[i].Backend)
		}
	}
}

// TestAbortBoundedWhileBlueEtcdIsSilent: an operator's abort (no deadline of its own) that must
// turn blue etcd's auth off again, with blue etcd taking connections and never answering (its
// host rebooting, a stalled disk), returns within a bound saying what is left, instead of
// waiting for the connection for good after writes reopened.
func TestAbortBoundedWhileBlueEtcdIsSilent(t *testing.T) {
	wasBound := blueAuthAbortTimeout
	blueAuthAbortTimeout = 500 * time.Millisecond
	t.Cleanup(func() { blueAuthAbortTimeout = wasBound })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // takes connections, says nothing
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	cert, key := ca.issue(t, dir, "kubefence", "kubefence", nil, x509.ExtKeyUsageClientAuth)
	r := &runner{p: bakePlan(t), j: &Journal{ID: "x", BlueAuthEnabled: true}}
	r.p.Blue.Etcd.Endpoints = []string{"https://" + ln.Addr().String()}
	r.p.Blue.Etcd.CAFile, r.p.Blue.Etcd.CertFile, r.p.Blue.Etcd.KeyFile = ca.file, cert, key
	start := time.Now()
	err = r.abortBlueAuth(context.Background())
	if err == nil || !r.j.BlueAuthEnabled {
		t.Errorf("abortBlueAuth with blue etcd silent = %v; want an error, auth still to turn off", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("abortBlueAuth waited %s for a silent blue etcd", took)
	}
}

// TestSwitchWaitsForAnOldProxy: a proxy too old to say its --drain-timeout (no drainTimeout in
// its status) gets the switch step's own time, as before: a bound guessed for it cut off a
// switch its longer drain made legitimately slow, and aborted the cutover in its window.
func TestSwitchWaitsForAnOldProxy(t *testing.T) {
	shortProxyAnswers(t, 200*time.Millisecond)
	g, sts, _ := threeProxies(-1)
	for _, s := range sts {
		s.Fenced = true
	}
	b := g.proxies[1].Client.(funcProxy)
	set := b.setBackend
	b.setBackend = func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
		select { // its drain: longer than any bound guessed from the others
		case <-time.After(time.Second):
		case <-ctx.Done():
			return admin.BackendResponse{}, ctx.Err()
		}
		return set(ctx, req)
	}
	g.proxies[1].Client = b
	if _, err := g.SetBackend(t.Context(), admin.BackendRequest{URL: greenURL, ExpectGeneration: 10 + 20 + 30}); err != nil {
		t.Fatalf("switch with an old proxy slow to drain: %v", err)
	}
	for i, s := range sts {
		if s.Backend != greenURL {
			t.Errorf("proxy %d on %s", i, s.Backend)
		}
	}
}

// TestStopGreenGoesOnWhenTheManifestStays: an abort, cleanup or rebuild that cannot remove
// green's static pod manifest (a read-only or full kubelet dir) still stops green's etcd
// members, and says the manifest is left: it returned at once, green's etcd left running.
func TestStopGreenGoesOnWhenTheManifestStays(t *testing.T) {
	w, green, _ := staticPodWorld(t)
	defer green.Close()
	// A directory with an entry in it: os.Remove fails, not with "does not exist".
	stuck := filepath.Join(t.TempDir(), "kube-apiserver-green.yaml")
	if err := os.Mkdir(stuck, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, stuck, "entry", "x")
	w.r.j.StaticPodPlaced = stuck
	w.r.j.GreenPIDs["g0"] = 101
	stopped, err := w.r.stopGreen()
	if err == nil || !strings.Contains(err.Error(), "static pod manifest") || !slices.Contains(w.stopped, 101) {
		t.Fatalf("stopGreen with the manifest stuck: stopped %v (pids %v), %v; want green's etcd stopped and the manifest named", stopped, w.stopped, err)
	}
}

// TestStatusNamesTheProxiesTheAbortLeftFenced: an abort whose unfence one silent proxy did not
// acknowledge reopens the others on blue and stops partway; status then names the proxy still
// fenced, instead of saying only that writes are fenced (on every proxy, as it reads).
func TestStatusNamesTheProxiesTheAbortLeftFenced(t *testing.T) {
	w := newDecisionWorld(t, false, StepCopy, false)
	stB := secondProxyGoesDown(t, w, StepCopy, false)
	if _, err := w.r.run(t.Context()); err == nil {
		t.Fatal("the abort with proxy b silent finished")
	}
	if w.st.Fenced || !stB.Fenced {
		t.Fatalf("proxy a fenced %v (want open), proxy b fenced %v (silent, still fenced)", w.st.Fenced, stB.Fenced)
	}
	st, err := Status(t.Context(), w.r.p)
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(st) // as 'cutover status -o json' prints it
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"stillFenced":["b"]`) {
		t.Errorf("status %s does not name proxy b as the one still fenced", out)
	}
}

// TestSwitchFailureWaitsForASilentProxyOnce: a switch step that fails because one of two
// proxies takes calls and never answers goes back to blue with the silent proxy waited for once
// (one statusAnswerTimeout), not once by the failure's look at the proxies and again by the
// abort's: the other proxy, fenced all along, opens on blue right after that one wait.
func TestSwitchFailureWaitsForASilentProxyOnce(t *testing.T) {
	const d = 300 * time.Millisecond
	shortProxyAnswers(t, d)
	w := newDecisionWorld(t, false, "", false)
	w.st.Fenced, w.st.Generation = true, 2
	var failedAt, openedAt time.Time
	var looksAfter int
	b := hanging()
	hangs := b.status
	b.status = func(ctx context.Context) (admin.Status, error) {
		if !failedAt.IsZero() && openedAt.IsZero() {
			looksAfter++
		}
		return hangs(ctx)
	}
	a := w.r.adm.(funcProxy)
	fence := a.fence
	a.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
		resp, err := fence(ctx, req)
		if !req.Fenced && err == nil {
			openedAt = time.Now()
		}
		return resp, err
	}
	w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: a}, {Name: "b", Client: b}}}
	w.r.steps[stepIndex(t, StepSwitch)] = fakeStep{n: StepSwitch, past: true, do: func(ctx context.Context, r *runner) (string, error) {
		detail, err := switchStep{}.run(ctx, r)
		failedAt = time.Now()
		return detail, err
	}}
	w.r.j = journalThrough(w.r.p, steps, StepVerify, time.Now().UTC())
	w.r.j.FenceGeneration = 2
	rep, err := w.r.run(t.Context())
	if err == nil || rep == nil || !strings.Contains(rep.Error, "proxy b") {
		t.Fatalf("report %+v, %v: want the abort incomplete, naming proxy b", rep, err)
	}
	if w.st.Fenced || w.st.Backend != w.r.p.Blue.APIServer.URL || openedAt.IsZero() {
		t.Fatalf("proxy a %+v: want open on blue", *w.st)
	}
	if looksAfter != 1 {
		t.Errorf("proxy b was asked its status %d times between the switch's failure and proxy a's unfence; one wait for a silent proxy is enough", looksAfter)
	}
	if took := openedAt.Sub(failedAt); took > 2*d {
		t.Errorf("proxy a opened %s after the switch failed (a status answer is due within %s)", took, d)
	}
}
