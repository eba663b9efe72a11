package datadir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

// TestSnapshotRenameRefused: the streamed snapshot is renamed into place without replacing
// anything. Only a file already at dst ("it appeared while the snapshot streamed") is said to
// have appeared; a filesystem without that rename (NFS: EINVAL) is named as such, with what to
// do, and nothing is left behind.
func TestSnapshotRenameRefused(t *testing.T) {
	url, _ := startSystemEtcd(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	spec := ConnSpec{Endpoints: []string{url}}

	t.Run("no RENAME_NOREPLACE", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "snap.db")
		old := atomicfile.Renameat2
		atomicfile.Renameat2 = func(int, string, int, string, uint) error { return unix.EINVAL }
		t.Cleanup(func() { atomicfile.Renameat2 = old })
		_, err := SnapshotFrom(ctx, spec, url, dst)
		if !errors.Is(err, atomicfile.ErrNoReplaceUnsupported) {
			t.Fatalf("got %v, want ErrNoReplaceUnsupported", err)
		}
		if strings.Contains(err.Error(), "appeared") {
			t.Errorf("says the snapshot appeared: %v", err)
		}
		for _, want := range []string{dst, "local filesystem"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q does not say %q", err, want)
			}
		}
		if entries, _ := os.ReadDir(filepath.Dir(dst)); len(entries) > 0 {
			t.Errorf("left %v", entries)
		}
	})
	t.Run("already there", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "snap.db")
		if err := os.WriteFile(dst, []byte("someone's"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := SnapshotFrom(ctx, spec, url, dst)
		if !errors.Is(err, os.ErrExist) || !strings.Contains(err.Error(), "appeared while the snapshot streamed") {
			t.Fatalf("got %v, want the file that appeared", err)
		}
		if got, _ := os.ReadFile(dst); string(got) != "someone's" {
			t.Errorf("%s replaced: %q", dst, got)
		}
	})
}
