package datadir

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubefence/kubefence/internal/flock"
	"github.com/kubefence/kubefence/internal/testenv"
)

func TestBackupRestore(t *testing.T) {
	parent := t.TempDir()
	dataDir := filepath.Join(parent, "member-a")
	writeTree(t, dataDir, memberDir)
	root := filepath.Join(parent, "backups")
	now := time.Date(2025, 3, 4, 5, 6, 7, 0, time.FixedZone("CET", 3600))

	rep, err := Backup(t.Context(), dataDir, root, "3.5.9", now)
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(root, "member-a-3.5.9-20250304T040607Z") // UTC
	if rep.Backup != backup || rep.DataDir != dataDir || rep.Files != len(memberDir) {
		t.Fatalf("Backup = %+v, want %s with %d files", rep, backup, len(memberDir))
	}
	var bytes int64
	for _, c := range memberDir {
		bytes += int64(len(c))
	}
	if rep.Bytes != bytes {
		t.Errorf("Bytes = %d, want %d", rep.Bytes, bytes)
	}
	if got := backupOrigin(backup); got != dataDir {
		t.Errorf("the backup says it was taken from %q, want %s", got, dataDir)
	}
	backupFiles := readTree(t, backup)
	delete(backupFiles, ManifestName)
	delete(backupFiles, BackupInfoName)
	if !maps.Equal(backupFiles, memberDir) {
		t.Fatalf("backup holds %v, want %v", backupFiles, memberDir)
	}
	if _, err := VerifyManifest(t.Context(), backup); err != nil {
		t.Fatalf("the backup's manifest: %v", err)
	}
	if got := dirNames(t, root); !slices.Equal(got, []string{filepath.Base(backup)}) {
		t.Fatalf("backup root holds %v", got)
	}

	// The same name again is refused and the first backup is kept as it was.
	before := readTree(t, backup)
	writeTree(t, dataDir, map[string]string{"member/wal/x.wal": "wal bytes, grown"})
	_, err = Backup(t.Context(), dataDir, root, "3.5.9", now)
	assertErrContains(t, err, backup+": file already exists", "never overwritten")
	assertTree(t, backup, before)
	if got := dirNames(t, root); !slices.Equal(got, []string{filepath.Base(backup)}) {
		t.Fatalf("after the refused backup the root holds %v (a partial copy left?)", got)
	}

	// Restore over the (since changed) data dir: the current one is kept aside.
	current := readTree(t, dataDir)
	restoredAt := time.Date(2025, 3, 5, 0, 0, 0, 0, time.UTC)
	rr, err := RestoreBackup(t.Context(), backup, dataDir, restoredAt)
	if err != nil {
		t.Fatal(err)
	}
	replaced := dataDir + ".replaced-20250305T000000Z"
	if !rr.Restored || rr.Replaced != replaced || rr.Files != len(memberDir) || rr.Backup != backup || rr.DataDir != dataDir {
		t.Fatalf("RestoreBackup = %+v, want replaced %s and %d files", rr, replaced, len(memberDir))
	}
	assertTree(t, dataDir, memberDir)
	assertTree(t, replaced, current)
	assertTree(t, backup, before) // a restore reads the backup only
	if got := dirNames(t, parent); !slices.Equal(got, []string{"backups", "member-a", "member-a.replaced-20250305T000000Z"}) {
		t.Fatalf("after the restore the parent holds %v", got)
	}
}

