package cutover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

const blueURL, greenURL = "https://blue:6443", "https://green:6443"

// threeProxies is a group of three in-memory proxies open on blue; broken makes one of them
// refuse backend changes.
func threeProxies(broken int) (*proxyGroup, []*admin.Status, [][]string) {
	sts := make([]*admin.Status, 3)
	calls := make([][]string, 3)
	g := &proxyGroup{}
	for i := range 3 {
		sts[i] = &admin.Status{Backend: blueURL, Generation: uint64(10 * (i + 1))}
		p := memProxy(sts[i], &calls[i])
		if i == broken {
			p.setBackend = func(context.Context, admin.BackendRequest) (admin.BackendResponse, error) {
				return admin.BackendResponse{}, errors.New("unreachable")
			}
		}
		g.proxies = append(g.proxies, admin.Target[proxyAdmin]{Name: []string{"a", "b", "c"}[i], Client: p})
	}
	return g, sts, calls
}

func TestProxyGroupFencesAndSwitchesAll(t *testing.T) {
	g, sts, _ := threeProxies(-1)
	ctx := t.Context()
	resp, err := g.Fence(ctx, admin.FenceRequest{Fenced: true})
	if err != nil || !resp.Barrier.Complete || !resp.Status.Fenced || resp.Status.Generation != 10+20+30+3 {
		t.Fatalf("fence: %+v %v", resp, err)
	}
	if _, err := g.SetBackend(ctx, admin.BackendRequest{URL: greenURL}); err != nil {
		t.Fatal(err)
	}
	st, err := g.Status(ctx)
	if err != nil || st.Backend != greenURL {
		t.Fatalf("after the switch: %+v %v", st, err)
	}
	for i, s := range sts {
		if s.Backend != greenURL || !s.Fenced {
			t.Errorf("proxy %d: %+v", i, s)
		}
	}
}

// TestProxyGroupSwitchExpectsGeneration: a switch expecting the generation the fence left
// (the sum over the proxies) switches none when one proxy's fence was turned off and on since,
// and sends each proxy its own generation when none changed, so that a change after the
// group's look is refused by the proxy itself.
func TestProxyGroupSwitchExpectsGeneration(t *testing.T) {
	g, sts, calls := threeProxies(-1)
	ctx := t.Context()
	resp, err := g.Fence(ctx, admin.FenceRequest{Fenced: true})
	if err != nil {
		t.Fatal(err)
	}
	fenced := resp.Status.Generation
	sts[1].Generation += 2 // off and on again by hand
	if _, err := g.SetBackend(ctx, admin.BackendRequest{URL: greenURL, ExpectGeneration: fenced}); err == nil || !strings.Contains(err.Error(), "changed since") {
		t.Fatalf("switch after a proxy's fence changed: %v", err)
	}
	for i, s := range sts {
		if s.Backend != blueURL || slices.Contains(calls[i], "backend "+greenURL) {
			t.Errorf("proxy %d asked to switch (%q) or switched (%s) after the fence changed", i, calls[i], s.Backend)
		}
	}
	if _, err := g.SetBackend(ctx, admin.BackendRequest{URL: greenURL, ExpectGeneration: fenced + 2}); err != nil {
		t.Fatalf("switch at the generation expected: %v", err)
	}
	for i, s := range sts {
		if s.Backend != greenURL {
			t.Errorf("proxy %d on %s", i, s.Backend)
		}
	}
}

// TestProxyGroupPartialSwitchGoesBack: a proxy that does not acknowledge the switch makes the
// ones that did go back to blue: no proxy may serve green while another serves blue.
func TestProxyGroupPartialSwitchGoesBack(t *testing.T) {
	g, sts, calls := threeProxies(1)
	g.backCA = "/blue-ca.crt"
	for _, s := range sts {
		s.Fenced = true
	}
	// memProxy answers Previous as the backend it had: set it as the real proxy does.
	for i := range g.proxies {
		p := g.proxies[i].Client.(funcProxy)
		if i == 1 {
			continue
		}
		inner, st := p.setBackend, sts[i]
		p.setBackend = func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
			prev := st.Backend
			resp, err := inner(ctx, req)
			resp.Previous = prev
			return resp, err
		}
		g.proxies[i].Client = p
	}
	_, err := g.SetBackend(t.Context(), admin.BackendRequest{URL: greenURL})
	if err == nil || !strings.Contains(err.Error(), "proxy b") || !strings.Contains(err.Error(), "switched back") {
		t.Fatalf("partial switch: %v", err)
	}
	for i, s := range sts {
		if s.Backend != blueURL {
			t.Errorf("proxy %d left on %s after a partial switch", i, s.Backend)
		}
	}
	if got := strings.Join(calls[0], ","); got != "backend "+greenURL+",backend "+blueURL {
		t.Errorf("proxy a was asked %q", got)
	}
}

