package datadir

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubefence/kubefence/internal/testenv"
)

// nobody is the owner the tests give data dirs: another user than the one kubefence runs as,
// as the etcd user of distro packages is.
const nobody = 65534

// chownTree gives every file and dir under root to uid:gid.
func chownTree(t *testing.T, root string, uid, gid int) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// assertOwned fails unless every file and dir under root (and what a link in it leads to)
// belongs to uid:gid.
func assertOwned(t *testing.T, root string, uid, gid int) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := os.Stat(p) // what a symlink leads to: etcd opens that
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		if int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("%s is owned by %d:%d, want %d:%d (etcd, running as that user, gets \"permission denied\")", p, st.Uid, st.Gid, uid, gid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "giving files to another user needs root")
	}
}

// TestRestoreKeepsTheOwner: kubefence as root restores the backup of a data dir etcd runs on as
// another user. The restored tree belongs to the owner of the data dir it replaces, not to root.
func TestRestoreKeepsTheOwner(t *testing.T) {
	needRoot(t)
	parent := t.TempDir()
	d := filepath.Join(parent, "etcd")
	writeTree(t, d, memberDir)
	br, err := Backup(t.Context(), d, filepath.Join(parent, "backups"), "3.5.35", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	chownTree(t, d, nobody, nobody+1)
	if _, err := RestoreBackup(t.Context(), br.Backup, d, time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	assertOwned(t, d, nobody, nobody+1)
}

// TestRebuildKeepsTheOwner: a rebuild (v2 migration, downgrade) swaps in new trees; each belongs
// to the owner of the data dir it replaces.
func TestRebuildKeepsTheOwner(t *testing.T) {
	needRoot(t)
	f := newRebuildFixture(t)
	for i, d := range f.dirs {
		chownTree(t, d, nobody-i, nobody)
	}
	e, s := f.start()
	if err := e.rebuild(t.Context(), s, f.build); err != nil {
		t.Fatal(err)
	}
	for i, d := range f.dirs {
		assertOwned(t, d, nobody-i, nobody)
	}
}

// TestOwnerCheckWithoutRoot: kubefence not run as root cannot give what it builds to the data
// dir's owner: refused up front, naming both users, before anything is changed.
func TestOwnerCheckWithoutRoot(t *testing.T) {
	d := t.TempDir()
	owner, err := ownerOf(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.checkAs(owner.UID); err != nil {
		t.Fatalf("as the owner: %v", err)
	}
	assertErrContains(t, owner.checkAs(owner.UID+1), d, "uid", "root")
	if err := owner.checkAs(0); err != nil {
		t.Fatalf("as root: %v", err)
	}
}

// TestOwnerFollowsTheWALLink: a member whose member/wal links to a WAL disk gets the segments
// etcd wrote there in a step given to its owner too.
func TestOwnerFollowsTheWALLink(t *testing.T) {
	needRoot(t)
	parent := t.TempDir()
	d, wal := filepath.Join(parent, "etcd"), filepath.Join(parent, "wal-disk", "wal")
	writeTree(t, d, map[string]string{"member/snap/db": "x"})
	writeTree(t, wal, map[string]string{"0.wal": "segment"}) // written by etcd run as root in a step
	if err := os.Chown(wal, nobody, nobody); err != nil {    // the member's WAL disk is its user's
		t.Fatal(err)
	}
	symlink(t, wal, filepath.Join(d, "member", "wal"))
	if err := (Owner{Dir: d, UID: nobody, GID: nobody}).apply(d); err != nil {
		t.Fatal(err)
	}
	assertOwned(t, wal, nobody, nobody)
	assertOwned(t, d, nobody, nobody)
}

// TestOwnerFollowsNoOtherLink: the data dir's user (etcd, or whoever took it over) can put
// links in it; kubefence as root must not give what they lead to away (a link to /root would
// hand root's home to that user). Only member/wal's link, to the member's WAL disk, is followed.
func TestOwnerFollowsNoOtherLink(t *testing.T) {
	needRoot(t)
	parent := t.TempDir()
	d, outside := filepath.Join(parent, "etcd"), filepath.Join(parent, "outside")
	writeTree(t, d, map[string]string{"member/snap/db": "x", "member/wal/0.wal": "segment"})
	writeTree(t, outside, map[string]string{"secret": "root's"})
	symlink(t, outside, filepath.Join(d, "member", "snap", "dir-link"))
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(d, "member", "file-link"))
	if err := (Owner{Dir: d, UID: nobody, GID: nobody}).apply(d); err != nil {
		t.Fatal(err)
	}
	assertOwned(t, outside, 0, 0)
	assertOwned(t, filepath.Join(d, "member", "wal"), nobody, nobody)
	assertOwned(t, filepath.Join(d, "member", "snap", "db"), nobody, nobody)
	// Nor member/wal's link, when what it leads to is not the member's user's (its WAL disk is):
	// that user can replace the link.
	if err := os.RemoveAll(filepath.Join(d, "member", "wal")); err != nil {
		t.Fatal(err)
	}
	symlink(t, outside, filepath.Join(d, "member", "wal"))
	if err := (Owner{Dir: d, UID: nobody, GID: nobody}).apply(d); err != nil {
		t.Fatal(err)
	}
	assertOwned(t, outside, 0, 0)
}

// TestOwnerWalksTheLinkItChecked: the member's user may re-point member/wal between the check
// of where it leads and the walk; what is walked is what was checked.
func TestOwnerWalksTheLinkItChecked(t *testing.T) {
	needRoot(t)
	parent := t.TempDir()
	d, wal, outside := filepath.Join(parent, "etcd"), filepath.Join(parent, "wal-disk", "wal"), filepath.Join(parent, "outside")
	writeTree(t, d, map[string]string{"member/snap/db": "x"})
	writeTree(t, wal, map[string]string{"0.wal": "segment"})
	writeTree(t, outside, map[string]string{"secret": "root's"})
	if err := os.Chown(wal, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(d, "member", "wal")
	symlink(t, wal, link)
	ownerHook = func(string) {
		if err := os.Remove(link); err != nil {
			t.Error(err)
		}
		symlink(t, outside, link)
	}
	t.Cleanup(func() { ownerHook = nil })
	if err := (Owner{Dir: d, UID: nobody, GID: nobody}).apply(d); err != nil {
		t.Fatal(err)
	}
	assertOwned(t, outside, 0, 0)
	assertOwned(t, wal, nobody, nobody)
}

// TestRebuildRefusesANewDirSwapped: the new dir of a member is built next to its data dir, in a
// directory the etcd user owns; swapped for a link while it is built (etcd's restore follows
// it), it is refused before it is given to the member's user: giving it would chown what the
// link leads to (a root-owned directory on root's PATH) to that user.
func TestRebuildRefusesANewDirSwapped(t *testing.T) {
	needRoot(t)
	f := newRebuildFixture(t)
	for _, d := range f.dirs {
		chownTree(t, d, nobody, nobody)
	}
	decoy := t.TempDir() // root's
	e, s := f.start()
	err := e.rebuild(t.Context(), s, func(src, tmp string, ms Membership) (string, error) {
		// The etcd user's move, between kubefence's removal of tmp and the restore into it.
		if err := os.RemoveAll(tmp); err != nil {
			return "", err
		}
		if err := os.Symlink(decoy, tmp); err != nil {
			return "", err
		}
		return f.build(src, tmp, ms)
	})
	if err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("rebuild with its new dir swapped for a link: %v; want it refused", err)
	}
	assertOwned(t, decoy, 0, 0)
}

// TestRebuildStopsAtASignal: a rebuild whose context is cancelled (Ctrl-C, SIGTERM) between
// members builds no more and swaps nothing in: it went on restoring every member and swapped
// them all.
func TestRebuildStopsAtASignal(t *testing.T) {
	f := newRebuildFixture(t)
	e, s := f.start()
	ctx, cancel := context.WithCancel(t.Context())
	built := 0
	err := e.rebuild(ctx, s, func(src, tmp string, ms Membership) (string, error) {
		if built++; built == 1 {
			cancel()
		}
		return f.build(src, tmp, ms)
	})
	if !errors.Is(err, context.Canceled) || built != 1 || s.Swapped {
		t.Fatalf("rebuild cancelled while building: %v, built %d, swapped %v; want it stopped after the first", err, built, s.Swapped)
	}
}

// TestBackupDirOutOfTheEtcdUsersReach: a data dir in a directory the etcd user owns (Debian's
// /var/lib/etcd) has its default backup dir there too, where that user could plant a journal
// naming a binary kubefence, as root, then runs: refused before anything in it is read (a dry
// run too), with a backup dir to give instead.
func TestBackupDirOutOfTheEtcdUsersReach(t *testing.T) {
	needRoot(t)
	parent := filepath.Join(t.TempDir(), "etcd")
	d := filepath.Join(parent, "m1")
	writeMemberWith(t, d, testPeers[0], 5, testPeers[:1])
	chownTree(t, parent, nobody, nobody)
	bin := filepath.Join(t.TempDir(), "bin")
	writeTree(t, bin, nil)
	fakeEtcd(t, bin, "3.5.35", "3.5.35")
	fakeEtcd(t, bin, "3.6.16", "3.6.16")
	for _, dry := range []bool{true, false} {
		_, err := Run(t.Context(), OpUpgrade, Options{DataDirs: []string{d}, DryRun: dry, Target: Version{3, 6, 16}, BinDir: bin})
		if err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") || !strings.Contains(err.Error(), "--backup-dir") {
			t.Errorf("upgrade (dry run %v) with its backup dir in the etcd user's directory: %v; want it refused", dry, err)
		}
	}
	if _, err := os.Stat(filepath.Join(parent, "kubefence-backups")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused upgrade made its backup dir (%v)", err)
	}
	if _, err := Run(t.Context(), OpUpgrade, Options{DataDirs: []string{d}, DryRun: true, Target: Version{3, 6, 16}, BinDir: bin, BackupDir: filepath.Join(t.TempDir(), "backups")}); err != nil {
		t.Errorf("dry run with a backup dir of root's: %v", err)
	}
}

// TestRestoreRefusesItsCopySwapped: the restore's copy is built beside the data dir, in a
// directory the etcd user can write to; swapped for a link while it is copied (the copy then
// goes where the link leads), it is refused, and what the link leads to is not given to that
// user.
func TestRestoreRefusesItsCopySwapped(t *testing.T) {
	needRoot(t)
	_, dataDir, rep := backedUpMember(t)
	chownTree(t, dataDir, nobody, nobody)
	decoy := t.TempDir() // root's
	tmp := filepath.Clean(dataDir) + ".kubefence-restore"
	swapped := false
	statHook = func(string) { // the etcd user's move, once the copy began
		if swapped || !exists(tmp) {
			return
		}
		swapped = true
		if err := os.Rename(tmp, tmp+".aside"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(decoy, tmp); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { statHook = nil })
	_, err := RestoreBackup(t.Context(), rep.Backup, dataDir, time.Now())
	if !swapped || err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("restore with its copy swapped for a link (swapped %v): %v; want it refused", swapped, err)
	}
	assertOwned(t, decoy, 0, 0)
}

// TestOwnerFollowsTheRootLinkOnlyToTheUsers: a data dir that is a link is followed only to a
// directory its user owns (a data dir on its own disk); one the user swapped for a link to a
// root-owned directory (/etc) is refused, and that directory is not given away.
func TestOwnerFollowsTheRootLinkOnlyToTheUsers(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	decoy, theirs := filepath.Join(dir, "decoy"), filepath.Join(dir, "theirs")
	writeTree(t, decoy, map[string]string{"f": "root's"})
	writeTree(t, theirs, map[string]string{"f": "theirs"})
	chownTree(t, theirs, nobody, nobody)
	o := Owner{UID: nobody, GID: nobody, Dir: "the data dir"}
	toDecoy, toTheirs := filepath.Join(dir, "to-decoy"), filepath.Join(dir, "to-theirs")
	for link, target := range map[string]string{toDecoy: decoy, toTheirs: theirs} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.apply(toDecoy); err == nil {
		t.Error("apply followed a link to a root-owned directory")
	}
	assertOwned(t, decoy, 0, 0)
	if err := o.apply(toTheirs); err != nil {
		t.Errorf("apply on a link to the user's own directory: %v", err)
	}
}
