package v2v3

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/snap/snappb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/raft/v3/raftpb"
)

func bp(b bool) *bool { return &b }

// transformStore turns a whole store into keys, as a migration does with its overlay.
func transformStore(st v2store.Store, hidden map[string]bool, o Options) ([]KV, map[int64]*Lease, TransformStats, error) {
	c := newCollector(o, false)
	walkStore(st, hidden, c)
	err := sortKVs(c.kvs)
	c.stats.Keys = len(c.kvs)
	return c.kvs, c.leases, c.stats, err
}

func TestApplyV2(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	st := v2store.New("/0", "/1")
	steps := []struct {
		name string
		req  etcdserverpb.Request
		want outcome
	}{
		{"set", etcdserverpb.Request{Method: "PUT", Path: "/1/a", Val: "1"}, outcomeApplied},
		{"cas ok", etcdserverpb.Request{Method: "PUT", Path: "/1/a", Val: "2", PrevValue: "1"}, outcomeApplied},
		{"cas by value fails", etcdserverpb.Request{Method: "PUT", Path: "/1/a", Val: "3", PrevValue: "1"}, outcomeRefused},
		{"cas by index fails", etcdserverpb.Request{Method: "PUT", Path: "/1/a", Val: "3", PrevIndex: 1}, outcomeRefused},
		{"create when absent", etcdserverpb.Request{Method: "PUT", Path: "/1/b", Val: "b", PrevExist: bp(false)}, outcomeApplied},
		{"create when present fails", etcdserverpb.Request{Method: "PUT", Path: "/1/b", Val: "x", PrevExist: bp(false)}, outcomeRefused},
		{"update", etcdserverpb.Request{Method: "PUT", Path: "/1/b", Val: "b2", PrevExist: bp(true)}, outcomeApplied},
		{"update absent fails", etcdserverpb.Request{Method: "PUT", Path: "/1/nope", Val: "x", PrevExist: bp(true)}, outcomeRefused},
		{"ttl key", etcdserverpb.Request{Method: "PUT", Path: "/1/ttl", Val: "t", Expiration: now.Add(time.Hour).UnixNano()}, outcomeApplied},
		{"refresh keeps value", etcdserverpb.Request{Method: "PUT", Path: "/1/ttl", PrevExist: bp(true), Refresh: bp(true), Expiration: now.Add(2 * time.Hour).UnixNano()}, outcomeApplied},
		{"short ttl", etcdserverpb.Request{Method: "PUT", Path: "/1/short", Val: "s", Expiration: now.Add(time.Second).UnixNano()}, outcomeApplied},
		{"dir", etcdserverpb.Request{Method: "PUT", Path: "/1/d", Dir: true}, outcomeApplied},
		{"in-order key", etcdserverpb.Request{Method: "POST", Path: "/1/d", Val: "job"}, outcomeApplied},
		{"delete non-empty dir fails", etcdserverpb.Request{Method: "DELETE", Path: "/1/d", Dir: true}, outcomeRefused},
		{"recursive delete", etcdserverpb.Request{Method: "DELETE", Path: "/1/d", Recursive: true}, outcomeApplied},
		{"cad fails", etcdserverpb.Request{Method: "DELETE", Path: "/1/b", PrevValue: "wrong"}, outcomeRefused},
		{"cad", etcdserverpb.Request{Method: "DELETE", Path: "/1/b", PrevValue: "b2"}, outcomeApplied},
		{"qget", etcdserverpb.Request{Method: "QGET", Path: "/1/a"}, outcomeIgnored},
		{"sync expires at request time", etcdserverpb.Request{Method: "SYNC", Time: now.Add(time.Minute).UnixNano()}, outcomeSync},
	}
	for _, s := range steps {
		if got := applyV2(st, &s.req); got != s.want {
			t.Fatalf("%s: outcome %d, want %d", s.name, got, s.want)
		}
	}
	kvs, leases, stats, err := transformStore(st, nil, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]KV{}
	for _, kv := range kvs {
		got[string(kv.Key)] = kv
	}
	if len(got) != 2 || string(got["/a"].Value) != "2" || string(got["/ttl"].Value) != "t" {
		t.Fatalf("keys after replay: %v", got)
	}
	l := leases[got["/ttl"].Lease]
	if l == nil || l.TTL != 7200 || l.Keys != 1 || stats.TTLKeys != 1 {
		t.Fatalf("lease of the refreshed key: %+v, stats %+v", l, stats)
	}
	if got["/a"].CreateRevision != 1 || got["/a"].ModRevision != 2 {
		t.Errorf("revisions of /a: %+v", got["/a"])
	}
}