func TestMergeStatus(t *testing.T) {
	res := []admin.Result[admin.Status]{
		{Proxy: "a", Value: admin.Status{Backend: blueURL, Fenced: true, Generation: 3, RefusedWrites: 1, OpenWatches: 5, OpenStreams: 6, Hold: admin.HoldStatus{Held: 2}}},
		{Proxy: "b", Value: admin.Status{Backend: greenURL, Generation: 4, RefusedWrites: 2, OpenWatches: 70, OpenStreams: 71, Hold: admin.HoldStatus{Held: 1}}},
	}
	st := mergeStatus(res)
	if !st.Fenced || st.Generation != 7 || st.RefusedWrites != 3 {
		t.Errorf("merged %+v: want fenced (any), generations and refusals added", st)
	}
	// The rehearsal names the streams the switch will move: all proxies' (it said 0 before).
	if st.OpenWatches != 75 || st.OpenStreams != 77 || st.Hold.Held != 3 {
		t.Errorf("merged %+v: want open watches, streams and held writes added", st)
	}
	if !strings.HasPrefix(st.Backend, "mixed: ") || !strings.Contains(st.Backend, greenURL+" (b)") {
		t.Errorf("merged backend %q: want a mixed backend naming who is where", st.Backend)
	}
}

func TestPlanProxies(t *testing.T) {
	p, _ := validPlan(t)
	if refs := p.proxyRefs(); len(refs) != 1 || refs[0].AdminSocket != p.Proxy.AdminSocket {
		t.Fatalf("without proxies: %+v", refs)
	}
	p.Proxies = []ProxyRef{{AdminSocket: "/run/a.sock"}, {AdminSocket: "/run/b.sock", AdminAddress: "https://x:1"}, {AdminAddress: "http://x:1"}}
	var ps problems
	p.validateProxies(&ps)
	if len(ps) != 2 || !strings.Contains(ps[0].Error(), "proxies[1]") || !strings.Contains(ps[1].Error(), "mutual TLS") {
		t.Fatalf("problems %v", ps)
	}
}

// secondProxyGoesDown puts w's proxy in a group with a second one, b, and makes step fail
// after b stopped answering; it returns b's state.
func secondProxyGoesDown(t *testing.T, w *decisionWorld, step string, past bool) *admin.Status {
	t.Helper()
	var callsB []string
	stB := &admin.Status{Backend: w.st.Backend, Generation: 5}
	b := memProxy(stB, &callsB)
	group := &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: w.r.adm}, {Name: "b", Client: b}}}
	w.r.adm = group
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	w.r.steps[stepIndex(t, step)] = fakeStep{n: step, past: past, do: func(context.Context, *runner) (string, error) {
		down := errors.New("connection refused")
		b.status = func(context.Context) (admin.Status, error) { return admin.Status{}, down }
		b.fence = func(context.Context, admin.FenceRequest) (admin.FenceResponse, error) {
			return admin.FenceResponse{}, down
		}
		group.proxies[1].Client = b
		return "", errors.New(step + " broke: proxy b: " + down.Error())
	}}
	return stB
}

// TestAbortWithAProxyDown: a failure before the switch with one of two proxies unreachable
// still puts the other one back open on blue, and says the abort is incomplete.
func TestAbortWithAProxyDown(t *testing.T) {
	w := newDecisionWorld(t, false, StepCopy, false)
	stB := secondProxyGoesDown(t, w, StepCopy, false)
	rep, err := w.r.run(t.Context())
	if err == nil || rep.Result != ResultFailed || !strings.Contains(rep.Error, "proxy b") {
		t.Fatalf("report %+v, err %v", rep, err)
	}
	if w.st.Fenced || !stB.Fenced {
		t.Fatalf("proxy a fenced %v (want open), proxy b fenced %v (down, still fenced)", w.st.Fenced, stB.Fenced)
	}
}

