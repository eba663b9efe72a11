package v2v3

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
)

// verifyChunkBytes is how much of the output one read transaction maps in before the database
// is closed and reopened, so the read-back never makes the whole output resident.
const verifyChunkBytes = 16 << 20

// expected is what the output's key bucket must hold, in revision order: the source's v3
// entries unchanged, then the v2 keys, then the bump marker.
type expected struct {
	data    []byte // the snapshot, for streamed values
	release func()
	v3      *v3Data
	kvs     []KV
	leases  map[int64]*Lease
	marker  int64
}

// verifyOutput reads the written backend back and checks every entry and lease. A streamed
// value is compared with what encoding/json decodes from the snapshot's JSON string, not with
// kubefence's own decoder, so the check is independent of the writer.
func verifyOutput(dbPath string, e expected, progress Progress) (int, error) {
	var problems []string
	problem := func(format string, a ...any) {
		if len(problems) < 21 {
			problems = append(problems, fmt.Sprintf(format, a...))
		}
	}
	var v3entries []digest
	if e.v3 != nil {
		v3entries = e.v3.entries
	}
	i3, iv, seen, markerSeen := 0, 0, 0, false
	check := func(k, v []byte) {
		switch {
		case i3 < len(v3entries):
			d := v3entries[i3]
			i3++
			if d.key != string(k) || d.hash != maphash.Bytes(hashSeed, v) {
				problem("v3 entry at revision %x differs from the source's", k)
			}
		case iv < len(e.kvs):
			w := &e.kvs[iv]
			iv++
			var kv mvccpb.KeyValue
			if err := kv.Unmarshal(v); err != nil {
				problem("entry at revision %x: %v", k, err)
				return
			}
			want := w.Value
			if w.streamed() {
				var s string
				if err := json.Unmarshal(e.data[w.raw.off-1:w.raw.off+int64(w.raw.n)+1], &s); err != nil {
					problem("key %q: the snapshot's value does not decode: %v", w.Key, err)
					return
				}
				want = []byte(s)
			}
			switch {
			case !bytes.Equal(k, revBytes(w.ModRevision)):
				problem("key %q: expected at revision %d, found revision %x", w.Key, w.ModRevision, k)
			case !bytes.Equal(kv.Key, w.Key) || !bytes.Equal(kv.Value, want):
				problem("key %q: key or value differs", w.Key)
			case kv.CreateRevision != w.CreateRevision || kv.ModRevision != w.ModRevision || kv.Version != max(w.version, 1) || kv.Lease != w.Lease:
				problem("key %q: revisions, version or lease differ", w.Key)
			default:
				seen++
			}
		case e.marker > 0 && !markerSeen && bytes.Equal(k, revBytes(e.marker)) && len(v) == 0:
			markerSeen = true
		default:
			problem("unexpected entry at revision %x", k)
		}
	}
	var next []byte
	for done := false; !done; {
		db, err := bolt.Open(dbPath, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			return seen, err
		}
		err = db.View(func(tx *bolt.Tx) error {
			kb := tx.Bucket([]byte("key"))
			if kb == nil {
				return errors.New("no key bucket")
			}
			c := kb.Cursor()
			k, v := c.First()
			if next != nil {
				k, v = c.Seek(next)
			}
			for size := 0; k != nil; k, v = c.Next() {
				if size >= verifyChunkBytes {
					next = bytes.Clone(k)
					return nil
				}
				check(k, v)
				size += len(v)
			}
			done = true
			return nil
		})
		if err == nil && done {
			err = verifyLeases(db, e, problem)
		}
		if err := joinClose(err, db); err != nil {
			return seen, err
		}
		e.release()
		progress.report("verify", int64(iv), int64(len(e.kvs)))
	}
	if seen != len(e.kvs) {
		problem("%d of %d keys as expected", seen, len(e.kvs))
	}
	if i3 != len(v3entries) {
		problem("%d of %d v3 entries present", i3, len(v3entries))
	}
	if e.marker > 0 && !markerSeen {
		problem("the revision bump marker at %d is missing", e.marker)
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > 20 {
			problems = append(problems[:20], "... and more")
		}
		return seen, errors.New(strings.Join(problems, "; "))
	}
	return seen, nil
}

func verifyLeases(db *bolt.DB, e expected, problem func(string, ...any)) error {
	got := map[int64]bool{}
	err := db.View(func(tx *bolt.Tx) error {
		lb := tx.Bucket([]byte("lease"))
		if lb == nil {
			return errors.New("no lease bucket")
		}
		return lb.ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				problem("lease key %x", k)
				return nil
			}
			id := int64(binary.BigEndian.Uint64(k))
			got[id] = true
			if e.v3 != nil && e.v3.leaseIDs[id] {
				if e.v3.leases[id] != maphash.Bytes(hashSeed, v) {
					problem("v3 lease %d differs from the source's", id)
				}
				return nil
			}
			var l leasepb.Lease
			if err := l.Unmarshal(v); err != nil {
				return err
			}
			if w := e.leases[id]; w == nil || w.TTL != l.TTL || l.ID != id {
				problem("lease %d unexpected or with TTL %d", id, l.TTL)
			}
			return nil
		})
	})
	for id := range e.leases {
		if !got[id] {
			problem("lease %d missing", id)
		}
	}
	if e.v3 != nil {
		for id := range e.v3.leaseIDs {
			if !got[id] {
				problem("v3 lease %d missing", id)
			}
		}
	}
	return err
}
