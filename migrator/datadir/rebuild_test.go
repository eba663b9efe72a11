package datadir

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/kubefence/kubefence/internal/flock"
)

var testPeers = []Peer{
	{ID: 0x1, Name: "m1", PeerURLs: []string{"http://127.0.0.1:12380"}},
	{ID: 0x2, Name: "m2", PeerURLs: []string{"http://127.0.0.1:22380"}},
	{ID: 0x3, Name: "m3", PeerURLs: []string{"http://127.0.0.1:32380"}},
}

// writeMember makes a member data dir ReadMembership reads: a WAL for member self of
// cluster 0xc, with commit entries all committed, and a backend whose members bucket lists peers.
func writeMember(t *testing.T, dir string, self Peer, commit uint64) {
	t.Helper()
	writeMemberOf(t, dir, 0xc, self, commit)
}

// writeMemberOf is writeMember for a member of cluster.
func writeMemberOf(t *testing.T, dir string, cluster uint64, self Peer, commit uint64) {
	t.Helper()
	writeMemberFull(t, dir, cluster, self, commit, testPeers)
}

// writeMemberWith is writeMember with the members bucket listing peers.
func writeMemberWith(t *testing.T, dir string, self Peer, commit uint64, peers []Peer) {
	t.Helper()
	writeMemberFull(t, dir, 0xc, self, commit, peers)
}

// tlsPeers is testPeers at https peer URLs.
func tlsPeers() []Peer {
	out := slices.Clone(testPeers)
	for i := range out {
		out[i].PeerURLs = []string{strings.Replace(out[i].PeerURLs[0], "http:", "https:", 1)}
	}
	return out
}

func writeMemberFull(t *testing.T, dir string, cluster uint64, self Peer, commit uint64, peers []Peer) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "member", "snap"), 0o700); err != nil {
		t.Fatal(err)
	}
	md, err := (&etcdserverpb.Metadata{NodeID: self.ID, ClusterID: cluster}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	w, err := wal.Create(zap.NewNop(), filepath.Join(dir, "member", "wal"), md)
	if err != nil {
		t.Fatal(err)
	}
	ents := make([]raftpb.Entry, commit)
	for i := range ents {
		ents[i] = raftpb.Entry{Term: 1, Index: uint64(i + 1), Type: raftpb.EntryNormal}
	}
	if err := errors.Join(w.Save(raftpb.HardState{Term: 1, Commit: commit}, ents), w.Close()); err != nil {
		t.Fatal(err)
	}
	writeMembersBucket(t, filepath.Join(dir, "member", "snap", "db"), peers)
}

