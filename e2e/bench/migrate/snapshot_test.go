package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/snap"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// reference writes the dataset's keys below split into etcd's own v2store, one write at a time
// as the dataset's indices assume, and returns what the store saves.
func reference(t *testing.T, d dataset) []byte {
	st := v2store.New("/0", "/1")
	for i := range d.split {
		ttl := v2store.TTLOptionSet{}
		if isEvent(i) {
			ttl.ExpireTime = d.expire
		}
		must := func(_ *v2store.Event, err error) {
			if err != nil {
				t.Fatalf("key %d: %v", i, err)
			}
		}
		must(st.Set("/1"+key(i), false, value(i), ttl))
		if updated(i) {
			must(st.Set("/1"+key(i), false, "updated", ttl))
		}
		if deleted(i) {
			must(st.Delete("/1"+key(i), false, false))
		}
	}
	b, err := st.Save()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestWriteStoreMatchesV2Store(t *testing.T) {
	expire := time.Date(2026, 11, 23, 16, 0, 0, 123456789, time.UTC)
	for _, tc := range []struct {
		name     string
		n, split int
	}{
		{"no user keys", 10, 0},
		{"one key", 1, 1},
		{"every kind of key", 1000, 1000},
		{"a tail left out", 1000, 733},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := dataset{n: tc.n, split: tc.split, expire: expire}
			want := reference(t, d)
			empty, err := v2store.New("/0", "/1").Save()
			if err != nil {
				t.Fatal(err)
			}
			var skel storeJSON
			if err := json.Unmarshal(empty, &skel); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			n, err := writeStore(&got, &skel, d)
			if err != nil || n != int64(got.Len()) {
				t.Fatalf("writeStore: %d bytes counted, %d written, %v", n, got.Len(), err)
			}
			var w, g struct {
				Root         json.RawMessage
				CurrentIndex uint64
			}
			if err := json.Unmarshal(want, &w); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got.Bytes(), &g); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
			if !bytes.Equal(w.Root, g.Root) {
				k := 0
				for k < len(g.Root) && k < len(w.Root) && g.Root[k] == w.Root[k] {
					k++
				}
				t.Errorf("Root differs from v2store's at byte %d:\n got %.300s\nwant %.300s", k, g.Root[max(k-150, 0):], w.Root[max(k-150, 0):])
			}
			if w.CurrentIndex != g.CurrentIndex {
				t.Errorf("CurrentIndex %d, v2store says %d", g.CurrentIndex, w.CurrentIndex)
			}
			if err := v2store.New("/0", "/1").Recovery(got.Bytes()); err != nil {
				t.Errorf("v2store cannot recover the written store: %v", err)
			}
		})
	}
}

func TestWriteSnapFileReadByEtcd(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int{1, 200, 70_000} {
		data := bytes.Repeat([]byte("{}"), size)
		jsonPath := filepath.Join(dir, "store.json")
		if err := os.WriteFile(jsonPath, data, 0o600); err != nil {
			t.Fatal(err)
		}
		meta := raftpb.SnapshotMetadata{Index: 3, Term: 2, ConfState: raftpb.ConfState{Voters: []uint64{0xbdae9bbc11dd390d}}}
		dst := filepath.Join(dir, "0000000000000002-0000000000000003.snap")
		os.Remove(dst)
		if err := writeSnapFile(dst, meta, jsonPath, int64(len(data))); err != nil {
			t.Fatal(err)
		}
		s, err := snap.Read(zap.NewNop(), dst)
		if err != nil {
			t.Fatalf("%d bytes: etcd's snapshotter: %v", len(data), err)
		}
		if !bytes.Equal(s.Data, data) || s.Metadata.Index != 3 || s.Metadata.Term != 2 || len(s.Metadata.ConfState.Voters) != 1 {
			t.Errorf("%d bytes: read back %d bytes, metadata %+v", len(data), len(s.Data), s.Metadata)
		}
	}
}