// TestUnfenceFailsWithAProxyDown: past the switch (journaled), an unfence that fails because
// one of two proxies does not answer is not an abort (there is none past the switch): the
// advice is --resume, and nothing is switched back or stopped.
func TestUnfenceFailsWithAProxyDown(t *testing.T) {
	w := newDecisionWorld(t, false, StepUnfence, false)
	secondProxyGoesDown(t, w, StepUnfence, true)
	rep, err := w.r.run(t.Context())
	if err == nil || rep == nil || !strings.Contains(rep.Next, "--resume") {
		t.Fatalf("report %+v, err %v: want the advice to resume", rep, err)
	}
	for _, e := range w.events {
		if e.Type == EventAbort {
			t.Fatalf("an abort was started past the switch: %+v", e)
		}
	}
	if w.st.Backend != greenURLOf(w.r) || len(w.stopped) != 0 {
		t.Fatalf("proxy a on %s, stopped %v: want it left on green, nothing stopped", w.st.Backend, w.stopped)
	}
}

// greenURLOf is the plan's green apiserver URL as a proxy reports it.
func greenURLOf(r *runner) string { return strings.TrimSuffix(r.p.Green.APIServer.URL, "/") }

// TestRoutedProxies: proxies in front of apiservers of their own (an HA control plane) are each
// switched to their own green apiserver, while the steps see the plan's URLs only; a proxy on
// the plan's URL where it has its own is reported out of place.
func TestRoutedProxies(t *testing.T) {
	p, _ := validPlan(t)
	planBlue, planGreen := p.Blue.APIServer.URL, p.Green.APIServer.URL
	own := [][2]string{{"", ""}, {"https://n2:6443", "https://n2:6445"}, {"https://n3:6443/", "https://n3:6445"}}
	g := &proxyGroup{}
	sts := make([]*admin.Status, 3)
	calls := make([][]string, 3)
	for i, o := range own {
		sts[i] = &admin.Status{Backend: strings.TrimSuffix(cmp.Or(o[0], planBlue), "/")}
		pr := ProxyRef{AdminSocket: "/run/x.sock", BlueURL: o[0], GreenURL: o[1]}
		g.proxies = append(g.proxies, admin.Target[proxyAdmin]{Name: string(rune('a' + i)), Client: routeProxy(memProxy(sts[i], &calls[i]), p, pr)})
	}
	ctx := t.Context()
	if st, err := g.Status(ctx); err != nil || st.Backend != planBlue {
		t.Fatalf("status on blue: %+v %v; want the plan's blue for all", st, err)
	}
	if _, err := g.SetBackend(ctx, admin.BackendRequest{URL: planGreen}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{planGreen, "https://n2:6445", "https://n3:6445"} {
		if sts[i].Backend != want {
			t.Errorf("proxy %d switched to %s, want %s", i, sts[i].Backend, want)
		}
	}
	if st, err := g.Status(ctx); err != nil || st.Backend != planGreen {
		t.Fatalf("status on green: %+v %v", st, err)
	}
	// A proxy on the plan's blue where it has its own is not where it should be.
	sts[1].Backend = planBlue
	if st, _ := g.Status(ctx); !strings.HasPrefix(st.Backend, "mixed: ") || !strings.Contains(st.Backend, "not this proxy's https://n2:6443") {
		t.Errorf("a proxy on the plan's blue instead of its own: merged backend %q", st.Backend)
	}
}

func TestPlanHAValidation(t *testing.T) {
	cases := []struct {
		name string
		edit func(p *Plan)
		want string
	}{
		{"valid", func(p *Plan) {
			p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://n2:6445", Kubeconfig: "/k"}}}
			p.Proxies = []ProxyRef{{AdminSocket: "/a"}, {AdminSocket: "/b", BlueURL: "https://n2:6443", GreenURL: "https://n2:6445"}}
		}, ""},
		{"a trailing slash is the same URL", func(p *Plan) {
			p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://n2:6445", Kubeconfig: "/k"}}}
			p.Proxies = []ProxyRef{{AdminSocket: "/b", GreenURL: "https://n2:6445/"}}
		}, ""},
		{"blue URL a green apiserver's but for a slash", func(p *Plan) {
			p.Proxies = []ProxyRef{{AdminSocket: "/a", BlueURL: p.Green.APIServer.URL + "/"}}
		}, "proxies[0].blueURL"},
		{"another green apiserver at blue's URL", func(p *Plan) {
			p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: p.Blue.APIServer.URL, Kubeconfig: "/k"}}}
		}, "or is blue's"},
		{"another CA", func(p *Plan) {
			p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://n2:6445", Kubeconfig: "/k", CAFile: "/other-ca.crt"}}}
		}, "green.apiservers[0].caFile"},
		{"green URL not a green apiserver", func(p *Plan) {
			p.Proxies = []ProxyRef{{AdminSocket: "/a", GreenURL: "https://n9:6445"}}
		}, "proxies[0].greenURL"},
		{"blue URL a green apiserver", func(p *Plan) {
			p.Proxies = []ProxyRef{{AdminSocket: "/a", BlueURL: p.Green.APIServer.URL}}
		}, "proxies[0].blueURL"},
		{"second static pod", func(p *Plan) {
			p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://n2:6445", Kubeconfig: "/k"}, StaticPod: &StaticPod{Manifest: "/m", ManifestDir: "/d"}}}
		}, "green.apiservers[0].staticPod"},
		{"another etcd user", func(p *Plan) {
			p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://n2:6445", Kubeconfig: "/k", EtcdUser: "other"}}}
		}, "green.apiservers[0].etcdUser"},
		{"external members' data dirs are their hosts'", func(p *Plan) {
			m := p.Green.Etcd.Members[0]
			p.Green.Etcd.Members = append(p.Green.Etcd.Members,
				GreenMember{Name: "g1", DataDir: m.DataDir, ClientURL: "http://n2:2479", PeerURL: "http://n2:2480", Learner: true, External: true},
				GreenMember{Name: "g2", DataDir: m.DataDir, ClientURL: "http://n3:2479", PeerURL: "http://n3:2480", Learner: true, External: true})
		}, ""},
		{"a data dir twice on this host", func(p *Plan) {
			m := p.Green.Etcd.Members[0]
			p.Green.Etcd.Members = append(p.Green.Etcd.Members,
				GreenMember{Name: "g1", DataDir: m.DataDir, ClientURL: "http://n2:2479", PeerURL: "http://n2:2480", Learner: true},
				GreenMember{Name: "g2", DataDir: "/g2", ClientURL: "http://n3:2479", PeerURL: "http://n3:2480"})
		}, "is used twice"},
		{"URL twice", func(p *Plan) {
			p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: p.Green.APIServer.URL, Kubeconfig: "/k"}}}
		}, "used twice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, _ := validPlan(t)
			p.setDefaults()
			c.edit(p)
			err := errors.Join(p.validate()...)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error naming %s", err, c.want)
			}
		})
	}
}

