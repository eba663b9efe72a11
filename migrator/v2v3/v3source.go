package v2v3

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// v3Data is what the migration needs to know of a member's v3 backend, which the output starts
// from unchanged (etcd's restore copies it): a digest of every key bucket entry and lease (for
// the verification), the live keys (for conflicts) and the lease IDs (which the v2 keys' leases
// must not reuse).
type v3Data struct {
	path     string
	entries  []digest // key bucket, in revision order, tombstones too
	leases   map[int64]uint64
	leaseIDs map[int64]bool
	maxRev   int64
	// live is the latest state of every key that is not deleted.
	live map[string]liveKey
}

// digest is a bucket entry's key and a hash of its value.
type digest struct {
	key  string
	hash uint64
}

// liveKey is a live v3 key's generation: what a v2 value written over it continues.
type liveKey struct{ CreateRevision, Version int64 }

var hashSeed = maphash.MakeSeed()

func readV3(path string) (*v3Data, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("%s is locked: a running etcd uses this data dir; stop it, or migrate a copy", path)
	}
	if err != nil {
		return nil, err
	}
	defer db.Close()
	d := &v3Data{path: path, live: map[string]liveKey{}, leaseIDs: map[int64]bool{}, leases: map[int64]uint64{}}
	err = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte("key")); b != nil {
			if err := b.ForEach(func(k, v []byte) error {
				d.entries = append(d.entries, digest{string(k), maphash.Bytes(hashSeed, v)})
				if len(k) >= 8 {
					d.maxRev = max(d.maxRev, int64(binary.BigEndian.Uint64(k[:8])))
				}
				if len(v) == 0 {
					return nil
				}
				var kv mvccpb.KeyValue
				if err := kv.Unmarshal(v); err != nil {
					return fmt.Errorf("v3 key at revision %x: %w", k, err)
				}
				if len(k) == 18 && k[17] == 't' { // tombstone
					delete(d.live, string(kv.Key))
				} else {
					d.live[string(kv.Key)] = liveKey{kv.CreateRevision, kv.Version}
				}
				return nil
			}); err != nil {
				return err
			}
		}
		// etcd starts at the largest of the newest key's revision and the compactions': the
		// newest writes may have been deletes, compacted away since.
		if b := tx.Bucket([]byte("meta")); b != nil {
			for _, name := range []string{"finishedCompactRev", "scheduledCompactRev"} {
				if v := b.Get([]byte(name)); len(v) >= 8 {
					d.maxRev = max(d.maxRev, int64(binary.BigEndian.Uint64(v[:8])))
				}
			}
		}
		if b := tx.Bucket([]byte("lease")); b != nil {
			if err := b.ForEach(func(k, v []byte) error {
				if len(k) == 8 {
					id := int64(binary.BigEndian.Uint64(k))
					d.leaseIDs[id] = true
					d.leases[id] = maphash.Bytes(hashSeed, v)
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return d, err
}

// checkPrefixRewrite refuses a prefix rewrite (--prefix-from/--prefix-to) when a live v3 key
// has the old prefix. The rewrite moves v2 keys only: the v3 backend is carried over as it is
// (etcd's restore copies it, every revision and tombstone with it), so such a key would stay
// under the old prefix, out of sight of an apiserver on the new one, and a key in both stores,
// compared after the rewrite, would no longer be found in both.
func (d *v3Data) checkPrefixRewrite(from, to string) error {
	if from == to {
		return nil
	}
	var under []string
	for k := range d.live {
		if strings.HasPrefix(k, from) {
			under = append(under, k)
		}
	}
	if len(under) == 0 {
		return nil
	}
	sort.Strings(under)
	return fmt.Errorf("--prefix-from %s: the source's v3 store holds %d key(s) under it (v3 key %q first), and only v2 keys are rewritten: the v3 store is carried over as it is, so they would stay under %s apart from the v2 keys moved to %s, and a key in both stores would no longer be found in both. Migrate without --prefix-from/--prefix-to and keep the apiserver's --etcd-prefix; to change the prefix, copy both stores' keys afterwards from the running cluster (etcdctl make-mirror --prefix %s --dest-prefix %s into a new cluster; revisions are not kept)",
		from, len(under), under[0], from, to, from, to)
}

// Conflict policies for a key present in both stores.
const (
	ConflictError = ""
	ConflictV3    = "v3"
	ConflictV2    = "v2"
)

// MergeStats counts what merging with v3 data did.
type MergeStats struct {
	V3Keys      int      `json:"v3Keys"`      // live v3 keys carried over
	V3Revisions int      `json:"v3Revisions"` // key bucket entries carried over
	Conflicts   []string `json:"conflicts,omitempty"`
}

// renumber moves the v2 keys above the v3 store's revision, in their original order (v2 indexes
// and v3 revisions are separate counters that overlap), and settles keys present in both. It
// returns the v2 keys kept (ConflictV3 leaves out a v2 key in both; its lease, if no other key
// holds it, is left out by leasesHeld).
func renumber(kvs []KV, v3 *v3Data, policy string) ([]KV, MergeStats, error) {
	stats := MergeStats{V3Keys: len(v3.live), V3Revisions: len(v3.entries)}
	idx := map[int64]bool{}
	for _, kv := range kvs {
		idx[kv.CreateRevision] = true
		idx[kv.ModRevision] = true
	}
	order := make([]int64, 0, len(idx))
	for i := range idx {
		order = append(order, i)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	newRev := make(map[int64]int64, len(order))
	for i, old := range order {
		newRev[old] = v3.maxRev + 1 + int64(i)
	}
	out := kvs[:0]
	var conflicts []string
	for _, kv := range kvs {
		kv.CreateRevision, kv.ModRevision = newRev[kv.CreateRevision], newRev[kv.ModRevision]
		if cur, ok := v3.live[string(kv.Key)]; ok {
			conflicts = append(conflicts, string(kv.Key))
			switch policy {
			case ConflictV3:
				continue
			case ConflictV2:
				// An update of the live v3 key: same generation, one more version.
				kv.CreateRevision = cur.CreateRevision
				kv.version = cur.Version + 1
			}
		}
		out = append(out, kv)
	}
	sort.Strings(conflicts)
	stats.Conflicts = conflicts
	if len(conflicts) > 0 && policy == ConflictError {
		shown := conflicts
		if len(shown) > 10 {
			shown = append(shown[:10:10], fmt.Sprintf("... %d more", len(conflicts)-10))
		}
		return nil, stats, fmt.Errorf("%d key(s) exist in both the v2 and the v3 store: %v; choose which wins with --on-conflict=v3 or --on-conflict=v2", len(conflicts), shown)
	}
	return out, stats, nil
}
