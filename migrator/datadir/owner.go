package datadir

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Owner is the user and group a data dir belongs to. etcd of distro packages (and kubespray)
// runs as user etcd, kubefence often as root: what kubefence builds for such a member (a
// restored or rebuilt data dir, the files etcd writes in a step's run) is given to the owner of
// the data dir it replaces, or etcd fails with "permission denied" after a successful run.
type Owner struct {
	Dir      string
	UID, GID int
}

// ownerOf is the owner of dir (of what it links to, when it is a symlink).
func ownerOf(dir string) (Owner, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return Owner{}, err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return Owner{}, fmt.Errorf("%s: no owner information", dir)
	}
	return Owner{Dir: dir, UID: int(st.Uid), GID: int(st.Gid)}, nil
}

// checkAs refuses a run as user euid that cannot give what it builds to o: only root gives
// files to another user.
func (o Owner) checkAs(euid int) error {
	if euid == 0 || euid == o.UID {
		return nil
	}
	return fmt.Errorf("%s belongs to uid %d, and kubefence runs as uid %d: the data dir it builds (a restore, a rebuild) and the files etcd writes in a step would belong to uid %[3]d, which etcd running as uid %[2]d cannot open. Run kubefence as root (it gives them to uid %[2]d) or as uid %[2]d; nothing was changed",
		o.Dir, o.UID, euid)
}

// checkOwners is checkAs for each of dirs (those that exist) and this process's user.
func checkOwners(dirs ...string) (map[string]Owner, error) {
	owners := map[string]Owner{}
	for _, d := range dirs {
		o, err := ownerOf(d)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := o.checkAs(os.Geteuid()); err != nil {
			return nil, err
		}
		owners[d] = o
	}
	return owners, nil
}

// apply gives every file and dir under root to o. It follows two links only, to a directory o's
// user owns: member/wal's (a member/wal linked to its WAL disk holds the segments etcd wrote in
// a step) and root itself (a data dir linked to its disk; the user can swap the data dir in
// its parent for a link, to /etc, which is not given); any other link is given, not what it leads to: the
// data dir's user can put links in it, and kubefence as root following one to /root would hand
// that away. Each link is resolved once, and what was checked is what is walked. Only root can,
// and only root needs to (checkAs refused any other user whose files would be another's).
func (o Owner) apply(root string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	real := root
	if fi, err := os.Lstat(root); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		target, ok := o.ownedLinkTarget(root)
		if !ok {
			return fmt.Errorf("%s is a link to what uid %d does not own (the data dir swapped for a link?): not given to that user", root, o.UID)
		}
		real = target
	}
	err := o.chownTree(real)
	if err == nil {
		if wal, ok := o.ownedLinkTarget(filepath.Join(real, "member", "wal")); ok {
			if ownerHook != nil {
				ownerHook(real)
			}
			err = o.chownTree(wal)
		}
	}
	if err != nil {
		return fmt.Errorf("give %s to uid %d, gid %d (the owner of %s): %w", root, o.UID, o.GID, o.Dir, err)
	}
	return nil
}

// applyBuilt gives dir, which kubefence built (a rebuilt member, a restored copy), to o: dir is
// in a directory the data dir's user can write to, who could swap it for a link while it was
// built (what was built then went where the link led) and, given, what it leads to would be
// theirs. So dir must be a directory of this process's user, not a link, and is walked as it
// is (a link found at its place by the walk is given, not followed), and no link in it is
// followed: kubefence made none.
func (o Owner) applyBuilt(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := builtHere(dir); err != nil {
		return err
	}
	if err := o.chownTree(dir); err != nil {
		return fmt.Errorf("give %s to uid %d, gid %d (the owner of %s): %w", dir, o.UID, o.GID, o.Dir, err)
	}
	return nil
}

// builtHere fails unless path, just built, is a directory of this process's user, not a link:
// its parent is the etcd user's, who could put a link at path for the build to follow, and what
// it leads to must not be given to that user (owner.apply follows a link at the root).
func builtHere(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s was replaced (by a %s) while it was built: someone with write access to %s is at work there; nothing was swapped in", path, fi.Mode().Type(), filepath.Dir(path))
	}
	return nil
}

// ownerHook, when set (tests), runs between the check of member/wal's link and the walk of
// where it led.
var ownerHook func(root string)

// ownedLinkTarget is where the link at path leads, resolved once, when that is a directory o's
// user owns: a member's WAL disk is its user's; anything else a link there leads to (the user
// can replace it) is not given.
func (o Owner) ownedLinkTarget(path string) (string, bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return "", false
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", false
	}
	ti, err := os.Lstat(target)
	if err != nil || !ti.IsDir() {
		return "", false
	}
	st, ok := ti.Sys().(*syscall.Stat_t)
	return target, ok && int(st.Uid) == o.UID
}

// chownTree gives dir and everything under it to o, following no link (dir included: the
// caller resolved it).
func (o Owner) chownTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, o.UID, o.GID)
	})
}