// TestAbortPutsAStrayProxyBack: a proxy that switched to green although the switch was not
// acknowledged (its answer lost) is put back on blue before any proxy is unfenced: unfenced on
// green, it would reopen writes there while the others write blue. In every mode: the switch
// put the other proxy back itself (switchBack), and a switch cut short goes back (pastSwitch).
func TestAbortPutsAStrayProxyBack(t *testing.T) {
	for _, replicate := range []bool{true, false} {
		t.Run(fmt.Sprintf("replicate %v", replicate), func(t *testing.T) {
			w := newDecisionWorld(t, false, StepSwitch, true)
			if replicate {
				w.r.p.Migration.Mode = ModeReplicate
			}
			var callsB []string
			stB := &admin.Status{Backend: w.st.Backend, Generation: 5}
			b := memProxy(stB, &callsB)
			inner := b.setBackend
			b.setBackend = func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
				resp, err := inner(ctx, req)
				if req.URL == w.r.p.Green.APIServer.URL {
					return admin.BackendResponse{}, errors.New("the answer to backend set was lost")
				}
				return resp, err
			}
			w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: memProxy(w.st, &w.calls)}, {Name: "b", Client: b}}}
			if err := w.r.openJournal(); err != nil {
				t.Fatal(err)
			}
			rep, err := w.r.run(t.Context())
			if err == nil || rep.Result != ResultAborted {
				t.Fatalf("report %+v, err %v; want the cutover aborted", rep, err)
			}
			blue := w.r.p.Blue.APIServer.URL
			if w.st.Backend != blue || stB.Backend != blue || w.st.Fenced || stB.Fenced {
				t.Fatalf("after the abort: a %+v, b %+v; want both open on blue", w.st, stB)
			}
			if got := strings.Join(callsB, ","); !strings.HasSuffix(got, "backend "+blue+",fence off") {
				t.Errorf("proxy b was asked %q; want it back on blue before it is unfenced", got)
			}
		})
	}
}