// writeMembersBucket makes a backend at path whose members bucket lists peers.
func writeMembersBucket(t *testing.T, path string, peers []Peer) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("members"))
		if err != nil {
			return err
		}
		for _, p := range peers {
			v, _ := json.Marshal(map[string]any{"id": p.ID, "name": p.Name, "peerURLs": p.PeerURLs})
			if err := b.Put([]byte(strconv.FormatUint(p.ID, 16)), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
}

// rebuildFixture is three stopped members; m2 is the most advanced, m3 next. A fake build
// makes each new dir a fresh member (commit index 1, as a restore leaves it) with a file
// saying which member and index it was built from.
type rebuildFixture struct {
	t    *testing.T
	dirs []string
	opts Options
}

func newRebuildFixture(t *testing.T) *rebuildFixture {
	parent := t.TempDir()
	f := &rebuildFixture{t: t}
	for i, commit := range []uint64{10, 30, 20} {
		d := filepath.Join(parent, testPeers[i].Name)
		writeMember(t, d, testPeers[i], commit)
		f.dirs = append(f.dirs, d)
	}
	f.opts = Options{DataDirs: f.dirs, BackupDir: filepath.Join(parent, "backups"), Target: Version{3, 6, 16}}
	if err := f.opts.defaults(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(f.opts.BackupDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return f
}

const builtFrom = "built-from"

func (f *rebuildFixture) build(src, tmp string, ms Membership) (string, error) {
	from, err := ReadMembership(src, "")
	if err != nil {
		return "", err
	}
	self := ms.Self
	writeMember(f.t, tmp, Peer{ID: self.ID, Name: self.Name, PeerURLs: self.PeerURLs}, 1)
	what := fmt.Sprintf("%s@%d", from.Self.Name, from.CommitIndex)
	return "from " + what, os.WriteFile(filepath.Join(tmp, builtFrom), []byte(what), 0o600)
}

// start is what Run does first: finish interrupted swaps, then load the journal (or plan a
// one-step run when there is none).
func (f *rebuildFixture) start() (*executor, *StepReport) {
	f.t.Helper()
	for _, d := range f.dirs {
		if err := recoverSwap(d); err != nil {
			f.t.Fatalf("recoverSwap: %v", err)
		}
	}
	rep, err := loadJournal(f.opts.journalPath(), OpUpgrade, f.opts)
	if err != nil {
		f.t.Fatal(err)
	}
	if rep == nil {
		rep = &Report{Operation: OpUpgrade, Target: f.opts.Target.String(), DataDirs: f.opts.DataDirs, Journal: f.opts.journalPath(), Options: f.opts.rebuildOptions(),
			Steps: []*StepReport{{Name: "migrate", Kind: StepMigrateV2, Version: "3.5.21"}}}
	}
	s := rep.Steps[0]
	s.Started, s.Members = true, map[string]string{}
	e := &executor{opts: f.opts, rep: rep}
	if err := e.save(); err != nil {
		f.t.Fatal(err)
	}
	return e, s
}

func (f *rebuildFixture) builtFrom() []string {
	var out []string
	for _, d := range f.dirs {
		b, _ := os.ReadFile(filepath.Join(d, builtFrom))
		out = append(out, string(b))
	}
	return out
}

// crashAfter makes the swap stop after n members, as a kill -9 would.
func crashAfter(n int) func(string) error {
	return func(string) error {
		if n--; n == 0 {
			return errors.New("killed")
		}
		return nil
	}
}

// TestRebuildResumesFromJournaledSource: a rebuild killed mid-swap resumes from the source the
// first run chose and journaled, never from a less advanced member, whichever swaps were done.
func TestRebuildResumesFromJournaledSource(t *testing.T) {
	for swapsBeforeCrash := 1; swapsBeforeCrash <= 3; swapsBeforeCrash++ {
		t.Run(fmt.Sprintf("killed after %d swap(s)", swapsBeforeCrash), func(t *testing.T) {
			f := newRebuildFixture(t)
			e, s := f.start()
			e.afterSwap = crashAfter(swapsBeforeCrash)
			if err := e.rebuild(t.Context(), s, f.build); err == nil {
				t.Fatal("the injected crash did not stop the step")
			}
			e, s = f.start()
			if err := e.rebuild(t.Context(), s, f.build); err != nil {
				t.Fatalf("resumed rebuild: %v", err)
			}
			for i, got := range f.builtFrom() {
				if got != "m2@30" {
					t.Errorf("%s was rebuilt from %q, want m2@30 (the most advanced member, chosen first)", f.dirs[i], got)
				}
			}
			for _, d := range f.dirs {
				if exists(filepath.Join(d, readyMarker)) || exists(newPath(d)) || exists(oldPath(d)) {
					t.Errorf("%s: swap leftovers remain", d)
				}
			}
		})
	}
}

// interruptedRebuilds stop a rebuild with nothing swapped: killed while building, or with every
// new dir ready and its swaps failed.
var interruptedRebuilds = []struct {
	name string
	run  func(t *testing.T, f *rebuildFixture, e *executor, s *StepReport) error
}{
	{"killed while building the second new dir", func(t *testing.T, f *rebuildFixture, e *executor, s *StepReport) error {
		built := 0
		return e.rebuild(t.Context(), s, func(src, tmp string, ms Membership) (string, error) {
			if built++; built == 2 {
				return "", errors.New("killed")
			}
			return f.build(src, tmp, ms)
		})
	}},
	{"every new dir ready, the first swap failed", func(t *testing.T, f *rebuildFixture, e *executor, s *StepReport) error {
		// A non-empty dir where the first member's old dir goes: its rename fails.
		writeTree(t, oldPath(f.dirs[0]), map[string]string{"x": "in the way"})
		return e.rebuild(t.Context(), s, f.build)
	}},
}

// TestRebuildRefusesChangedSource: on resume, a journaled source that is gone or no longer at
// the journaled index, or a member not yet swapped that changed since the source was chosen
// (an etcd ran on the old data dirs after the interrupted run), is refused, and nothing is
// swapped: the dirs that run rebuilt hold older data. This holds whether the run was killed
// while building or after every new dir was ready (its swaps failed), when nothing is left to
// build. Following the advice (remove the stale new dirs) rebuilds from the dirs as they are.
func TestRebuildRefusesChangedSource(t *testing.T) {
	for _, interrupt := range interruptedRebuilds {
		for _, c := range []struct {
			name     string
			change   func(t *testing.T, f *rebuildFixture)
			want     []string
			thenFrom string // after the stale new dirs are removed, every member is rebuilt from this ("": refused still)
		}{
			{"source gone", func(t *testing.T, f *rebuildFixture) {
				if err := os.RemoveAll(f.dirs[1]); err != nil {
					t.Fatal(err)
				}
			}, []string{"m2", "is gone"}, ""},
			{"source less advanced", func(t *testing.T, f *rebuildFixture) {
				rewriteMember(t, f.dirs[1], testPeers[1], 25)
			}, []string{"m2", "commit index 25", "30", "less advanced", "nothing was swapped", "m1.kubefence-new"}, "m2@25"},
			{"source more advanced", func(t *testing.T, f *rebuildFixture) {
				rewriteMember(t, f.dirs[1], testPeers[1], 35)
			}, []string{"m2", "commit index 35", "30", "changed", "nothing was swapped", "m1.kubefence-new"}, "m2@35"},
			{"another member in the source's place", func(t *testing.T, f *rebuildFixture) {
				rewriteMember(t, f.dirs[1], testPeers[2], 30)
			}, []string{"m3", "not m2", "nothing was swapped"}, ""},
			{"a member not yet swapped changed", func(t *testing.T, f *rebuildFixture) {
				rewriteMember(t, f.dirs[0], testPeers[0], 15)
			}, []string{"m1", "commit index 15", "10", "nothing was swapped", "m1.kubefence-new"}, "m2@30"},
		} {
			t.Run(interrupt.name+"/"+c.name, func(t *testing.T) {
				f := newRebuildFixture(t)
				e, s := f.start()
				if err := interrupt.run(t, f, e, s); err == nil {
					t.Fatal("the injected failure did not stop the step")
				}
				c.change(t, f)
				before := map[string]string{}
				for _, d := range f.dirs {
					if exists(d) {
						before[d] = strings.Join(dirNames(t, filepath.Join(d, "member", "wal")), ",")
					}
				}
				e, s = f.start()
				err := e.rebuild(t.Context(), s, f.build)
				assertErrContains(t, err, c.want...)
				for d, names := range before {
					if exists(filepath.Join(d, builtFrom)) || strings.Join(dirNames(t, filepath.Join(d, "member", "wal")), ",") != names {
						t.Errorf("%s was swapped although the step was refused", d)
					}
				}
				if c.thenFrom == "" {
					return
				}
				for _, d := range f.dirs {
					if err := os.RemoveAll(newPath(d)); err != nil {
						t.Fatal(err)
					}
				}
				e, s = f.start()
				if err := e.rebuild(t.Context(), s, f.build); err != nil {
					t.Fatalf("after the stale new dirs were removed: %v", err)
				}
				for i, got := range f.builtFrom() {
					if got != c.thenFrom {
						t.Errorf("%s was rebuilt from %q, want %s (the most advanced member now)", f.dirs[i], got, c.thenFrom)
					}
				}
			})
		}
	}
}

// TestRebuildRefusesChangedMemberAfterASwap: killed after the first swap, then a member not yet
// swapped changed: swapping the rest in would delete its newer data, and the member swapped in
// cannot be taken back, so the step is refused with the backups as the way out.
func TestRebuildRefusesChangedMemberAfterASwap(t *testing.T) {
	f := newRebuildFixture(t)
	e, s := f.start()
	e.afterSwap = crashAfter(1)
	if err := e.rebuild(t.Context(), s, f.build); err == nil {
		t.Fatal("the injected crash did not stop the step")
	}
	rewriteMember(t, f.dirs[2], testPeers[2], 21)
	e, s = f.start()
	err := e.rebuild(t.Context(), s, f.build)
	assertErrContains(t, err, "m3", "commit index 21", "nothing more was swapped", f.dirs[0], "restore-backup")
	for _, d := range f.dirs[1:] {
		if exists(filepath.Join(d, builtFrom)) {
			t.Errorf("%s was swapped although the step was refused", d)
		}
	}
}

// TestRebuildOlderJournalWithoutStates: a rebuild an older kubefence journaled has no member
// states to check its ready new dirs against: they are refused (not swapped), and once removed
// the step builds them again and finishes.
func TestRebuildOlderJournalWithoutStates(t *testing.T) {
	f := newRebuildFixture(t)
	e, s := f.start()
	e.afterSwap = crashAfter(1)
	if err := e.rebuild(t.Context(), s, f.build); err == nil {
		t.Fatal("the injected crash did not stop the step")
	}
	e, s = f.start()
	s.Source.Members = nil // as an older kubefence journaled it
	if err := e.save(); err != nil {
		t.Fatal(err)
	}
	err := e.rebuild(t.Context(), s, f.build)
	assertErrContains(t, err, "older kubefence", "m3.kubefence-new", "m2.kubefence-new", "remove them")
	for _, d := range f.dirs[1:] {
		if exists(filepath.Join(d, builtFrom)) {
			t.Errorf("%s was swapped although the step was refused", d)
		}
		if err := os.RemoveAll(newPath(d)); err != nil {
			t.Fatal(err)
		}
	}
	e, s = f.start()
	if err := e.rebuild(t.Context(), s, f.build); err != nil {
		t.Fatalf("after the unchecked new dirs were removed: %v", err)
	}
	for i, got := range f.builtFrom() {
		if got != "m2@30" {
			t.Errorf("%s was rebuilt from %q, want m2@30", f.dirs[i], got)
		}
	}
}

// rewriteMember replaces dir with a member self at commit index commit, as an etcd that ran on
// it (or a restore into it) would leave it.
func rewriteMember(t *testing.T, dir string, self Peer, commit uint64) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	writeMember(t, dir, self, commit)
}

// TestBackupResumedAfterCrash: a run killed after a backup was renamed into place, before the
// journal recorded it, keeps that backup on resume instead of taking a second one.
func TestBackupResumedAfterCrash(t *testing.T) {
	f := newRebuildFixture(t)
	step := func() *StepReport { return &StepReport{Name: "backup", Kind: StepBackup, Version: "3.4.23"} }
	rep := &Report{Operation: OpUpgrade, Target: f.opts.Target.String(), DataDirs: f.opts.DataDirs, Journal: f.opts.journalPath(), Steps: []*StepReport{step()}}
	e := &executor{opts: f.opts, rep: rep, afterBackup: func(string) error { return errors.New("killed") }}
	if err := e.save(); err != nil { // as the walk does before a step starts
		t.Fatal(err)
	}
	if err := e.do(t.Context(), rep.Steps[0]); err == nil {
		t.Fatal("the injected crash did not stop the step")
	}
	resumed, err := loadJournal(f.opts.journalPath(), OpUpgrade, f.opts)
	if err != nil || resumed == nil {
		t.Fatalf("journal after the crash: %v, %v", resumed, err)
	}
	e = &executor{opts: f.opts, rep: resumed}
	s := resumed.Steps[0]
	s.Members = map[string]string{}
	if err := e.do(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	backups, _ := filepath.Glob(filepath.Join(f.opts.BackupDir, "m*-3.4.23-*"))
	if len(backups) != len(f.dirs) {
		t.Fatalf("%d backups for %d data dirs: %v", len(backups), len(f.dirs), backups)
	}
	if got := s.Members[f.dirs[0]]; !strings.Contains(got, "earlier") {
		t.Errorf("the first data dir's backup: %q, want it kept from the killed run", got)
	}
}

// TestBackupsOfSameNamedDataDirs: members gathered as /p/host1/etcd and /p/host2/etcd each get
// a backup of their own, taken in the same second; and a backup planned for a data dir is kept
// on resume only if it was taken from that dir (two clusters sharing a backup dir name their
// backups alike), else the data dir is backed up again.
func TestBackupsOfSameNamedDataDirs(t *testing.T) {
	parent := t.TempDir()
	dirs := []string{filepath.Join(parent, "host1", "etcd"), filepath.Join(parent, "host2", "etcd")}
	for i, d := range dirs {
		writeTree(t, d, map[string]string{"member/snap/db": "backend of " + d, "member/wal/x.wal": fmt.Sprint("wal ", i)})
	}
	opts := Options{DataDirs: dirs, BackupDir: filepath.Join(parent, "backups"), Target: Version{3, 6, 16}}
	if err := opts.defaults(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(opts.BackupDir, 0o700); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	newRun := func() (*executor, *StepReport) {
		now = now.Add(time.Hour)
		s := &StepReport{Name: "backup", Kind: StepBackup, Version: "3.5.21"}
		rep := &Report{Operation: OpUpgrade, Target: opts.Target.String(), DataDirs: dirs, Journal: opts.journalPath(), Steps: []*StepReport{s}}
		return &executor{opts: opts, rep: rep, now: func() time.Time { return now }}, s
	}
	assertOwnBackups := func(t *testing.T, e *executor) {
		t.Helper()
		for _, d := range dirs {
			b := e.rep.Backups[d]
			if _, err := VerifyManifest(t.Context(), b); err != nil {
				t.Fatalf("%s's backup %s: %v", d, b, err)
			}
			got := readTree(t, b)
			delete(got, ManifestName)
			delete(got, BackupInfoName)
			if want := readTree(t, d); !maps.Equal(got, want) {
				t.Errorf("%s's backup %s holds %v, want %v", d, b, got, want)
			}
		}
	}

	t.Run("one run", func(t *testing.T) {
		e, s := newRun()
		s.Members = map[string]string{}
		if err := e.do(t.Context(), s); err != nil {
			t.Fatal(err)
		}
		assertOwnBackups(t, e)
	})

	t.Run("a planned backup taken from another data dir", func(t *testing.T) {
		other := filepath.Join(parent, "other", "etcd")
		writeTree(t, other, memberDir)
		e, s := newRun()
		s.Members = map[string]string{}
		e.rep.PlannedBackups = map[string]string{}
		for _, d := range dirs {
			// Another cluster's backup took the name first.
			dst := filepath.Join(opts.BackupDir, fmt.Sprintf("%s-%s-planned", filepath.Base(filepath.Dir(d)), filepath.Base(d)))
			if _, err := backupTo(t.Context(), other, opts.BackupDir, dst); err != nil {
				t.Fatal(err)
			}
			e.rep.PlannedBackups[d] = dst
		}
		if err := e.do(t.Context(), s); err != nil {
			t.Fatal(err)
		}
		assertOwnBackups(t, e)
		if got := s.Members[dirs[0]]; !strings.Contains(got, "not taken from this data dir") {
			t.Errorf("the report says %q, want why the planned backup was not kept", got)
		}
	})
}

// TestDryRunChangesNothing: a dry run only reports; what an interrupted swap left beside a data
// dir is a real run's to finish or clean up.
func TestDryRunChangesNothing(t *testing.T) {
	parent := t.TempDir()
	d := filepath.Join(parent, "m1")
	writeMemberWith(t, d, testPeers[0], 5, testPeers[:1]) // a cluster of one: the whole of it
	writeTree(t, oldPath(d), map[string]string{"x": "the member before a finished swap"})
	// The binaries the plan names, so that the dry run plans the whole upgrade and does not stop
	// at the first binary missing (which would leave .old untouched whatever a dry run does).
	bin := filepath.Join(parent, "bin")
	writeTree(t, bin, nil)
	fakeEtcd(t, bin, "3.5.35", "3.5.35")
	fakeEtcd(t, bin, "3.6.16", "3.6.16")
	rep, err := Run(t.Context(), OpUpgrade, Options{DataDirs: []string{d}, DryRun: true, Target: Version{3, 6, 16}, BinDir: bin})
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if !rep.DryRun || len(rep.Steps) == 0 {
		t.Fatalf("dry run report: DryRun %v, %d steps; want a dry run that planned the upgrade", rep.DryRun, len(rep.Steps))
	}
	if !exists(oldPath(d)) {
		t.Fatalf("a dry run removed %s", oldPath(d))
	}
}

// TestRebuildNeedsTheWholeCluster: a rebuild builds every member from the most advanced one,
// with the membership it names. Data dirs of another cluster would get this one's data, and a
// member left out could never rejoin the rebuilt ones: refused, nothing built.
func TestRebuildNeedsTheWholeCluster(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, f *rebuildFixture)
		want string
	}{
		{"another cluster's member", func(t *testing.T, f *rebuildFixture) {
			if err := os.RemoveAll(f.dirs[2]); err != nil {
				t.Fatal(err)
			}
			writeMemberOf(t, f.dirs[2], 0xd, testPeers[2], 20)
		}, "cluster"},
		{"a member left out", func(_ *testing.T, f *rebuildFixture) { f.dirs = f.dirs[:2] }, "m3"},
		{"a member twice", func(t *testing.T, f *rebuildFixture) {
			if err := os.RemoveAll(f.dirs[2]); err != nil {
				t.Fatal(err)
			}
			writeMember(t, f.dirs[2], testPeers[1], 20)
		}, "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRebuildFixture(t)
			tc.edit(t, f)
			f.opts.DataDirs = f.dirs
			e, s := f.start()
			err := e.rebuild(t.Context(), s, f.build)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("rebuild = %v, want a refusal naming %q", err, tc.want)
			}
			if built := f.builtFrom(); slices.ContainsFunc(built, func(s string) bool { return s != "" }) {
				t.Fatalf("members were built: %v", built)
			}
		})
	}
}

