// Package atomicfile writes files so that a reader, or the next start after a crash, sees either
// the old content or the new, never a mix: temp file in the same directory, fsync, rename, fsync
// of the directory.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Write replaces path with data, created with mode.
func Write(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename this finds nothing
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, err)
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory, making a rename or a new entry in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// SyncDirs fsyncs root and every directory under it, making the entries of a tree built by
// others (files they synced themselves) durable before the tree is renamed into place.
func SyncDirs(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		return SyncDir(p)
	})
}

// PlaceDir renames the directory tmp, built by the caller, to dst: every directory in tmp is
// synced first (what etcd's restore and bbolt write is synced as files, not as entries of
// their directories), dst may only be absent or an empty directory (then removed), the rename
// never replaces anything, and dst's parent is synced.
func PlaceDir(tmp, dst string) error {
	if err := SyncDirs(tmp); err != nil {
		return err
	}
	if entries, err := os.ReadDir(dst); err == nil && len(entries) == 0 {
		if err := os.Remove(dst); err != nil {
			return err
		}
	}
	if err := RenameNoReplace(tmp, dst); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(dst))
}

// RenameNoReplace renames src to dst, failing with an error that wraps os.ErrExist if dst
// exists, or ErrNoReplaceUnsupported (and the errno) if the filesystem cannot rename so.
func RenameNoReplace(src, dst string) error {
	err := Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%s: %w", dst, os.ErrExist)
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EINVAL) && !intoItself(src, dst):
		return fmt.Errorf("rename %s to %s: %w (%w)", src, dst, ErrNoReplaceUnsupported, err)
	}
	return fmt.Errorf("rename %s to %s: %w", src, dst, err)
}

// ErrNoReplaceUnsupported is a filesystem without an atomic no-replace rename: NFS refuses any
// rename flag with EINVAL, and so do some FUSE filesystems; a kernel before 3.15 has no
// renameat2 (ENOSYS). A plain rename there would replace a file another process put at dst.
var ErrNoReplaceUnsupported = errors.New("the filesystem does not support an atomic no-replace rename (RENAME_NOREPLACE; NFS and some FUSE filesystems do not): use a directory on a local filesystem")

// intoItself reports whether dst is src or lies inside it: renameat2's other EINVAL, making a
// directory a subdirectory of itself (paths compared as written).
func intoItself(src, dst string) bool {
	s, serr := filepath.Abs(src)
	d, derr := filepath.Abs(dst)
	return serr == nil && derr == nil && (d == s || strings.HasPrefix(d, s+string(filepath.Separator)))
}

// Renameat2 is renameat2(2) as RenameNoReplace makes it: unix.Renameat2, or, in a test of code
// that places files with RenameNoReplace, one that fails as a filesystem without
// RENAME_NOREPLACE does.
var Renameat2 = unix.Renameat2
