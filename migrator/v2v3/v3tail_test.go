package v2v3

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// mixedMember writes a member with a v2 key in its snapshot (index 0x100), a v3 key in its
// backend (consistent index 0x100; with a term when etcd35, as 3.5 and later keep one) and the
// WAL tail given (from index 0x101, all committed).
func mixedMember(t *testing.T, etcd35 bool, tail ...*etcdserverpb.InternalRaftRequest) string {
	t.Helper()
	st := v2store.New("/0", "/1")
	if _, err := st.Set("/1/v2key", false, "x", v2store.TTLOptionSet{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	snapDir := filepath.Join(dir, "member", "snap")
	if err := os.MkdirAll(snapDir, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := st.Save()
	if err != nil {
		t.Fatal(err)
	}
	writeSnap(t, filepath.Join(snapDir, "0000000000000001-0000000000000100.snap"), data, 0x100, false)
	meta := map[string][]byte{"consistent_index": binary.BigEndian.AppendUint64(nil, 0x100)}
	if etcd35 {
		meta["term"] = binary.BigEndian.AppendUint64(nil, 1)
	}
	writeBackend(t, filepath.Join(snapDir, "db"), &mvccpb.KeyValue{Key: []byte("/a"), Value: []byte("1"), CreateRevision: 1, ModRevision: 1, Version: 1}, meta)
	w, err := wal.Create(zap.NewNop(), filepath.Join(dir, "member", "wal"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SaveSnapshot(walpb.Snapshot{Index: 0x100, Term: 1, ConfState: &raftpb.ConfState{Voters: []uint64{1}}}); err != nil {
		t.Fatal(err)
	}
	var ents []raftpb.Entry
	for i, r := range tail {
		b, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		ents = append(ents, raftpb.Entry{Term: 1, Index: 0x101 + uint64(i), Type: raftpb.EntryNormal, Data: b})
	}
	if err := w.Save(raftpb.HardState{Term: 1, Commit: 0x100 + uint64(len(tail))}, ents); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestV3WritesInTheTail: v3 writes the WAL has committed past the backend's consistent index
// (a member that crashed before its backend committed them, a live copy) would be lost, since
// the backend is carried over as it is: refused, saying what to do, or with DropV3Tail left
// out with a warning. etcd 3.4 saves the index only with a write that changed keys: there a
// put, a delete, a txn holding a put or a delete (kube-apiserver writes only through those), a
// lease revoke (it deletes the lease's keys) or an auth change past it may be missing, while
// a txn that only reads or a lease grant changes no key; 3.5 and later save it with every
// commit. v2 writes there are fine.
func TestV3WritesInTheTail(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	v2put := &etcdserverpb.InternalRaftRequest{V2: &etcdserverpb.Request{Method: "PUT", Path: "/1/late", Val: "y"}}
	put := &etcdserverpb.InternalRaftRequest{Put: &etcdserverpb.PutRequest{Key: []byte("/b"), Value: []byte("2")}}
	txn := &etcdserverpb.InternalRaftRequest{Txn: &etcdserverpb.TxnRequest{}}
	lease := &etcdserverpb.InternalRaftRequest{LeaseGrant: &etcdserverpb.LeaseGrantRequest{ID: 7, TTL: 60}}
	rangeOp := &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestRange{RequestRange: &etcdserverpb.RangeRequest{Key: []byte("/a")}}}
	putOp := &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestPut{RequestPut: put.Put}}
	delOp := &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestDeleteRange{RequestDeleteRange: &etcdserverpb.DeleteRangeRequest{Key: []byte("/a")}}}
	cmp := []*etcdserverpb.Compare{{Key: []byte("/a"), Target: etcdserverpb.Compare_MOD, Result: etcdserverpb.Compare_EQUAL, TargetUnion: &etcdserverpb.Compare_ModRevision{ModRevision: 1}}}
	readTxn := &etcdserverpb.InternalRaftRequest{Txn: &etcdserverpb.TxnRequest{Success: []*etcdserverpb.RequestOp{rangeOp}, Failure: []*etcdserverpb.RequestOp{rangeOp}}}
	// kube-apiserver's update: put if unchanged, else read.
	updateTxn := &etcdserverpb.InternalRaftRequest{Txn: &etcdserverpb.TxnRequest{Compare: cmp, Success: []*etcdserverpb.RequestOp{putOp}, Failure: []*etcdserverpb.RequestOp{rangeOp}}}
	nested := &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestTxn{RequestTxn: &etcdserverpb.TxnRequest{Failure: []*etcdserverpb.RequestOp{delOp}}}}
	nestedTxn := &etcdserverpb.InternalRaftRequest{Txn: &etcdserverpb.TxnRequest{Compare: cmp, Success: []*etcdserverpb.RequestOp{rangeOp}, Failure: []*etcdserverpb.RequestOp{nested}}}
	del := &etcdserverpb.InternalRaftRequest{DeleteRange: &etcdserverpb.DeleteRangeRequest{Key: []byte("/a")}}
	revoke := &etcdserverpb.InternalRaftRequest{LeaseRevoke: &etcdserverpb.LeaseRevokeRequest{ID: 7}}
	userAdd := &etcdserverpb.InternalRaftRequest{AuthUserAdd: &etcdserverpb.AuthUserAddRequest{Name: "u", Password: "p"}}
	for _, tc := range []struct {
		name    string
		etcd35  bool
		tail    []*etcdserverpb.InternalRaftRequest
		drop    bool
		wantErr string
	}{
		{"v2 writes only", true, []*etcdserverpb.InternalRaftRequest{v2put}, false, ""},
		{"3.4: a v3 put", false, []*etcdserverpb.InternalRaftRequest{v2put, put}, false, "0x102"},
		{"3.4: an empty txn, a txn that only reads, a lease grant", false, []*etcdserverpb.InternalRaftRequest{v2put, txn, readTxn, lease}, false, ""},
		{"3.4: kube-apiserver's update txn", false, []*etcdserverpb.InternalRaftRequest{v2put, updateTxn, readTxn}, false, "0x102"},
		{"3.4: a delete in a nested txn", false, []*etcdserverpb.InternalRaftRequest{nestedTxn, v2put}, false, "0x101"},
		{"3.4: a delete", false, []*etcdserverpb.InternalRaftRequest{v2put, del}, false, "0x102"},
		{"3.4: a lease revoke", false, []*etcdserverpb.InternalRaftRequest{lease, revoke}, false, "0x102"},
		{"3.4: an auth change", false, []*etcdserverpb.InternalRaftRequest{userAdd}, false, "0x101"},
		{"3.4: an update txn, dropped", false, []*etcdserverpb.InternalRaftRequest{v2put, updateTxn}, true, ""},
		{"3.5: an auth change", true, []*etcdserverpb.InternalRaftRequest{v2put, userAdd}, false, "0x102"},
		{"3.5: a v3 put", true, []*etcdserverpb.InternalRaftRequest{v2put, put}, false, "0x102"},
		{"3.5: a txn", true, []*etcdserverpb.InternalRaftRequest{txn}, false, "0x101"},
		{"3.5: a lease grant", true, []*etcdserverpb.InternalRaftRequest{lease, v2put}, false, "0x101"},
		{"3.5: a v3 put, dropped", true, []*etcdserverpb.InternalRaftRequest{v2put, put}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, mixedMember(t, tc.etcd35, tc.tail...), now)
			c.DropV3Tail = tc.drop
			rep, err := Run(c)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), "v3 writes") || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Run = %v, want a refusal naming the v3 writes up to entry %s", err, tc.wantErr)
				}
				// A plain start of etcd 3.4 leaves its index behind a txn or delete that changed
				// nothing; a snapshot records it.
				if !strings.Contains(err.Error(), "--snapshot-count=1") {
					t.Errorf("Run = %v, want the advice to start etcd once with --snapshot-count=1", err)
				}
				if _, serr := os.Stat(c.OutputDir); !os.IsNotExist(serr) {
					t.Errorf("a refused migration left %s", c.OutputDir)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if out := readOutput(t, c.OutputDir); out["/a"] == nil || out["/late"] == nil {
				t.Fatalf("output %v lacks /a or /late", out)
			}
			if warned := len(rep.Warnings) > 0 && strings.Contains(rep.Warnings[0], "left out"); warned != tc.drop {
				t.Fatalf("warnings %q; want one saying the v3 writes were left out: %v", rep.Warnings, tc.drop)
			}
		})
	}
}

