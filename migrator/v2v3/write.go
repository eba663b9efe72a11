package v2v3

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
	"go.uber.org/zap"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/internal/flock"
	"github.com/kubefence/kubefence/internal/pathguard"
)

// revBytes is the key bucket's key for a revision: 8-byte big-endian main, '_', 8-byte sub.
func revBytes(main int64) []byte { return appendRev(make([]byte, 0, 17), main) }

func appendRev(b []byte, main int64) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(main))
	return append(b, '_', 0, 0, 0, 0, 0, 0, 0, 0)
}

// Membership of the new member, as `etcdutl snapshot restore` takes it.
type Membership struct {
	Name                     string
	InitialCluster           string
	InitialAdvertisePeerURLs []string
	InitialClusterToken      string
}

// workPath is the working dir the new member is built in, next to outDir. Its name comes from
// outDir's, as datadir.BuildInto's does (<dst>.kubefence-part): a run killed before it renamed
// the member into place (kill -9, the OOM killer) leaves it behind, as big as the new database,
// and the next run to the same output removes it instead of adding another beside it.
func workPath(outDir string) string { return filepath.Clean(outDir) + ".kubefence-part" }

// lockPath is the lock a run holds beside outDir. It is the name migrate upgrade, downgrade and
// restore-backup give the lock beside a data dir (datadir's dirLockPath; datadir imports this
// package, so the name is written twice): a run to an output and one of those on a data dir at
// that path exclude each other too.
func lockPath(outDir string) string { return filepath.Clean(outDir) + ".kubefence-lock" }

// lockOutput takes the lock beside the output for the whole run. The working dir is named after
// the output and removed before each run, so a second run to the same output would remove the
// first's half-written member, or rename its own into place while the first still writes.
func lockOutput(c *Config) (*flock.Lock, error) {
	if err := os.MkdirAll(filepath.Dir(filepath.Clean(c.OutputDir)), 0o700); err != nil {
		return nil, err
	}
	l, err := flock.Take(lockPath(c.OutputDir))
	var held *flock.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("another kubefence process (%s) is building or working on %s (it holds %s): wait for it to finish, or stop that process; nothing was written", held.Who(), c.OutputDir, held.Path)
	}
	if err != nil {
		return nil, err
	}
	l.Note("migrate v2-to-v3 from " + c.DataDir)
	return l, nil
}

// restoreBase makes the new member in the working dir next to outDir (what a killed run left
// there removed first): etcd's own restore (WAL, snapshot, membership, consistent index) run on
// the source's v3 backend when it has one, or on an empty backend. The v2 keys are appended
// afterwards with plain bbolt: etcd's backend maps its file with MAP_POPULATE, which would make
// the whole output resident.
func restoreBase(outDir, v3db string, m Membership) (work, member string, err error) {
	if err := os.MkdirAll(filepath.Dir(outDir), 0o700); err != nil {
		return "", "", err
	}
	work = workPath(outDir)
	if err := os.RemoveAll(work); err != nil {
		return "", "", fmt.Errorf("remove %s, the working dir an earlier run to %s left: %w", work, outDir, err)
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return "", "", err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(work)
		}
	}()
	base := v3db
	if base == "" {
		base = filepath.Join(work, "empty.db")
		if err := emptyBackend(base); err != nil {
			return "", "", err
		}
	}
	member = filepath.Join(work, "data")
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath: base, SkipHashCheck: true,
		Name: m.Name, OutputDataDir: member, PeerURLs: m.InitialAdvertisePeerURLs,
		InitialCluster: m.InitialCluster, InitialClusterToken: m.InitialClusterToken,
	})
	if err != nil {
		return "", "", fmt.Errorf("give the new data dir its membership: %w", err)
	}
	return work, member, nil
}

// backendPageSize is the page size of a backend built from nothing (a source with v3 keys keeps
// its backend's). bbolt records it in the file and etcd reads it from there; it is 64 KB by
// default on kernels with 64 KB pages (some arm64 and ppc64le distributions), and etcd's defrag
// rewrites the file with the OS's. With 4 KB pages most 1-4 KB Kubernetes objects take a page
// or two each (at 1M keys: a 3.4 GB file for about 2.3 GB of values, written in 8.5 s and read
// back in 5.0 s); 16 KB pages hold several (2.7 GB, 5.6 s and 4.1 s). etcd appends by revision,
// so larger pages cost it little.
const backendPageSize = 16 << 10

func emptyBackend(path string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{PageSize: backendPageSize})
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{"key", "meta", "lease"} {
			if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
				return err
			}
		}
		return nil
	})
	return joinClose(err, db)
}