func TestTransformOptions(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	st := v2store.New("/0", "/1")
	mustSet := func(path, v string, exp time.Time) {
		if _, err := st.Set(path, false, v, v2store.TTLOptionSet{ExpireTime: exp}); err != nil {
			t.Fatal(err)
		}
	}
	mustSet("/1/registry/events/a", "a", now.Add(90*time.Second+100*time.Millisecond))
	mustSet("/1/registry/events/b", "b", now.Add(90*time.Second+900*time.Millisecond)) // same second as a
	mustSet("/1/registry/events/c", "c", now.Add(10*time.Minute))
	mustSet("/1/registry/events/old", "x", now.Add(-time.Second)) // expired by the clock
	mustSet("/1/_hidden/k", "h", time.Time{})
	mustSet("/1/registry/_x/k", "h", time.Time{})
	mustSet("/1/registry/pods/p", "p", time.Time{})
	mustSet("/0/members/m", "m", time.Time{}) // membership: never user data
	hidden := map[string]bool{"/1/_hidden/k": true, "/1/registry/_x/k": true}
	cases := []struct {
		name     string
		o        Options
		keys     int
		leases   int
		expired  int
		hidden   int
		skipped  int
		ttlDrops int
	}{
		{"defaults", Options{Now: now}, 4, 2, 1, 2, 2, 0},
		{"include hidden", Options{Now: now, IncludeHidden: true}, 6, 2, 1, 2, 0, 0},
		{"no ttl", Options{Now: now, NoTTL: true}, 1, 0, 0, 2, 2, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kvs, leases, s, err := transformStore(st, hidden, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if len(kvs) != tc.keys || len(leases) != tc.leases || s.ExpiredDropped != tc.expired || s.Hidden != tc.hidden || s.HiddenSkipped != tc.skipped || s.TTLDropped != tc.ttlDrops {
				t.Fatalf("keys %d leases %d stats %+v", len(kvs), len(leases), s)
			}
			for i := 1; i < len(kvs); i++ {
				if kvs[i].ModRevision <= kvs[i-1].ModRevision {
					t.Fatal("keys not in revision order")
				}
			}
			for _, l := range leases {
				if l.TTL < 1 || l.ID <= now.Unix() {
					t.Errorf("lease %+v", l)
				}
			}
		})
	}
	kvs, leases, _, _ := transformStore(st, hidden, Options{Now: now})
	for _, kv := range kvs {
		if string(kv.Key) == "/registry/events/a" {
			if l := leases[kv.Lease]; l == nil || l.Keys != 2 || l.TTL != 91 {
				t.Errorf("a and b expire in the same second and should share a 91 s lease: %+v", l)
			}
		}
	}
}

