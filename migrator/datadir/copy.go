package datadir

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/internal/flock"
	"github.com/kubefence/kubefence/internal/pathguard"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// CopyReport is what a member copy did.
type CopyReport struct {
	Source   string `json:"source"`
	WALDir   string `json:"walDir,omitempty"`
	Output   string `json:"output"`
	Live     bool   `json:"live"`
	Files    int    `json:"files"`
	Bytes    int64  `json:"bytes"`
	Manifest string `json:"manifest"`
	// Attempts is how many live copies were taken (a copy that raced a WAL purge is retaken).
	Attempts int `json:"attempts,omitempty"`
	// Snapshot is the v3 backend of a live copy, taken through the member's maintenance API.
	Snapshot *SnapshotInfo `json:"snapshot,omitempty"`
	// CommitIndex bounds what a replay of the copy's WAL applies.
	CommitIndex uint64        `json:"commitIndex,omitempty"`
	Detection   *Detection    `json:"detection,omitempty"`
	Duration    time.Duration `json:"durationNanos"`
	// Warnings say what the copy, whole and matching its manifest, could not be told: the
	// version and storage Detect could not read from it (Detection is then nil).
	Warnings []string `json:"warnings,omitempty"`
}

// InUse reports whether something holds the data dir: a running etcd (it keeps an exclusive
// lock on its backend file, member/snap/db, while it runs) or a kubefence copy or backup reading
// it (a shared lock, holdStopped). The probe asks for an exclusive lock, which either refuses.
func InUse(dataDir string) (bool, error) {
	f, busy, err := lockBackend(dataDir, unix.LOCK_EX)
	if f != nil {
		f.Close()
	}
	return busy, err
}

// lockBackend takes the lock how (unix.LOCK_EX or LOCK_SH) on dataDir's backend file without
// waiting, and returns it held (close to release); busy when another holds a lock that excludes
// it. A data dir without a backend gives no file, not busy: nothing can hold it.
func lockBackend(dataDir string, how int) (f *os.File, busy bool, err error) {
	f, err = os.Open(filepath.Join(dataDir, "member", "snap", "db"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, true, nil
		}
		return nil, false, err
	}
	return f, false, nil
}

// inUseError says what to do about a data dir InUse found held, before doing what.
func inUseError(dataDir, what string) error {
	return fmt.Errorf("%s is in use: a running etcd holds its backend (stop the member first), or a kubefence copy or backup is reading it (wait for it to finish); %s", dataDir, what)
}

// holdStopped takes a shared lock on the member's backend, so an etcd started while kubefence
// works on the dir waits for it instead of changing files under it. The lock goes with close.
func holdStopped(dataDir string) (io.Closer, error) {
	f, busy, err := lockBackend(dataDir, unix.LOCK_SH)
	switch {
	case err != nil:
		return nil, err
	case busy:
		return nil, fmt.Errorf("%s is in use by a running etcd (member/snap/db is locked): stop the member first, or copy it while it runs with --live --endpoint <its client URL>", dataDir)
	case f == nil:
		return nil, fmt.Errorf("%s is not an etcd member data dir: %w", dataDir, os.ErrNotExist)
	}
	return f, nil
}

