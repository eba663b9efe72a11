package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
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
// <data dir name>-<version>-<UTC time>, with a sha256 manifest. A backup is never overwritten:
// the complete copy is renamed into place only if that name is free.
func Backup(dataDir, root, version string, now time.Time) (BackupReport, error) {
	return backupTo(dataDir, root, backupPath(dataDir, root, version, now))
}

// backupPath is where Backup puts dataDir's backup taken at now.
func backupPath(dataDir, root, version string, now time.Time) string {
	return filepath.Join(root, fmt.Sprintf("%s-%s-%s", filepath.Base(filepath.Clean(dataDir)), version, now.UTC().Format("20060102T150405Z")))
}

// backupTo is Backup into dst, a new dir under root.
func backupTo(dataDir, root, dst string) (BackupReport, error) {
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
	m, err := BuildDir(dst, func(tmp string) (Manifest, error) { return copyTree(dataDir, tmp, nil) })
	if errors.Is(err, os.ErrExist) {
		err = fmt.Errorf("%w: a backup is never overwritten", err)
	}
	if err != nil {
		return rep, fmt.Errorf("back up %s: %w", dataDir, err)
	}
	rep.Backup, rep.Files, rep.Bytes, rep.Duration = dst, len(m), m.Bytes(), time.Since(start)
	return rep, nil
}

// RestoreReport says what a restore did.
type RestoreReport struct {
	Backup   string        `json:"backup"`
	DataDir  string        `json:"dataDir"`
	Replaced string        `json:"replaced,omitempty"`
	Files    int           `json:"files"`
	Duration time.Duration `json:"durationNanos"`
}

// RestoreBackup verifies a backup against its manifest, copies it next to dataDir, verifies the
// copy, and puts it in place. A data dir already there is kept, renamed to
// <data dir>.replaced-<UTC time>; it must not be in use by a running etcd.
func RestoreBackup(backup, dataDir string, now time.Time) (RestoreReport, error) {
	start := time.Now()
	rep := RestoreReport{Backup: backup, DataDir: dataDir}
	tmp := filepath.Clean(dataDir) + ".kubefence-restore"
	for _, p := range []string{dataDir, tmp} {
		if err := pathguard.CheckApart("the data dir", p, "the backup", backup); err != nil {
			return rep, fmt.Errorf("%w: a restore replaces the data dir and never writes into the backup, so restore into a path outside it (or move the backup out of the data dir first)", err)
		}
	}
	want, err := ReadManifest(backup)
	if err != nil {
		return rep, err
	}
	got, err := HashDir(backup)
	if err != nil {
		return rep, err
	}
	if err := Compare(want, got); err != nil {
		return rep, fmt.Errorf("the backup %s is damaged, nothing was restored: %w", backup, err)
	}
	if busy, err := InUse(dataDir); err != nil {
		return rep, err
	} else if busy {
		return rep, fmt.Errorf("%s is in use by a running etcd: stop it before restoring", dataDir)
	}
	// An upgrade or downgrade killed in a swap left the member beside dataDir, not in it: put
	// it back first, as their next run would, so that it is kept below like any data dir.
	if err := recoverSwap(dataDir); err != nil {
		return rep, fmt.Errorf("finish the swap an interrupted upgrade or downgrade left in %s: %w", dataDir, err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		return rep, err
	}
	m, err := copyTree(backup, tmp, nil)
	if err == nil {
		err = Compare(want, m)
	}
	if err == nil {
		err = atomicfile.SyncDirs(tmp) // every directory, not only those holding files
	}
	if err != nil {
		os.RemoveAll(tmp)
		return rep, diskHint(fmt.Errorf("restore %s: %w", backup, err), filepath.Dir(dataDir))
	}
	if _, err := os.Stat(dataDir); err == nil {
		rep.Replaced = fmt.Sprintf("%s.replaced-%s", filepath.Clean(dataDir), now.UTC().Format("20060102T150405Z"))
		if err := atomicfile.RenameNoReplace(dataDir, rep.Replaced); err != nil {
			os.RemoveAll(tmp)
			return rep, err
		}
	}
	if err := os.Rename(tmp, dataDir); err != nil {
		return rep, err
	}
	if err := atomicfile.SyncDir(filepath.Dir(filepath.Clean(dataDir))); err != nil {
		return rep, err
	}
	rep.Files, rep.Duration = len(m), time.Since(start)
	return rep, nil
}
