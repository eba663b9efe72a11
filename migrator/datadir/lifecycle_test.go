package datadir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCheckDowngrade(t *testing.T) {
	det := func(v Version, st Storage) Detection {
		return Detection{Version: v, Storage: st, Source: VersionFileName}
	}
	for _, tc := range []struct {
		name    string
		cur     Detection
		target  Version
		wantErr []string // nil: allowed
	}{
		{name: "3.6 to 3.5", cur: det(Version{3, 6, 16}, StorageV3), target: Version{3, 5, 21}},
		{name: "3.6.0 to 3.5.0", cur: det(Version{3, 6, 0}, StorageV3), target: Version{3, 5, 0}},
		{name: "3.5 to 3.4", cur: det(Version{3, 5, 9}, StorageV3), target: Version{3, 4, 23},
			wantErr: []string{"3.6 to 3.5 only", "kubefence migrate restore-backup", "to 3.4"}},
		{name: "3.6 to 3.4", cur: det(Version{3, 6, 16}, StorageV3), target: Version{3, 4, 23},
			wantErr: []string{"3.6 to 3.5 only", "restore-backup"}},
		{name: "3.6 to 3.6", cur: det(Version{3, 6, 16}, StorageV3), target: Version{3, 6, 16},
			wantErr: []string{"not an older minor", "upgrade"}},
		{name: "3.6 to an older 3.6 patch", cur: det(Version{3, 6, 16}, StorageV3), target: Version{3, 6, 1},
			wantErr: []string{"not an older minor", "upgrade"}},
		{name: "3.5 to 3.6", cur: det(Version{3, 5, 9}, StorageV3), target: Version{3, 6, 16},
			wantErr: []string{"3.6.16 is not an older minor", "kubefence migrate upgrade"}},
		{name: "3.7 to 3.5", cur: det(Version{3, 7, 0}, StorageV3), target: Version{3, 5, 21},
			wantErr: []string{"one minor at a time", "downgrade to 3.6 first"}},
		{name: "3.7 to 3.6", cur: det(Version{3, 7, 0}, StorageV3), target: Version{3, 6, 16},
			wantErr: []string{"3.6 → 3.5 downgrade only"}},
		{name: "v2 storage", cur: det(Version{3, 6, 16}, StorageV2), target: Version{3, 5, 21},
			wantErr: []string{"v2 content", VersionFileName}},
		// 3.5 data may well hold v2 content; the way back to 3.4 is the backup either way.
		{name: "v2 storage 3.5 to 3.4", cur: det(Version{3, 5, 9}, StorageV2), target: Version{3, 4, 23},
			wantErr: []string{"3.6 to 3.5 only", "restore-backup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkDowngrade(tc.cur, tc.target)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("checkDowngrade(%v → %v) = %v, want allowed", tc.cur.Version, tc.target, err)
				}
				return
			}
			assertErrContains(t, err, tc.wantErr...)
		})
	}
}

// TestPlanUpgrade: the steps an upgrade plans from a version file, with fake binaries.
func TestPlanUpgrade(t *testing.T) {
	bin := t.TempDir()
	for _, v := range []string{"3.5.9", "3.5.35", "3.6.16"} {
		fakeEtcd(t, bin, v, v)
	}
	for _, tc := range []struct {
		from, target string
		want         []string // kind@version
	}{
		{"3.4.23/etcd3", "3.5.35", []string{"backup@3.4.23", "run@3.5.35"}}, // to 3.6 looks for v2 content in real data: e2e
		{"3.4.23/etcd2", "3.6.16", []string{"backup@3.4.23", "run@3.5.35", "migrate-v2@3.5.35", "run@3.6.16"}},
		{"3.4.23/etcd2", "3.5.9", []string{"backup@3.4.23", "run@3.5.9"}},
		{"3.5.9/etcd3", "3.5.35", []string{"backup@3.5.9", "run@3.5.35"}},
		// v2 content from 3.5: a 3.5 run first applies the WAL to the backend (a member stopped
		// uncleanly has v3 writes there the v2 migration would refuse to lose).
		{"3.5.35/etcd2", "3.6.16", []string{"backup@3.5.35", "run@3.5.35", "migrate-v2@3.5.35", "run@3.6.16"}},
		{"3.6.16/etcd2", "3.6.16", []string{"backup@3.6.16", "migrate-v2@3.6.16", "run@3.6.16"}},
		{"3.5.35/etcd3", "3.5.35", nil},
		{"3.5.35/etcd3", "3.5.9", nil}, // a newer patch of the target's minor: nothing to do
	} {
		t.Run(tc.from+"->"+tc.target, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, map[string]string{"member/snap/db": "x", VersionFileName: tc.from})
			rep, err := plan(t.Context(), OpUpgrade, Options{DataDirs: []string{dir}, Target: mustParseVersion(t, tc.target), BinDir: bin})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range rep.Steps {
				got = append(got, s.Kind+"@"+s.Version)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("steps %v, want %v", got, tc.want)
			}
		})
	}
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"member/snap/db": "x", VersionFileName: "3.6.16/etcd3"})
	_, err := plan(t.Context(), OpUpgrade, Options{DataDirs: []string{dir}, Target: mustParseVersion(t, "3.5.35"), BinDir: bin})
	assertErrContains(t, err, "newer than --target-version", "downgrade")
}

