package cutover

import (
	"os"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/internal/testetcd"
)

// TestCopyRetakesItsOwnSnapshot: a cutover killed after the snapshot was renamed into its state
// dir but before the journal recorded the copy runs the copy again on --resume; the snapshot
// never replaces a file, so the step removes its own first instead of failing the resume.
func TestCopyRetakesItsOwnSnapshot(t *testing.T) {
	url := testetcd.Start(t).URL
	p := &Plan{StateDir: t.TempDir(), Migration: Migration{Mode: "snapshot"}}
	p.Blue.Etcd.Endpoints = []string{url}
	r := &runner{p: p, j: &Journal{}}
	if err := os.WriteFile(r.snapshotPath(), []byte("the interrupted run's snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (copyStep{}).run(t.Context(), r); err != nil {
		t.Fatalf("copy after an interrupted one: %v", err)
	}
	if r.j.Snapshot != r.snapshotPath() || r.j.SnapshotRevision == 0 {
		t.Errorf("journal: snapshot %q at revision %d, want %s at the store's revision", r.j.Snapshot, r.j.SnapshotRevision, r.snapshotPath())
	}
}

// TestCopyStepSaysV2KeysAreNotCopied: a blue on etcd 3.5 or older may hold v2 keys, which no
// snapshot has; without blue.etcd.dataDir the cutover copies none, and green starts fine
// without them: the copy step's result says so (the snapshot's warning was dropped), and what
// to give the plan.
func TestCopyStepSaysV2KeysAreNotCopied(t *testing.T) {
	if got := v2NotCopied(nil); got != "" {
		t.Errorf("no warning: %q", got)
	}
	got := v2NotCopied([]string{"the snapshot holds the v3 keyspace only: any v2 keys of https://10.0.0.1:2379 (etcd 3.4.23) are NOT in it"})
	for _, want := range []string{"WARNING", "v2 keys", "NOT in it", "will not be on green", "blue.etcd.dataDir"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}
