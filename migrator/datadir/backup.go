package datadir

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/internal/flock"
	"github.com/kubefence/kubefence/internal/pathguard"
)

// BackupReport says where a backup went.
type BackupReport struct {
	DataDir  string        `json:"dataDir"`
	Backup   string        `json:"backup"`
	Files    int           `json:"files"`
	Bytes    int64         `json:"bytes"`
	Duration time.Duration `json:"durationNanos"`
}

// Backup copies a stopped member's data dir into a new dir under root named
// <data dir name>-<version>-<UTC time>, with a sha256 manifest and a note of where it was
// taken from (BackupInfoName). A backup is never overwritten: the complete copy is renamed
// into place only if that name is free.
func Backup(ctx context.Context, dataDir, root, version string, now time.Time) (BackupReport, error) {
	return backupTo(ctx, dataDir, root, backupPath(filepath.Base(filepath.Clean(dataDir)), root, version, now))
}

// backupPath is where the backup of a data dir labelled label (its name, or more when another
// data dir of the run has that name: dirLabels) taken at now goes.
func backupPath(label, root, version string, now time.Time) string {
	return filepath.Join(root, fmt.Sprintf("%s-%s-%s", label, version, now.UTC().Format("20060102T150405Z")))
}

// BackupInfoName is the note in a backup of the data dir it was taken from. It is kubefence's
// own, like the manifest: not listed in it, and not restored.
const BackupInfoName = "kubefence-backup.json"

// BackupInfo is what a backup's BackupInfoName says.
type BackupInfo struct {
	DataDir string `json:"dataDir"`
}

// backupOrigin is the data dir the backup at dir was taken from ("" when it does not say: not
// a backup, or one an older kubefence took).
func backupOrigin(dir string) string {
	var info BackupInfo
	b, err := os.ReadFile(filepath.Join(dir, BackupInfoName))
	if err != nil || json.Unmarshal(b, &info) != nil {
		return ""
	}
	return info.DataDir
}

// backupTo is Backup into dst, a new dir under root.
func backupTo(ctx context.Context, dataDir, root, dst string) (BackupReport, error) {
	start := time.Now()
	rep := BackupReport{DataDir: dataDir}
	if err := apart("the backup dir", root, "the data dir", dataDir); err != nil {
		return rep, err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return rep, fmt.Errorf("backup dir: %w", err)
	}
	lock, err := holdStopped(dataDir)
	if err != nil {
		return rep, err
	}
	defer lock.Close()
	m, err := BuildDir(dst, func(tmp string) (Manifest, error) {
		m, err := copyTree(ctx, dataDir, tmp, nil)
		if err != nil {
			return nil, err
		}
		info, err := json.Marshal(BackupInfo{DataDir: dataDir})
		if err != nil {
			return nil, err
		}
		return m, atomicfile.Write(filepath.Join(tmp, BackupInfoName), append(info, '\n'), 0o600)
	})
	if errors.Is(err, os.ErrExist) {
		err = fmt.Errorf("%w: a backup is never overwritten", err)
	}
	if err != nil {
		return rep, fmt.Errorf("back up %s: %w", dataDir, err)
	}
	rep.Backup, rep.Files, rep.Bytes, rep.Duration = dst, len(m), m.Bytes(), time.Since(start)
	return rep, nil
}

// RestoreReport says what a restore did, also when it failed: what it changed on disk by then
// (Changed) is in it.
type RestoreReport struct {
	Backup  string `json:"backup"`
	DataDir string `json:"dataDir"`
	// Restored says the verified copy of the backup is in place at DataDir.
	Restored bool   `json:"restored"`
	Replaced string `json:"replaced,omitempty"`
	// Copy is the verified copy of the backup, left beside the data dir when renaming it into
	// place failed.
	Copy string `json:"verifiedCopy,omitempty"`
	// RemovedRebuild is the member an interrupted upgrade or downgrade had rebuilt beside the
	// data dir (<data dir>.kubefence-new, ready to swap in), from the data the restore
	// replaced, with that run's options: removed, so that the next run builds it again.
	RemovedRebuild string `json:"removedRebuild,omitempty"`
	// Abandoned are the journals of unfinished upgrades and downgrades of the data dir, renamed
	// aside: their next run plans afresh from the restored data.
	Abandoned []string `json:"abandonedJournals,omitempty"`
	// Unread are journals found in a backup dir other users can write to (trusted by the user
	// who ran there, perhaps): not read, nor abandoned; a run they journal would resume.
	Unread   []string      `json:"unreadJournals,omitempty"`
	Files    int           `json:"files"`
	Duration time.Duration `json:"durationNanos"`
}