// TestOneRunPerDataDir: two upgrades of one data dir with other backup dirs (or the members
// named in another order, or a subset) must not both run: the second would remove the dir the
// first is building and swap the same dir.
func TestOneRunPerDataDir(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	first := Options{DataDirs: []string{a, b}, BackupDir: filepath.Join(root, "b1")}
	l, err := first.lock()
	if err != nil {
		t.Fatal(err)
	}
	defer l.release(true)
	for _, o := range []Options{
		{DataDirs: []string{a, b}, BackupDir: filepath.Join(root, "b2")},
		{DataDirs: []string{b, a}, BackupDir: filepath.Join(root, "b1")},
		{DataDirs: []string{b}, BackupDir: filepath.Join(root, "b3")},
	} {
		if l2, err := o.lock(); err == nil || !strings.Contains(err.Error(), "another kubefence upgrade, downgrade or restore-backup") {
			if err == nil {
				l2.release(true)
			}
			t.Errorf("%v with backups in %s: %v; want it refused while the first runs", o.DataDirs, o.BackupDir, err)
		}
	}
}

// TestJournalPerSetOfDataDirs: two clusters sharing a backup dir, whose first data dirs have the
// same name, keep a journal each; an older kubefence's journal (named after the first data dir
// only) is resumed by its own data dirs and does not stand in another cluster's way.
func TestJournalPerSetOfDataDirs(t *testing.T) {
	root := t.TempDir()
	backups := filepath.Join(root, "backups")
	a := Options{DataDirs: []string{filepath.Join(root, "a", "etcd")}, BackupDir: backups, Target: Version{3, 6, 16}}
	b := Options{DataDirs: []string{filepath.Join(root, "b", "etcd")}, BackupDir: backups, Target: Version{3, 6, 16}}
	if a.journalPath() == b.journalPath() {
		t.Fatalf("both clusters journal in %s", a.journalPath())
	}
	older := filepath.Join(backups, "journal-etcd.json")
	writeTree(t, backups, map[string]string{"journal-etcd.json": `{"operation":"upgrade","target":"3.6.16","dataDirs":["` + a.DataDirs[0] + `"],"journal":"` + older + `","steps":[]}`})
	rep, err := loadJournal(a.journalPath(), OpUpgrade, a)
	if err != nil || rep == nil || rep.Journal != older {
		t.Fatalf("a's older journal: %+v, %v; want it resumed where it is", rep, err)
	}
	if rep, err := loadJournal(b.journalPath(), OpUpgrade, b); err != nil || rep != nil {
		t.Fatalf("b with a's older journal beside: %+v, %v; want a fresh plan", rep, err)
	}
}

