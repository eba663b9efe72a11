// Package v2v3 converts an etcd member's v2 store into a new etcd v3 member data dir, offline,
// from a copy of the data dir: load the newest valid v2 snapshot, replay the WAL up to the
// committed index with kubefence's own applier on v2store, turn v2 file nodes into v3 keys
// (revisions kept, TTL keys into leases), write them into a fresh backend, give it membership
// the way `etcdutl snapshot restore` does, and read the result back to verify every key.
package v2v3

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

// Source is what was read from a member data dir.
type Source struct {
	// SnapshotFile is the v2 snapshot loaded ("" when the member never took one).
	SnapshotFile string
	Meta         raftpb.SnapshotMetadata
	snap         *snapFile // nil when the member never took a snapshot; Close unmaps it
	// Skipped are newer snapshot files that could not be read, with why.
	Skipped []string
	// Entries are the committed WAL entries after the snapshot.
	Entries   []raftpb.Entry
	HardState raftpb.HardState
	// NodeID and ClusterID are the member's and its cluster's ids, from the WAL's metadata.
	NodeID, ClusterID uint64
	// V3Keys counts keys in the member's v3 backend (member/snap/db).
	V3Keys int
	// v3Auth is what the v3 backend's auth store holds (carried over with the backend when it
	// holds keys, V3Keys > 0).
	v3Auth v3AuthState
	// consistentIndex is the last WAL entry the v3 backend applied, as far as it tells:
	// etcd 3.5 and later (a backend with a term) save it with every backend commit, 3.4 only
	// with a write that changed keys. lastV3KeyWrite and lastV3Write are the last entries of
	// the committed WAL tail that may change v3 keys or auth (v3KeyWrite), or anything in the
	// v3 backend (0: none).
	consistentIndex, lastV3KeyWrite, lastV3Write uint64
	indexEveryEntry                              bool
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Close unmaps the snapshot.
func (s *Source) Close() error { return s.snap.close() }

// ReadSource reads a member data dir without writing to it. walDir defaults to
// dataDir/member/wal.
func ReadSource(dataDir, walDir string) (*Source, error) {
	return readSource(dataDir, walDir, nil)
}

func readSource(dataDir, walDir string, clock *phaseClock) (_ *Source, err error) {
	member := filepath.Join(dataDir, "member")
	if st, err := os.Stat(member); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%s is not an etcd member data dir (no member/ directory)", dataDir)
	}
	if walDir == "" {
		walDir = filepath.Join(member, "wal")
	}
	src := &Source{}
	meta, err := readBackendMeta(filepath.Join(member, "snap", "db"))
	if err != nil {
		return nil, err
	}
	src.V3Keys, src.consistentIndex, src.indexEveryEntry, src.v3Auth = meta.keys, meta.consistentIndex, meta.hasTerm, meta.auth
	if err := src.loadSnapshot(filepath.Join(member, "snap")); err != nil {
		return nil, err
	}
	clock.lap("readSnapshot")
	defer func() {
		if err != nil {
			src.Close()
		}
	}()
	firstSegment, lastSegment, err := checkWALSequence(walDir)
	if err != nil {
		return nil, err
	}
	md, hs, ents, err := src.readWAL(filepath.Join(member, "snap"), walDir, firstSegment)
	if err != nil {
		return nil, err
	}
	src.HardState = hs
	var m etcdserverpb.Metadata
	if err := m.Unmarshal(md); err != nil {
		return nil, fmt.Errorf("the WAL in %s: metadata: %w", walDir, err)
	}
	src.NodeID, src.ClusterID = m.NodeID, m.ClusterID
	read := src.Meta.Index
	if len(ents) > 0 {
		read = max(read, ents[len(ents)-1].Index)
	}
	if err := checkWALReached(walDir, lastSegment, read); err != nil {
		return nil, err
	}
	for _, e := range ents {
		// Never apply the uncommitted tail.
		if e.Index <= src.Meta.Index || e.Index > hs.Commit {
			continue
		}
		src.Entries = append(src.Entries, e)
	}
	clock.lap("readWAL")
	return src, nil
}

