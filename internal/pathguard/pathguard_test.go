package pathguard

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/internal/testenv"
)

// tree makes, under a temp dir: src/sub, other, waldisk/wal, link-to-src -> src, link-to-sub ->
// src/sub, src/wal -> waldisk/wal (a member's WAL on another disk), and chdirs there.
func tree(t *testing.T) string {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"src/sub", "other", "waldisk/wal"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"link-to-src": "src", "link-to-sub": "src/sub", "src/wal": "waldisk/wal"} {
		if err := os.Symlink(filepath.Join(root, target), filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(root)
	return root
}

func TestCheckApart(t *testing.T) {
	root := tree(t)
	for _, c := range []struct {
		name, output, source string
		want                 string // "" apart, "inside", "hold"
	}{
		{"sibling", "other/out", "src", ""},
		{"name sharing a prefix", "src-copy", "src", ""},
		{"the source itself", "src", "src", "inside"},
		{"lexically inside", "src/out", "src", "inside"},
		{"absolute inside", filepath.Join(root, "src", "out"), "src", "inside"},
		{"relative source, absolute output", filepath.Join(root, "src", "a", "b"), "./src/", "inside"},
		{"dot as the source", "out", ".", "inside"},
		{"dot as the output", ".", "src", "hold"},
		{"through a symlink to the source", "link-to-src/out", "src", "inside"},
		{"through a symlink to a subdir", "link-to-sub/out", "src", "inside"},
		{"source given through a symlink", "src/out", "link-to-src", "inside"},
		{"dot-dot after a symlink is the target's parent", "link-to-sub/../out", "src", "inside"},
		{"dot-dot lexically out of the source", "src/../other/out", "src", ""},
		{"output holds the source", root, "src", "hold"},
		{"output holds the source through a symlink", "link-to-src", "src/sub", "hold"},
		// The source reads what its symlinks point at (a WAL dir elsewhere): an output there, or
		// reached through such a link, is written into the source.
		{"inside the source through its own symlink", "src/wal/copy", "src", "inside"},
		{"where a symlink in the source points", "waldisk/wal/copy", "src", "inside"},
		{"beside where a symlink in the source points", "waldisk/copy", "src", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckApart("the output", c.output, "the source", c.source)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("CheckApart(%q, %q) = %v, want apart", c.output, c.source, err)
			case c.want == "":
			case err == nil:
				t.Fatalf("CheckApart(%q, %q) = nil, want %q", c.output, c.source, c.want)
			case !IsOverlap(err):
				t.Fatalf("CheckApart(%q, %q) = %v, not an OverlapError", c.output, c.source, err)
			case (c.want == "hold") != err.(*OverlapError).Holds:
				t.Fatalf("CheckApart(%q, %q) = %v, want %q", c.output, c.source, err, c.want)
			}
		})
	}
}

func TestCheckApartBindMount(t *testing.T) {
	// A bind mount needs root; a second name for the same directory is what matters, and a
	// hard-linked directory cannot be made, so this runs only where mount works.
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root to bind-mount")
	}
	root := tree(t)
	mnt := filepath.Join(root, "other", "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := bindMount(filepath.Join(root, "src"), mnt); err != nil {
		testenv.SkipOrFail(t, fmt.Sprintf("bind mount: %v", err))
	}
	t.Cleanup(func() { unmount(mnt) })
	if err := CheckApart("the output", filepath.Join(mnt, "out"), "the source", "src"); !IsOverlap(err) {
		t.Fatalf("an output under a bind mount of the source: %v, want an overlap", err)
	}
}

func TestCheckFresh(t *testing.T) {
	dir := t.TempDir()
	full, empty, file, link := filepath.Join(dir, "full"), filepath.Join(dir, "empty"), filepath.Join(dir, "file"), filepath.Join(dir, "link")
	for _, err := range []error{os.Mkdir(full, 0o700), os.WriteFile(filepath.Join(full, "x"), nil, 0o600), os.Mkdir(empty, 0o700),
		os.WriteFile(file, nil, 0o600), os.Symlink(empty, link)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		path, want string // want "" for none
	}{
		{filepath.Join(dir, "new"), ""},
		{empty, ""},
		{full, "is not empty"},
		{file, "is a file"},
		{link, "is a symlink"},
	} {
		if err := CheckFresh("--output-dir", tc.path); (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckFresh(%s) = %v, want %q", filepath.Base(tc.path), err, tc.want)
		}
	}
}