// TestOneRunAtATime: a second upgrade or downgrade of the same data dirs (an impatient rerun)
// would finish the first one's swaps or remove the dir it is building: refused while the first
// holds the lock, naming it.
func TestOneRunAtATime(t *testing.T) {
	f := newRebuildFixture(t)
	first, err := flock.Take(f.opts.lockPath())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	_, err = Run(t.Context(), OpUpgrade, f.opts)
	if err == nil || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("Run while another holds the lock: %v, want a refusal naming its pid", err)
	}
}

// TestResumeRefusesChangedOptions: a run killed after one member's new dir was marked ready,
// resumed with another option that decides what a rebuilt member holds, would keep that member
// and build the others differently: members of one raft group with different data. Refused,
// naming the option and both values; the same options resume.
func TestResumeRefusesChangedOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(o *Options)
		want   []string
	}{
		{"--include-hidden", func(o *Options) { o.IncludeHidden = true }, []string{"--include-hidden", "false", "true"}},
		{"--on-conflict", func(o *Options) { o.OnConflict = "v2" }, []string{"--on-conflict", `""`, `"v2"`}},
		{"--initial-cluster-token", func(o *Options) { o.ClusterToken = "other" }, []string{"--initial-cluster-token", `"etcd-cluster"`, `"other"`}},
		{"the same options", func(*Options) {}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRebuildFixture(t)
			e, s := f.start()
			built := 0
			if err := e.rebuild(t.Context(), s, func(src, tmp string, ms Membership) (string, error) {
				if built++; built == 2 {
					return "", errors.New("killed")
				}
				return f.build(src, tmp, ms)
			}); err == nil {
				t.Fatal("the injected crash did not stop the step")
			}
			opts := f.opts
			opts.DataDirs = slices.Clone(f.opts.DataDirs)
			tc.change(&opts)
			rep, err := loadJournal(opts.journalPath(), OpUpgrade, opts)
			if tc.want == nil {
				if err != nil || rep == nil {
					t.Fatalf("resume with the same options: %v, %v", rep, err)
				}
				return
			}
			assertErrContains(t, err, tc.want...)
		})
	}
}