// readWAL reads the WAL from the loaded snapshot on. etcd writes a snapshot file before the
// WAL's record of it, and starts from the newest snapshot the WAL records: a newest file it
// stopped before recording is skipped for that one here too. first is the WAL's first segment.
func (s *Source) readWAL(snapDir, walDir string, first walSegment) ([]byte, raftpb.HardState, []raftpb.Entry, error) {
	md, hs, ents, err := s.readWALAt(walDir, first)
	if !errors.Is(err, wal.ErrSnapshotNotFound) || s.snap == nil {
		return md, hs, ents, err
	}
	valid, verr := wal.ValidSnapshotEntries(zap.NewNop(), walDir)
	if verr != nil {
		return md, hs, ents, err
	}
	recorded := map[[2]uint64]bool{}
	for _, v := range valid {
		recorded[[2]uint64{v.Index, v.Term}] = true
	}
	_ = s.snap.close()
	s.snap, s.SnapshotFile, s.Meta = nil, "", raftpb.SnapshotMetadata{}
	if err := s.loadSnapshotIf(snapDir, func(m raftpb.SnapshotMetadata) bool { return recorded[[2]uint64{m.Index, m.Term}] }); err != nil {
		return nil, hs, nil, err
	}
	return s.readWALAt(walDir, first)
}

// readWALAt reads the WAL from the loaded snapshot on, refusing first a WAL whose first segment
// (first) starts after that snapshot: etcd purges the segments before the newest snapshot it
// recorded, so when that snapshot was skipped (unreadable) the WAL no longer reaches back to
// the older one loaded, and etcd's reader says only that no file matches the snapshot index.
func (s *Source) readWALAt(walDir string, first walSegment) ([]byte, raftpb.HardState, []raftpb.Entry, error) {
	if first.index <= s.Meta.Index {
		return readWALFrom(walDir, s.Meta)
	}
	from := "there is no readable snapshot to replay it on"
	if s.snap != nil {
		from = fmt.Sprintf("past the newest snapshot that could be loaded, %s (index %d)", s.SnapshotFile, s.Meta.Index)
	}
	msg := fmt.Sprintf("the WAL in %s starts at entry %d (%s), and %s: etcd purged the older segments once it had a newer snapshot", walDir, first.index, first.name, from)
	if len(s.Skipped) > 0 {
		msg += fmt.Sprintf(", and the newer snapshot(s) were skipped: %s", strings.Join(s.Skipped, "; "))
	}
	return nil, raftpb.HardState{}, nil, errors.New(msg + ". This copy cannot be migrated: migrate a copy of another member's data dir (with several members, build every one from that copy), or restore this one from a copy whose newest snapshot is intact")
}

// readWALFrom reads the WAL in walDir from the snapshot at meta on.
func readWALFrom(walDir string, meta raftpb.SnapshotMetadata) ([]byte, raftpb.HardState, []raftpb.Entry, error) {
	w, err := wal.OpenForRead(zap.NewNop(), walDir, walpb.Snapshot{Index: meta.Index, Term: meta.Term})
	if err != nil {
		return nil, raftpb.HardState{}, nil, fmt.Errorf("open WAL in %s: %w", walDir, err)
	}
	defer w.Close()
	md, hs, ents, err := w.ReadAll()
	if err != nil {
		return nil, hs, nil, fmt.Errorf("the WAL in %s is damaged or incomplete (%w); restore the data dir from a good copy", walDir, err)
	}
	return md, hs, ents, nil
}

// loadSnapshot loads the newest snapshot file whose checksum and encoding are good, falling back
// to older ones (and saying so). Unlike etcd's snapshotter it never renames a broken file: the
// source is read-only to us.
func (s *Source) loadSnapshot(dir string) error { return s.loadSnapshotIf(dir, nil) }

// loadSnapshotIf is loadSnapshot among the files recorded accepts (those the WAL records; nil:
// all).
func (s *Source) loadSnapshotIf(dir string, recorded func(raftpb.SnapshotMetadata) bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".snap") {
			names = append(names, e.Name())
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	unreadable := 0
	for _, name := range names {
		path := filepath.Join(dir, name)
		sf, err := openSnapFile(path)
		if err != nil {
			s.Skipped = append(s.Skipped, fmt.Sprintf("%s: %v", path, err))
			unreadable++
			continue
		}
		if recorded != nil && !recorded(sf.meta) {
			_ = sf.close()
			s.Skipped = append(s.Skipped, fmt.Sprintf("%s: not recorded in the WAL (etcd wrote it and stopped before recording it; etcd starts from an older one too)", path))
			continue
		}
		s.SnapshotFile, s.Meta, s.snap = path, sf.meta, sf
		return nil
	}
	if unreadable > 0 {
		return fmt.Errorf("no readable v2 snapshot in %s: %s", dir, strings.Join(s.Skipped, "; "))
	}
	return nil
}

