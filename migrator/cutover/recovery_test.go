package cutover

import (
	"os"
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
