package cutover

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

// TestPreflightRefusesAStateDirWithoutNoReplaceRenames: blue's snapshot is placed in the state
// dir (and green's members beside their data dirs) by a rename that replaces nothing, which NFS
// (and some FUSE filesystems) refuse with EINVAL. In mode snapshot that rename comes after the
// fence, once all of blue's db has streamed: the preflight tries one first and refuses such a
// directory, saying what to do, before anything is changed.
func TestPreflightRefusesAStateDirWithoutNoReplaceRenames(t *testing.T) {
	p, _ := validPlan(t)
	r := testRunner(t, p, filepath.Join(t.TempDir(), "no-proxy.sock"))
	if err := checkNoReplaceRenames(p); err != nil {
		t.Fatalf("a local state dir: %v", err)
	}
	if entries, _ := os.ReadDir(p.StateDir); len(entries) > 0 {
		t.Errorf("the check left %v in the state dir", entries)
	}

	old := atomicfile.Renameat2
	atomicfile.Renameat2 = func(int, string, int, string, uint) error { return unix.EINVAL } // NFS
	t.Cleanup(func() { atomicfile.Renameat2 = old })
	_, err := preflightStep{}.run(t.Context(), r)
	if err == nil {
		t.Fatal("preflight passed")
	}
	var line string
	for l := range strings.SplitSeq(err.Error(), "\n") {
		if strings.Contains(l, "no-replace rename") {
			line = l
		}
	}
	for _, want := range []string{"stateDir " + p.StateDir, "NFS", "local filesystem", "after the fence"} {
		if !strings.Contains(line, want) {
			t.Errorf("the preflight's refusal %q does not say %q", line, want)
		}
	}
	if entries, _ := os.ReadDir(p.StateDir); len(entries) > 0 {
		t.Errorf("the check left %v in the state dir", entries)
	}
}