// TestOpenOnGreenHasAWayOut: a switch cut short (b and c fenced on blue) with proxy a open on
// green (a fence off by hand). In mode replicate green's apiserver may not write yet, so
// nothing reached green through a: the abort fences a again and goes back, every proxy open on
// blue. After a copy writes may have reached green: the abort refuses before it changes
// anything, and says how to go forward by hand (b and c to green, then the fences off there),
// never to run the command that just refused. --resume ends the same way.
func TestOpenOnGreenHasAWayOut(t *testing.T) {
	for _, tc := range []struct {
		name              string
		replicate, resume bool
	}{
		{"replicate, abort", true, false},
		{"copy, abort", false, false},
		{"replicate, resume", true, true},
		{"copy, resume", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, tc.resume, "", false)
			if tc.replicate {
				w.r.p.Migration.Mode = ModeReplicate
				gatedGreen(t, w.r)
			}
			green, blue := w.r.p.Green.APIServer.URL, w.r.p.Blue.APIServer.URL
			*w.st = admin.Status{Backend: green, Fenced: false, Generation: 7}
			stB, stC := &admin.Status{Backend: blue, Fenced: true, Generation: 5}, &admin.Status{Backend: blue, Fenced: true, Generation: 5}
			var callsB, callsC []string
			w.fencedBeforeSwitch(t, tc.resume, "", memProxy(stB, &callsB), memProxy(stC, &callsC))
			var said string
			if tc.resume {
				rep, err := w.r.run(t.Context())
				if rep == nil {
					t.Fatalf("resume: %v", err)
				}
				said = rep.Next
			} else if _, err := w.r.abortByOperator(t.Context()); err != nil {
				said = err.Error()
			}
			if tc.replicate {
				for name, st := range map[string]*admin.Status{"a": w.st, "b": stB, "c": stC} {
					if st.Backend != blue || st.Fenced {
						t.Errorf("proxy %s %+v (said %q); want every proxy open on blue", name, *st, said)
					}
				}
				if !strings.HasPrefix(strings.Join(w.calls, ","), "fence on") {
					t.Errorf("proxy a was asked %q; want it fenced again first", w.calls)
				}
				return
			}
			for _, want := range []string{"proxy a is open on green", "backend set " + green, "fence off --expect-backend " + green} {
				if !strings.Contains(said, want) {
					t.Errorf("said %q; want %q", said, want)
				}
			}
			for _, not := range []string{"cutover abort' again", "new cutover from"} {
				if strings.Contains(said, not) {
					t.Errorf("said %q; it has %q", said, not)
				}
			}
			if len(callsB)+len(callsC) > 0 || !stB.Fenced || !stC.Fenced || len(w.stopped) > 0 {
				t.Errorf("calls b %q, c %q; green stopped %v: want nothing changed", callsB, callsC, w.stopped)
			}
		})
	}
}

// TestAbortKeepsAnUncheckedProxyFenced: a proxy whose switch answer was lost (it is on green)
// and that cannot be looked at when the abort puts the proxies back, but answers the unfence a
// moment later, stays fenced: the unfence expects blue. The abort is incomplete; run again, it
// puts that proxy back on blue and opens it.
func TestAbortKeepsAnUncheckedProxyFenced(t *testing.T) {
	w := newDecisionWorld(t, false, StepSwitch, true)
	var callsB []string
	stB := &admin.Status{Backend: w.st.Backend, Generation: 5}
	b := memProxy(stB, &callsB)
	inner, innerStatus, down := b.setBackend, b.status, false
	b.setBackend = func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
		resp, err := inner(ctx, req)
		if req.URL == w.r.p.Green.APIServer.URL {
			down = true // not looked at again until the unfence
			return admin.BackendResponse{}, errors.New("the answer to backend set was lost")
		}
		return resp, err
	}
	b.status = func(ctx context.Context) (admin.Status, error) {
		if down {
			return admin.Status{}, errors.New("connection refused")
		}
		return innerStatus(ctx)
	}
	group := &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: memProxy(w.st, &w.calls)}, {Name: "b", Client: b}}}
	w.r.adm = group
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	rep, err := w.r.run(t.Context())
	if err == nil || rep.Result != ResultFailed || !strings.Contains(rep.Error, "proxy b") {
		t.Fatalf("report %+v, err %v; want the abort incomplete, naming proxy b", rep, err)
	}
	blue, green := w.r.p.Blue.APIServer.URL, w.r.p.Green.APIServer.URL
	if stB.Backend != green || !stB.Fenced {
		t.Fatalf("proxy b %+v: want still fenced on green", stB)
	}
	if w.st.Backend != blue || w.st.Fenced {
		t.Fatalf("proxy a %+v: want open on blue", w.st)
	}
	down = false
	if _, err := w.r.abortByOperator(t.Context()); err != nil {
		t.Fatalf("abort again: %v", err)
	}
	if stB.Backend != blue || stB.Fenced {
		t.Fatalf("after the second abort proxy b %+v: want open on blue", stB)
	}
}

