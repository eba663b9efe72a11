// Package pathguard keeps a command's outputs apart from its source: an output (or a temp dir
// next to it) that is the source, lies inside it, or holds it is refused before anything is
// written or removed.
package pathguard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// CheckApart returns an error when output and source overlap: output is source, is inside it,
// or holds it. Both are compared as the kernel would open them: made absolute, with symlinks
// (and any ".." after one) resolved for the part of the path that exists. A bind mount of the
// source is caught too, by comparing the identities of output's existing ancestors with the
// source's. outRole and srcRole name the two in the error ("the output", "the source"), which
// gives both paths as given and as resolved; callers add what to do.
//
// The source's own symlinks count as the source: an output under one as written (src/wal/copy),
// or where one points (a member's WAL dir on another disk), is inside what a copy of the source
// reads and follows.
func CheckApart(outRole, output, srcRole, source string) error {
	out, src := Resolve(output), Resolve(source)
	e := &OverlapError{OutputRole: outRole, Output: output, SourceRole: srcRole, Source: source, ResolvedOutput: out, ResolvedSource: src}
	switch {
	case within(out, src) || sameDirAbove(out, src) || within(absClean(output), absClean(source)):
		return e
	case linkedFrom(out, src, e):
		return e
	case within(src, out) || sameDirAbove(src, out):
		e.Holds = true
		return e
	}
	return nil
}

// OverlapError is an output that is, lies inside, or holds the source.
type OverlapError struct {
	OutputRole, Output, SourceRole, Source string
	ResolvedOutput, ResolvedSource         string
	// Holds is true when the output holds the source (rather than lying inside it).
	Holds bool
	// Link is the source's symlink (and Target where it points) the output lies under, if any.
	Link, Target string
}

// absClean is p made absolute and cleaned, symlinks not resolved: the path as written.
func absClean(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return filepath.Clean(p)
}

// linkedFrom reports whether out lies where a symlink inside src points (a directory a copy of
// src follows), and names the link in e.
func linkedFrom(out, src string, e *OverlapError) bool {
	found := false
	_ = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found || d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		if target := Resolve(path); within(out, target) {
			if st, serr := os.Stat(target); serr == nil && st.IsDir() {
				found, e.Link, e.Target = true, path, target
				return filepath.SkipAll
			}
		}
		return nil
	})
	return found
}

func (e *OverlapError) Error() string {
	how := "must not be inside"
	if e.Holds {
		how = "must not hold"
	}
	s := fmt.Sprintf("%s %s %s %s %s", e.OutputRole, e.Output, how, e.SourceRole, e.Source)
	if e.Link != "" {
		return s + fmt.Sprintf(" (its symlink %s points to %s, which holds it)", e.Link, e.Target)
	}
	if e.ResolvedOutput != filepath.Clean(e.Output) || e.ResolvedSource != filepath.Clean(e.Source) {
		s += fmt.Sprintf(" (resolved: %s and %s)", e.ResolvedOutput, e.ResolvedSource)
	}
	return s
}

// IsOverlap reports whether err is (or wraps) an OverlapError.
func IsOverlap(err error) bool {
	var o *OverlapError
	return errors.As(err, &o)
}

// within reports whether path is dir or lies under it (both resolved).
func within(path, dir string) bool {
	return path == dir || dir == string(filepath.Separator) || strings.HasPrefix(path, dir+string(filepath.Separator))
}

// sameDirAbove reports whether dir (when it exists) is the same directory as path or one of
// path's existing ancestors: a bind mount makes one directory reachable under two names.
func sameDirAbove(path, dir string) bool {
	want, err := os.Stat(dir)
	if err != nil || !want.IsDir() {
		return false
	}
	for cur := path; ; cur = filepath.Dir(cur) {
		if st, err := os.Stat(cur); err == nil && os.SameFile(st, want) {
			return true
		}
		if filepath.Dir(cur) == cur {
			return false
		}
	}
}

// Resolve returns p as the kernel would reach it: absolute, each existing component's symlinks
// resolved before the next component (so "link/.." is the link target's parent, not "."), and
// the part that does not exist yet appended lexically.
func Resolve(p string) string {
	abs, err := absolute(p)
	if err != nil {
		return filepath.Clean(p)
	}
	r, _, _ := walk(abs)
	return r
}

