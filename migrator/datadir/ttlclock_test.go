package datadir

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/snap"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// writeV2Member makes a real etcd 3.4 member data dir holding v2 data: a v2 snapshot of st at
// index 0x100, a WAL for member self of cluster 0xc with extra (empty, committed) entries after
// it, and a backend with only the members bucket (no v3 keys).
func writeV2Member(t *testing.T, dir string, self Peer, st v2store.Store, extra int) {
	t.Helper()
	writeV2MemberTail(t, dir, self, st, make([][]byte, extra))
}

// writeV2MemberTail is writeV2Member with a committed WAL tail of entries holding tail's data.
func writeV2MemberTail(t *testing.T, dir string, self Peer, st v2store.Store, tail [][]byte) {
	t.Helper()
	snapDir := filepath.Join(dir, "member", "snap")
	if err := os.MkdirAll(snapDir, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := st.Save()
	if err != nil {
		t.Fatal(err)
	}
	cs := raftpb.ConfState{Voters: []uint64{testPeers[0].ID, testPeers[1].ID, testPeers[2].ID}}
	if err := snap.New(zap.NewNop(), snapDir).SaveSnap(raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 0x100, Term: 1, ConfState: cs}}); err != nil {
		t.Fatal(err)
	}
	md, err := (&etcdserverpb.Metadata{NodeID: self.ID, ClusterID: 0xc}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	w, err := wal.Create(zap.NewNop(), filepath.Join(dir, "member", "wal"), md)
	if err != nil {
		t.Fatal(err)
	}
	ents := make([]raftpb.Entry, len(tail))
	for i := range ents {
		ents[i] = raftpb.Entry{Term: 1, Index: 0x101 + uint64(i), Type: raftpb.EntryNormal, Data: tail[i]}
	}
	err = errors.Join(w.SaveSnapshot(walpb.Snapshot{Index: 0x100, Term: 1, ConfState: &cs}),
		w.Save(raftpb.HardState{Term: 1, Commit: 0x100 + uint64(len(tail))}, ents), w.Close())
	if err != nil {
		t.Fatal(err)
	}
	writeMembersBucket(t, filepath.Join(snapDir, "db"), testPeers)
}

// newV2Fixture is three stopped etcd 3.4 members with the same v2 store: a plain key and an
// event key that expires at expiry. m2 is the most advanced.
func newV2Fixture(t *testing.T, expiry time.Time) *rebuildFixture {
	st := v2store.New("/0", "/1")
	if _, err := st.Set("/1/registry/pods/a", false, "pod", v2store.TTLOptionSet{}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Set("/1/registry/events/e", false, "event", v2store.TTLOptionSet{ExpireTime: expiry}); err != nil {
		t.Fatal(err)
	}
	f := newRebuildFixture(t)
	for i, extra := range []int{1, 3, 2} {
		if err := os.RemoveAll(f.dirs[i]); err != nil {
			t.Fatal(err)
		}
		writeV2Member(t, f.dirs[i], testPeers[i], st, extra)
	}
	return f
}

// keysAndLeases is every entry of a member backend's key and lease buckets, bucket/key → value.
func keysAndLeases(t *testing.T, dir string) map[string]string {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "member", "snap", "db"), 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]string{}
	err = db.View(func(tx *bolt.Tx) error {
		for _, name := range []string{"key", "lease"} {
			b := tx.Bucket([]byte(name))
			if b == nil {
				return fmt.Errorf("no %s bucket", name)
			}
			if err := b.ForEach(func(k, v []byte) error { out[name+"/"+string(k)] = string(v); return nil }); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	return out
}

// TestV2MigrationMembersAgree: every member a multi-member v2 migration rebuilds gets the same
// keys and leases, however long the builds take and whether the step was resumed. The TTL
// clock is taken once for the step and journaled: a key expiring between two members' builds
// would otherwise be kept on one and dropped on the other, and the lease's later revoke would
// put their revisions apart for good.
func TestV2MigrationMembersAgree(t *testing.T) {
	expiry := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name       string
		crashAfter int  // swaps before an injected crash (0: none)
		olderRun   bool // the crashed run journaled no clock (an older kubefence)
		wantLeases int  // the event's lease: 1 when built with the first reading of the clock
	}{
		{"one run", 0, false, 1},
		{"resumed after a crash", 1, false, 1},
		// The resumed run takes the clock (its second reading, after the expiry): the member
		// the older run swapped in with a clock of its own is built again with it.
		{"resumed after an older kubefence's crash", 1, true, 0},
		// Killed after the last swap (the source's), before the journal said so: every member
		// is in, built with the first reading.
		{"resumed after a crash after the last swap", 3, false, 1},
		// The same by an older kubefence: the source's v2 data is gone, so no member can be
		// built again with a new clock. The resume finishes as that version would have.
		{"resumed after an older kubefence's crash after the last swap", 3, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newV2Fixture(t, expiry)
			// The first reading of the clock is a minute before the event expires, every later
			// one a minute after.
			read := 0
			now := func() time.Time {
				if read++; read == 1 {
					return expiry.Add(-time.Minute)
				}
				return expiry.Add(time.Minute)
			}
			e, s := f.start()
			e.now = now
			if tc.crashAfter > 0 {
				e.afterSwap = crashAfter(tc.crashAfter)
				if err := e.migrateV2(t.Context(), s); err == nil {
					t.Fatal("the injected crash did not stop the step")
				}
				e, s = f.start()
				e.now = now
				if tc.olderRun {
					forgetClock(t, e, s, f.dirs)
				}
			}
			if err := e.migrateV2(t.Context(), s); err != nil {
				t.Fatal(err)
			}
			for _, d := range f.dirs {
				if exists(filepath.Join(d, readyMarker)) || exists(newPath(d)) || exists(oldPath(d)) {
					t.Errorf("%s: swap leftovers remain", d)
				}
			}
			want := keysAndLeases(t, f.dirs[0])
			leases := 0
			for k := range want {
				if len(k) > len("lease/") && k[:len("lease/")] == "lease/" {
					leases++
				}
			}
			if leases != tc.wantLeases {
				t.Fatalf("%s holds %d leases, want %d", f.dirs[0], leases, tc.wantLeases)
			}
			for _, d := range f.dirs[1:] {
				if got := keysAndLeases(t, d); !maps.Equal(got, want) {
					t.Errorf("%s's keys and leases differ from %s's:\n%q\n%q", d, f.dirs[0], got, want)
				}
			}
		})
	}
}