// CopyStopped copies a stopped member's data dir (and a separate WAL dir, into member/wal) to
// dst, syncing every file, and records a sha256 manifest in the copy. dst must be absent or
// empty; the copy is built next to it and renamed into place when complete. With a separate
// WAL dir, the data dir's own member/wal is left out, as CopyMemberFiles does: etcd reads the
// WAL dir only, and what is there is stale (or a link to the WAL dir, copied twice).
func CopyStopped(ctx context.Context, dataDir, walDir, dst string) (CopyReport, error) {
	start := time.Now()
	rep := CopyReport{Source: dataDir, WALDir: walDir, Output: dst}
	if err := checkOutput(dst, dataDir, walDir); err != nil {
		return rep, err
	}
	lock, err := holdStopped(dataDir)
	if err != nil {
		return rep, err
	}
	defer lock.Close()
	var notWAL func(rel string) bool
	if walDir != "" {
		memberWAL := filepath.Join("member", "wal") + string(filepath.Separator)
		notWAL = func(rel string) bool { return !strings.HasPrefix(rel, memberWAL) }
	}
	m, err := BuildDir(dst, func(tmp string) (Manifest, error) {
		m, err := copyTree(ctx, dataDir, tmp, notWAL)
		if err != nil || walDir == "" {
			return m, err
		}
		w, err := copyTree(ctx, walDir, filepath.Join(tmp, "member", "wal"), func(rel string) bool { return strings.HasSuffix(rel, ".wal") })
		for _, e := range w {
			e.Path = filepath.ToSlash(filepath.Join("member", "wal", e.Path))
			m = append(m, e)
		}
		return m, err
	})
	if err != nil {
		return rep, err
	}
	rep.Files, rep.Bytes, rep.Manifest = len(m), m.Bytes(), filepath.Join(dst, ManifestName)
	rep.detect()
	rep.Duration = time.Since(start)
	return rep, nil
}

// detect says in the report what the copy holds (Detection). The copy is whole and matches its
// manifest by now, so one Detect cannot read (a stale or garbled version.txt copied as it was, a
// WAL it cannot parse) is a warning, not a failure: a failure would leave a good copy in place
// unreported, and a rerun would be refused for the output not being empty.
func (r *CopyReport) detect() {
	d, err := Detect(r.Output, "")
	if err != nil {
		r.Warnings = append(r.Warnings, fmt.Sprintf("the copy is whole and matches its manifest, but kubefence cannot tell what the copy holds: %v", err))
		return
	}
	r.Detection = &d
}

// A running member's data dir is not a consistent copy: its backend is a bbolt file updated in
// place. CopyLive therefore takes the member's files in an order that makes the result a prefix of
// its log: first the v2 snapshot files (written whole, once), then the v3 backend through the
// member's maintenance API (its consistent index is at least the newest snapshot's, because
// etcd commits the backend before it writes a snapshot file), then the WAL segments, which only
// grow. The WAL then covers everything after the snapshot and the backend; whatever etcd or a v2
// migration replays stops at the committed index the copied WAL records, and a torn last record
// is ignored (etcd repairs it on start). A copy that raced a WAL purge (a segment gone between the
// snapshot and the WAL copy) is detected by reading it back and taken again.

// LiveAttempts bounds retries of a live copy that raced a WAL purge.
const LiveAttempts = 3

