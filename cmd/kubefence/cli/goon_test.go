package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/migrator/cutover"
)

// writeJournal writes a journal of the plan (its hash) into stateDir.
func writeJournal(t *testing.T, plan, stateDir string, j cutover.Journal) {
	t.Helper()
	data, err := os.ReadFile(plan)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	j.Version, j.ID, j.PlanHash = 1, "x", hex.EncodeToString(sum[:8])
	out, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(stateDir, "journal.json"), string(out), 0o600)
}

// TestGoingOnNeedsOnlyWhatIsLeft: past the switch (and during a bake, for finish and rollback)
// nothing builds or starts green any more: a green etcd binary or manifest gone since does not
// refuse the command that finishes the window or ends the bake (editing the plan to drop them
// would change its hash, which those commands refuse). Before the switch a resume still checks
// every file.
func TestGoingOnNeedsOnlyWhatIsLeft(t *testing.T) {
	for _, tc := range []struct {
		name    string
		journal cutover.Journal
		args    []string
		refused bool // a usage error naming green.etcd.binary
	}{
		{"finish a bake", cutover.Journal{State: cutover.StateBaking, Bake: &cutover.BakeRecord{Revision: 7}}, []string{"cutover", "finish"}, false},
		{"resume past the switch", cutover.Journal{State: cutover.StateRunning, Done: []cutover.StepRecord{{Step: cutover.StepPreflight}, {Step: cutover.StepSwitch}}}, []string{"cutover", "--resume"}, false},
		{"resume before the switch", cutover.Journal{State: cutover.StateRunning, Done: []cutover.StepRecord{{Step: cutover.StepPreflight}}}, []string{"cutover", "--resume"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan, stateDir := writeLoadablePlan(t)
			writeJournal(t, plan, stateDir, tc.journal)
			root := filepath.Dir(plan)
			for _, gone := range []string{"bin/etcd-3.6.16", "green-apiserver.yaml"} {
				if err := os.Remove(filepath.Join(root, gone)); err != nil {
					t.Fatal(err)
				}
			}
			code, _, errOut := runCLI(append(tc.args, "--plan", plan)...)
			named := strings.Contains(errOut, "green.etcd.binary")
			if tc.refused != (code == ExitUsage && named) || !tc.refused && named {
				t.Errorf("%v = %d, stderr %q; want refused (usage, naming green.etcd.binary): %v", tc.args, code, errOut, tc.refused)
			}
		})
	}
}