// absolute is p made absolute without cleaning it: "link/.." must go up from where the link
// leads, as the kernel goes, not cancel out as filepath.Abs would have it.
func absolute(p string) (string, error) {
	if filepath.IsAbs(p) {
		return p, nil
	}
	wd, err := os.Getwd()
	return wd + string(filepath.Separator) + p, err
}

// CheckFresh returns an error unless output is free to be made: it does not exist, or it is an
// empty directory. A file there (a snapshot or a db given by mistake) or a directory holding
// anything is refused; role names it in the error ("--output-dir", "the output").
func CheckFresh(role, output string) error {
	st, err := os.Lstat(output)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("%s %s: %w", role, output, err)
	case st.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%s %s is a symlink: give the directory it points to, or a new path", role, output)
	case !st.IsDir():
		return fmt.Errorf("%s %s is a file: refusing to overwrite it (choose a new path)", role, output)
	}
	entries, err := os.ReadDir(output)
	if err != nil {
		return fmt.Errorf("%s %s: %w", role, output, err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s %s is not empty: refusing to overwrite it (choose a new path, or move it away)", role, output)
	}
	if isMountPoint(output) {
		return fmt.Errorf("%s %s is a mount point: the new directory is built beside it and renamed into its place, which a mount point refuses; give a directory inside it (e.g. %s)", role, output, filepath.Join(output, "data"))
	}
	return nil
}

// CheckReplaceable refuses a directory that is put in place by a rename (a restore into it, a
// rebuild of its member): a symlink, which the rename would move, leaving the directory it
// points to behind, or a mount point, which refuses the rename (after the new directory was
// built beside it, on the filesystem above). A path that does not exist passes.
func CheckReplaceable(role, dir string) error {
	st, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("%s %s: %w", role, dir, err)
	case st.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%s %s is a symlink to %s: it is replaced by a rename, which would move the link and leave that directory behind; give the directory itself (the link then points to the new one)", role, dir, Resolve(dir))
	case isMountPoint(dir):
		return fmt.Errorf("%s %s is a mount point: it is replaced by a rename, which a mount point refuses (after the new one was built beside it, on the filesystem above); with etcd stopped, move the member into a directory inside the mount (e.g. %s), point etcd's --data-dir there and give that", role, dir, filepath.Join(dir, "data"))
	}
	return nil
}

// isMountPoint reports whether dir is where a filesystem (or a bind mount) is mounted, from
// /proc/self/mountinfo (its fifth field, with spaces and the like escaped as \ooo).
func isMountPoint(dir string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	want := Resolve(dir)
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMountPath(f[4]) == want {
			return true
		}
	}
	return false
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// OpenOwn opens (creating it 0600 if missing) a file kubefence keeps for itself in a directory
// another user may write to (a data dir's parent, a backup dir): never through a link that user
// put at path, nor a hard link to someone else's file, nor a FIFO or device. Lock files and step
// logs are opened so; anything else there is refused with what was found.
func OpenOwn(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, flag|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link, not a file kubefence made: remove it (check who put it there) and try again", path)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	// No links beside this one; none at all is a file its holder removed since it was opened
	// (a lock released: flock.Take opens it again).
	if !fi.Mode().IsRegular() || st == nil || st.Nlink > 1 {
		f.Close()
		return nil, fmt.Errorf("%s is not a file kubefence made (%s, %d links): remove it (check who put it there) and try again", path, fi.Mode().Type(), linkCount(st))
	}
	return f, nil
}

func linkCount(st *syscall.Stat_t) uint64 {
	if st == nil {
		return 0
	}
	return uint64(st.Nlink)
}

// CheckTrustedDir refuses dir unless no other user can change what kubefence finds in it: dir
// must belong to this process's user (or root) and be writable by nobody else, and so must
// every directory above it, up to /, where a root-owned one with the sticky bit (/tmp) is
// enough (no one else can rename entries in it). It is checked as the path resolves, and so is
// each directory holding a link on the way (whoever can write there can point the link
// elsewhere). kubefence keeps there what it reads back and acts on as root (a journal naming
// the binaries it runs, step logs it appends to): in a directory the etcd user can write to,
// that user could plant them.
func CheckTrustedDir(role, dir string) error { return checkTrusted(role, dir, true, backupExample) }

// CheckTrustedDirLike is CheckTrustedDir with example the directory its error suggests instead.
func CheckTrustedDirLike(role, dir, example string) error {
	return checkTrusted(role, dir, true, example)
}