func writeSnap(t *testing.T, path string, data []byte, index uint64, corrupt bool) {
	t.Helper()
	rs := raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: index, Term: 1}}
	b, err := rs.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	sp := snappb.Snapshot{Crc: crc32.Update(0, crcTable, b), Data: b}
	if corrupt {
		sp.Crc++
	}
	out, err := sp.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotFallback(t *testing.T) {
	dir := t.TempDir()
	st := v2store.New("/0", "/1")
	data, _ := st.Save()
	writeSnap(t, filepath.Join(dir, "0000000000000002-0000000000000010.snap"), data, 0x10, false)
	writeSnap(t, filepath.Join(dir, "0000000000000002-0000000000000020.snap"), data, 0x20, true)
	if err := os.WriteFile(filepath.Join(dir, "0000000000000002-0000000000000030.snap"), []byte("trunc"), 0o600); err != nil {
		t.Fatal(err)
	}
	var s Source
	if err := s.loadSnapshot(dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Meta.Index != 0x10 || len(s.Skipped) != 2 || !strings.Contains(s.Skipped[0], "0030.snap") || !strings.Contains(s.Skipped[1], "checksum mismatch") {
		t.Fatalf("loaded index %d, skipped %v", s.Meta.Index, s.Skipped)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".broken") {
			t.Fatal("a broken snapshot was renamed: the source must not be written")
		}
	}
	bad := t.TempDir()
	writeSnap(t, filepath.Join(bad, "0000000000000002-0000000000000020.snap"), data, 0x20, true)
	if err := (&Source{}).loadSnapshot(bad); err == nil || !strings.Contains(err.Error(), "no readable v2 snapshot") {
		t.Fatalf("only corrupt snapshots: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	srcAtWork := filepath.Join(t.TempDir(), "out.kubefence-part") // the working dir of output out
	if err := os.Mkdir(srcAtWork, 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "member.db")
	if err := os.WriteFile(file, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		c    Config
		want []string
	}{
		{"output is a file", Config{DataDir: src, OutputDir: file, Member: Membership{Name: "a", InitialCluster: "a=http://x:1", InitialAdvertisePeerURLs: []string{"http://x:1"}}}, []string{"is a file"}},
		{"empty", Config{}, []string{"--data-dir is required", "--output-dir is required", "--name, --initial-cluster"}},
		{"non-empty output", Config{DataDir: src, OutputDir: full, Member: Membership{Name: "a", InitialCluster: "a=http://x:1", InitialAdvertisePeerURLs: []string{"http://x:1"}}}, []string{"is not empty"}},
		{"output inside source", Config{DataDir: src, OutputDir: filepath.Join(src, "out"), Member: Membership{Name: "a", InitialCluster: "a=http://x:1", InitialAdvertisePeerURLs: []string{"http://x:1"}}}, []string{"must not be inside"}},
		{"source where the working dir goes", Config{DataDir: srcAtWork, OutputDir: strings.TrimSuffix(srcAtWork, ".kubefence-part"), Member: Membership{Name: "a", InitialCluster: "a=http://x:1", InitialAdvertisePeerURLs: []string{"http://x:1"}}}, []string{"the working dir next to --output-dir", "removed before each run"}},
		{"compacted without bump", Config{DataDir: src, OutputDir: filepath.Join(t.TempDir(), "o"), MarkCompacted: true, Member: Membership{Name: "a", InitialCluster: "a=http://x:1", InitialAdvertisePeerURLs: []string{"http://x:1"}}}, []string{"go together"}},
		{"bump without compacted", Config{DataDir: src, OutputDir: filepath.Join(t.TempDir(), "o"), RevisionBump: 5, Options: Options{PrefixFrom: "/a"}, Member: Membership{Name: "a", InitialCluster: "a=http://x:1", InitialAdvertisePeerURLs: []string{"http://x:1"}}}, []string{"go together (etcd", "--prefix-from and --prefix-to go together"}},
		{"missing transformer", Config{DataDir: src, OutputDir: filepath.Join(t.TempDir(), "o"), Options: Options{Transformer: "/nonexistent/xform"}, Member: Membership{Name: "a", InitialCluster: "a=http://x:1", InitialAdvertisePeerURLs: []string{"http://x:1"}}}, []string{"--transformer"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v lacks %q", err, w)
				}
			}
		})
	}
	if _, err := ReadSource(src, ""); err == nil || !strings.Contains(err.Error(), "not an etcd member data dir") {
		t.Errorf("ReadSource of an empty dir: %v", err)
	}
}

func TestHiddenPrefixes(t *testing.T) {
	for p, want := range map[string][]string{
		"/1/a/_b/c":    {"/1/a/_b"},
		"/1/_top":      {"/1/_top"},
		"/1/x/_y/_z/w": {"/1/x/_y", "/1/x/_y/_z"},
		"/1/_a/b/_c":   {"/1/_a", "/1/_a/b/_c"},
		"/1/plain":     nil,
	} {
		if got := hiddenPrefixes(p); !slices.Equal(got, want) {
			t.Errorf("hiddenPrefixes(%s) = %v, want %v", p, got, want)
		}
	}
}