// TestCheckFreshMountPoint: an empty mount point cannot be replaced by the dir built beside it
// (rename: EBUSY, after all the work): it is refused at once, saying what to give instead.
func TestCheckFreshMountPoint(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root to bind-mount")
	}
	dir := t.TempDir()
	vol, dst := filepath.Join(dir, "volume"), filepath.Join(dir, "data")
	for _, d := range []string{vol, dst} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := bindMount(vol, dst); err != nil {
		testenv.SkipOrFail(t, fmt.Sprintf("bind mount: %v", err))
	}
	t.Cleanup(func() { unmount(dst) })
	if err := CheckFresh("--output-dir", dst); err == nil || !strings.Contains(err.Error(), "mount point") {
		t.Fatalf("CheckFresh(an empty mount point) = %v, want it refused as a mount point", err)
	}
}

// TestCheckTrustedDir: a directory kubefence keeps what it reads back and runs (a backup dir:
// journals naming binaries, step logs) must be out of other users' reach, up to /: one under a
// directory the etcd user owns (kubeadm-less distros: /var/lib/etcd) is refused, as is one
// that user could write, or a link placed there by them; a root-owned sticky one (/tmp) counts
// as out of reach.
func TestCheckTrustedDir(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "giving directories to another user needs root")
	}
	const nobody = 65534
	root := t.TempDir()
	mk := func(rel string, uid int, mode os.FileMode) string {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := mk("ok/backups", 0, 0o700)
	etcdOwned := mk("etcd", nobody, 0o700)
	under := mk("etcd/kubefence-backups", 0, 0o700)
	writable := mk("open", 0, 0o777)
	sticky := mk("sticky", 0, 0o777|os.ModeSticky)
	inSticky := mk("sticky/backups", 0, 0o700)
	linked := filepath.Join(etcdOwned, "linked")
	if err := os.Symlink(ok, linked); err != nil {
		t.Fatal(err)
	}
	mk("ok/backups/x", 0, 0o700) // reached through linked, a link the etcd user may repoint
	relay := filepath.Join(root, "relay")
	if err := os.Symlink(linked, relay); err != nil {
		t.Fatal(err)
	}
	theirLink := filepath.Join(sticky, "kb") // in /tmp, say: its owner may repoint it
	if err := os.Symlink(ok, theirLink); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(theirLink, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		dir, want string
	}{
		{ok, ""},
		{inSticky, ""},
		{sticky, "others can write"}, // they could put a journal there before kubefence does
		{under, "belongs to uid 65534"},
		{etcdOwned, "belongs to uid 65534"},
		{writable, "others can write"},
		{linked, "belongs to uid 65534"},
		{filepath.Join(linked, "x"), "belongs to uid 65534"},
		{theirLink, "belongs to uid 65534"},
		{relay, "belongs to uid 65534"}, // root's link to the etcd user's link: they repoint theirs
	}
	for _, tc := range cases {
		err := CheckTrustedDir("--backup-dir", tc.dir)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckTrustedDir(%s) = %v, want %q", tc.dir, err, tc.want)
		}
	}
}

// TestCheckTrustedParent: a backup dir not made yet is judged by the nearest directory above it
// that exists, as a directory above one is: under /tmp (root's, sticky) or several levels deep
// in root's directories it may be made; under the etcd user's it may not.
func TestCheckTrustedParent(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "giving directories to another user needs root")
	}
	root := t.TempDir()
	sticky := filepath.Join(root, "sticky")
	etcd := filepath.Join(root, "etcd")
	for _, d := range []string{sticky, etcd} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(etcd, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ dir, want string }{
		{filepath.Join(sticky, "kubefence-backups"), ""},
		{filepath.Join(root, "a", "b", "c"), ""},
		{filepath.Join(etcd, "kubefence-backups"), "belongs to uid 65534"},
		{filepath.Join(etcd, "x", "y"), "belongs to uid 65534"},
	}
	for _, tc := range cases {
		err := CheckTrustedParent("--backup-dir", tc.dir)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckTrustedParent(%s) = %v, want %q", tc.dir, err, tc.want)
		}
	}
}