// TestUpgradeTo36NeedsEtcd3526: etcd's 3.6 upgrade guide asks for every member on 3.5.26 or
// later first (3.5.1–3.5.19 did not persist a learner's promotion, and only 3.5.26 cleans up
// zombie members; 3.6 repairs the learner flag only). So an upgrade that reaches 3.6 refuses an
// older 3.5 binary, naming it and the floor, and runs the 3.5 binary on 3.5 data that is not
// known to have run on 3.5.26 or later (an older version.txt, or an inferred 3.5). Data with v2
// content gets a 3.5 run whatever its patch (it applies the WAL before the v2 migration), so the
// floor shows on v3-only data: 3.5.26 or later in version.txt goes straight to 3.6.
func TestUpgradeTo36NeedsEtcd3526(t *testing.T) {
	bin := t.TempDir()
	for _, v := range []string{"3.5.9", "3.5.35", "3.6.16"} {
		fakeEtcd(t, bin, v, v)
	}
	opts := Options{Target: Version{3, 6, 16}, BinDir: bin}
	for _, tc := range []struct {
		name string
		cur  Detection
		v2   bool
		want []string
	}{
		{"3.5.9/etcd2 in version.txt", Detection{Version: Version{3, 5, 9}, Storage: StorageV2, Source: VersionFileName}, true,
			[]string{"run@3.5.35", "migrate-v2@3.5.35", "run@3.6.16"}},
		{"3.5 inferred, v2 content", Detection{Version: Version{3, 5, 0}, Storage: StorageV2, Source: "inferred"}, true,
			[]string{"run@3.5.35", "migrate-v2@3.5.35", "run@3.6.16"}},
		{"3.5.26/etcd2 in version.txt", Detection{Version: Version{3, 5, 26}, Storage: StorageV2, Source: VersionFileName}, true,
			[]string{"run@3.5.35", "migrate-v2@3.5.35", "run@3.6.16"}},
		{"3.5.9/etcd3 in version.txt", Detection{Version: Version{3, 5, 9}, Storage: StorageV3, Source: VersionFileName}, false,
			[]string{"run@3.5.35", "run@3.6.16"}},
		{"3.5 inferred, v3 only", Detection{Version: Version{3, 5, 0}, Storage: StorageV3, Source: "inferred"}, false,
			[]string{"run@3.5.35", "run@3.6.16"}},
		{"3.5.26/etcd3 in version.txt", Detection{Version: Version{3, 5, 26}, Storage: StorageV3, Source: VersionFileName}, false,
			[]string{"run@3.6.16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps, err := planUpgrade(t.Context(), opts, tc.cur, tc.v2, false)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range steps {
				got = append(got, s.Kind+"@"+s.Version)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("steps %v, want %v", got, tc.want)
			}
		})
	}
	old := t.TempDir()
	fakeEtcd(t, old, "3.5.9", "3.5.9")
	fakeEtcd(t, old, "3.6.16", "3.6.16")
	opts.BinDir = old
	for _, cur := range []Detection{
		{Version: Version{3, 4, 23}, Storage: StorageV2, Source: VersionFileName},
		{Version: Version{3, 5, 9}, Storage: StorageV3, Source: VersionFileName},
	} {
		_, err := planUpgrade(t.Context(), opts, cur, cur.Storage == StorageV2, false)
		assertErrContains(t, err, "etcd-3.5.9", "3.5.26", "upgrade_3_6")
	}
}

// TestUnfinishedRunOfTheSameDataDirsFound: a run's journal is named after its data dirs in the
// order given; the same dirs in another order, or some of them, find no journal at their own
// name, and planned afresh over a half-upgraded cluster (new backups of it). An unfinished run
// journaled for any of them is refused, naming it.
func TestUnfinishedRunOfTheSameDataDirsFound(t *testing.T) {
	root := t.TempDir()
	backups := filepath.Join(root, "backups")
	x, y, z := filepath.Join(root, "x"), filepath.Join(root, "y"), filepath.Join(root, "z")
	first := Options{DataDirs: []string{x, y}, BackupDir: backups, Target: Version{3, 6, 16}}
	writeTree(t, backups, map[string]string{filepath.Base(first.journalPath()): `{"operation":"upgrade","target":"3.6.16","dataDirs":["` + x + `","` + y + `"],"steps":[]}`})
	for _, dirs := range [][]string{{y, x}, {y}} {
		o := first
		o.DataDirs = dirs
		_, err := loadJournal(o.journalPath(), OpUpgrade, o)
		var other *otherRunError
		if !errors.As(err, &other) || !strings.Contains(err.Error(), first.journalPath()) {
			t.Errorf("%v with an unfinished run of %v journaled: %v; want it refused, naming that journal", dirs, first.DataDirs, err)
		}
	}
	o := first
	o.DataDirs = []string{z}
	if rep, err := loadJournal(o.journalPath(), OpUpgrade, o); err != nil || rep != nil {
		t.Errorf("other data dirs beside it: %+v, %v; want a fresh plan", rep, err)
	}
}