func TestMoveLeases(t *testing.T) {
	// 100 and 101 are ours; 100 clashes with a v3 lease. Moving it to 101 must not overwrite our
	// own 101, which moves on past the v3 lease at 102.
	leases := map[int64]*Lease{100: {ID: 100, TTL: 10, Keys: 1}, 101: {ID: 101, TTL: 11, Keys: 1}}
	kvs := []KV{{Key: []byte("/a"), Lease: 100}, {Key: []byte("/b"), Lease: 101}, {Key: []byte("/c")}}
	got := moveLeases(kvs, leases, map[int64]bool{100: true, 102: true})
	if len(got) != 2 || got[101] == nil || got[101].TTL != 10 || got[103] == nil || got[103].TTL != 11 {
		t.Fatalf("leases = %v", got)
	}
	if kvs[0].Lease != 101 || kvs[1].Lease != 103 || kvs[2].Lease != 0 {
		t.Fatalf("keys point at %d, %d, %d", kvs[0].Lease, kvs[1].Lease, kvs[2].Lease)
	}
	for id, l := range got {
		if l.ID != id {
			t.Errorf("lease %d says ID %d", id, l.ID)
		}
	}
}

// TestRunKeepsFileAtOutput: a file where the output dir should go is refused and left as it
// was, also when it appears after Validate (finish would have removed it).
func TestRunKeepsFileAtOutput(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	c := testConfig(t, smallMember(t, now), now)
	c.OutputDir = filepath.Join(t.TempDir(), "member.db")
	if err := os.WriteFile(c.OutputDir, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(c); err == nil || !strings.Contains(err.Error(), "is a file") {
		t.Errorf("Run with a file at --output-dir: %v, want an error saying it is a file", err)
	}
	if b, err := os.ReadFile(c.OutputDir); string(b) != "kept" {
		t.Fatalf("the file at --output-dir now holds %q (%v)", b, err)
	}
	member := t.TempDir()
	if err := finish(member, c.OutputDir); err == nil {
		t.Error("finish over a file: no error")
	}
	if b, err := os.ReadFile(c.OutputDir); string(b) != "kept" {
		t.Fatalf("finish replaced the file at the output: %q (%v)", b, err)
	}
}

// TestRunClearsAKilledRunsWork: the new member is built in a working dir next to the output,
// which a killed run (kill -9, the OOM killer) leaves behind, as big as the new database. Its
// name comes from the output's, so the next run to that output removes what the killed one
// left instead of adding another copy beside it.
func TestRunClearsAKilledRunsWork(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	src := smallMember(t, now)
	parent := t.TempDir()
	out := filepath.Join(parent, "out")
	// run migrates into out and returns what was next to it while the keys were written.
	run := func() []string {
		t.Helper()
		c := testConfig(t, src, now)
		c.OutputDir = out
		var beside []string
		c.Progress = func(phase string, _, _ int64) {
			if phase == "write" && beside == nil {
				// The working dir; the run's lock beside it is TestOneRunPerOutput's.
				beside = slices.DeleteFunc(dirNames(t, parent), func(n string) bool { return n == "out.kubefence-lock" })
			}
		}
		if _, err := Run(c); err != nil {
			t.Fatal(err)
		}
		return beside
	}
	first := run()
	if len(first) != 1 {
		t.Fatalf("while writing, %s held %v: want one working dir", parent, first)
	}
	work := filepath.Join(parent, first[0])
	// As a run killed while writing leaves it: no output, the working dir with a database.
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(work, "data", "member", "snap"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "data", "member", "snap", "db"), []byte("a killed run's database"), 0o600); err != nil {
		t.Fatal(err)
	}
	if again := run(); len(again) != 1 || again[0] != first[0] {
		t.Errorf("while the second run wrote, %s held %v: want only %s, the first run's working dir, emptied and used again", parent, again, first[0])
	}
	if names := dirNames(t, parent); len(names) != 1 || names[0] != "out" {
		t.Fatalf("%s holds %v after the run, want only out", parent, names)
	}
}

