package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	for _, content := range []string{"first", "second, longer than the first"} {
		if err := Write(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v; want %q", got, err, content)
		}
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("%d files left in the directory, want only the target", len(entries))
	}
	if err := Write(filepath.Join(dir, "missing", "x"), nil, 0o600); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

func TestSyncDirs(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "member", "snap"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "member", "snap", "db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SyncDirs(root); err != nil {
		t.Fatal(err)
	}
	if err := SyncDirs(filepath.Join(root, "missing")); err == nil {
		t.Fatal("SyncDirs of a missing tree succeeded")
	}
}

// TestRenameNoReplaceUnsupported: NFS refuses any rename flag with EINVAL (some FUSE
// filesystems too; an old kernel has no renameat2: ENOSYS). The error says the filesystem has
// no atomic no-replace rename and to use a local one, not just "invalid argument"; a file
// already at dst is still os.ErrExist, and a directory renamed into itself is not taken for it.
func TestRenameNoReplaceUnsupported(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, errno := range []unix.Errno{unix.EINVAL, unix.ENOSYS} {
		failRenames(t, errno)
		err := RenameNoReplace(src, dst)
		if !errors.Is(err, ErrNoReplaceUnsupported) || !errors.Is(err, errno) || errors.Is(err, os.ErrExist) {
			t.Fatalf("%v: got %v, want ErrNoReplaceUnsupported wrapping it", errno, err)
		}
		for _, want := range []string{src, dst, "atomic no-replace rename", "NFS", "local filesystem"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: %q does not say %q", errno, err, want)
			}
		}
	}
	failRenames(t, unix.EINVAL)
	if err := RenameNoReplace(dir, filepath.Join(dir, "sub")); errors.Is(err, ErrNoReplaceUnsupported) {
		t.Errorf("a directory renamed into itself: %v", err)
	}
	failRenames(t, unix.EEXIST)
	if err := RenameNoReplace(src, dst); !errors.Is(err, os.ErrExist) || errors.Is(err, ErrNoReplaceUnsupported) {
		t.Errorf("EEXIST: got %v, want os.ErrExist", err)
	}
}

// failRenames has Renameat2 fail with errno until the test ends.
func failRenames(t *testing.T, errno unix.Errno) {
	t.Helper()
	old := Renameat2
	Renameat2 = func(int, string, int, string, uint) error { return errno }
	t.Cleanup(func() { Renameat2 = old })
}