// Changed reports whether the restore changed anything on disk: the backup put in place, the
// data dir moved aside, a verified copy left beside it, or a rebuilt member removed.
func (r RestoreReport) Changed() bool {
	return r.Restored || r.Replaced != "" || r.Copy != "" || r.RemovedRebuild != ""
}

// RestoreBackup verifies a backup against its manifest, copies it next to dataDir, verifies the
// copy, and puts it in place. A data dir already there is kept, renamed to
// <data dir>.replaced-<UTC time>; it must not be in use (InUse). It holds the lock an
// upgrade or downgrade holds beside the data dir, so it never runs between their steps.
func RestoreBackup(ctx context.Context, backup, dataDir string, now time.Time) (RestoreReport, error) {
	return restoreBackup(ctx, backup, dataDir, now, os.Rename)
}

// restoreBackup is RestoreBackup, its last rename (the verified copy into place) done by place.
func restoreBackup(ctx context.Context, backup, dataDir string, now time.Time, place func(copy, dataDir string) error) (rep RestoreReport, err error) {
	start := time.Now()
	rep = RestoreReport{Backup: backup, DataDir: dataDir}
	defer func() { rep.Duration = time.Since(start) }()
	tmp := filepath.Clean(dataDir) + ".kubefence-restore"
	for _, p := range []string{dataDir, tmp} {
		if err := pathguard.CheckApart("the data dir", p, "the backup", backup); err != nil {
			return rep, fmt.Errorf("%w: a restore replaces the data dir and never writes into the backup, so restore into a path outside it (or move the backup out of the data dir first)", err)
		}
	}
	if err := pathguard.CheckReplaceable("the data dir", dataDir); err != nil {
		return rep, err
	}
	want, err := verifiedBackup(ctx, backup)
	if err != nil {
		return rep, err
	}
	lock, err := lockForRestore(dataDir)
	if err != nil {
		return rep, err
	}
	defer lock.ReleaseRemove()
	if err := stoppedForRestore(dataDir); err != nil {
		return rep, err
	}
	// An upgrade or downgrade killed in a swap left the member beside dataDir, not in it: put
	// it back first, as their next run would, so that it is kept below like any data dir.
	if err := recoverSwap(dataDir); err != nil {
		return rep, fmt.Errorf("finish the swap an interrupted upgrade or downgrade left in %s: %w", dataDir, err)
	}
	if err := checkSameMember(backup, dataDir); err != nil {
		return rep, err
	}
	owners, err := checkOwners(dataDir)
	if err != nil {
		return rep, err
	}
	files, err := copyVerified(ctx, backup, tmp, want)
	if err != nil {
		return rep, diskHint(fmt.Errorf("restore %s: %w", backup, err), filepath.Dir(dataDir))
	}
	rep.Files = files
	if o, ok := owners[dataDir]; ok {
		if err := o.applyBuilt(tmp); err != nil {
			os.RemoveAll(tmp)
			return rep, err
		}
	}
	perr := placeCopy(&rep, tmp, now, place)
	if !rep.Restored {
		return rep, perr
	}
	// In place, even if its rename may not be durable: the next run must not resume a journal
	// on the restored data.
	var aerr error
	rep.Abandoned, rep.Unread, aerr = abandonRuns(backup, dataDir, now)
	return rep, errors.Join(perr, aerr)
}