// CopyLive copies a running member's data dir; endpoint is that member's client URL.
func CopyLive(ctx context.Context, dataDir, walDir, dst string, spec ConnSpec, endpoint string) (CopyReport, error) {
	start := time.Now()
	rep := CopyReport{Source: dataDir, WALDir: walDir, Output: dst, Live: true}
	if endpoint == "" {
		return rep, errors.New("--live needs --endpoint, the running member's client URL: its backend can only be copied consistently through etcd's snapshot API")
	}
	if err := checkOutput(dst, dataDir, walDir); err != nil {
		return rep, err
	}
	cli, err := NewClient(spec, endpoint)
	if err != nil {
		return rep, err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	st, err := cli.Status(sctx, endpoint)
	cancel()
	if err != nil {
		return rep, fmt.Errorf("etcd %s: %w", endpoint, err)
	}
	memberID := st.Header.MemberId
	var last error
	for rep.Attempts = 1; rep.Attempts <= LiveAttempts; rep.Attempts++ {
		var snap SnapshotInfo
		var commit uint64
		m, err := BuildDir(dst, func(tmp string) (Manifest, error) {
			viaAPI := tmp + ".backend" // this copy's own: one a killed copy left goes first
			if err := os.Remove(viaAPI); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			defer os.Remove(viaAPI)
			m, err := CopyMemberFiles(ctx, dataDir, walDir, tmp, func() (string, int64, error) {
				var err error
				snap, err = SnapshotFrom(ctx, spec, endpoint, viaAPI)
				return viaAPI, snap.Bytes - sha256.Size, err
			})
			if err != nil {
				return m, err
			}
			commit, err = checkLiveCopy(tmp, memberID)
			return m, err
		})
		if err == nil {
			rep.Files, rep.Bytes, rep.Manifest, rep.Snapshot, rep.CommitIndex = len(m), m.Bytes(), filepath.Join(dst, ManifestName), &snap, commit
			rep.detect()
			rep.Duration = time.Since(start)
			return rep, nil
		}
		var retry *errRetry
		switch {
		case errors.As(err, &retry):
			last = retry.err
		case errors.Is(err, ErrRaced):
			last = err
		default:
			return rep, err
		}
	}
	rep.Attempts--
	return rep, fmt.Errorf("live copy of %s: %w", dataDir, last)
}

// ErrRaced marks a copy of a running member's files that raced the member: a file was gone
// by the time it was opened (a WAL segment cut from its preallocated .tmp, a snapshot or WAL
// segment purged). Taking the copy again may succeed.
var ErrRaced = errors.New("a file of the running member changed during the copy")

// gone marks err as ErrRaced when it says that a listed file no longer exists.
func gone(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrRaced, err)
	}
	return err
}

// statHook, when set (tests), runs before walkFollow looks at a path.
var statHook func(path string)

// errRetry marks a live copy that raced the member and may succeed if taken again.
type errRetry struct{ err error }

func (e *errRetry) Error() string { return e.err.Error() }

// CopyMemberFiles copies a running member's files into dir in the order that makes them a
// prefix of its log (see above): its snapshot files; then its backend, which must come from the
// maintenance API — the first n bytes of the file backend returns; then its WAL segments.
func CopyMemberFiles(ctx context.Context, dataDir, walDir, dir string, backend func() (path string, n int64, err error)) (Manifest, error) {
	if walDir == "" {
		walDir = filepath.Join(dataDir, "member", "wal")
	}
	if wals, _ := filepath.Glob(filepath.Join(walDir, "*.wal")); len(wals) == 0 {
		return nil, fmt.Errorf("no WAL files in %s: is this a member's data dir (or its --wal-dir)?", walDir)
	}
	m, err := copyTree(ctx, filepath.Join(dataDir, "member", "snap"), filepath.Join(dir, "member", "snap"), func(rel string) bool { return strings.HasSuffix(rel, ".snap") })
	if err != nil {
		return nil, err
	}
	prefix(m, "member/snap")
	src, n, err := backend()
	if err != nil {
		return nil, err
	}
	if err := copyOne(ctx, src, filepath.Join(dir, "member", "snap", "db"), n, &m, "member/snap/db"); err != nil {
		return nil, err
	}
	w, err := copyTree(ctx, walDir, filepath.Join(dir, "member", "wal"), func(rel string) bool { return strings.HasSuffix(rel, ".wal") })
	if err != nil {
		return nil, err
	}
	prefix(w, "member/wal")
	return append(m, w...), nil
}

// checkLiveCopy reads the copy back as etcd would: a WAL that no longer reaches back to the
// newest snapshot (a purge raced the copy) or a backend older than that snapshot is retried.
func checkLiveCopy(dir string, memberID uint64) (uint64, error) {
	src, err := v2v3.ReadSource(dir, "")
	if err != nil {
		return 0, &errRetry{err}
	}
	defer src.Close()
	if src.NodeID != memberID {
		return 0, fmt.Errorf("the endpoint is member %x but the data dir belongs to member %x: give the client URL of the member whose data dir this is", memberID, src.NodeID)
	}
	meta, err := readMeta(filepath.Join(dir, "member", "snap", "db"))
	if err != nil {
		return 0, err
	}
	if meta.consistentIdx < src.Meta.Index {
		return 0, &errRetry{fmt.Errorf("the backend's consistent index %d is older than snapshot index %d", meta.consistentIdx, src.Meta.Index)}
	}
	return src.HardState.Commit, nil
}

