package v2v3

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// writeWAL makes a member dir whose WAL holds n v2 PUTs, split over several small segments;
// the last `uncommitted` of them are never committed.
func writeWAL(t *testing.T, n int, uncommitted ...int) (dataDir, walDir string) {
	t.Helper()
	dataDir = t.TempDir()
	walDir = filepath.Join(dataDir, "member", "wal")
	old := wal.SegmentSizeBytes
	wal.SegmentSizeBytes = 16 << 10
	t.Cleanup(func() { wal.SegmentSizeBytes = old })
	w, err := wal.Create(zap.NewNop(), walDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		req := etcdserverpb.InternalRaftRequest{V2: &etcdserverpb.Request{Method: "PUT", Path: "/1/k" + strings.Repeat("x", i%7), Val: strings.Repeat("v", 300)}}
		data, err := req.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		commit := uint64(i)
		if len(uncommitted) > 0 && i > n-uncommitted[0] {
			commit = uint64(n - uncommitted[0])
		}
		if err := w.Save(raftpb.HardState{Term: 1, Commit: commit}, []raftpb.Entry{{Term: 1, Index: uint64(i), Type: raftpb.EntryNormal, Data: data}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dataDir, walDir
}

func walFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	sort.Strings(names)
	return names
}

// tearLastRecord cuts a WAL segment inside its last written record (before the preallocated
// zeros), as a crash mid-write can leave it.
func tearLastRecord(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	if err := os.WriteFile(file, b[:end-40], 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestWALProblemsNamed(t *testing.T) {
	t.Run("intact", func(t *testing.T) {
		d, _ := writeWAL(t, 200)
		src, err := ReadSource(d, "")
		if err != nil || len(src.Entries) != 200 {
			t.Fatalf("entries %d, %v", len(src.Entries), err)
		}
	})
	t.Run("uncommitted tail is not applied", func(t *testing.T) {
		d, _ := writeWAL(t, 200, 5)
		src, err := ReadSource(d, "")
		if err != nil || len(src.Entries) != 195 || src.HardState.Commit != 195 {
			t.Fatalf("entries %d, commit %d, %v", len(src.Entries), src.HardState.Commit, err)
		}
	})
	t.Run("torn last record is tolerated", func(t *testing.T) {
		d, w := writeWAL(t, 200)
		files := walFiles(t, w)
		tearLastRecord(t, files[len(files)-1])
		src, err := ReadSource(d, "")
		if err != nil {
			t.Fatalf("a torn tail must be tolerated: %v", err)
		}
		if len(src.Entries) < 190 {
			t.Fatalf("%d entries read before the torn record", len(src.Entries))
		}
	})
	t.Run("torn record in a middle segment", func(t *testing.T) {
		// etcd's reader stops at a torn record in any segment when it only reads: the later
		// segments' committed entries would be left out without a word.
		d, w := writeWAL(t, 200)
		files := walFiles(t, w)
		if len(files) < 3 {
			t.Fatalf("want several segments, got %d", len(files))
		}
		tearLastRecord(t, files[1])
		src, err := ReadSource(d, "")
		if err == nil || !strings.Contains(err.Error(), filepath.Base(files[len(files)-1])) {
			n := 0
			if src != nil {
				n = len(src.Entries)
			}
			t.Fatalf("read %d of 200 entries, err %v: want an error naming the segment not reached (%s)", n, err, filepath.Base(files[len(files)-1]))
		}
	})
	t.Run("bad crc in the middle", func(t *testing.T) {
		d, w := writeWAL(t, 200)
		files := walFiles(t, w)
		if len(files) < 3 {
			t.Fatalf("want several segments, got %d", len(files))
		}
		f := files[1]
		b, _ := os.ReadFile(f)
		b[2000] ^= 0xff
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ReadSource(d, "")
		if err == nil || !strings.Contains(err.Error(), filepath.Base(f)) || !strings.Contains(err.Error(), "at position") {
			t.Fatalf("error should name %s and a position: %v", filepath.Base(f), err)
		}
	})
	t.Run("missing segment", func(t *testing.T) {
		d, w := writeWAL(t, 200)
		files := walFiles(t, w)
		if err := os.Remove(files[1]); err != nil {
			t.Fatal(err)
		}
		_, err := ReadSource(d, "")
		if err == nil || !strings.Contains(err.Error(), "WAL segment missing between "+filepath.Base(files[0])) {
			t.Fatalf("error should name the gap after %s: %v", filepath.Base(files[0]), err)
		}
	})
}

// TestCorruptNewestSnapshotAndPurgedWAL: the newest snapshot is unreadable, so the migration
// falls back to an older one; etcd purged the WAL segments back to that one, as it does once a
// newer snapshot is recorded. etcd's reader only says no WAL file matches the snapshot index:
// the error names the snapshot skipped and why, and says to migrate another member's copy.
func TestCorruptNewestSnapshotAndPurgedWAL(t *testing.T) {
	old := wal.SegmentSizeBytes
	wal.SegmentSizeBytes = 16 << 10
	t.Cleanup(func() { wal.SegmentSizeBytes = old })
	dir := t.TempDir()
	snapDir, walDir := filepath.Join(dir, "member", "snap"), filepath.Join(dir, "member", "wal")
	if err := os.MkdirAll(snapDir, 0o700); err != nil {
		t.Fatal(err)
	}
	st := v2store.New("/0", "/1")
	data, err := st.Save()
	if err != nil {
		t.Fatal(err)
	}
	w, err := wal.Create(zap.NewNop(), walDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs := &raftpb.ConfState{Voters: []uint64{1}}
	if err := w.SaveSnapshot(walpb.Snapshot{Index: 0x100, Term: 1, ConfState: cs}); err != nil {
		t.Fatal(err)
	}
	const newest = 0x100 + 150
	var reqs []*etcdserverpb.Request
	for i := 0; i < 200; i++ {
		reqs = append(reqs, &etcdserverpb.Request{Method: "PUT", Path: fmt.Sprintf("/1/k%d", i), Val: strings.Repeat("v", 300)})
	}
	for _, e := range entriesOf(t, reqs, 0x101) {
		e.Term = 1
		if err := w.Save(raftpb.HardState{Term: 1, Commit: e.Index}, []raftpb.Entry{e}); err != nil {
			t.Fatal(err)
		}
		if e.Index == newest {
			if err := w.SaveSnapshot(walpb.Snapshot{Index: newest, Term: 1, ConfState: cs}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	writeSnap(t, filepath.Join(snapDir, "0000000000000001-0000000000000100.snap"), data, 0x100, false)
	writeSnap(t, filepath.Join(snapDir, fmt.Sprintf("0000000000000001-%016x.snap", newest)), data, newest, true)
	// Purge as etcd does: the segments before the one holding the newest snapshot's index.
	files := walFiles(t, walDir)
	var seq, index uint64
	purged := 0
	for i := 0; i+1 < len(files); i++ {
		if _, err := fmt.Sscanf(filepath.Base(files[i+1]), "%016x-%016x.wal", &seq, &index); err != nil {
			t.Fatal(err)
		}
		if index > newest {
			break
		}
		if err := os.Remove(files[i]); err != nil {
			t.Fatal(err)
		}
		purged++
	}
	if purged == 0 {
		t.Fatalf("no segment to purge among %v", files)
	}
	_, err = ReadSource(dir, "")
	if err == nil {
		t.Fatal("ReadSource read a WAL that no longer reaches the snapshot it loaded")
	}
	for _, want := range []string{fmt.Sprintf("%016x.snap", newest), "checksum mismatch", "another member"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}