// TestUnfinishedRunInAnotherDefaultBackupDir: the backup dir defaults to one beside the first
// data dir, so the same dirs given in another order default to another: the unfinished run
// journaled beside the first order's first dir is found all the same.
func TestUnfinishedRunInAnotherDefaultBackupDir(t *testing.T) {
	root := t.TempDir()
	x, y := filepath.Join(root, "a", "etcd"), filepath.Join(root, "b", "etcd")
	first := Options{DataDirs: []string{x, y}, Target: Version{3, 6, 16}}
	if err := first.defaults(); err != nil {
		t.Fatal(err)
	}
	writeTree(t, first.BackupDir, map[string]string{filepath.Base(first.journalPath()): `{"operation":"upgrade","target":"3.6.16","dataDirs":["` + x + `","` + y + `"],"steps":[]}`})
	again := Options{DataDirs: []string{y, x}, Target: Version{3, 6, 16}}
	if err := again.defaults(); err != nil {
		t.Fatal(err)
	}
	if again.BackupDir == first.BackupDir {
		t.Fatalf("both orders default to %s: the test shows nothing", again.BackupDir)
	}
	_, err := loadJournal(again.journalPath(), OpUpgrade, again)
	var other *otherRunError
	if !errors.As(err, &other) || !strings.Contains(err.Error(), first.journalPath()) {
		t.Fatalf("%v with an unfinished run of %v journaled in %s: %v; want it refused, naming that journal", again.DataDirs, first.DataDirs, first.BackupDir, err)
	}
}

// TestStopBeforeTheNextStep: a run stopped (Ctrl-C) while a step ends, here as its backup is
// put in place, begins no other step: a run step journaled as started would have launched its
// etcd (3.6 on 3.5 data) on the stopped context and SIGKILLed it a moment later, a data dir a
// newer etcd opened for write and was killed on, for an operator who asked to stop. A run step
// given a stopped context starts no etcd either. Proof of a start is the etcd log, which is
// written before the process starts, and the fake etcd's marker.
func TestStopBeforeTheNextStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		walk bool // the whole walk, stopped in the backup; else the run step alone, stopped before
	}{
		{"the walk begins no step after a stop", true},
		{"a run step starts no etcd after a stop", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			d := filepath.Join(parent, "m1")
			writeMemberWith(t, d, testPeers[0], 5, testPeers[:1])
			marker := filepath.Join(parent, "etcd-ran")
			bin := filepath.Join(parent, "etcd-3.6.16")
			if err := os.WriteFile(bin, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			opts := Options{DataDirs: []string{d}, BackupDir: filepath.Join(parent, "backups"), Target: Version{3, 6, 16}}
			if err := errors.Join(opts.defaults(), os.MkdirAll(opts.BackupDir, 0o700)); err != nil {
				t.Fatal(err)
			}
			rep := &Report{Operation: OpUpgrade, Target: opts.Target.String(), DataDirs: opts.DataDirs, Journal: opts.journalPath(), Steps: []*StepReport{
				{Name: "back up", Kind: StepBackup, Version: "3.5.35"},
				{Name: "run etcd 3.6.16", Kind: StepRun, Version: "3.6.16", Binary: bin, Members: map[string]string{}},
			}}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			e := &executor{opts: opts, rep: rep, afterBackup: func(string) error { cancel(); return nil }}
			if err := e.save(); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.walk {
				err = e.walk(ctx)
			} else {
				cancel()
				err = e.runStep(ctx, rep.Steps[1])
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("stopped run: %v, want context.Canceled", err)
			}
			if tc.walk && (!rep.Steps[0].Done || rep.Steps[1].Started) {
				t.Errorf("backup done %v, run started %v; want the backup done and the run not begun", rep.Steps[0].Done, rep.Steps[1].Started)
			}
			if logs, _ := filepath.Glob(filepath.Join(opts.BackupDir, "logs", "*")); len(logs) > 0 || exists(marker) {
				t.Errorf("etcd was started after the stop (logs %v, marker %v)", logs, exists(marker))
			}
		})
	}
}

// TestRunRefusesAnUnknownConflictPolicy: an --on-conflict the v2 migration does not know is
// refused before anything is made (no backup dir, no journal), dry run or not: journaled, it
// would be refused only at the migration, after the backups and the first steps.
func TestRunRefusesAnUnknownConflictPolicy(t *testing.T) {
	for _, dry := range []bool{true, false} {
		parent := t.TempDir()
		dir := filepath.Join(parent, "etcd")
		writeMember(t, dir, testPeers[0], 1)
		_, err := Run(t.Context(), OpUpgrade, Options{DataDirs: []string{dir}, Target: Version{3, 6, 16}, OnConflict: "both", DryRun: dry})
		assertErrContains(t, err, `--on-conflict "both"`, "use v3 or v2")
		if names := dirNames(t, parent); !slices.Equal(names, []string{"etcd"}) {
			t.Errorf("dry run %t: refused, it left %v in %s", dry, names, parent)
		}
	}
}