// checkOutput refuses an output that overlaps a source (see apart), and one that already
// holds files.
func checkOutput(dst string, sources ...string) error {
	if dst == "" {
		return errors.New("an output dir is required")
	}
	if err := apart("the output", dst, "the source", sources...); err != nil {
		return err
	}
	return pathguard.CheckFresh("the output", dst)
}

// apart refuses an output that is a source, lies inside one, or holds one, and the same for
// the temp dir BuildDir makes next to it (which it removes first): pathguard.CheckApart, the
// one check every command that reads a source and writes an output uses. Empty sources are
// skipped.
func apart(outRole, output, srcRole string, sources ...string) error {
	for _, src := range sources {
		if src == "" {
			continue
		}
		for _, p := range []string{output, partPath(output)} {
			if err := pathguard.CheckApart(outRole, p, srcRole, src); err != nil {
				return fmt.Errorf("%w: the source is never written, so choose a path outside it", err)
			}
		}
	}
	return nil
}

func partPath(dst string) string { return filepath.Clean(dst) + ".kubefence-part" }

// PartPaths are the temp paths beside dst that a build of dst (BuildInto, BuildDir:
// dst.kubefence-part) or a snapshot into dst (SnapshotFrom, TakeSnapshot: dst.part) works in,
// which a kubefence stopped midway (killed, or a build it abandoned) leaves behind with the data
// it was copying. The next build or snapshot to dst replaces them; a caller that removes dst for
// good removes them too.
func PartPaths(dst string) []string { return []string{partPath(dst), filepath.Clean(dst) + ".part"} }

// BuildDir builds dst through a temp dir next to it (BuildInto): build fills the temp dir and
// returns the manifest of what it wrote, which is written into it.
func BuildDir(dst string, build func(tmp string) (Manifest, error)) (Manifest, error) {
	var m Manifest
	err := BuildInto(dst, func(tmp string) error {
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return err
		}
		var err error
		if m, err = build(tmp); err != nil {
			return err
		}
		return m.Write(tmp)
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// BuildInto builds dst through a temp dir next to it, absent when build starts (build creates
// it, as etcd's restore does); then the temp dir is renamed to dst, never over anything but an
// empty dir, and dst's parent is synced (every directory in it first). On any error the temp dir is removed and dst is
// untouched.
func BuildInto(dst string, build func(tmp string) error) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	// The temp dir is named after dst and removed first: a second build to dst would remove
	// the first's from under it. Held beside dst, as upgrade, downgrade, restore-backup and
	// v2-to-v3 hold it beside a data dir, so that they exclude one another too.
	lock, err := flock.Take(dirLockPath(dst))
	var held *flock.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("another kubefence process (%s) is building or working on %s (it holds %s): wait for it to finish, or stop that process; nothing was written", held.Who(), dst, held.Path)
	}
	if err != nil {
		return err
	}
	defer lock.ReleaseRemove()
	lock.Note("building " + dst)
	tmp := partPath(dst)
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	fail := func(err error) error {
		os.RemoveAll(tmp)
		return diskHint(err, filepath.Dir(dst))
	}
	if err := build(tmp); err != nil {
		return fail(err)
	}
	// What build wrote may come from etcd's restore, which syncs its files but not the
	// directories naming them: PlaceDir syncs them, so that a crash after the rename cannot
	// leave dst without its WAL dir (etcd would start a new member there).
	if err := atomicfile.PlaceDir(tmp, dst); err != nil {
		return fail(err)
	}
	return nil
}

// diskHint adds what to do to a full disk.
func diskHint(err error, dir string) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: the filesystem of %s is full; the partial output was removed and the source is untouched; free space or choose another place", err, dir)
	}
	return err
}