func TestRestoreIntoMissingDir(t *testing.T) {
	parent := t.TempDir()
	dataDir := filepath.Join(parent, "data")
	writeTree(t, dataDir, memberDir)
	rep, err := Backup(t.Context(), dataDir, filepath.Join(parent, "backups"), "3.6.16", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	rr, err := RestoreBackup(t.Context(), rep.Backup, dataDir, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if rr.Replaced != "" {
		t.Errorf("Replaced = %q, want none: there was no data dir", rr.Replaced)
	}
	assertTree(t, dataDir, memberDir)
}

// TestRestoreRefusesALinkOrAMountPoint: a restore puts the data dir in place by renaming, so a
// data dir that is a symlink (the rename would move the link, the directory it points to left
// behind) or a mount point (the rename fails, after the whole backup was copied onto the
// filesystem above) is refused before anything is copied, naming what to give instead.
func TestRestoreRefusesALinkOrAMountPoint(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, real, dataDir string)
		want string
	}{
		{"symlink", func(t *testing.T, real, dataDir string) {
			if err := os.Symlink(real, dataDir); err != nil {
				t.Fatal(err)
			}
		}, "is a symlink"},
		{"mount point", func(t *testing.T, real, dataDir string) {
			if os.Geteuid() != 0 {
				testenv.SkipOrFail(t, "needs root to bind-mount")
			}
			if err := os.Mkdir(dataDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount(real, dataDir, "", unix.MS_BIND, ""); err != nil {
				testenv.SkipOrFail(t, "bind mount: "+err.Error())
			}
			t.Cleanup(func() { _ = unix.Unmount(dataDir, 0) })
		}, "is a mount point"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			real := filepath.Join(parent, "real")
			writeTree(t, real, memberDir)
			rep, err := Backup(t.Context(), real, filepath.Join(parent, "backups"), "3.6.16", time.Unix(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			dataDir := filepath.Join(parent, "data")
			tc.make(t, real, dataDir)
			_, err = RestoreBackup(t.Context(), rep.Backup, dataDir, time.Unix(0, 0))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore: %v, want a refusal saying it %s", err, tc.want)
			}
			if _, err := os.Lstat(dataDir + ".kubefence-restore"); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the backup was copied before the refusal (%v)", err)
			}
			assertTree(t, real, memberDir)
		})
	}
}

// TestRestoreRefusesAnotherMembersBackup: a backup records the data dir it was taken from, and
// its WAL the member; restored into another data dir that holds another member, it would run
// that member's data in this one's place, two members with one ID: refused, nothing copied,
// saying how to do it on purpose (move the data dir away: a restore into a missing one checks
// nothing). Into the data dir it was taken from it goes, whatever member that holds now.
func TestRestoreRefusesAnotherMembersBackup(t *testing.T) {
	parent := t.TempDir()
	m1, m2 := filepath.Join(parent, "m1"), filepath.Join(parent, "m2")
	writeMember(t, m1, testPeers[0], 5)
	writeMember(t, m2, testPeers[1], 5)
	rep, err := Backup(t.Context(), m1, filepath.Join(parent, "backups"), "3.6.16", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	_, err = RestoreBackup(t.Context(), rep.Backup, m2, time.Unix(0, 0))
	if err == nil || !strings.Contains(err.Error(), "member 1") || !strings.Contains(err.Error(), "member 2") || !strings.Contains(err.Error(), "move "+m2+" away") {
		t.Fatalf("restore of m1's backup into m2: %v, want a refusal naming both members and the way to do it on purpose", err)
	}
	if _, err := os.Lstat(m2 + ".kubefence-restore"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the backup was copied before the refusal (%v)", err)
	}
	// Taken from m1, it goes back into m1 whatever member m1 holds now (a rebuild may have
	// given it a new ID).
	if err := os.RemoveAll(m1); err != nil {
		t.Fatal(err)
	}
	writeMember(t, m1, testPeers[2], 5)
	if _, err := RestoreBackup(t.Context(), rep.Backup, m1, time.Unix(0, 0)); err != nil {
		t.Fatalf("restore into the data dir it was taken from: %v", err)
	}
	if err := os.Rename(m2, m2+".moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := RestoreBackup(t.Context(), rep.Backup, m2, time.Unix(0, 0)); err != nil {
		t.Fatalf("restore into m2's place once m2 was moved away: %v", err)
	}
}

func TestRestoreDamagedBackup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		damage  func(t *testing.T, backup string)
		wantErr []string
	}{
		{name: "changed file", wantErr: []string{"is damaged, nothing was restored", "member/snap/db: sha256"},
			damage: func(t *testing.T, b string) {
				writeTree(t, b, map[string]string{"member/snap/db": "bit rot"})
			}},
		{name: "missing file", wantErr: []string{"is damaged", "member/wal/x.wal: missing"},
			damage: func(t *testing.T, b string) {
				if err := os.Remove(filepath.Join(b, "member", "wal", "x.wal")); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "extra file", wantErr: []string{"is damaged", "member/wal/y.wal: not in the manifest"},
			damage: func(t *testing.T, b string) {
				writeTree(t, b, map[string]string{"member/wal/y.wal": "stray"})
			}},
		{name: "no manifest", wantErr: []string{"has no manifest"},
			damage: func(t *testing.T, b string) {
				if err := os.Remove(filepath.Join(b, ManifestName)); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dataDir := filepath.Join(parent, "data")
			writeTree(t, dataDir, memberDir)
			rep, err := Backup(t.Context(), dataDir, filepath.Join(parent, "backups"), "3.5.9", time.Unix(1700000000, 0))
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, rep.Backup)
			writeTree(t, dataDir, map[string]string{"member/wal/x.wal": "newer wal"})
			want := readTree(t, dataDir)

			_, err = RestoreBackup(t.Context(), rep.Backup, dataDir, time.Unix(1800000000, 0))
			assertErrContains(t, err, tc.wantErr...)
			assertTree(t, dataDir, want)
			if got := dirNames(t, parent); !slices.Equal(got, []string{"backups", "data"}) {
				t.Fatalf("after the refused restore the parent holds %v, want nothing new", got)
			}
		})
	}
}