// TestRenumberAboveTheCompaction: etcd starts at the largest of the key bucket's newest revision
// and the compactions' (its newest writes may have been deletes, compacted away since); the v2
// keys go above that, not into revisions v3 clients have seen.
func TestRenumberAboveTheCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	writeBackend(t, path, &mvccpb.KeyValue{Key: []byte("/a"), Value: []byte("1"), CreateRevision: 2, ModRevision: 2, Version: 1},
		map[string][]byte{"finishedCompactRev": revBytes(7), "scheduledCompactRev": revBytes(9)})
	d, err := readV3(path)
	if err != nil {
		t.Fatal(err)
	}
	kvs, _, err := renumber([]KV{{Key: []byte("/b"), CreateRevision: 4, ModRevision: 4}}, d, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := kvs[0].ModRevision; got != 10 {
		t.Errorf("the v2 key is at revision %d, want 10 (above the compaction scheduled at 9)", got)
	}
}

// writeBackend writes a v3 backend at path holding kv at its mod revision, meta in the meta
// bucket, and an empty lease bucket.
func writeBackend(t *testing.T, path string, kv *mvccpb.KeyValue, meta map[string][]byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		kb, err := tx.CreateBucket([]byte("key"))
		if err != nil {
			return err
		}
		mb, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucket([]byte("lease")); err != nil {
			return err
		}
		v, err := kv.Marshal()
		if err != nil {
			return err
		}
		if err := kb.Put(revBytes(kv.ModRevision), v); err != nil {
			return err
		}
		for k, v := range meta {
			if err := mb.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err = errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
}

// TestPrefixRewriteWithV3Keys: --prefix-from/--prefix-to rewrites the v2 keys, and the source's
// v3 store is carried over as it is, so v3 keys under the old prefix would stay there, apart
// from the v2 keys moved; and a key in both stores, compared after the rewrite, would no longer
// be found in both. Refused, naming such a key and what to do; a rewrite no v3 key falls under
// goes ahead.
func TestPrefixRewriteWithV3Keys(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	inBoth := &etcdserverpb.InternalRaftRequest{V2: &etcdserverpb.Request{Method: "PUT", Path: "/1/a", Val: "v2"}}
	for _, tc := range []struct {
		name     string
		from, to string
		tail     []*etcdserverpb.InternalRaftRequest
		wantErr  bool
		wantKeys []string
	}{
		{name: "a v3 key under the prefix", from: "/", to: "/new/", wantErr: true},
		{name: "a key in both stores", from: "/", to: "/new/", tail: []*etcdserverpb.InternalRaftRequest{inBoth}, wantErr: true},
		{name: "no v3 key under the prefix", from: "/v2", to: "/k8s/v2", wantKeys: []string{"/a", "/k8s/v2key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, mixedMember(t, true, tc.tail...), now)
			c.PrefixFrom, c.PrefixTo = tc.from, tc.to
			rep, err := Run(c)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), `v3 key "/a"`) || !strings.Contains(err.Error(), "--prefix-from") {
					t.Fatalf("Run = %+v, %v; want a refusal naming the v3 key /a under --prefix-from", rep, err)
				}
				if _, serr := os.Stat(c.OutputDir); !os.IsNotExist(serr) {
					t.Errorf("a refused migration left %s", c.OutputDir)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out := readOutput(t, c.OutputDir)
			for _, k := range tc.wantKeys {
				if out[k] == nil {
					t.Errorf("key %s missing from %v", k, out)
				}
			}
			if len(out) != len(tc.wantKeys) {
				t.Errorf("keys %v, want %v", out, tc.wantKeys)
			}
		})
	}
}

