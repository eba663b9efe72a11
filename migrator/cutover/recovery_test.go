package cutover

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoAbortOfferedPastTheSwitch: a cutover stopped after its switch is finished with --resume;
// abort refuses it, so neither a new run over it nor cleanup offers abort.
func TestNoAbortOfferedPastTheSwitch(t *testing.T) {
	p, _ := validPlan(t)
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	j := &Journal{Version: 1, ID: "x", PlanHash: p.hash, State: StateRunning, Done: []StepRecord{{Step: StepPreflight}, {Step: StepFence}, {Step: StepSwitch}}}
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	_, runErr := Run(t.Context(), Options{Plan: p})
	_, cleanErr := Cleanup(t.Context(), Options{Plan: p}, false)
	for what, err := range map[string]error{"a new run": runErr, "cleanup": cleanErr} {
		if err == nil || !strings.Contains(err.Error(), "--resume") || strings.Contains(err.Error(), "cutover abort") {
			t.Errorf("%s over a switched cutover: %v; want --resume named, and no abort", what, err)
		}
	}
}

// TestCheckFilesAfterSwitch: past the switch the programs that start green are not asked for,
// what the unfence, the bake and a rollback read still is.
func TestCheckFilesAfterSwitch(t *testing.T) {
	p, _ := validPlan(t)
	for _, f := range []string{p.Green.Etcd.Binary, p.Green.APIServer.Command[0], p.Blue.APIServer.Kubeconfig} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	err := p.CheckFilesAfterSwitch()
	if err == nil || !strings.Contains(err.Error(), "blue.apiserver.kubeconfig") || strings.Contains(err.Error(), "green.etcd.binary") || strings.Contains(err.Error(), "command[0]") {
		t.Errorf("CheckFilesAfterSwitch: %v; want the kubeconfig named, not the programs", err)
	}
}

// TestFinishByHand: past the switch, when --resume cannot run, the advice lists what the
// remaining steps would have done: in mode replicate green's apiserver may only read until
// ungate-green, so a bare fence off would reopen writes onto a green that answers each one 500.
func TestFinishByHand(t *testing.T) {
	for _, tc := range []struct {
		name      string
		replicate bool
		done      []string
		want, not []string
	}{
		{"snapshot", false, nil, []string{"fence off --expect-backend"}, []string{"grant-role"}},
		{"replicate, green gated", true, nil, []string{"user grant-role kube-apiserver-etcd-client " + readWriteRole, "then 'kubefence fence off --expect-backend"}, nil},
		{"replicate, green ungated", true, []string{StepUngateGreen}, []string{"fence off --expect-backend"}, []string{"grant-role"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			p.Migration.Mode = map[bool]string{true: ModeReplicate, false: "snapshot"}[tc.replicate]
			p.Green.APIServer.EtcdUser = "kube-apiserver-etcd-client"
			j := &Journal{Done: []StepRecord{{Step: StepSwitch}}}
			for _, s := range tc.done {
				j.Done = append(j.Done, StepRecord{Step: s})
			}
			got := finishByHand(p, j)
			checkAdvice(t, got, tc.want, tc.not)
		})
	}
}

// checkAdvice fails t unless advice holds every one of want and none of not.
func checkAdvice(t *testing.T, advice string, want, not []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(advice, w) {
			t.Errorf("advice %q lacks %q", advice, w)
		}
	}
	for _, n := range not {
		if strings.Contains(advice, n) {
			t.Errorf("advice %q has %q", advice, n)
		}
	}
}

// TestFinishRollbackByHand: past a rollback's switch, when 'rollback --resume' cannot run,
// the advice lists what its remaining steps would have done: blue's apiserver may only read
// blue etcd until ungate-blue (the bake's gate), so a bare fence off would reopen writes onto a
// blue that answers each one 500. cutover status says it too.
func TestFinishRollbackByHand(t *testing.T) {
	for _, tc := range []struct {
		name      string
		done      []string
		want, not []string
	}{
		{"blue gated", nil, []string{"--endpoints https://", "user grant-role " + DefaultGreenEtcdUser + " " + readWriteRole, "then 'kubefence fence off --expect-backend https://"}, nil},
		{"blue ungated", []string{StepUngateBlue}, []string{"fence off --expect-backend"}, []string{"grant-role"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := bakePlan(t)
			if err := os.MkdirAll(filepath.Join(p.StateDir, "rollback"), 0o700); err != nil {
				t.Fatal(err)
			}
			main := &Journal{Version: 1, ID: "x", State: StateRollingBack, PlanHash: p.hash, Bake: &BakeRecord{Revision: 2, Rollback: "r"}}
			rj := &Journal{Version: 1, ID: "r", State: StateRunning, Done: []StepRecord{{Step: StepFence}, {Step: StepDrain}, {Step: StepSwitch}}}
			for _, s := range tc.done {
				rj.Done = append(rj.Done, StepRecord{Step: s})
			}
			if err := errors.Join(main.save(p.StateDir), rj.save(filepath.Join(p.StateDir, "rollback"))); err != nil {
				t.Fatal(err)
			}
			st, err := Status(t.Context(), p)
			if err != nil {
				t.Fatal(err)
			}
			got := st.FinishByHand
			if !strings.Contains(got, p.Blue.APIServer.URL) {
				t.Errorf("advice %q does not reopen writes on blue %s", got, p.Blue.APIServer.URL)
			}
			checkAdvice(t, got, tc.want, tc.not)
		})
	}
}

// TestWayBackWithAProxysCredentialsGone: abort and cleanup read the plan without checking the
// files it names (runbook), so a proxy whose admin client certificate or CA is gone since (its
// host rebuilt, the proxy decommissioned) must not keep them from running: cleanup talks to no
// proxy, and to the abort that proxy is one that does not answer, saying why (an abort unfences
// the others and reports itself incomplete then, as for a proxy that is down).
func TestWayBackWithAProxysCredentialsGone(t *testing.T) {
	p, _ := validPlan(t)
	missing := filepath.Join(t.TempDir(), "gone.crt")
	p.Proxies = []ProxyRef{{AdminSocket: filepath.Join(t.TempDir(), "admin.sock")}, {AdminAddress: "https://10.0.0.11:9446", CertFile: missing, KeyFile: missing, CAFile: missing}}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	j := &Journal{Version: 1, ID: "x", PlanHash: p.hash, State: StateAborted, GreenPIDs: map[string]int{}}
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	if _, err := Cleanup(t.Context(), Options{Plan: p}, false); err != nil {
		t.Errorf("cleanup with a proxy's credentials gone: %v", err)
	}
	g, err := newProxyGroup(p, true)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.proxies[1].Client.Status(t.Context())
	if err == nil || !strings.Contains(err.Error(), "gone.crt") {
		t.Errorf("status of the proxy whose credentials are gone: %v; want an error naming the file", err)
	}
	if _, err := newProxyGroup(p, false); err == nil || !strings.Contains(err.Error(), "gone.crt") {
		t.Errorf("a cutover's own proxy group with a proxy's credentials gone: %v; want it refused, naming the file", err)
	}
}
