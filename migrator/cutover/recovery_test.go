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