func joinClose(err error, db *bolt.DB) error {
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeBatchBytes bounds what one bbolt transaction holds in memory.
const writeBatchBytes = 8 << 20

// appendKeys writes the keys (in revision order, all above the backend's own revisions), their
// leases and, with bump > 0, the revision bump and compaction mark `etcdutl snapshot restore
// --bump-revision --mark-compacted` writes: an empty entry at latest+bump and
// scheduledCompactRev at it. It returns the revision of that marker (0 without a bump).
func appendKeys(dbPath string, data []byte, release func(), kvs []KV, leases map[int64]*Lease, bump uint64, progress Progress) (int64, error) {
	// No sync per transaction: the file is in a temp dir that is removed unless the whole
	// migration succeeds, so one sync at the end (before verification and the rename) is as
	// durable and saves one fdatasync per batch.
	db, err := bolt.Open(dbPath, 0o600, &bolt.Options{NoFreelistSync: true, NoSync: true})
	if err != nil {
		return 0, err
	}
	var latest int64
	err = db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket([]byte("key")).Cursor().Last(); len(k) >= 8 {
			latest = int64(binary.BigEndian.Uint64(k))
		}
		return nil
	})
	if err != nil {
		return 0, joinClose(err, db)
	}
	if len(kvs) > 0 && kvs[0].ModRevision <= latest {
		return 0, joinClose(fmt.Errorf("internal error: key %q at revision %d is not above the backend's revision %d", kvs[0].Key, kvs[0].ModRevision, latest), db)
	}
	// One buffer holds a batch's keys and values (bbolt keeps the slices until the commit) and
	// is reused by the next batch.
	arena := make([]byte, 0, writeBatchBytes+1<<20)
	for start := 0; start < len(kvs); {
		err := db.Update(func(tx *bolt.Tx) error {
			kb := tx.Bucket([]byte("key"))
			kb.FillPercent = 1 // appends in revision order
			arena = arena[:0]
			for ; start < len(kvs) && len(arena) < writeBatchBytes; start++ {
				kv := &kvs[start]
				k := len(arena)
				arena = appendRev(arena, kv.ModRevision)
				v := len(arena)
				var err error
				if arena, err = appendKV(arena, kv, data); err != nil {
					return fmt.Errorf("value of %s: %w", kv.Key, err)
				}
				if err := kb.Put(arena[k:v:v], arena[v:len(arena):len(arena)]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, joinClose(err, db)
		}
		release()
		progress.report("write", int64(start), int64(len(kvs)))
	}
	if len(kvs) > 0 {
		latest = kvs[len(kvs)-1].ModRevision
	}
	marker, err := writeLeases(db, leases, latest, bump)
	if err == nil {
		err = db.Sync()
	}
	return marker, joinClose(err, db)
}

// writeLeases writes the leases and, with bump > 0, the bump marker at latest+bump; it returns
// the marker's revision.
func writeLeases(db *bolt.DB, leases map[int64]*Lease, latest int64, bump uint64) (int64, error) {
	var marker int64
	err := db.Update(func(tx *bolt.Tx) error {
		lb := tx.Bucket([]byte("lease"))
		ids := make([]int64, 0, len(leases))
		for id := range leases {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for _, id := range ids {
			l := leases[id]
			v, err := (&leasepb.Lease{ID: l.ID, TTL: l.TTL, RemainingTTL: l.TTL}).Marshal()
			if err != nil {
				return err
			}
			k := make([]byte, 8)
			binary.BigEndian.PutUint64(k, uint64(l.ID))
			if err := lb.Put(k, v); err != nil {
				return err
			}
		}
		if bump == 0 {
			return nil
		}
		marker = latest + int64(bump)
		if err := tx.Bucket([]byte("key")).Put(revBytes(marker), []byte{}); err != nil {
			return err
		}
		return tx.Bucket([]byte("meta")).Put([]byte("scheduledCompactRev"), revBytes(marker))
	})
	return marker, err
}

// marshalKV encodes the key as mvccpb.KeyValue.
func marshalKV(kv *KV, data []byte) ([]byte, error) { return appendKV(nil, kv, data) }

// appendKV appends the key encoded as mvccpb.KeyValue to b, decoding a streamed value straight
// into place.
func appendKV(b []byte, kv *KV, data []byte) ([]byte, error) {
	if !kv.streamed() {
		m := &mvccpb.KeyValue{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: max(kv.version, 1), Lease: kv.Lease}
		n := len(b)
		b = slices.Grow(b, m.Size())[:n+m.Size()]
		_, err := m.MarshalToSizedBuffer(b[n:])
		return b, err
	}
	// Field order as the generated code writes it: key(1), create(2), mod(3), version(4),
	// value(5), lease(6). The value's length is only known once decoded, so it is decoded
	// into place after a length prefix sized for the raw (longer or equal) JSON.
	raw := int(kv.raw.n)
	b = slices.Grow(b, len(kv.Key)+raw+64)
	b = appendBytesField(b, 1, kv.Key)
	b = appendVarintField(b, 2, uint64(kv.CreateRevision))
	b = appendVarintField(b, 3, uint64(kv.ModRevision))
	b = appendVarintField(b, 4, uint64(max(kv.version, 1)))
	valStart := len(b)
	b = append(b, 5<<3|2)
	lenAt := len(b)
	b = binary.AppendUvarint(b, uint64(raw)) // placeholder of the maximal width
	width := len(b) - lenAt
	body := len(b)
	b, err := kv.raw.bytes(data, b)
	if err != nil {
		return nil, err
	}
	n := len(b) - body
	if n == 0 {
		b = b[:valStart] // proto3 leaves empty bytes out
	} else if w := uvarintLen(uint64(n)); w != width {
		copy(b[lenAt+w:], b[body:])
		b = b[:lenAt+w+n]
		binary.PutUvarint(b[lenAt:], uint64(n))
	} else {
		binary.PutUvarint(b[lenAt:], uint64(n))
	}
	if kv.Lease != 0 {
		b = appendVarintField(b, 6, uint64(kv.Lease))
	}
	return b, nil
}

func appendBytesField(b []byte, num int, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = append(b, byte(num<<3|2))
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendVarintField(b []byte, num int, v uint64) []byte {
	if v == 0 {
		return b
	}
	return binary.AppendUvarint(append(b, byte(num<<3)), v)
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// finish renames the verified member dir into place.
func finish(member, outDir string) error {
	// Checked again: something may have taken the path since Validate, and os.Remove would
	// remove a file as readily as the empty dir it expects.
	if err := pathguard.CheckFresh("output dir", outDir); err != nil {
		return err
	}
	return atomicfile.PlaceDir(member, outDir)
}