// TestAbortNamesWhatRunsOnOtherHosts: green apiservers and etcd members that their own hosts
// started keep running after an abort (kubefence stops only what it started); the report says
// which, so the operator stops them there.
func TestAbortNamesWhatRunsOnOtherHosts(t *testing.T) {
	w := newDecisionWorld(t, false, StepVerify, false)
	w.r.p.Green.APIServers = []GreenAPIServer{
		{APIServerRef: APIServerRef{URL: "https://host2:6443"}},
		{APIServerRef: APIServerRef{URL: "https://host3:6443"}, Command: []string{"kube-apiserver"}},
	}
	w.r.p.Green.Etcd.Members = append(w.r.p.Green.Etcd.Members, GreenMember{Name: "green-2", Learner: true, External: true})
	if err := w.r.openJournal(); err != nil {
		t.Fatal(err)
	}
	rep, err := w.r.run(t.Context())
	if err == nil || rep.Result != ResultAborted {
		t.Fatalf("report %+v, err %v; want the cutover aborted", rep, err)
	}
	for _, want := range []string{"https://host2:6443", "green-2"} {
		if !strings.Contains(rep.Next, want) {
			t.Errorf("next %q does not name %s", rep.Next, want)
		}
	}
	if strings.Contains(rep.Next, "host3") {
		t.Errorf("next %q names host3's apiserver, which kubefence started and stopped", rep.Next)
	}
}

// TestRoutedPartialSwitchGoesBack: a switch one routed proxy refuses puts the others back on
// their own blue apiservers, not on the plan's.
func TestRoutedPartialSwitchGoesBack(t *testing.T) {
	p, _ := validPlan(t)
	own := []ProxyRef{{BlueURL: "https://n1:6443", GreenURL: p.Green.APIServer.URL}, {BlueURL: "https://n2:6443", GreenURL: p.Green.APIServer.URL}}
	g := &proxyGroup{}
	sts := make([]*admin.Status, 2)
	calls := make([][]string, 2)
	for i, pr := range own {
		sts[i] = &admin.Status{Backend: pr.BlueURL, Fenced: true}
		mp := memProxy(sts[i], &calls[i])
		if i == 1 {
			mp.setBackend = func(context.Context, admin.BackendRequest) (admin.BackendResponse, error) {
				return admin.BackendResponse{}, errors.New("unreachable")
			}
		}
		g.proxies = append(g.proxies, admin.Target[proxyAdmin]{Name: pr.BlueURL, Client: routeProxy(mp, p, pr)})
	}
	if _, err := g.SetBackend(t.Context(), admin.BackendRequest{URL: p.Green.APIServer.URL}); err == nil {
		t.Fatal("a switch one proxy refused succeeded")
	}
	if sts[0].Backend != "https://n1:6443" || sts[1].Backend != "https://n2:6443" {
		t.Errorf("after the partial switch: %s, %s; want each on its own blue", sts[0].Backend, sts[1].Backend)
	}
}

// TestRollbackAbortPutsAStrayProxyBack: an aborted rollback leaves every proxy on green before
// it unfences: one that switched to blue unacknowledged would open writes on a blue whose
// apiserver may only read.
func TestRollbackAbortPutsAStrayProxyBack(t *testing.T) {
	p, _ := validPlan(t)
	green, blue := p.Green.APIServer.URL, p.Blue.APIServer.URL
	stA, stB := &admin.Status{Backend: green, Fenced: true}, &admin.Status{Backend: blue, Fenced: true}
	var callsA, callsB []string
	r := &runner{p: p, o: Options{Plan: p}, adm: &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: memProxy(stA, &callsA)}, {Name: "b", Client: memProxy(stB, &callsB)}}},
		main: &Journal{ID: "c", State: StateRollingBack}, j: &Journal{ID: "r", FencedAt: time.Now().UTC()}, from: p.greenSide(), to: p.blueSide(), journalDir: filepath.Join(p.StateDir, "rollback")}
	if err := os.MkdirAll(r.journalDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.abortRollback(t.Context(), "test", nil); err != nil {
		t.Fatal(err)
	}
	if stA.Backend != green || stB.Backend != green || stA.Fenced || stB.Fenced {
		t.Fatalf("after the rollback's abort: a %+v, b %+v; want both open on green", stA, stB)
	}
	if got := strings.Join(callsB, ","); got != "backend "+green+",fence off" {
		t.Errorf("proxy b was asked %q; want it back on green before it is unfenced", got)
	}
	if r.j.UnfencedAt.IsZero() {
		t.Error("the rollback's journal does not say when writes reopened (status would say they are fenced)")
	}
}

