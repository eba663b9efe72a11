package cutover

import (
	"os"
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