// placeCopy puts the verified copy at tmp in place of rep.DataDir, the data dir there (if any)
// renamed aside first, and records both in rep as it goes.
func placeCopy(rep *RestoreReport, tmp string, now time.Time, place func(copy, dataDir string) error) error {
	dataDir := rep.DataDir
	// Again: an etcd started while the backup was copied (systemd restarting it) would go on
	// acknowledging writes into the dir renamed aside.
	if err := stoppedForRestore(dataDir); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := dropRebuild(rep); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if _, err := os.Stat(dataDir); err == nil {
		replaced := fmt.Sprintf("%s.replaced-%s", filepath.Clean(dataDir), now.UTC().Format("20060102T150405Z"))
		if err := atomicfile.RenameNoReplace(dataDir, replaced); err != nil {
			os.RemoveAll(tmp)
			return err
		}
		rep.Replaced = replaced
	}
	if err := place(tmp, dataDir); err != nil {
		rep.Copy = tmp
		return notPlaced(err, dataDir, tmp, rep.Replaced)
	}
	rep.Restored = true
	if err := syncParent(filepath.Dir(filepath.Clean(dataDir))); err != nil {
		return fmt.Errorf("the backup is restored in %s, but the rename that put it there may not survive a crash (fsync of its parent dir: %w): check the disk", dataDir, err)
	}
	return nil
}

// syncParent makes a rename in dir durable (a var: tests make it fail).
var syncParent = atomicfile.SyncDir

// dropRebuild removes the new dir an interrupted upgrade or downgrade built beside the data
// dir and marked ready (recoverSwap removed any not marked): the next run, planned afresh once
// its journal is abandoned, finds it built from the same source (same member, same commit
// index: the backup it takes holds the data that was rebuilt); its marker keeps a run with
// other options from taking it (readyMark), and removed, nothing of the abandoned run is left
// beside the restored data. Removed before the data dir is renamed aside, as
// otherwise a restore killed between its two renames would leave it for recoverSwap to put in
// the data dir's place. Its marker goes first: a removal that fails halfway leaves no dir
// marked ready.
func dropRebuild(rep *RestoreReport) error {
	n := newPath(rep.DataDir)
	if !exists(n) {
		return nil
	}
	if err := os.Remove(filepath.Join(n, readyMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s, a member an interrupted upgrade or downgrade rebuilt from the data this restore replaces: %w; nothing was restored", n, err)
	}
	if err := os.RemoveAll(n); err != nil {
		return fmt.Errorf("remove %s, a member an interrupted upgrade or downgrade rebuilt from the data this restore replaces: %w; nothing was restored", n, err)
	}
	rep.RemovedRebuild = n
	return atomicfile.SyncDir(filepath.Dir(n))
}

// stoppedForRestore refuses a data dir a running etcd uses.
func stoppedForRestore(dataDir string) error {
	busy, err := InUse(dataDir)
	if err == nil && busy {
		err = inUseError(dataDir, "nothing was restored")
	}
	return err
}

// checkSameMember refuses to restore the backup of one member, taken from another data dir,
// into a data dir that holds another member (each's WAL names it): that member's data would
// run in this one's place, two members with one ID. A backup taken from this data dir passes
// whatever member it holds now (a rebuild, in an upgrade or downgrade, may give members new
// IDs: undoing it is what the backup is for); so does a data dir whose member cannot be read
// (damaged: the reason to restore) or is not there, and a backup whose member cannot be read
// (its files were checked against its manifest).
func checkSameMember(backup, dataDir string) error {
	origin := backupOrigin(backup)
	if origin != "" && pathguard.Resolve(origin) == pathguard.Resolve(dataDir) {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dataDir, "member")); err != nil {
		return nil
	}
	here, err := ReadMembership(dataDir, "")
	if err != nil {
		return nil
	}
	from, err := ReadMembership(backup, "")
	if err != nil || from.Self.ID == here.Self.ID {
		return nil
	}
	if origin == "" {
		origin = "a data dir it does not name"
	}
	return fmt.Errorf("the backup %s is of member %x (cluster %x), taken from %s, but %s holds member %x (cluster %x): restored there, one member's data would run in another's place, two members with one ID. Restore the backup taken from this member; or, to put that member here on purpose, move %s away first (a restore into a missing data dir checks nothing)",
		backup, from.Self.ID, from.ClusterID, origin, dataDir, here.Self.ID, here.ClusterID, dataDir)
}

