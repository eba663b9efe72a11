package datadir

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// builtByRun is the file the adoption tests' builds leave in a new dir: which run built it.
const builtByRun = "built-by-run"

// noStop is freshRebuild's stop for a run left to finish.
const noStop = -1

// freshRebuild is one run of a one-step rebuild (kind, to version) on f's data dirs with opts,
// planned afresh when no journal is there, the TTL clock fixed. stop (unless noStop) is the
// swaps it does before it is stopped, as a crash would: with 0, its first swap fails (a
// non-empty dir where the first member's old dir goes), leaving every new dir ready.
func freshRebuild(t *testing.T, f *rebuildFixture, run int, opts Options, kind, version string, stop int) (*StepReport, error) {
	t.Helper()
	f.opts = opts
	e, s := f.start()
	s.Kind, s.Version = kind, version
	e.now = func() time.Time { return time.Unix(1_800_000_000, 0) }
	switch {
	case stop == 0:
		writeTree(t, oldPath(f.dirs[0]), map[string]string{"x": "in the way"})
	case stop > 0:
		e.afterSwap = crashAfter(stop)
	}
	return s, e.rebuild(t.Context(), s, func(src, tmp string, ms Membership) (string, error) {
		what, err := f.build(src, tmp, ms)
		if err != nil {
			return "", err
		}
		return what, os.WriteFile(filepath.Join(tmp, builtByRun), []byte(strconv.Itoa(run)), 0o600)
	})
}

// olderMarker rewrites dir's ready marker as an older kubefence wrote it: the source only,
// changed by edit (when not nil).
func olderMarker(t *testing.T, dir string, edit func(*RebuildSource)) {
	t.Helper()
	p := filepath.Join(dir, readyMarker)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var src RebuildSource
	if err := json.Unmarshal(b, &src); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&src)
	}
	if b, err = json.Marshal(src); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(b, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestFreshRunAdoptsOnlyWhatItWouldBuild: a rebuild stopped with every new dir ready (its first
// swap failed), then its journal gone (deleted by hand, as several of kubefence's errors advise,
// or abandoned by restore-backup of one member), and a run planned afresh on the same data: the
// ready dirs (and a member it swapped in) name the same source (same member at the same commit
// index; a downgrade has no TTL clock, and here the v2 migration's is the same too). The fresh
// run keeps them only when it would build them the same way: built with another option or for
// another version, or by an older kubefence that did not record what it built with, each is
// built again, and the step says why. Adopted, they would swap in members of another cluster (another token) or with
// other content than the run was asked for.
func TestFreshRunAdoptsOnlyWhatItWouldBuild(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kind    string
		change  func(o *Options) string // changes the rerun's options; returns its version
		swaps   int                     // swaps the first run did before it was stopped
		older   bool                    // the ready markers are an older kubefence's
		restore bool                    // the journal is abandoned by restoring one member
		why     string                  // in each rebuilt member's line; "" when adopted
	}{
		{name: "downgrade, the same options", kind: StepDowngrade},
		{name: "downgrade, another token", kind: StepDowngrade, why: `--initial-cluster-token: built with "etcd-cluster", now "second-token"`,
			change: func(o *Options) string { o.ClusterToken = "second-token"; return "3.5.21" }},
		{name: "downgrade, another token, one member restored", kind: StepDowngrade, restore: true, why: `--initial-cluster-token: built with "etcd-cluster", now "second-token"`,
			change: func(o *Options) string { o.ClusterToken = "second-token"; return "3.5.21" }},
		{name: "downgrade, another version", kind: StepDowngrade, why: `version: built with "3.5.21", now "3.5.26"`,
			change: func(o *Options) string { return "3.5.26" }},
		{name: "downgrade, an older kubefence's markers", kind: StepDowngrade, older: true, why: "older kubefence"},
		{name: "downgrade, one member swapped in, the same options", kind: StepDowngrade, swaps: 1},
		{name: "downgrade, one member swapped in, another token", kind: StepDowngrade, swaps: 1, why: `--initial-cluster-token: built with "etcd-cluster", now "second-token"`,
			change: func(o *Options) string { o.ClusterToken = "second-token"; return "3.5.21" }},
		{name: "v2 migration, the same options", kind: StepMigrateV2},
		{name: "v2 migration, --include-hidden", kind: StepMigrateV2, why: "--include-hidden: built with false, now true",
			change: func(o *Options) string { o.IncludeHidden = true; return "3.5.21" }},
		{name: "v2 migration, --on-conflict", kind: StepMigrateV2, why: `--on-conflict: built with "", now "v3"`,
			change: func(o *Options) string { o.OnConflict = "v3"; return "3.5.21" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRebuildFixture(t)
			first := f.opts
			var backup string
			if tc.restore {
				br, err := Backup(t.Context(), f.dirs[0], f.opts.BackupDir, "3.6.16", time.Unix(1800000000, 0))
				if err != nil {
					t.Fatal(err)
				}
				backup = br.Backup
			}
			if _, err := freshRebuild(t, f, 1, first, tc.kind, "3.5.21", tc.swaps); err == nil {
				t.Fatal("the first run was not stopped")
			}
			if tc.older {
				for _, d := range f.dirs {
					if !exists(filepath.Join(d, readyMarker)) {
						olderMarker(t, newPath(d), nil)
					}
				}
			}
			if tc.restore {
				if _, err := RestoreBackup(t.Context(), backup, f.dirs[0], time.Unix(1800000100, 0)); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Remove(first.journalPath()); err != nil {
				t.Fatal(err)
			}
			again, version := first, "3.5.21"
			if tc.change != nil {
				version = tc.change(&again)
			}
			s, err := freshRebuild(t, f, 2, again, tc.kind, version, noStop)
			if err != nil {
				t.Fatalf("the fresh run: %v", err)
			}
			for i, d := range f.dirs {
				b, _ := os.ReadFile(filepath.Join(d, builtByRun))
				want := "2"
				if tc.why == "" && !(tc.restore && i == 0) {
					want = "1" // adopted
				}
				if string(b) != want {
					t.Errorf("%s was built by run %q, want %s; the step says %q", d, b, want, s.Members[d])
				}
				if tc.why != "" && !(tc.restore && i == 0) && !strings.Contains(s.Members[d], tc.why) {
					t.Errorf("%s: the step says %q, want why the ready dir was not taken (%q)", d, s.Members[d], tc.why)
				}
			}
		})
	}
}