// CheckTrustedParent is CheckTrustedDir for a directory to be made: its nearest existing
// ancestor must be out of other users' reach as a directory above it is (a root-owned sticky
// one, /tmp, will do).
func CheckTrustedParent(role, dir string) error {
	p := filepath.Clean(dir)
	for {
		if _, err := os.Lstat(p); err == nil || p == filepath.Dir(p) {
			break
		}
		p = filepath.Dir(p)
	}
	return checkTrusted(role, p, p == filepath.Clean(dir), backupExample)
}

// CheckTrustedAbove is CheckTrustedDir for the directories above dir, not dir itself (which the
// caller makes its own, or refuses): from its nearest existing ancestor but itself, up to /, a
// root-owned sticky one (/tmp) will do. Whoever can rename an entry in one of them can put
// another directory in dir's place. example is a directory to suggest instead.
func CheckTrustedAbove(role, dir, example string) error {
	p := filepath.Dir(filepath.Clean(dir))
	for {
		if _, err := os.Lstat(p); err == nil || p == filepath.Dir(p) {
			break
		}
		p = filepath.Dir(p)
	}
	return checkTrusted(role, p, false, example)
}

// backupExample is the directory the backup dir's errors suggest.
const backupExample = "/var/lib/kubefence-backups"

// checkTrusted is CheckTrustedDir; strict holds dir itself to its rule (not a sticky one);
// example is a directory the error suggests.
func checkTrusted(role, dir string, strict bool, example string) error {
	abs, err := absolute(dir)
	if err != nil {
		return fmt.Errorf("%s %s: %w", role, dir, err)
	}
	real, links, err := walk(abs)
	if err != nil {
		return fmt.Errorf("%s %s: %w", role, dir, err)
	}
	type chain struct {
		dir  string
		self bool
	}
	chains := []chain{{real, strict}}
	for _, l := range links {
		// Its owner may repoint it, even in a sticky directory; whoever can write to the
		// directory holding it may replace it.
		if l.uid != 0 && l.uid != os.Geteuid() {
			return fmt.Errorf("%s %s: the link %s on the way belongs to uid %d: give a path without it", role, dir, l.path, l.uid)
		}
		chains = append(chains, chain{filepath.Dir(l.path), false})
	}
	for _, c := range chains {
		for q := c.dir; ; q = filepath.Dir(q) {
			if err := trustedDir(q, c.self && q == c.dir); err != nil {
				return fmt.Errorf("%s %s: %w: give a directory that only root (or this user) can write to, nor any directory above it (e.g. %s)", role, dir, err, example)
			}
			if q == filepath.Dir(q) {
				break
			}
		}
	}
	return nil
}

// linkMet is a symbolic link met resolving a path: where it is (its directory resolved) and
// whose it is.
type linkMet struct {
	path string
	uid  int
}

// maxLinks is how many symbolic links a walk follows (the kernel's limit) before it takes the
// path for a loop.
const maxLinks = 40

// walk resolves the absolute path p as the kernel does, a component at a time, and returns
// where it leads and every symbolic link met on the way, also those in a link's target. At a
// component it cannot go past (missing, unreadable, a loop), err says why and the path is what
// was resolved with the rest appended as written.
func walk(p string) (string, []linkMet, error) {
	todo := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur, links := "/", []linkMet(nil)
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err == nil && fi.Mode()&os.ModeSymlink != 0 && len(links) == maxLinks {
			err = fmt.Errorf("%s: more than %d links", p, maxLinks)
		}
		if err != nil {
			return filepath.Join(append([]string{next}, todo...)...), links, err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		target, err := os.Readlink(next)
		if err != nil {
			return filepath.Join(append([]string{next}, todo...)...), links, err
		}
		uid := -1
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid = int(st.Uid)
		}
		links = append(links, linkMet{next, uid})
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, links, nil
}

// trustedDir checks one directory of CheckTrustedDir's chain; self is the directory itself
// (a sticky one is not enough there: anyone could create its files first).
func trustedDir(q string, self bool) error {
	fi, err := os.Lstat(q)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner to check", q)
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%s belongs to uid %d", q, uid)
	}
	sticky := fi.Mode()&os.ModeSticky != 0 && st.Uid == 0 && !self
	if fi.Mode().Perm()&0o022 != 0 && !sticky {
		return fmt.Errorf("others can write to %s (mode %s)", q, fi.Mode().Perm())
	}
	return nil
}