// TestRollbackAbortLeavesAnOperatorsFence: a rollback that fails before its own fence (blue's
// tip unreadable, blue etcd unreachable) lifts no fence: one on already is the operator's, put
// on to stop a misbehaving green before rolling back, and writes stay fenced on green.
func TestRollbackAbortLeavesAnOperatorsFence(t *testing.T) {
	p, _ := validPlan(t)
	green := p.Green.APIServer.URL
	st := &admin.Status{Backend: green, Fenced: true, Reason: "operator: green misbehaves"}
	var calls []string
	r := &runner{p: p, o: Options{Plan: p}, adm: &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: memProxy(st, &calls)}}},
		main: &Journal{ID: "c", State: StateRollingBack}, j: &Journal{ID: "r"}, from: p.greenSide(), to: p.blueSide(), journalDir: filepath.Join(p.StateDir, "rollback")}
	if err := os.MkdirAll(r.journalDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.abortRollback(t.Context(), "test", nil); err != nil {
		t.Fatal(err)
	}
	if !st.Fenced || st.Backend != green || slices.Contains(calls, "fence off") {
		t.Fatalf("after the rollback's abort: %+v, calls %v; want the operator's fence left on green", st, calls)
	}
}

// TestBackToLeavesOpenProxiesAlone: a proxy that is not fenced was not switched by this run
// (a switch needs the fence) and refuses a backend change; the abort must not try, or it could
// never finish (a preflight that found a proxy on another backend aborts with it open).
func TestBackToLeavesOpenProxiesAlone(t *testing.T) {
	p, _ := validPlan(t)
	st := &admin.Status{Backend: "https://elsewhere:6443"}
	var calls []string
	mp := memProxy(st, &calls)
	mp.setBackend = func(context.Context, admin.BackendRequest) (admin.BackendResponse, error) {
		calls = append(calls, "backend")
		return admin.BackendResponse{}, errors.New("not fenced: a backend change needs the fence on")
	}
	g := &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: mp}}}
	if _, err := g.putFencedOn(t.Context(), p.Blue.APIServer, nil); err != nil || len(calls) > 0 {
		t.Fatalf("putFencedOn on an open proxy: %v, calls %v; want nothing asked", err, calls)
	}
}

// TestBackToConfirmsAnUnconfirmedProxy: a proxy restarted with an unusable state file is fenced,
// unconfirmed, on its --upstream (blue): it refuses fence off until a backend set. An abort puts
// it on blue by name, or no re-run of the abort could ever unfence it.
func TestBackToConfirmsAnUnconfirmedProxy(t *testing.T) {
	p, _ := validPlan(t)
	blue := strings.TrimSuffix(p.Blue.APIServer.URL, "/")
	st := &admin.Status{Backend: blue, Fenced: true, Unconfirmed: true, Generation: 4}
	var calls []string
	mp := memProxy(st, &calls)
	g := &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: mp}}}
	if merged, err := g.Status(t.Context()); err != nil || !merged.Unconfirmed {
		t.Fatalf("group status %+v, %v: want it unconfirmed as its proxy", merged, err)
	}
	if _, err := g.putFencedOn(t.Context(), p.Blue.APIServer, nil); err != nil || !slices.Contains(calls, "backend "+p.Blue.APIServer.URL) {
		t.Fatalf("putFencedOn on an unconfirmed proxy on blue: %v, calls %v; want a backend set to blue", err, calls)
	}
}

// TestPartialSwitchLostAnswer: a proxy whose answer was lost (a timeout during its drain) may
// have switched: the error says so, not that every proxy that switched was switched back.
func TestPartialSwitchLostAnswer(t *testing.T) {
	g, sts, _ := threeProxies(-1)
	for _, s := range sts {
		s.Fenced = true
	}
	p := g.proxies[1].Client.(funcProxy)
	inner := p.setBackend
	p.setBackend = func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
		_, _ = inner(ctx, req)
		return admin.BackendResponse{}, fmt.Errorf("%w: %w", admin.ErrUnreachable, context.DeadlineExceeded)
	}
	g.proxies[1].Client = p
	_, err := g.SetBackend(t.Context(), admin.BackendRequest{URL: greenURL})
	if err == nil || !strings.Contains(err.Error(), "proxy b may have switched") {
		t.Fatalf("partial switch with a lost answer: %v; want it to say proxy b may be on the new backend", err)
	}
}