// dirNames lists the names in dir.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestOneRunPerOutput: the working dir is named after the output and removed before each run,
// so a second run to the same output (an impatient rerun, another terminal) would remove the
// first's half-written member, or rename its own into place while the first still writes. It
// is refused while the first holds the lock beside the output, with an error naming the
// first's pid and what it does; the first's work is left as it was, and the first finishes.
func TestOneRunPerOutput(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	src := smallMember(t, now)
	c := testConfig(t, src, now)
	db := filepath.Join(workPath(c.OutputDir), "data", "member", "snap", "db")
	var second error
	secondRan := false
	c.Progress = func(phase string, _, _ int64) {
		if phase != "write" || secondRan {
			return
		}
		secondRan = true
		before, err := os.Stat(db)
		if err != nil {
			t.Fatalf("the first run's database while it writes: %v", err)
		}
		again := testConfig(t, src, now)
		again.OutputDir = c.OutputDir
		_, second = Run(again)
		if after, err := os.Stat(db); err != nil || !os.SameFile(before, after) {
			t.Errorf("the second run removed or replaced the first's database %s (%v)", db, err)
		}
	}
	if _, err := Run(c); err != nil {
		t.Fatalf("the first run: %v", err)
	}
	if !secondRan {
		t.Fatal("no write progress: the second run never started")
	}
	want := []string{"pid " + strconv.Itoa(os.Getpid()), "migrate v2-to-v3 from " + src, c.OutputDir + ".kubefence-lock", "wait for it to finish"}
	if second == nil {
		t.Fatal("a second run to the output while the first wrote it succeeded")
	}
	for _, w := range want {
		if !strings.Contains(second.Error(), w) {
			t.Errorf("the second run's error %q does not say %q", second, w)
		}
	}
	if names := dirNames(t, filepath.Dir(c.OutputDir)); !slices.Equal(names, []string{"out"}) {
		t.Errorf("%s holds %v after the run, want only out (no lock file, no working dir)", filepath.Dir(c.OutputDir), names)
	}
}