// TestRerunChoosesAConflictPolicy: a v2 migration refused for a key in both stores, with the
// default --on-conflict, says to choose which wins with --on-conflict; the same command with
// --on-conflict=v3 then goes on, since the refused step built no member (the option could not
// make members disagree), and every member keeps the v3 value.
func TestRerunChoosesAConflictPolicy(t *testing.T) {
	f := newV2Fixture(t, time.Now().Add(24*time.Hour))
	for _, d := range f.dirs {
		putV3Key(t, d, "/registry/pods/a", "from-v3")
	}
	e, s := f.start()
	err := e.migrateV2(t.Context(), s)
	assertErrContains(t, err, "both the v2 and the v3 store", "--on-conflict=v3")
	if built := f.builtFrom(); slices.ContainsFunc(built, func(s string) bool { return s != "" }) {
		t.Fatalf("members were built: %v", built)
	}

	f.opts.OnConflict = "v3"
	rep, err := loadJournal(f.opts.journalPath(), OpUpgrade, f.opts)
	if err != nil || rep == nil {
		t.Fatalf("rerun with --on-conflict=v3 after the refusal: %v, %v; want the run resumed", rep, err)
	}
	if rep.Options == nil || rep.Options.OnConflict != "v3" {
		t.Fatalf("resumed with options %+v, want --on-conflict v3 taken", rep.Options)
	}
	e, s = f.start()
	if err := e.migrateV2(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	for _, d := range f.dirs {
		if got := v3Value(t, d, "/registry/pods/a"); got != "from-v3" {
			t.Errorf("%s: /registry/pods/a = %q, want the v3 value", d, got)
		}
	}
	var journaled Report
	b, err := os.ReadFile(f.opts.journalPath())
	if err == nil {
		err = json.Unmarshal(b, &journaled)
	}
	if err != nil || journaled.Options == nil || journaled.Options.OnConflict != "v3" {
		t.Errorf("journal: options %+v, %v; want --on-conflict v3 journaled for a later resume", journaled.Options, err)
	}
}

// putV3Key writes a live v3 key into dir's backend at revision 1, with the lease bucket and
// consistent index an etcd backend holding keys has.
func putV3Key(t *testing.T, dir, key, value string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "member", "snap", "db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("key"))
		if err != nil {
			return err
		}
		v, err := (&mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), CreateRevision: 1, ModRevision: 1, Version: 1}).Marshal()
		if err != nil {
			return err
		}
		rev := binary.BigEndian.AppendUint64(nil, 1)
		rev = binary.BigEndian.AppendUint64(append(rev, '_'), 0)
		if err := b.Put(rev, v); err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists([]byte("lease")); err != nil {
			return err
		}
		// Applied up to the v2 snapshot (writeV2Member), as etcd 3.5 records it.
		meta, err := tx.CreateBucketIfNotExists([]byte("meta"))
		if err != nil {
			return err
		}
		if err := meta.Put([]byte("consistent_index"), binary.BigEndian.AppendUint64(nil, 0x100)); err != nil {
			return err
		}
		return meta.Put([]byte("term"), binary.BigEndian.AppendUint64(nil, 1))
	})
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
}

