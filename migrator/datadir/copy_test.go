package datadir

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubefence/kubefence/internal/flock"
)

// lockExclusive holds an exclusive flock on path, as a running etcd does on member/snap/db,
// until the test ends.
func lockExclusive(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
}

func TestCopyStoppedRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, src string) (dst string)
		wantErr []string
	}{
		{name: "output is the source", wantErr: []string{"must not be inside the source", "the source is never written"},
			setup: func(t *testing.T, src string) string { return src + "/" }},
		{name: "output inside the source", wantErr: []string{"must not be inside the source"},
			setup: func(t *testing.T, src string) string { return filepath.Join(src, "member", "copy") }},
		{name: "output inside the source, unclean path", wantErr: []string{"must not be inside the source"},
			setup: func(t *testing.T, src string) string {
				return filepath.Dir(src) + "/x/../" + filepath.Base(src) + "//copy"
			}},
		{name: "no output", wantErr: []string{"an output dir is required"},
			setup: func(t *testing.T, src string) string { return "" }},
		{name: "non-empty output", wantErr: []string{"is not empty", "refusing to overwrite"},
			setup: func(t *testing.T, src string) string {
				dst := filepath.Join(filepath.Dir(src), "out")
				writeTree(t, dst, map[string]string{"keep.txt": "precious"})
				return dst
			}},
		{name: "in use", wantErr: []string{"is in use by a running etcd", "--live --endpoint"},
			setup: func(t *testing.T, src string) string {
				lockExclusive(t, filepath.Join(src, "member", "snap", "db"))
				return filepath.Join(filepath.Dir(src), "out")
			}},
		{name: "not a member dir", wantErr: []string{"is not an etcd member data dir"},
			setup: func(t *testing.T, src string) string {
				if err := os.Remove(filepath.Join(src, "member", "snap", "db")); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(filepath.Dir(src), "out")
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			src := filepath.Join(parent, "data")
			writeTree(t, src, memberDir)
			dst := tc.setup(t, src)
			srcBefore := readTree(t, src)
			namesBefore := dirNames(t, parent)
			var outBefore map[string]string
			if dst != "" {
				if _, err := os.Stat(dst); err == nil {
					outBefore = readTree(t, dst)
				}
			}

			rep, err := CopyStopped(t.Context(), src, "", dst)
			assertErrContains(t, err, tc.wantErr...)
			if rep.Files != 0 || rep.Detection != nil {
				t.Errorf("a refused copy reports %+v", rep)
			}
			assertTree(t, src, srcBefore)
			if got := dirNames(t, parent); !slices.Equal(got, namesBefore) {
				t.Errorf("the parent held %v and now holds %v", namesBefore, got)
			}
			if outBefore != nil {
				assertTree(t, dst, outBefore)
			}
		})
	}
}