// forgetClock makes the journal and the ready markers of an interrupted v2 migration what an
// older kubefence wrote: no TTL clock (and, in the markers, no options: olderMarker).
func forgetClock(t *testing.T, e *executor, s *StepReport, dirs []string) {
	t.Helper()
	s.Source.TTLClock = time.Time{}
	if err := e.save(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		for _, p := range []string{d, newPath(d)} {
			if exists(filepath.Join(p, readyMarker)) {
				olderMarker(t, p, func(src *RebuildSource) { src.TTLClock = time.Time{} })
			}
		}
	}
}

// TestResumeChecksBackups: a v2 migration killed after its first swap, resumed once a member's
// backup is gone or damaged (days later, a backup dir cleaned up), is refused before the step
// changes anything, naming the backup: the backups are the only way back. With the backups
// whole, the resume finishes.
func TestResumeChecksBackups(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, backup string)
		want   []string // nil: resumed
	}{
		{"backups whole", func(*testing.T, string) {}, nil},
		{"a backup removed", func(t *testing.T, b string) {
			if err := os.RemoveAll(b); err != nil {
				t.Fatal(err)
			}
		}, []string{"is missing", "nothing was changed", "put"}},
		{"a backup damaged", func(t *testing.T, b string) {
			writeTree(t, b, map[string]string{"member/snap/db": "bit rot"})
		}, []string{"is damaged", "member/snap/db", "nothing was changed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newV2Fixture(t, time.Unix(1_800_000_000, 0))
			rep := &Report{Operation: OpUpgrade, Target: f.opts.Target.String(), DataDirs: f.dirs, Journal: f.opts.journalPath(),
				BackupDir: f.opts.BackupDir, Options: f.opts.rebuildOptions(), Steps: []*StepReport{
					{Name: "back up", Kind: StepBackup, Version: "3.5.21"},
					{Name: "migrate", Kind: StepMigrateV2, Version: "3.5.21"},
				}}
			e := &executor{opts: f.opts, rep: rep, afterSwap: crashAfter(1)}
			if err := e.walk(t.Context()); err == nil {
				t.Fatal("the injected crash did not stop the step")
			}
			resumed, err := loadJournal(f.opts.journalPath(), OpUpgrade, f.opts)
			if err != nil || resumed == nil {
				t.Fatalf("journal after the crash: %v, %v", resumed, err)
			}
			backup := resumed.Backups[f.dirs[2]]
			tc.change(t, backup)
			before := map[string]map[string]string{}
			for _, d := range f.dirs {
				for _, p := range []string{d, newPath(d)} {
					if exists(p) {
						before[p] = readTree(t, p)
					}
				}
			}
			err = (&executor{opts: f.opts, rep: resumed}).walk(t.Context())
			if tc.want == nil {
				if err != nil {
					t.Fatalf("resume with the backups whole: %v", err)
				}
				return
			}
			assertErrContains(t, err, append(tc.want, backup, f.dirs[2])...)
			for p, files := range before {
				if !exists(p) || !maps.Equal(readTree(t, p), files) {
					t.Errorf("%s changed although the resume was refused", p)
				}
			}
		})
	}
}