// TestConflictV3DropsTTLKeysFromLeases: with --on-conflict=v3 a v2 key also in the v3 store is
// left out; a TTL key so left out no longer counts as a key with a TTL, nor in its lease, and a
// lease left with no key is not written.
func TestConflictV3DropsTTLKeysFromLeases(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	expire := now.Add(time.Hour).UnixNano()
	ttlPut := func(path string) *etcdserverpb.InternalRaftRequest {
		return &etcdserverpb.InternalRaftRequest{V2: &etcdserverpb.Request{Method: "PUT", Path: path, Val: "v2", Expiration: expire}}
	}
	for _, tc := range []struct {
		name              string
		tail              []*etcdserverpb.InternalRaftRequest
		ttlKeys, leases   int
		wantLeaseInBucket bool
	}{
		{"the lease's only key in both stores", []*etcdserverpb.InternalRaftRequest{ttlPut("/1/a")}, 0, 0, false},
		{"one of the lease's two keys in both stores", []*etcdserverpb.InternalRaftRequest{ttlPut("/1/a"), ttlPut("/1/b")}, 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, mixedMember(t, true, tc.tail...), now)
			c.OnConflict = ConflictV3
			rep, err := Run(c)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Keys.TTLKeys != tc.ttlKeys || rep.Leases != tc.leases {
				t.Errorf("report: %d keys with a TTL in %d leases, want %d in %d (the v2 /a is left out)", rep.Keys.TTLKeys, rep.Leases, tc.ttlKeys, tc.leases)
			}
			if out := readOutput(t, c.OutputDir); string(out["/a"].Value) != "1" {
				t.Errorf("/a = %q, want the v3 value 1", out["/a"].Value)
			}
			db, err := bolt.Open(filepath.Join(c.OutputDir, "member", "snap", "db"), 0o400, &bolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var n int
			if err := db.View(func(tx *bolt.Tx) error { n = tx.Bucket([]byte("lease")).Stats().KeyN; return nil }); err != nil {
				t.Fatal(err)
			}
			if (n > 0) != tc.wantLeaseInBucket {
				t.Errorf("%d lease(s) written, want a lease: %v", n, tc.wantLeaseInBucket)
			}
		})
	}
}
