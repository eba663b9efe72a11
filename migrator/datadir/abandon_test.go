package datadir

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// failedUpgrade journals what an upgrade 3.4 → 3.6 leaves when it fails in its "run etcd 3.6"
// step: backed up, 3.5 run done (version.txt says so), 3.6 started. It returns the options of
// that run and the backup (of the 3.4 data).
func failedUpgrade(t *testing.T) (Options, string) {
	t.Helper()
	parent := t.TempDir()
	d, bin := filepath.Join(parent, "etcd"), filepath.Join(parent, "bin")
	writeTree(t, d, memberDir)
	writeTree(t, d, map[string]string{VersionFileName: "3.4.23/etcd3\n"})
	writeTree(t, bin, nil)
	fakeEtcd(t, bin, "3.5.35", "3.5.35")
	fakeEtcd(t, bin, "3.6.16", "3.6.16")
	opts := Options{DataDirs: []string{d}, Target: Version{3, 6, 16}, BinDir: bin}
	if err := opts.defaults(); err != nil {
		t.Fatal(err)
	}
	br, err := Backup(t.Context(), d, opts.BackupDir, "3.4.23", time.Unix(1800000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{Operation: OpUpgrade, Target: "3.6.16", DataDirs: opts.DataDirs, Journal: opts.journalPath(), BackupDir: opts.BackupDir, Options: opts.rebuildOptions(),
		Before:  []Detection{{DataDir: d, Version: Version{3, 4, 23}, Storage: StorageV3, Source: VersionFileName}},
		Backups: map[string]string{d: br.Backup},
		Steps: []*StepReport{
			{Name: "back up every data dir", Kind: StepBackup, Version: "3.4.23", Started: true, Done: true},
			{Name: "run etcd 3.5.35", Kind: StepRun, Version: "3.5.35", Binary: filepath.Join(bin, "etcd-3.5.35"), Started: true, Done: true},
			{Name: "run etcd 3.6.16", Kind: StepRun, Version: "3.6.16", Binary: filepath.Join(bin, "etcd-3.6.16"), Started: true},
		}}
	if err := (&executor{opts: opts, rep: rep}).save(); err != nil {
		t.Fatal(err)
	}
	writeTree(t, d, map[string]string{VersionFileName: "3.5.35/etcd3\n"})
	return opts, br.Backup
}

// TestRestoreAbandonsTheJournal: an upgrade failed in its 3.6 step and the operator restored
// the backup (3.4 data). The journal still says the backup and the 3.5 step are done, so the
// same upgrade a week later would start etcd 3.6 on 3.4 data. restore-backup marks the
// unfinished journal of that data dir abandoned (kept for the record), so the next run plans
// afresh: from 3.4, through 3.5.
func TestRestoreAbandonsTheJournal(t *testing.T) {
	opts, backup := failedUpgrade(t)
	journal := opts.journalPath()
	if _, err := RestoreBackup(t.Context(), backup, opts.DataDirs[0], time.Unix(1800000100, 0)); err != nil {
		t.Fatal(err)
	}
	rep, err := loadJournal(journal, OpUpgrade, opts)
	if err != nil || rep != nil {
		t.Fatalf("after restore-backup the journal %s is resumed (%v, %v): the next upgrade would run etcd 3.6 on the restored 3.4 data", journal, rep, err)
	}
	kept, _ := filepath.Glob(journal + ".abandoned-*")
	if len(kept) != 1 {
		t.Fatalf("abandoned journals beside %s: %v, want the old one kept for the record", journal, kept)
	}
	b, err := os.ReadFile(kept[0])
	if err != nil {
		t.Fatal(err)
	}
	var old Report
	if err := json.Unmarshal(b, &old); err != nil || !strings.Contains(old.Abandoned, backup) {
		t.Fatalf("abandoned journal says %q (%v), want the restore of %s named", old.Abandoned, err, backup)
	}
}

// TestRestoreAbandonsTheJournalWhenItsSyncFails: the backup is renamed into place, then the
// fsync of the parent dir fails (EIO). The data dir holds the restored data all the same: the
// unfinished run's journal must be abandoned still, or the next upgrade resumes it on the
// restored data; the error says the restore is in place but its rename may not be durable.
func TestRestoreAbandonsTheJournalWhenItsSyncFails(t *testing.T) {
	opts, backup := failedUpgrade(t)
	defer func(f func(string) error) { syncParent = f }(syncParent)
	syncParent = func(string) error { return errors.New("injected EIO") }
	rep, err := RestoreBackup(t.Context(), backup, opts.DataDirs[0], time.Unix(1800000100, 0))
	assertErrContains(t, err, "injected EIO", "restored", opts.DataDirs[0])
	if !rep.Restored || len(rep.Abandoned) != 1 {
		t.Fatalf("report %+v: want restored and the unfinished journal abandoned", rep)
	}
	if j, err := loadJournal(opts.journalPath(), OpUpgrade, opts); err != nil || j != nil {
		t.Fatalf("the journal is still resumed after the restore (%v, %v)", j, err)
	}
}

// TestResumeChecksTheDataVersion: a journal whose data dir was put back by hand (no
// restore-backup) holds 3.4 data where its last done step left 3.5: a resume would start etcd
// 3.6 on it. Refused, naming both versions.
func TestResumeChecksTheDataVersion(t *testing.T) {
	opts, backup := failedUpgrade(t)
	d := opts.DataDirs[0]
	if err := os.RemoveAll(d); err != nil {
		t.Fatal(err)
	}
	if _, err := copyTree(t.Context(), backup, d, nil); err != nil {
		t.Fatal(err)
	}
	_, err := Run(t.Context(), OpUpgrade, opts)
	assertErrContains(t, err, d, "3.4.23", "3.5", opts.journalPath(), "abandon")
	if got := readTree(t, d)[VersionFileName]; got != "3.4.23/etcd3\n" {
		t.Fatalf("version.txt %q after the refused resume", got)
	}
}

// TestRestoreLeavesJournalsOutOfReach: a journal in a backup dir another user can write to (the
// default one under Debian's /var/lib/etcd, the etcd user's) is not read, renamed or rewritten
// by restore-backup as root: that user could have planted it, and swapped the dir under the
// rename. No run resumes from such a dir (it refuses it), so none needs abandoning there.
func TestRestoreLeavesJournalsOutOfReach(t *testing.T) {
	needRoot(t)
	opts, backup := failedUpgrade(t)
	journal := opts.journalPath()
	before, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Dir(opts.DataDirs[0])
	if err := os.Chown(parent, nobody, nobody); err != nil { // the etcd user's /var/lib/etcd
		t.Fatal(err)
	}
	rep, err := RestoreBackup(t.Context(), backup, opts.DataDirs[0], time.Unix(1800000100, 0))
	if err != nil {
		t.Fatal(err)
	}
	if after, err := os.ReadFile(journal); err != nil || string(after) != string(before) {
		t.Errorf("restore-backup changed the journal in a backup dir the etcd user can write to: %v", err)
	}
	if len(rep.Unread) != 1 || rep.Unread[0] != journal {
		t.Errorf("report's unread journals %v, want %s named (a run of the etcd user's may be journaled there)", rep.Unread, journal)
	}
}

// TestRestoreDropsTheRebuiltMember: a downgrade killed after it built every member's new dir
// (<dir>.kubefence-new, marked ready), before the swaps. The operator restores every member's
// backup and runs the downgrade again, with another --initial-cluster-token: the journal was
// abandoned, so the rerun plans afresh and takes the token given. The new dirs the killed run
// built name the same source (the backups hold the data it built from) but were built with the
// old token: adopted, they would put the members in another cluster than the one asked for
// (and than a member the killed run had not built yet). restore-backup removes the new dir
// beside the data dir it restores, and the rerun builds every member itself.
func TestRestoreDropsTheRebuiltMember(t *testing.T) {
	f := newRebuildFixture(t)
	backups := map[string]string{}
	for _, d := range f.dirs {
		br, err := Backup(t.Context(), d, f.opts.BackupDir, "3.6.16", time.Unix(1800000000, 0))
		if err != nil {
			t.Fatal(err)
		}
		backups[d] = br.Backup
	}
	const tokenFile = "built-with-token"
	downgrade := func(token string, blockSwap bool) (*StepReport, error) {
		f.opts.ClusterToken = token
		e, s := f.start()
		s.Kind = StepDowngrade
		if blockSwap { // a non-empty dir where the first member's old dir goes: its rename fails
			writeTree(t, oldPath(f.dirs[0]), map[string]string{"x": "in the way"})
		}
		return s, e.rebuild(t.Context(), s, func(src, tmp string, ms Membership) (string, error) {
			what, err := f.build(src, tmp, ms)
			if err != nil {
				return "", err
			}
			return what, os.WriteFile(filepath.Join(tmp, tokenFile), []byte(token), 0o600)
		})
	}
	if _, err := downgrade("first-token", true); err == nil {
		t.Fatal("the blocked swap did not stop the step")
	}
	for _, d := range f.dirs {
		rr, err := RestoreBackup(t.Context(), backups[d], d, time.Unix(1800000100, 0))
		if err != nil {
			t.Fatal(err)
		}
		if exists(newPath(d)) || rr.RemovedRebuild != newPath(d) {
			t.Errorf("after restore-backup (report %+v) %s: want it removed, and the report to say so; the next run would adopt it", rr, newPath(d))
		}
	}
	s, err := downgrade("second-token", false)
	if err != nil {
		t.Fatalf("the downgrade after the restore: %v", err)
	}
	for _, d := range f.dirs {
		if b, err := os.ReadFile(filepath.Join(d, tokenFile)); err != nil || string(b) != "second-token" {
			t.Errorf("%s was built with token %q (%v), want second-token; the step says %q", d, b, err, s.Members[d])
		}
	}
}