// TestRefencedProxyGoesBack: in mode replicate an abort that had to fence again a proxy opened
// by hand on green goes back to blue and lifts that fence too: before the cutover's own fence
// (nothing journaled) the proxy would otherwise be left fenced on a stopped green; with every
// proxy on green (the switch's answer lost), "--resume" would be refused by the switch's
// generation check, changed by the hand.
func TestRefencedProxyGoesBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fenced  bool // the cutover's fence journaled and done
		bBackOn string
	}{
		{"before the cutover's fence", false, "blue"},
		{"every proxy on green", true, "green"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecisionWorld(t, false, "", false)
			w.r.p.Migration.Mode = ModeReplicate
			gatedGreen(t, w.r)
			green, blue := w.r.p.Green.APIServer.URL, w.r.p.Blue.APIServer.URL
			*w.st = admin.Status{Backend: green, Fenced: false, Generation: 8}
			stB := &admin.Status{Backend: map[string]string{"blue": blue, "green": green}[tc.bBackOn], Fenced: tc.fenced, Generation: 6}
			var callsB []string
			w.r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: memProxy(w.st, &w.calls)}, {Name: "b", Client: memProxy(stB, &callsB)}}}
			w.r.j = &Journal{Version: 1, ID: "x", PlanHash: "plan-hash", State: StateRunning, PIDsWriteAhead: true, Done: []StepRecord{{Step: StepPreflight}}, GreenPIDs: map[string]int{}}
			if tc.fenced {
				w.r.j.FencedAt, w.r.j.FenceGeneration = time.Now().UTC(), 10
				w.r.j.Done = append(w.r.j.Done, StepRecord{Step: StepFence})
			}
			if err := w.r.saveJournal(); err != nil {
				t.Fatal(err)
			}
			if _, err := w.r.abortByOperator(t.Context()); err != nil {
				t.Fatalf("abort: %v (a asked %q)", err, w.calls)
			}
			for name, st := range map[string]*admin.Status{"a": w.st, "b": stB} {
				if st.Fenced || sameURL(st.Backend) != sameURL(blue) {
					t.Errorf("proxy %s %+v; want it open on blue", name, *st)
				}
			}
		})
	}
}

// TestOpenProxyAtUnfenceNamesTheResume: the unfence refuses while a proxy is open away from
// where the switch went (restarted without its state file), and says how to go on once it is
// fenced and switched: a rollback's resume is 'cutover rollback --resume' ('cutover --resume'
// refuses a cutover rolling back).
func TestOpenProxyAtUnfenceNamesTheResume(t *testing.T) {
	for _, rollback := range []bool{false, true} {
		p := replicatePlan(t)
		r := (&runner{o: Options{Plan: p}, p: p, j: &Journal{FencedAt: time.Now()}}).forward()
		want, not := "'kubefence cutover --resume'", "rollback --resume"
		if rollback {
			r.main, r.from, r.to = &Journal{ID: "x"}, p.greenSide(), p.blueSide()
			want, not = "'kubefence cutover rollback --resume'", "'kubefence cutover --resume'"
		}
		var callsA, callsB []string
		r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{
			{Name: "a", Client: memProxy(&admin.Status{Backend: r.to.api.URL, Fenced: true, Generation: 4}, &callsA)},
			{Name: "b", Client: memProxy(&admin.Status{Backend: r.from.api.URL, Generation: 2}, &callsB)},
		}}
		_, err := unfenceStep{}.run(t.Context(), r)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), not) {
			t.Errorf("rollback %v: %v; want it to name %s", rollback, err, want)
		}
	}
}

// TestOneProxyNamedTwice: the plan may name one proxy twice in ways the plan check cannot tell
// apart (its socket and its --admin-listen address, an IP and a host name): fenced twice at
// once, its generation is never what the switch expects, and every run aborts in its window.
// The preflight asks each proxy which process it is (its status's instance) and refuses two
// entries that are one.
func TestOneProxyNamedTwice(t *testing.T) {
	for _, twice := range []bool{true, false} {
		p, _ := validPlan(t)
		r := (&runner{o: Options{Plan: p}, p: p, j: &Journal{}}).forward()
		var calls []string
		a := &admin.Status{Backend: strings.TrimSuffix(p.Blue.APIServer.URL, "/"), Generation: 1, Instance: "7f3a"}
		b := a
		if !twice {
			b = &admin.Status{Backend: a.Backend, Generation: 1, Instance: "c01d"}
		}
		r.adm = &proxyGroup{proxies: []admin.Target[proxyAdmin]{
			{Name: "/run/kubefence/admin.sock", Client: memProxy(a, &calls)},
			{Name: "https://10.0.0.5:9443", Client: memProxy(b, &calls)},
		}}
		err := r.checkProxyOnBlue(t.Context())
		if twice && (err == nil || !strings.Contains(err.Error(), "one proxy") || !strings.Contains(err.Error(), "https://10.0.0.5:9443")) {
			t.Errorf("one proxy named twice: %v; want it refused, naming both entries", err)
		}
		if !twice && err != nil {
			t.Errorf("two proxies: %v", err)
		}
	}
}