// v3Value is key's latest value in dir's backend ("" when it has none).
func v3Value(t *testing.T, dir, key string) string {
	t.Helper()
	var latest mvccpb.KeyValue
	for k, v := range keysAndLeases(t, dir) {
		if !strings.HasPrefix(k, "key/") {
			continue
		}
		var kv mvccpb.KeyValue
		if err := kv.Unmarshal([]byte(v)); err != nil {
			t.Fatal(err)
		}
		if string(kv.Key) == key && kv.ModRevision >= latest.ModRevision {
			latest = kv
		}
	}
	return string(latest.Value)
}

// TestResumeOlderJournalWithoutOptions: an older kubefence journaled no options. Its run is
// resumed with the options given now when no rebuild step built a member yet; when one did,
// with options nothing records, it is refused: the ready new dirs can be removed and built
// again, members swapped in cannot.
func TestResumeOlderJournalWithoutOptions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		crash func(f *rebuildFixture, e *executor) buildFunc
		want  []string // nil: resumed
	}{
		{"nothing built", func(_ *rebuildFixture, _ *executor) buildFunc {
			return func(string, string, Membership) (string, error) { return "", errors.New("killed") }
		}, nil},
		{"a new dir ready", func(f *rebuildFixture, _ *executor) buildFunc {
			built := 0
			return func(src, tmp string, ms Membership) (string, error) {
				if built++; built == 2 {
					return "", errors.New("killed")
				}
				return f.build(src, tmp, ms)
			}
		}, []string{"older kubefence", "--include-hidden", "nothing was swapped", "m1.kubefence-new", "remove"}},
		{"a member swapped in", func(f *rebuildFixture, e *executor) buildFunc {
			e.afterSwap = crashAfter(1)
			return f.build
		}, []string{"older kubefence", "m1 swapped in", "kubefence version that started it", "restore the backups"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRebuildFixture(t)
			e, s := f.start()
			if err := e.rebuild(t.Context(), s, tc.crash(f, e)); err == nil {
				t.Fatal("the injected crash did not stop the step")
			}
			var journal map[string]any
			b, err := os.ReadFile(f.opts.journalPath())
			if err == nil {
				err = json.Unmarshal(b, &journal)
			}
			if err != nil {
				t.Fatal(err)
			}
			delete(journal, "rebuildOptions")
			if b, err = json.Marshal(journal); err == nil {
				err = os.WriteFile(f.opts.journalPath(), b, 0o600)
			}
			if err != nil {
				t.Fatal(err)
			}
			opts := f.opts
			opts.IncludeHidden = true
			rep, err := loadJournal(opts.journalPath(), OpUpgrade, opts)
			if tc.want != nil {
				assertErrContains(t, err, tc.want...)
				return
			}
			if err != nil || rep == nil || rep.Options == nil || !rep.Options.IncludeHidden {
				t.Fatalf("resume: %v, %v; want the options given now taken", rep, err)
			}
		})
	}
}

