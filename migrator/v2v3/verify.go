package v2v3

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/maphash"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

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
// kubefence's own decoder, so the check is independent of the writer. It returns the keys found
// as expected and a CRC-32C of the key and lease buckets as read (Report.ContentCRC).
func verifyOutput(dbPath string, e expected, progress Progress) (int, uint32, error) {
	v := &verifier{e: e}
	if e.v3 != nil {
		v.v3entries = e.v3.entries
	}
	var next []byte
	for done := false; !done; {
		var err error
		if next, done, err = v.chunk(dbPath, next); err != nil {
			return v.seen, 0, err
		}
		e.release()
		progress.report("verify", int64(v.iv), int64(len(e.kvs)))
	}
	return v.seen, v.sum, v.result()
}

// verifier compares the backend's key bucket, in revision order, with what was meant to be
// written: the v3 entries kept, then the v2 keys, then the bump marker.
type verifier struct {
	e            expected
	v3entries    []digest
	i3, iv, seen int
	markerSeen   bool
	sum          uint32 // CRC-32C of the key and lease buckets' entries, in order
	problems     []string
	enc          *json.Encoder // into buf, reused for every value
	buf          bytes.Buffer
}

func (v *verifier) problem(format string, a ...any) {
	if len(v.problems) < 21 {
		v.problems = append(v.problems, fmt.Sprintf(format, a...))
	}
}

// chunk checks up to verifyChunkBytes of entries from next (nil: the first), with the database
// open only meanwhile; it returns where to go on, or done.
func (v *verifier) chunk(dbPath string, next []byte) ([]byte, bool, error) {
	db, err := bolt.Open(dbPath, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return nil, false, err
	}
	done := false
	err = db.View(func(tx *bolt.Tx) error {
		kb := tx.Bucket([]byte("key"))
		if kb == nil {
			return errors.New("no key bucket")
		}
		c := kb.Cursor()
		k, val := c.First()
		if next != nil {
			k, val = c.Seek(next)
		}
		for size := 0; k != nil; k, val = c.Next() {
			if size >= verifyChunkBytes {
				next = bytes.Clone(k)
				return nil
			}
			v.check(k, val)
			size += len(val)
		}
		done = true
		return nil
	})
	if err == nil && done {
		err = verifyLeases(db, v.e, v.problem, &v.sum)
	}
	return next, done, joinClose(err, db)
}

func (v *verifier) check(k, val []byte) {
	e := &v.e
	v.sum = crc32.Update(crc32.Update(v.sum, crcTable, k), crcTable, val)
	switch {
	case v.i3 < len(v.v3entries):
		d := v.v3entries[v.i3]
		v.i3++
		if d.key != string(k) || d.hash != maphash.Bytes(hashSeed, val) {
			v.problem("v3 entry at revision %x differs from the source's", k)
		}
	case v.iv < len(e.kvs):
		w := &e.kvs[v.iv]
		v.iv++
		v.checkKV(k, val, w)
	case e.marker > 0 && !v.markerSeen && bytes.Equal(k, revBytes(e.marker)) && len(val) == 0:
		v.markerSeen = true
	default:
		v.problem("unexpected entry at revision %x", k)
	}
}

// checkKV compares one written entry with the key w it should hold.
func (v *verifier) checkKV(k, val []byte, w *KV) {
	var kv mvccpb.KeyValue
	if err := kv.Unmarshal(val); err != nil {
		v.problem("entry at revision %x: %v", k, err)
		return
	}
	same := bytes.Equal(kv.Value, w.Value)
	if w.streamed() {
		var err error
		if same, err = v.decodesTo(v.e.data[w.raw.off-1:w.raw.off+int64(w.raw.n)+1], kv.Value); err != nil {
			v.problem("key %q: the snapshot's value does not decode: %v", w.Key, err)
			return
		}
	}
	switch {
	case !bytes.Equal(k, revBytes(w.ModRevision)):
		v.problem("key %q: expected at revision %d, found revision %x", w.Key, w.ModRevision, k)
	case !bytes.Equal(kv.Key, w.Key) || !same:
		v.problem("key %q: key or value differs", w.Key)
	case kv.CreateRevision != w.CreateRevision || kv.ModRevision != w.ModRevision || kv.Version != max(w.version, 1) || kv.Lease != w.Lease:
		v.problem("key %q: revisions, version or lease differ", w.Key)
	default:
		v.seen++
	}
}

// decodesTo says whether encoding/json decodes the JSON string quoted (quotes included) to
// value. It asks encoding/json, never kubefence's own decoder, and decodes only when it must:
//   - a string without escapes, in valid UTF-8 and without control characters, decodes to
//     itself;
//   - a string that is encoding/json's own encoding of a valid UTF-8 value (what etcd's v2store
//     writes) decodes to that value: for valid UTF-8, decoding inverts encoding;
//   - anything else (another encoder's escapes, bad UTF-8, a wrong value) is decoded.
func (v *verifier) decodesTo(quoted, value []byte) (bool, error) {
	raw := quoted[1 : len(quoted)-1]
	if plainJSON(raw) {
		return bytes.Equal(raw, value), nil
	}
	if v.enc == nil {
		v.enc = json.NewEncoder(&v.buf)
	}
	v.buf.Reset()
	// Only valid UTF-8 round-trips: encoding/json writes any bad byte as \ufffd.
	if err := v.enc.Encode(unsafe.String(unsafe.SliceData(value), len(value))); err == nil && utf8.Valid(value) {
		if b := v.buf.Bytes(); len(b) >= 3 && bytes.Equal(b[1:len(b)-2], raw) { // "...", newline
			return true, nil
		}
	}
	var s string
	if err := json.Unmarshal(quoted, &s); err != nil {
		return false, err
	}
	return s == string(value), nil
}

// plainJSON says whether a JSON string's contents hold no escape, no control character and only
// valid UTF-8: then they are their own value.
func plainJSON(raw []byte) bool {
	for _, c := range raw {
		if c < 0x20 || c == '\\' || c == '"' {
			return false
		}
	}
	return utf8.Valid(raw)
}

// result is nil when everything expected was found, else up to 20 problems.
func (v *verifier) result() error {
	e := &v.e
	if v.seen != len(e.kvs) {
		v.problem("%d of %d keys as expected", v.seen, len(e.kvs))
	}
	if v.i3 != len(v.v3entries) {
		v.problem("%d of %d v3 entries present", v.i3, len(v.v3entries))
	}
	if e.marker > 0 && !v.markerSeen {
		v.problem("the revision bump marker at %d is missing", e.marker)
	}
	if len(v.problems) == 0 {
		return nil
	}
	sort.Strings(v.problems)
	if len(v.problems) > 20 {
		v.problems = append(v.problems[:20], "... and more")
	}
	return errors.New(strings.Join(v.problems, "; "))
}

// verifyLeases checks the lease bucket, adding its entries to the CRC sum.
func verifyLeases(db *bolt.DB, e expected, problem func(string, ...any), sum *uint32) error {
	got := map[int64]bool{}
	err := db.View(func(tx *bolt.Tx) error {
		lb := tx.Bucket([]byte("lease"))
		if lb == nil {
			return errors.New("no lease bucket")
		}
		return lb.ForEach(func(k, v []byte) error {
			*sum = crc32.Update(crc32.Update(*sum, crcTable, k), crcTable, v)
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