// copyTree copies the regular files under src (those keep accepts, by path relative to src;
// all when keep is nil; never kubefence's own, ownFile) into dst, syncing each file and directory, and returns their manifest.
// Symlinks are followed (see walkFollow): the copy holds what they point to.
func copyTree(ctx context.Context, src, dst string, keep func(rel string) bool) (Manifest, error) {
	var m Manifest
	err := walkFollow(src, func(rel string) error {
		return os.MkdirAll(filepath.Join(dst, rel), 0o700)
	}, func(path, rel string) error {
		if ownFile(rel) || (keep != nil && !keep(rel)) {
			return nil
		}
		return gone(copyOne(ctx, path, filepath.Join(dst, rel), -1, &m, filepath.ToSlash(rel)))
	})
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{dst: true}
	for _, e := range m {
		dirs[filepath.Dir(filepath.Join(dst, filepath.FromSlash(e.Path)))] = true
	}
	for d := range dirs {
		if err := atomicfile.SyncDir(d); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// walkFollow calls dir for every directory and file for every regular file under root (root
// included, as "."), with paths relative to root, following symlinks to files and directories:
// a member's member/wal is often a symlink to a WAL disk, and a copy or backup without the WAL
// is not the member. A link that cannot be followed (a WAL disk not mounted) or that leads
// back to a directory it is in is an error. Sockets, pipes and devices are not etcd's and are
// skipped.
func walkFollow(root string, dir func(rel string) error, file func(path, rel string) error) error {
	return walkFollowAt(root, ".", map[string]bool{}, dir, file)
}

func walkFollowAt(path, rel string, ancestors map[string]bool, dir func(string) error, file func(string, string) error) error {
	if statHook != nil {
		statHook(path)
	}
	st, err := os.Stat(path)
	if err != nil {
		if target, lerr := os.Readlink(path); lerr == nil {
			return fmt.Errorf("%s is a symlink to %s, which cannot be followed (%w): a copy without it would not be the whole member; mount or fix what it points to, or remove the link", path, target, err)
		}
		return gone(err)
	}
	switch {
	case st.Mode().IsRegular():
		return file(path, rel)
	case !st.IsDir():
		return nil
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	if ancestors[real] {
		return fmt.Errorf("%s leads back to %s through a symlink: refusing to copy a loop; remove the link", path, real)
	}
	ancestors[real] = true
	defer delete(ancestors, real)
	if err := dir(rel); err != nil {
		return err
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := walkFollowAt(filepath.Join(path, e.Name()), filepath.Join(rel, e.Name()), ancestors, dir, file); err != nil {
			return err
		}
	}
	return nil
}

// copyOne copies src (its first n bytes when n >= 0) to dst, syncs it, and adds it to m as rel.
// A file that grows while copied is copied as far as it was read.
func copyOne(ctx context.Context, src, dst string, n int64, m *Manifest, rel string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	var r io.Reader = ctxReader{ctx, in}
	if n >= 0 {
		r = io.LimitReader(r, n)
	}
	h := sha256.New()
	size, err := io.Copy(io.MultiWriter(out, h), r)
	if err == nil {
		err = out.Sync()
	}
	if err = errors.Join(err, out.Close()); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	*m = append(*m, ManifestEntry{Path: rel, SHA256: fmt.Sprintf("%x", h.Sum(nil)), Size: size})
	return nil
}

func prefix(m Manifest, dir string) {
	for i := range m {
		m[i].Path = dir + "/" + m[i].Path
	}
}

// CopyFile copies src (its first n bytes when n >= 0) to a new file dst and syncs it.
func CopyFile(ctx context.Context, src, dst string, n int64) error {
	var m Manifest
	return copyOne(ctx, src, dst, n, &m, "")
}

// ctxReader reads r until ctx ends: a copy or hash of gigabytes stops at the first signal.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, context.Cause(c.ctx)
	}
	return c.r.Read(p)
}