// snapFile is a snap file mapped read-only: snappb.Snapshot{crc, data} around a
// raftpb.Snapshot{data, metadata}. The envelopes are parsed by hand so that the v2 store's JSON
// is a slice of the mapping, read page by page as the scanner goes and released behind it: the
// process never holds the whole snapshot (a 2 GB snapshot costs page cache, not heap or RSS).
type snapFile struct {
	mapping []byte
	data    []byte // the v2 store's JSON
	meta    raftpb.SnapshotMetadata
}

// release drops the mapping's resident pages (they stay in the page cache and come back on the
// next access): called every few MB while reading, so RSS stays flat.
func (s *snapFile) release() {
	if s != nil && len(s.mapping) > 0 {
		_ = unix.Madvise(s.mapping, unix.MADV_DONTNEED)
	}
}

func (s *snapFile) close() error {
	if s == nil || s.mapping == nil {
		return nil
	}
	err := unix.Munmap(s.mapping)
	s.mapping, s.data = nil, nil
	return err
}

func openSnapFile(path string) (sf *snapFile, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() == 0 {
		return nil, errors.New("empty file")
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	sf = &snapFile{mapping: m}
	defer func() {
		if err != nil {
			sf.close()
			sf = nil
		}
	}()
	crc, inner, err := snapEnvelope(m)
	if err != nil {
		return nil, err
	}
	var sum uint32
	for rest := inner; len(rest) > 0; {
		n := min(len(rest), tickEvery)
		sum = crc32.Update(sum, crcTable, rest[:n])
		rest = rest[n:]
		sf.release()
	}
	if sum != crc {
		return nil, errors.New("checksum mismatch")
	}
	if err := sf.readRaftSnapshot(inner); err != nil {
		return nil, err
	}
	return sf, nil
}

// snapEnvelope reads a .snap file's snappb.Snapshot: its crc (field 1) and data (field 2).
func snapEnvelope(m []byte) (crc uint32, inner []byte, err error) {
	corrupt := func(b []byte, n int) error {
		return fmt.Errorf("truncated or corrupt at byte %d: %w", len(m)-len(b), protowire.ParseError(n))
	}
	for b := m; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, nil, corrupt(b, n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, nil, corrupt(b, n)
			}
			crc, b = uint32(v), b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, nil, fmt.Errorf("truncated or corrupt at byte %d (the data field is longer than the file)", len(m)-len(b))
			}
			inner, b = v, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return 0, nil, corrupt(b, n)
			}
			b = b[n:]
		}
	}
	if len(inner) == 0 || crc == 0 {
		return 0, nil, errors.New("no data or checksum")
	}
	return crc, inner, nil
}

// readRaftSnapshot reads the raftpb.Snapshot inside the envelope: its data (field 1, the v2
// store's JSON, kept in place) and its metadata (field 2).
func (sf *snapFile) readRaftSnapshot(inner []byte) error {
	for len(inner) > 0 {
		num, typ, n := protowire.ConsumeTag(inner)
		if n < 0 {
			return fmt.Errorf("corrupt raft snapshot: %w", protowire.ParseError(n))
		}
		inner = inner[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, inner)
			if n < 0 {
				return fmt.Errorf("corrupt raft snapshot: %w", protowire.ParseError(n))
			}
			inner = inner[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(inner)
		if n < 0 {
			return errors.New("corrupt raft snapshot: truncated field")
		}
		inner = inner[n:]
		switch num {
		case 1:
			sf.data = v
		case 2:
			if err := sf.meta.Unmarshal(v); err != nil {
				return fmt.Errorf("corrupt raft snapshot metadata: %w", err)
			}
		}
	}
	return nil
}

// v3AuthState is what a v3 backend's auth store holds.
type v3AuthState struct {
	enabled      bool
	users, roles int
}

func (a v3AuthState) set() bool { return a.enabled || a.users > 0 || a.roles > 0 }

// backendMeta is what readBackendMeta finds in a v3 backend.
type backendMeta struct {
	keys            int
	consistentIndex uint64 // the last WAL entry it applied
	hasTerm         bool   // etcd 3.5 and later, which save the index with every commit
	auth            v3AuthState
}

// readBackendMeta counts the keys of the v3 backend, reads its consistent index and whether it
// keeps a term, and what its auth store holds, read-only. A live etcd holds the file's lock, so
// failing to get it in time means the data dir is in use.
func readBackendMeta(path string) (m backendMeta, _ error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return m, fmt.Errorf("%s is locked: a running etcd uses this data dir; stop it, or migrate a copy", path)
	}
	if err != nil {
		return m, fmt.Errorf("open v3 backend %s: %w", path, err)
	}
	defer db.Close()
	count := func(tx *bolt.Tx, bucket string) int {
		if b := tx.Bucket([]byte(bucket)); b != nil {
			return b.Stats().KeyN
		}
		return 0
	}
	err = db.View(func(tx *bolt.Tx) error {
		m.keys = count(tx, "key")
		if b := tx.Bucket([]byte("meta")); b != nil {
			if v := b.Get([]byte("consistent_index")); len(v) == 8 {
				m.consistentIndex = binary.BigEndian.Uint64(v)
			}
			m.hasTerm = b.Get([]byte("term")) != nil
		}
		if b := tx.Bucket([]byte("auth")); b != nil {
			m.auth.enabled = bytes.Equal(b.Get([]byte("authEnabled")), []byte{1})
		}
		m.auth.users, m.auth.roles = count(tx, "authUsers"), count(tx, "authRoles")
		return nil
	})
	return m, err
}