func TestRestoreInUse(t *testing.T) {
	parent := t.TempDir()
	dataDir := filepath.Join(parent, "data")
	writeTree(t, dataDir, memberDir)
	rep, err := Backup(t.Context(), dataDir, filepath.Join(parent, "backups"), "3.5.9", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	lockExclusive(t, filepath.Join(dataDir, "member", "snap", "db"))
	_, err = RestoreBackup(t.Context(), rep.Backup, dataDir, time.Unix(0, 0))
	assertErrContains(t, err, dataDir+" is in use: a running etcd holds its backend")
	assertTree(t, dataDir, memberDir)
	if got := dirNames(t, parent); !slices.Equal(got, []string{"backups", "data"}) {
		t.Fatalf("after the refused restore the parent holds %v", got)
	}
}

func TestBackupRefusals(t *testing.T) {
	parent := t.TempDir()
	dataDir := filepath.Join(parent, "data")
	writeTree(t, dataDir, memberDir)

	_, err := Backup(t.Context(), dataDir, filepath.Join(dataDir, "backups"), "3.5.9", time.Unix(0, 0))
	assertErrContains(t, err, "must not be inside the data dir "+dataDir)

	lockExclusive(t, filepath.Join(dataDir, "member", "snap", "db"))
	_, err = Backup(t.Context(), dataDir, filepath.Join(parent, "backups"), "3.5.9", time.Unix(0, 0))
	assertErrContains(t, err, "is in use by a running etcd")
	if names := dirNames(t, filepath.Join(parent, "backups")); len(names) != 0 {
		t.Fatalf("a refused backup left %v", names)
	}
	assertTree(t, dataDir, memberDir)
}

// TestCopiesFollowSymlinks: a member whose member/wal (or whole data dir) is a symlink, as
// when the WAL sits on its own disk, is backed up and copied with the WAL's contents; a link
// that cannot be followed is refused rather than copied as nothing.
func TestCopiesFollowSymlinks(t *testing.T) {
	withoutWAL := maps.Clone(memberDir)
	delete(withoutWAL, "member/wal/x.wal")
	for _, c := range []struct {
		name    string
		setup   func(t *testing.T, parent string) string // returns the data dir to copy
		want    map[string]string
		wantErr string
	}{
		{"member/wal is a symlink to a WAL disk", func(t *testing.T, parent string) string {
			writeTree(t, filepath.Join(parent, "data"), withoutWAL)
			writeTree(t, filepath.Join(parent, "wal-disk"), map[string]string{"x.wal": "wal bytes"})
			symlink(t, filepath.Join(parent, "wal-disk"), filepath.Join(parent, "data", "member", "wal"))
			return filepath.Join(parent, "data")
		}, memberDir, ""},
		{"member/wal is a relative symlink", func(t *testing.T, parent string) string {
			writeTree(t, filepath.Join(parent, "data"), withoutWAL)
			writeTree(t, filepath.Join(parent, "wal-disk"), map[string]string{"x.wal": "wal bytes"})
			symlink(t, "../../wal-disk", filepath.Join(parent, "data", "member", "wal"))
			return filepath.Join(parent, "data")
		}, memberDir, ""},
		{"a WAL segment is a symlink", func(t *testing.T, parent string) string {
			writeTree(t, filepath.Join(parent, "data"), withoutWAL)
			writeTree(t, filepath.Join(parent, "elsewhere"), map[string]string{"x.wal": "wal bytes"})
			symlink(t, filepath.Join(parent, "elsewhere", "x.wal"), filepath.Join(parent, "data", "member", "wal", "x.wal"))
			return filepath.Join(parent, "data")
		}, memberDir, ""},
		{"the data dir is a symlink", func(t *testing.T, parent string) string {
			writeTree(t, filepath.Join(parent, "real"), memberDir)
			symlink(t, filepath.Join(parent, "real"), filepath.Join(parent, "data"))
			return filepath.Join(parent, "data")
		}, memberDir, ""},
		{"member/wal is a dangling symlink", func(t *testing.T, parent string) string {
			writeTree(t, filepath.Join(parent, "data"), withoutWAL)
			symlink(t, filepath.Join(parent, "unmounted-wal-disk"), filepath.Join(parent, "data", "member", "wal"))
			return filepath.Join(parent, "data")
		}, nil, "member/wal is a symlink to "},
		{"a symlink loop", func(t *testing.T, parent string) string {
			writeTree(t, filepath.Join(parent, "data"), memberDir)
			symlink(t, "..", filepath.Join(parent, "data", "member", "wal", "loop"))
			return filepath.Join(parent, "data")
		}, nil, "loop"},
	} {
		for _, kind := range []string{"backup", "copy"} {
			t.Run(kind+": "+c.name, func(t *testing.T) {
				parent := t.TempDir()
				dataDir := c.setup(t, parent)
				var out string
				var err error
				if kind == "backup" {
					var rep BackupReport
					rep, err = Backup(t.Context(), dataDir, filepath.Join(parent, "backups"), "3.5.9", time.Unix(0, 0))
					out = rep.Backup
				} else {
					out = filepath.Join(parent, "copy")
					_, err = CopyStopped(t.Context(), dataDir, "", out)
				}
				if c.wantErr != "" {
					assertErrContains(t, err, c.wantErr)
					if kind == "backup" {
						if names := dirNames(t, filepath.Join(parent, "backups")); len(names) != 0 {
							t.Fatalf("a refused backup left %v", names)
						}
					} else if _, err := os.Stat(out); err == nil {
						t.Fatal("a refused copy left its output")
					}
					return
				}
				if err != nil { // the fake member's backend is not bbolt: a warning in a copy's report
					t.Fatal(err)
				}
				got := readTree(t, out)
				delete(got, ManifestName)
				delete(got, BackupInfoName)
				if !maps.Equal(got, c.want) {
					t.Fatalf("%s holds %v, want %v", kind, got, c.want)
				}
				if _, err := VerifyManifest(t.Context(), out); err != nil {
					t.Fatalf("the %s's manifest: %v", kind, err)
				}
			})
		}
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreAfterAnInterruptedSwap: an upgrade killed between its swap's two renames leaves
// no data dir and the member in <dir>.kubefence-old; its error suggests restore-backup. The
// restore must keep that member (as .replaced-…), not leave it for the next run to delete.
func TestRestoreAfterAnInterruptedSwap(t *testing.T) {
	parent := t.TempDir()
	d := filepath.Join(parent, "m1")
	writeTree(t, d, memberDir)
	br, err := Backup(t.Context(), d, filepath.Join(parent, "bk"), "3.4.23", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "written-after-the-backup"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(d, oldPath(d)); err != nil { // killed between the swap's two renames
		t.Fatal(err)
	}
	rr, err := RestoreBackup(t.Context(), br.Backup, d, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := recoverSwap(d); err != nil { // what the next upgrade does first
		t.Fatal(err)
	}
	if rr.Replaced == "" || !exists(filepath.Join(rr.Replaced, "written-after-the-backup")) {
		t.Fatalf("restore kept %q; want the member that was in %s kept there", rr.Replaced, oldPath(d))
	}
}

// TestRestoreFailsToPlaceTheCopy: the old data dir is renamed aside before the verified copy
// is renamed into place; when that second rename fails there is no data dir, and the error
// says where both are and what to rename back. Both are kept.
func TestRestoreFailsToPlaceTheCopy(t *testing.T) {
	parent := t.TempDir()
	dataDir := filepath.Join(parent, "data")
	writeTree(t, dataDir, memberDir)
	rep, err := Backup(t.Context(), dataDir, filepath.Join(parent, "backups"), "3.5.9", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, dataDir, map[string]string{"member/wal/x.wal": "newer wal bytes"})
	current := readTree(t, dataDir)
	rr, err := restoreBackup(t.Context(), rep.Backup, dataDir, time.Unix(1800000000, 0), func(string, string) error { return errors.New("injected rename failure") })
	replaced, restored := dataDir+".replaced-20270115T080000Z", dataDir+".kubefence-restore"
	assertErrContains(t, err, "injected rename failure", replaced, restored, "rename one of them to "+dataDir)
	if rr.Restored || rr.Replaced != replaced || rr.Copy != restored || !rr.Changed() {
		t.Errorf("report %+v, want not restored, the old dir at %s and the copy at %s", rr, replaced, restored)
	}
	assertTree(t, replaced, current)
	assertTree(t, restored, memberDir)
}

// TestRestoreWaitsForAnUpgrade: restore-backup takes the lock an upgrade or downgrade holds
// beside each data dir, so it cannot replace the dir between the steps of a running one.
func TestRestoreWaitsForAnUpgrade(t *testing.T) {
	parent := t.TempDir()
	dataDir := filepath.Join(parent, "data")
	writeTree(t, dataDir, memberDir)
	rep, err := Backup(t.Context(), dataDir, filepath.Join(parent, "backups"), "3.5.9", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	upgrade, err := flock.Take(dirLockPath(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	_, err = RestoreBackup(t.Context(), rep.Backup, dataDir, time.Unix(0, 0))
	upgrade.ReleaseRemove()
	assertErrContains(t, err, "pid "+strconv.Itoa(os.Getpid()), dirLockPath(dataDir))
	assertTree(t, dataDir, memberDir)
	if got := dirNames(t, parent); !slices.Equal(got, []string{"backups", "data"}) {
		t.Fatalf("after the refused restore the parent holds %v", got)
	}
}

// TestBackupAndRestoreStopAtASignal: the first Ctrl-C (the context every command runs with)
// stops a backup or a restore, however many gigabytes are left, leaving what it would leave
// after a crash: no backup under its name, the data dir as it was, no copy beside it.
func TestBackupAndRestoreStopAtASignal(t *testing.T) {
	parent, dataDir, rep := backedUpMember(t)
	root := filepath.Join(parent, "backups")
	writeTree(t, dataDir, map[string]string{"member/wal/x.wal": "since the backup"})
	current := readTree(t, dataDir)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()

	if _, err := Backup(cancelled, dataDir, root, "3.5.9", time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Errorf("backup after the signal: err %v, want context.Canceled", err)
	}
	if got := dirNames(t, root); !slices.Equal(got, []string{filepath.Base(rep.Backup)}) {
		t.Errorf("after the stopped backup the root holds %v", got)
	}
	if _, err := RestoreBackup(cancelled, rep.Backup, dataDir, time.Now()); !errors.Is(err, context.Canceled) {
		t.Errorf("restore after the signal: err %v, want context.Canceled", err)
	}
	assertTree(t, dataDir, current)
	// The signal while the restore copies the backup next to the data dir.
	copying, stop := context.WithCancel(t.Context())
	defer stop()
	statHook = func(string) { stop() }
	t.Cleanup(func() { statHook = nil })
	if _, err := RestoreBackup(copying, rep.Backup, dataDir, time.Now()); !errors.Is(err, context.Canceled) {
		t.Errorf("restore stopped while it copied: err %v, want context.Canceled", err)
	}
	statHook = nil
	assertTree(t, dataDir, current)
	if got := dirNames(t, parent); !slices.Equal(got, []string{"backups", "member-a"}) {
		t.Errorf("after the stopped restore %s holds %v", parent, got)
	}
}

// TestRestoreChecksAgainBeforeTheRename: etcd started (systemd restarting it) while the backup
// was copied: the restore refuses to rename its data dir aside under it, which would leave the
// writes it acknowledges meanwhile in the dir renamed away.
func TestRestoreChecksAgainBeforeTheRename(t *testing.T) {
	parent, dataDir, rep := backedUpMember(t)
	before := readTree(t, dataDir)
	var etcd *os.File
	statHook = func(string) { // the restore's copy: etcd starts and locks its backend
		if etcd != nil {
			return
		}
		f, err := os.Open(filepath.Join(dataDir, "member", "snap", "db"))
		if err == nil {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		}
		if err != nil {
			t.Error(err)
		}
		etcd = f
	}
	t.Cleanup(func() {
		statHook = nil
		if etcd != nil {
			etcd.Close()
		}
	})
	_, err := RestoreBackup(t.Context(), rep.Backup, dataDir, time.Now())
	assertErrContains(t, err, "is in use: a running etcd holds its backend")
	assertTree(t, dataDir, before)
	if got := dirNames(t, parent); !slices.Equal(got, []string{"backups", "member-a"}) {
		t.Errorf("after the refused restore %s holds %v", parent, got)
	}
}

// TestBackupCheckStoppedIsNotDamage: a signal while a resumed upgrade checks its backups stops
// the check; it says so, not that the backup is damaged (whose advice is to move the journal
// away and back up again).
func TestBackupCheckStoppedIsNotDamage(t *testing.T) {
	_, dataDir, rep := backedUpMember(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := checkBackup(ctx, rep.Backup, dataDir)
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "damaged") {
		t.Errorf("checking a backup after a signal: %v; want context.Canceled, not damaged", err)
	}
}

// backedUpMember is a member's data dir, PARENT/member-a, and its backup in PARENT/backups.
func backedUpMember(t *testing.T) (parent, dataDir string, rep BackupReport) {
	t.Helper()
	parent = t.TempDir()
	dataDir = filepath.Join(parent, "member-a")
	writeTree(t, dataDir, memberDir)
	rep, err := Backup(t.Context(), dataDir, filepath.Join(parent, "backups"), "3.5.9", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return parent, dataDir, rep
}
