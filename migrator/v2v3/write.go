package v2v3

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
	"go.uber.org/zap"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

// revBytes is the key bucket's key for a revision: 8-byte big-endian main, '_', 8-byte sub.
func revBytes(main int64) []byte {
	b := make([]byte, 17)
	binary.BigEndian.PutUint64(b, uint64(main))
	b[8] = '_'
	return b
}

// writeBackend writes the v3 data of the source (when any) and then the v2 keys and leases into
// a new bolt database at path, in revision order.
func writeBackend(path string, v3 *v3Data, kvs []KV, leases map[int64]*Lease) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		return err
	}
	defer db.Close()
	if v3 != nil {
		if err := copyV3(db, v3); err != nil {
			return err
		}
	}
	const batch = 10000
	for start := 0; start == 0 || start < len(kvs); start += batch {
		end := min(start+batch, len(kvs))
		err := db.Update(func(tx *bolt.Tx) error {
			kb, err := tx.CreateBucketIfNotExists([]byte("key"))
			if err != nil {
				return err
			}
			kb.FillPercent = 1 // appends in revision order
			for _, kv := range kvs[start:end] {
				v, err := (&mvccpb.KeyValue{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: max(kv.version, 1), Lease: kv.Lease}).Marshal()
				if err != nil {
					return err
				}
				if err := kb.Put(revBytes(kv.ModRevision), v); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(kvs) == 0 {
			break
		}
	}
	return db.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{"meta", "lease"} {
			if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
				return err
			}
		}
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
		return nil
	})
}

// copyV3 writes the source's key bucket, leases and compaction marks as they are.
func copyV3(db *bolt.DB, v3 *v3Data) error {
	return db.Update(func(tx *bolt.Tx) error {
		for name, entries := range map[string][][2][]byte{"key": v3.entries, "lease": v3.leases, "meta": v3.meta} {
			b, err := tx.CreateBucketIfNotExists([]byte(name))
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := b.Put(e[0], e[1]); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Membership of the new member, as `etcdutl snapshot restore` takes it.
type Membership struct {
	Name                     string
	InitialCluster           string
	InitialAdvertisePeerURLs []string
	InitialClusterToken      string
}

// buildDataDir writes the backend into a temp dir next to outDir, gives it membership (WAL and
// snapshot) with etcd's restore, and renames it into place.
func buildDataDir(outDir string, v3 *v3Data, kvs []KV, leases map[int64]*Lease, m Membership, bump uint64, markCompacted bool) error {
	parent := filepath.Dir(outDir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return err
	}
	work, err := os.MkdirTemp(parent, "."+filepath.Base(outDir)+".kubefence-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	db := filepath.Join(work, "v3.db")
	if err := writeBackend(db, v3, kvs, leases); err != nil {
		return fmt.Errorf("write v3 backend: %w", err)
	}
	member := filepath.Join(work, "data")
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath: db, SkipHashCheck: true,
		Name: m.Name, OutputDataDir: member, PeerURLs: m.InitialAdvertisePeerURLs,
		InitialCluster: m.InitialCluster, InitialClusterToken: m.InitialClusterToken,
		RevisionBump: bump, MarkCompacted: markCompacted,
	})
	if err != nil {
		return fmt.Errorf("give the new data dir its membership: %w", err)
	}
	if err := os.Remove(outDir); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("output dir %s: %w", outDir, err)
	}
	if err := os.Rename(member, outDir); err != nil {
		return err
	}
	return atomicfile.SyncDir(parent)
}