func TestCheckOutputRefusesFilesAndRelativeAliases(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	src := filepath.Join(dir, "data")
	if err := os.MkdirAll(filepath.Join(src, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(src, filepath.Join(dir, "alias")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ src, dst, want string }{
		{src, file, "is a file"},
		{"data", filepath.Join(dir, "data", "out"), "must not be inside"},
		{src, filepath.Join(dir, "alias", "out"), "must not be inside"},
		{".", "out", "must not be inside"},
	} {
		err := checkOutput(c.dst, c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("checkOutput(%q, %q) = %v, want %q", c.src, c.dst, err, c.want)
		}
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Fatal("the file was changed")
	}
}

// TestCopyMemberFilesRacesTheMember: etcd renames its preallocated WAL segment (0.tmp) when it
// cuts one, and purges old segments and snapshots, while a live copy lists and opens them. A
// file gone between the listing and the copy is a race (ErrRaced: copy again), not a failure.
func TestCopyMemberFilesRacesTheMember(t *testing.T) {
	data := t.TempDir()
	wal := filepath.Join(data, "member", "wal")
	for _, f := range []string{filepath.Join(data, "member", "snap", "0000000000000002-0000000000000010.snap"),
		filepath.Join(wal, "0000000000000000-0000000000000000.wal"), filepath.Join(wal, "0.tmp")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	statHook = func(path string) {
		if filepath.Base(path) == "0.tmp" { // the cut, just after the WAL dir was listed
			if err := os.Rename(path, filepath.Join(wal, "0000000000000001-0000000000000005.wal")); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(func() { statHook = nil })
	backend := filepath.Join(t.TempDir(), "db")
	if err := os.WriteFile(backend, []byte("db"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := CopyMemberFiles(t.Context(), data, "", filepath.Join(t.TempDir(), "copy"), func() (string, int64, error) { return backend, 2, nil })
	if !errors.Is(err, ErrRaced) {
		t.Fatalf("CopyMemberFiles = %v, want ErrRaced", err)
	}
}

// TestCopyStoppedWithWALDir: with a separate WAL dir, etcd reads its WAL from there only; a
// member/wal in the data dir is stale (left from before the WAL moved) or a link to the WAL
// dir. The copy's member/wal is the WAL dir's segments, once, as CopyMemberFiles takes them.
func TestCopyStoppedWithWALDir(t *testing.T) {
	wal := map[string]string{
		"0000000000000000-0000000000000000.wal": "current first segment",
		"0000000000000001-0000000000000100.wal": "current second segment",
	}
	for _, tc := range []struct {
		name      string
		memberWAL func(t *testing.T, dataDir, walDir string)
	}{
		{"stale segments in the data dir", func(t *testing.T, dataDir, _ string) {
			writeTree(t, filepath.Join(dataDir, "member", "wal"), map[string]string{
				"0000000000000000-0000000000000000.wal": "stale first segment",
				"0000000000000005-0000000000000500.wal": "stale later segment",
			})
		}},
		{"member/wal links to the WAL dir", func(t *testing.T, dataDir, walDir string) {
			if err := os.RemoveAll(filepath.Join(dataDir, "member", "wal")); err != nil {
				t.Fatal(err)
			}
			symlink(t, walDir, filepath.Join(dataDir, "member", "wal"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dataDir, walDir, dst := filepath.Join(parent, "data"), filepath.Join(parent, "wal"), filepath.Join(parent, "copy")
			writeTree(t, dataDir, map[string]string{"member/snap/db": "backend", "member/snap/1.snap": "snap", VersionFileName: "3.4.23/etcd2\n"})
			writeTree(t, walDir, wal)
			tc.memberWAL(t, dataDir, walDir)
			if _, err := CopyStopped(t.Context(), dataDir, walDir, dst); err != nil {
				t.Fatal(err)
			}
			assertTree(t, filepath.Join(dst, "member", "wal"), wal)
			if _, err := VerifyManifest(t.Context(), dst); err != nil {
				t.Errorf("the copy's manifest: %v", err)
			}
		})
	}
}

// TestBuildIntoLocksTheOutput: a build holds the lock beside its output (the name upgrade,
// downgrade, restore-backup and v2-to-v3 hold beside a data dir), so that a second run to the
// same output, which removes the temp dir named after it first, cannot remove the first's
// half-built copy from under it: refused, nothing built, naming the holder.
func TestBuildIntoLocksTheOutput(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "out")
	held, err := flock.Take(dst + ".kubefence-lock")
	if err != nil {
		t.Fatal(err)
	}
	held.Note("migrate copy to " + dst)
	built := false
	err = BuildInto(dst, func(tmp string) error { built = true; return os.Mkdir(tmp, 0o700) })
	if err == nil || !strings.Contains(err.Error(), "another kubefence process") || built || exists(dst) {
		t.Fatalf("build while another holds the output: %v (built %v, output there %v), want a refusal before anything", err, built, exists(dst))
	}
	held.ReleaseRemove()
	if err := BuildInto(dst, func(tmp string) error { return os.Mkdir(tmp, 0o700) }); err != nil || !exists(dst) {
		t.Fatalf("build once released: %v", err)
	}
	if exists(dst + ".kubefence-lock") {
		t.Error("the lock file is left beside the output")
	}
}

// TestInUseSeesACopy: a copy or backup of a stopped member holds its backend with a shared lock
// while it reads; a restore or an upgrade must not rename or change the dir under it, so the
// check they make sees that lock as it sees etcd's.
func TestInUseSeesACopy(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "member-a")
	writeTree(t, dataDir, memberDir)
	copying, err := holdStopped(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if busy, err := InUse(dataDir); err != nil || !busy {
		t.Errorf("InUse while a copy reads the member = %v, %v; want true", busy, err)
	}
	copying.Close()
	if busy, err := InUse(dataDir); err != nil || busy {
		t.Errorf("InUse once the copy ended = %v, %v; want false", busy, err)
	}
}