// TestRebuildRefusesALinkedDataDir: a plan that rebuilds members (a v2 migration, a storage
// downgrade) swaps each new member in by renaming its data dir; one that is a symlink would
// have the link moved and its directory left behind: refused before anything runs. A plan of
// plain version steps changes the data dir in place, and takes one.
func TestRebuildRefusesALinkedDataDir(t *testing.T) {
	parent := t.TempDir()
	real, link := filepath.Join(parent, "real"), filepath.Join(parent, "data")
	writeTree(t, real, memberDir)
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	steps := func(kinds ...string) []*StepReport {
		var out []*StepReport
		for _, k := range kinds {
			out = append(out, &StepReport{Kind: k})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		dir   string
		steps []*StepReport
		want  string
	}{
		{"downgrade of a linked data dir", link, steps(StepBackup, StepDowngrade), "is a symlink"},
		{"v2 migration of a linked data dir", link, steps(StepBackup, StepRun, StepMigrateV2, StepRun), "is a symlink"},
		{"version steps of a linked data dir", link, steps(StepBackup, StepRun), ""},
		{"downgrade of the directory itself", real, steps(StepBackup, StepDowngrade), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkReplaceable(&Report{DataDirs: []string{tc.dir}, Steps: tc.steps})
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkReplaceable: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestRunNeedsTheWholeCluster: a step starts etcd on the data dirs given, together: one member
// of three has no quorum (the step times out after the backup), two of three leave the third
// behind at the old version, and members still running elsewhere would take the step's etcd in
// (it dials the peer URLs its data records) and get its health checks written. Refused before
// anything is journaled or backed up, naming the member left out.
func TestRunNeedsTheWholeCluster(t *testing.T) {
	f := newRebuildFixture(t)
	bin := filepath.Join(t.TempDir(), "bin")
	writeTree(t, bin, nil)
	fakeEtcd(t, bin, "3.5.35", "3.5.35")
	fakeEtcd(t, bin, "3.6.16", "3.6.16")
	opts := f.opts
	opts.DataDirs, opts.BinDir = f.dirs[:1], bin
	_, err := Run(t.Context(), OpUpgrade, opts)
	if err == nil || !strings.Contains(err.Error(), "m2") || !strings.Contains(err.Error(), "not among the data dirs given") {
		t.Fatalf("upgrade of one member of three: %v; want a refusal naming the members left out", err)
	}
	dry := opts
	dry.DryRun = true
	if _, err := Run(t.Context(), OpUpgrade, dry); err == nil || !strings.Contains(err.Error(), "m2") {
		t.Fatalf("dry run of one member of three: %v; want the same refusal as the real run", err)
	}
	if exists(opts.journalPath()) {
		t.Fatal("the refused run left a journal")
	}
}

// TestRunRefusesTLSPeers: members of a set are started at the peer URLs their data records,
// without peer certificates; etcd refuses to listen on an https peer URL without them, so a step
// on such a set failed after its backup, again on every retry. Refused first, saying why.
func TestRunRefusesTLSPeers(t *testing.T) {
	parent := t.TempDir()
	var dirs []string
	for i, p := range tlsPeers() {
		d := filepath.Join(parent, p.Name)
		writeMemberWith(t, d, p, uint64(10+i), tlsPeers())
		dirs = append(dirs, d)
	}
	err := checkWholeCluster(dirs)
	if err == nil || !strings.Contains(err.Error(), "https://127.0.0.1:12380") || !strings.Contains(err.Error(), "peer") {
		t.Fatalf("checkWholeCluster of members with https peers: %v; want a refusal naming the peer URL", err)
	}
}

// TestRebuildRefusesADirInUse: a copy or backup started after the upgrade's own check (during
// its backup or a run) may read a data dir when the rebuild swaps it; the swap checks each dir
// again and swaps none while one is read, which would mix two dirs' files in the copy.
func TestRebuildRefusesADirInUse(t *testing.T) {
	f := newRebuildFixture(t)
	e, s := f.start()
	copying, err := holdStopped(f.dirs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer copying.Close()
	err = e.rebuild(t.Context(), s, f.build)
	assertErrContains(t, err, f.dirs[1]+" is in use")
	for _, d := range f.dirs {
		if exists(filepath.Join(d, builtFrom)) {
			t.Errorf("%s was swapped while %s was in use", d, f.dirs[1])
		}
	}
}

// TestRebuildHoldsTheDirsWhileSwapping: a copy starting on a dir while an earlier one is being
// swapped finds it in use (the swap holds every dir's backend until it is done), instead of the
// dir being renamed under it a moment later.
func TestRebuildHoldsTheDirsWhileSwapping(t *testing.T) {
	f := newRebuildFixture(t)
	e, s := f.start()
	var copyErr error
	e.afterSwap = func(d string) error {
		if d == f.dirs[0] {
			var l io.Closer
			if l, copyErr = holdStopped(f.dirs[1]); l != nil {
				l.Close()
			}
		}
		return nil
	}
	if err := e.rebuild(t.Context(), s, f.build); err != nil {
		t.Fatal(err)
	}
	if copyErr == nil || !strings.Contains(copyErr.Error(), "in use") {
		t.Errorf("a copy of %s while the swap ran: %v; want it refused, the dir in use", f.dirs[1], copyErr)
	}
}

// TestRebuildUsesTheSourcesMembership: etcd's restore derives the member IDs and the cluster ID
// from --initial-cluster and the token, so every member is built with the membership of the
// source (the most advanced member): a lagging member's own view (a member removed, a peer URL
// changed since) would build it into another cluster, and the next step would get no leader. A
// data dir of a member the source does not record is refused before anything is built.
func TestRebuildUsesTheSourcesMembership(t *testing.T) {
	moved := func(p Peer) Peer { p.PeerURLs = []string{"http://127.0.0.1:42380"}; return p }
	m4 := Peer{ID: 0x4, Name: "m4", PeerURLs: []string{"http://127.0.0.1:52380"}}
	for _, tc := range []struct {
		name  string
		dir   int    // the data dir rewritten, at its fixture commit index
		peers []Peer // what its members bucket lists instead
		want  string // a refusal, or "" for every member built with the source's membership
	}{
		{"a lagging member missed a removal", 0, append(slices.Clone(testPeers), m4), ""},
		{"a lagging member missed another's peer URL update", 0, []Peer{testPeers[0], testPeers[1], moved(testPeers[2])}, ""},
		{"a lagging member missed its own peer URL update", 0, []Peer{moved(testPeers[0]), testPeers[1], testPeers[2]}, ""},
		{"the source does not record a member given", 1, testPeers[:2], "m3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRebuildFixture(t)
			d := f.dirs[tc.dir]
			if err := os.RemoveAll(d); err != nil {
				t.Fatal(err)
			}
			self := slices.IndexFunc(tc.peers, func(p Peer) bool { return p.ID == testPeers[tc.dir].ID })
			writeMemberWith(t, d, tc.peers[self], []uint64{10, 30, 20}[tc.dir], tc.peers)
			built := map[string]Membership{}
			record := func(src, tmp string, ms Membership) (string, error) {
				built[tmp] = ms
				return f.build(src, tmp, ms)
			}
			if err := checkWholeCluster(f.dirs); (err != nil) != (tc.want != "") {
				t.Fatalf("checkWholeCluster = %v, want a refusal: %v", err, tc.want != "")
			}
			e, s := f.start()
			err := e.rebuild(t.Context(), s, record)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || len(built) > 0 {
					t.Fatalf("rebuild = %v, built %d; want a refusal naming %q before any build", err, len(built), tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("rebuild: %v", err)
			}
			for i, d := range f.dirs {
				ms := built[newPath(d)]
				if got, want := ms.InitialCluster(), InitialCluster(testPeers); got != want {
					t.Errorf("%s built with --initial-cluster %s, want the source's %s", d, got, want)
				}
				if !slices.Equal(ms.Self.PeerURLs, testPeers[i].PeerURLs) || ms.Self.Name != testPeers[i].Name {
					t.Errorf("%s built as %s at %v, want %s at %v (the source's record)", d, ms.Self.Name, ms.Self.PeerURLs, testPeers[i].Name, testPeers[i].PeerURLs)
				}
			}
		})
	}
}
