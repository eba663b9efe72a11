package datadir

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCopyMembers: several stopped members are each copied to OutputDir/<name>, and a member
// that cannot be copied is reported by its data dir without stopping the others. The fake
// members' backends are not bbolt, so Detect cannot tell what the copies hold: a warning in their
// reports, not an error, since each copy is whole and matches its manifest (a failure would
// leave the members out of the report, the command failing with every copy in place).
func TestCopyMembers(t *testing.T) {
	root := t.TempDir()
	a, b, missing := filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "missing")
	writeTree(t, a, memberDir)
	writeTree(t, b, memberDir)
	out := filepath.Join(root, "copies")

	reps, err := CopyMembers(t.Context(), MemberCopies{DataDirs: []string{a, missing, b}, OutputDir: out})
	assertErrContains(t, err, missing+": "+missing+" is not an etcd member data dir")
	if strings.Contains(err.Error(), "the copy in") {
		t.Errorf("CopyMembers = %v; a copy that matches its manifest failed", err)
	}
	if len(reps) != 2 || reps[0].Source != a || reps[1].Source != b {
		t.Fatalf("reports %+v, want a's and b's", reps)
	}
	for _, r := range reps {
		if r.Detection != nil || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "cannot tell what the copy holds") {
			t.Errorf("report of %s: detection %v, warnings %q; want a warning that its version cannot be told", r.Source, r.Detection, r.Warnings)
		}
	}
	for _, d := range []string{"a", "b"} {
		got := readTree(t, filepath.Join(out, d))
		delete(got, ManifestName)
		if !maps.Equal(got, memberDir) {
			t.Errorf("copy of %s holds %v, want %v", d, got, memberDir)
		}
		if _, err := VerifyManifest(t.Context(), filepath.Join(out, d)); err != nil {
			t.Errorf("copy of %s: %v", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "missing")); !os.IsNotExist(err) {
		t.Errorf("the member that failed left a copy behind: %v", err)
	}
}

// TestCopyMembersRefusals: copies that cannot be taken as asked are refused before anything is
// written.
func TestCopyMembersRefusals(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	writeTree(t, a, memberDir)
	writeTree(t, b, memberDir)
	h1, h2 := filepath.Join(root, "host1", "etcd"), filepath.Join(root, "host2", "etcd")
	writeTree(t, h1, memberDir)
	writeTree(t, h2, memberDir)
	for _, tc := range []struct {
		name string
		m    MemberCopies
		want string
	}{
		{"WAL dir with several members", MemberCopies{DataDirs: []string{a, b}, WALDir: filepath.Join(root, "wal"), OutputDir: filepath.Join(root, "out")}, "single data dir"},
		{"live without an endpoint per member", MemberCopies{DataDirs: []string{a, b}, OutputDir: filepath.Join(root, "out"), Live: true, Endpoints: []string{"http://127.0.0.1:1"}}, "one endpoint per data dir"},
		{"one member's copy inside another member", MemberCopies{DataDirs: []string{a, b}, OutputDir: filepath.Join(b, "copies")}, "must not be inside"},
		{"the copy is the source", MemberCopies{DataDirs: []string{a}, OutputDir: a}, "must not be inside"},
		// Both would be copied to OUT/etcd.
		{"two members' data dirs with the same name", MemberCopies{DataDirs: []string{h1, h2}, OutputDir: filepath.Join(root, "out")}, "same name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := readTree(t, root)
			reps, err := CopyMembers(t.Context(), tc.m)
			assertErrContains(t, err, tc.want)
			if len(reps) != 0 {
				t.Errorf("a refused copy reports %+v", reps)
			}
			assertTree(t, root, before)
		})
	}
}
