package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
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