// TestSnapshotTheWALDoesNotRecord: etcd writes a snapshot file before the WAL's record of it;
// stopped in between, it leaves a newest .snap the WAL does not know, and etcd starts from the
// newest one the WAL records. So does the migration, saying it skipped the other; it used to
// load that one and call the WAL damaged.
func TestSnapshotTheWALDoesNotRecord(t *testing.T) {
	st := v2store.New("/0", "/1")
	if _, err := st.Set("/1/k", false, "v", v2store.TTLOptionSet{}); err != nil {
		t.Fatal(err)
	}
	dir := writeMember(t, st, nil) // a snapshot at 0x100, recorded in the WAL
	data, err := st.Save()
	if err != nil {
		t.Fatal(err)
	}
	writeSnap(t, filepath.Join(dir, "member", "snap", "0000000000000001-0000000000000200.snap"), data, 0x200, false)
	s, err := ReadSource(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Meta.Index != 0x100 || len(s.Skipped) != 1 || !strings.Contains(s.Skipped[0], "0200.snap") || !strings.Contains(s.Skipped[0], "WAL") {
		t.Fatalf("loaded index %#x, skipped %q: want 0x100, and the unrecorded one skipped as such", s.Meta.Index, s.Skipped)
	}
}

// TestCancelledRunPlacesNothing: a run whose context ends (Ctrl-C, SIGTERM, a cutover's stop)
// stops between its phases, and places no output: it went on to the end and renamed it into
// place.
func TestCancelledRunPlacesNothing(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	c := testConfig(t, smallMember(t, now), now)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rep, err := RunContext(ctx, c)
	if !errors.Is(err, context.Canceled) || rep != nil {
		t.Fatalf("RunContext on an ended context = %+v, %v; want context.Canceled and no report", rep, err)
	}
	if _, err := os.Stat(c.OutputDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("output %s after a cancelled run: %v; want none", c.OutputDir, err)
	}
}

// TestStoppedDuringVerifyPlacesNothing: the verify phase ends by renaming the output into
// place; a run stopped while it reads the output back does not place it.
func TestStoppedDuringVerifyPlacesNothing(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	c := testConfig(t, smallMember(t, now), now)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c.Progress = func(phase string, _, _ int64) {
		if phase == "verify" {
			cancel()
		}
	}
	if rep, err := RunContext(ctx, c); !errors.Is(err, context.Canceled) {
		t.Fatalf("RunContext stopped during verify = %+v, %v; want context.Canceled", rep, err)
	}
	if _, err := os.Stat(c.OutputDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("output %s after a run stopped during verify: %v; want none", c.OutputDir, err)
	}
}

// TestContentDigestComparesMembers: the members of a new cluster must all be built from one
// source copy, with one --ttl-clock and the same flags, or they hold different data under one
// cluster. The report's content digest (the key and lease buckets) is what to compare: the same
// for two members built from one copy, different for another copy or another clock.
func TestContentDigestComparesMembers(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	src := smallMember(t, now)
	build := func(src, name string, clock time.Time) *Report {
		t.Helper()
		c := testConfig(t, src, clock)
		c.Member = Membership{Name: name, InitialCluster: "a=http://10.0.0.1:2380,b=http://10.0.0.2:2380", InitialClusterToken: "t",
			InitialAdvertisePeerURLs: []string{map[string]string{"a": "http://10.0.0.1:2380", "b": "http://10.0.0.2:2380"}[name]}}
		rep, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	a, b := build(src, "a", now), build(src, "b", now)
	if a.ContentCRC == 0 || a.ContentCRC != b.ContentCRC {
		t.Fatalf("members a and b built from one copy: content digests %08x and %08x, want equal and set", a.ContentCRC, b.ContentCRC)
	}
	if c := build(src, "b", now.Add(time.Second)); c.ContentCRC == a.ContentCRC {
		t.Errorf("a member built with another --ttl-clock has a's content digest %08x", a.ContentCRC)
	}
	st := v2store.New("/0", "/1")
	if _, err := st.Set("/1/registry/pods/a", false, "other", v2store.TTLOptionSet{}); err != nil {
		t.Fatal(err)
	}
	if d := build(writeMember(t, st, nil), "b", now); d.ContentCRC == a.ContentCRC {
		t.Errorf("a member built from another copy has a's content digest %08x", a.ContentCRC)
	}
}

// TestPastQuotaShare: the rule the migration warns by and the cutover's preflight refuses by.
// A database is past its quota's share above 80% of it; QuotaFor gives the smallest quota it
// is not past; a negative quota is none.
func TestPastQuotaShare(t *testing.T) {
	for _, tc := range []struct {
		size, quota int64
		past        bool
	}{
		{0, DefaultQuota, false},
		{DefaultQuota / 5 * 4, DefaultQuota, false},
		{DefaultQuota/5*4 + 1, DefaultQuota, true},
		{DefaultQuota, DefaultQuota, true},
		{1 << 40, -1, false},
		{1, 0, true},
	} {
		if got := PastQuotaShare(tc.size, tc.quota); got != tc.past {
			t.Errorf("PastQuotaShare(%d, %d) = %v, want %v", tc.size, tc.quota, got, tc.past)
		}
	}
	for _, size := range []int64{4 << 10, 19 << 30 / 10, 3<<30 + 7} {
		if q := QuotaFor(size); PastQuotaShare(size, q) || !PastQuotaShare(size, q-5) {
			t.Errorf("QuotaFor(%d) = %d: want the smallest quota (to the 5 bytes its fifths round to) the size is not past 80%% of", size, q)
		}
	}
}

// TestQuotaWarned: etcd's default quota (--quota-backend-bytes) is 2 GiB, and an etcd whose
// database is past its quota refuses writes (NOSPACE). An output past 80% of it is warned
// about, naming its size and the flag green etcd needs; a smaller one is not.
func TestQuotaWarned(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	src := smallMember(t, now)
	defer func(q int64) { defaultQuota = q }(defaultQuota)
	for _, tc := range []struct {
		name  string
		quota int64 // etcd's default
		given int64 // Config.Quota: the quota the new members will run with
		warn  bool
	}{
		{"output past 80% of the default quota", 4 << 10, 0, true},
		{"output well under the default quota", 1 << 40, 0, false},
		// A caller that knows the members' quota (the cutover: green.etcd.extraArgs) is
		// warned against it, not against a default they do not run with.
		{"past the default, well under the quota given", 4 << 10, 1 << 40, false},
		{"under the default, past the quota given", 1 << 40, 4 << 10, true},
		{"no quota (negative)", 4 << 10, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defaultQuota = tc.quota
			c := testConfig(t, src, now)
			c.Quota = tc.given
			rep, err := Run(c)
			if err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(filepath.Join(c.OutputDir, "member", "snap", "db"))
			if err != nil {
				t.Fatal(err)
			}
			var warning string
			for _, w := range rep.Warnings {
				if strings.Contains(w, "--quota-backend-bytes") {
					warning = w
				}
			}
			if (warning != "") != tc.warn {
				t.Fatalf("warnings %q; want a quota warning: %v", rep.Warnings, tc.warn)
			}
			if tc.warn && !strings.Contains(warning, fmt.Sprint(st.Size())) {
				t.Errorf("the warning %q does not give the database's size, %d bytes", warning, st.Size())
			}
		})
	}
}