// verifiedBackup is the backup's manifest, once the backup's files are checked against it.
func verifiedBackup(ctx context.Context, backup string) (map[string]string, error) {
	want, err := ReadManifest(backup)
	if err != nil {
		return nil, err
	}
	got, err := HashDir(ctx, backup)
	if err != nil {
		return nil, err
	}
	if err := Compare(want, got); err != nil {
		return nil, fmt.Errorf("the backup %s is damaged, nothing was restored: %w", backup, err)
	}
	return want, nil
}

// lockForRestore takes the lock beside dataDir that an upgrade or downgrade holds while it
// runs (dirLockPath).
func lockForRestore(dataDir string) (*flock.Lock, error) {
	lock, err := flock.Take(dirLockPath(dataDir))
	var held *flock.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("a kubefence upgrade, downgrade or restore-backup (pid %s) works on %s (it holds %s): wait for it to finish, or stop that process; nothing was restored", held.PID(), dataDir, held.Path)
	}
	if err != nil {
		return nil, err
	}
	lock.Note("restore-backup")
	return lock, nil
}

// copyVerified copies the backup to tmp (replacing what an earlier attempt left) and checks
// the copy against want, returning how many files it copied; on any error tmp is removed.
func copyVerified(ctx context.Context, backup, tmp string, want map[string]string) (int, error) {
	if err := os.RemoveAll(tmp); err != nil {
		return 0, err
	}
	m, err := copyTree(ctx, backup, tmp, nil)
	if err == nil {
		err = Compare(want, m)
	}
	if err == nil {
		err = atomicfile.SyncDirs(tmp) // every directory, not only those holding files
	}
	if err != nil {
		os.RemoveAll(tmp)
	}
	return len(m), err
}

// notPlaced is the error of a restore whose verified copy could not be renamed into place,
// after the old data dir (if any) was renamed aside: there is no data dir now, so it says
// where both are and what to rename back.
func notPlaced(err error, dataDir, copy, replaced string) error {
	if replaced == "" {
		return fmt.Errorf("put the verified copy of the backup, %s, in place: %w. There is no data dir at %s: rename the copy to %s to finish the restore", copy, err, dataDir, dataDir)
	}
	return fmt.Errorf("put the verified copy of the backup, %s, in place: %w. There is no data dir at %s now: the data dir it had is %s and the verified copy is %s; rename one of them to %s (the copy to finish the restore, the old dir to undo it)", copy, err, dataDir, replaced, copy, dataDir)
}

// abandonRuns abandons the unfinished runs of dataDir journaled in the backup's dir or in the
// default backup dir beside dataDir (abandonJournals), of those out of other users' reach:
// what another user could have put in the others is not read, renamed or written by root, only
// named (unread: a run of the user who could write there may be journaled in it).
func abandonRuns(backup, dataDir string, now time.Time) (kept, unread []string, err error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, nil, err
	}
	var backupDirs []string
	candidates := []string{filepath.Dir(filepath.Clean(backup)), filepath.Join(filepath.Dir(abs), "kubefence-backups")}
	if candidates[0] == candidates[1] {
		candidates = candidates[:1]
	}
	for _, d := range candidates {
		if pathguard.CheckTrustedDir("a backup dir", d) == nil {
			backupDirs = append(backupDirs, d)
		} else if names, _ := filepath.Glob(filepath.Join(d, "journal-*.json")); len(names) > 0 {
			unread = append(unread, names...)
		}
	}
	why := fmt.Sprintf("restore-backup put %s back in %s at %s", backup, abs, now.UTC().Format(time.RFC3339))
	kept, err = abandonJournals(abs, backupDirs, why, now)
	if err != nil {
		return kept, unread, fmt.Errorf("the backup is restored in %s, but: %w", dataDir, err)
	}
	return kept, unread, nil
}