// noteV3Write records a committed tail entry that writes v3 state.
func (s *Source) noteV3Write(w v3Write, index uint64) {
	switch w {
	case v3KeyWrite:
		s.lastV3KeyWrite, s.lastV3Write = index, index
	case v3OtherWrite:
		s.lastV3Write = index
	}
}

// unappliedV3 is the last committed tail entry whose v3 writes the backend may not hold, as
// far as its consistent index tells (0: none). A 3.4 backend's index only moves with a write
// that changed keys, so there a write that may change keys or auth past it may be missing (or
// may have changed nothing: a txn whose compare failed, a delete of no key), and one that
// changes no key (a lease grant) is left alone.
func (s *Source) unappliedV3() uint64 {
	last := s.lastV3KeyWrite
	if s.indexEveryEntry {
		last = s.lastV3Write
	}
	if last > s.consistentIndex {
		return last
	}
	return 0
}

// walSegment is a WAL segment file: SEQ-INDEX.wal, INDEX the first entry it holds.
type walSegment struct {
	name  string
	index uint64
}

// checkWALSequence checks that the WAL's segment files (SEQ-INDEX.wal) have consecutive
// sequence numbers, naming the gap: etcd's reader only reports the checksum error a gap causes.
// It returns the first and the last segment.
func checkWALSequence(dir string) (first, last walSegment, _ error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil {
		return first, last, err
	}
	if len(names) == 0 {
		return first, last, fmt.Errorf("no WAL files in %s: is this the member's WAL dir (--wal-dir)?", dir)
	}
	sort.Strings(names)
	var prev, seq, index uint64
	for i, n := range names {
		if _, err := fmt.Sscanf(filepath.Base(n), "%016x-%016x.wal", &seq, &index); err != nil {
			return first, last, fmt.Errorf("unexpected file in the WAL dir: %s", n)
		}
		if i == 0 {
			first = walSegment{name: filepath.Base(n), index: index}
		}
		if i > 0 && seq != prev+1 {
			return first, last, fmt.Errorf("WAL segment missing between %s and %s (sequence %d to %d): restore the data dir from a good copy",
				filepath.Base(names[i-1]), filepath.Base(n), prev, seq)
		}
		prev = seq
	}
	return first, walSegment{name: filepath.Base(names[len(names)-1]), index: index}, nil
}

// checkWALReached refuses a WAL read that ended before its last segment: etcd's reader stops
// at a torn record in any segment when it only reads, and the entries after it (in the later
// segments) would be left out without a word. read is the last entry read (or the snapshot's).
func checkWALReached(dir string, last walSegment, read uint64) error {
	if read+1 >= last.index {
		return nil
	}
	return fmt.Errorf("the WAL in %s ends at entry %d, before its last segment %s (from entry %d): a damaged record in an earlier segment hides the rest (etcd refuses to start on it too); restore the data dir from a good copy. Only if etcd does start on a copy of it (a new leader rewrote the entries at the segment's start), migrate a copy that etcd has run on since", dir, read, last.name, last.index)
}
