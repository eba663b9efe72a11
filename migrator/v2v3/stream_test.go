package v2v3

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/raft/v3/raftpb"
)

var oddValues = []string{"", "plain", `{"kind":"Pod","a":"<b>&amp;"}`, "quote\" back\\slash", "tab\tnl\n\x01ctl",
	"é ü 中文 😀", "\u2028\u2029", "bad utf8 \xff\xfe", "%41%2F", `\u0041 literally`}

// randomStore builds a store with dirs, files, TTL keys (some already expired at now) and
// hidden keys, all with awkward values.
func randomStore(r *rand.Rand, now time.Time) v2store.Store {
	st := v2store.New("/0", "/1")
	_, _ = st.Set("/0/members/1/attributes", false, `{"name":"m"}`, v2store.TTLOptionSet{})
	for i := 0; i < 300; i++ {
		p := randomPath(r)
		var ttl v2store.TTLOptionSet
		if r.Intn(5) == 0 {
			ttl.ExpireTime = now.Add(time.Duration(r.Intn(7200)-600) * time.Second).Add(time.Duration(r.Intn(1000)) * time.Millisecond)
		}
		_, _ = st.Set(p, r.Intn(20) == 0, oddValues[r.Intn(len(oddValues))]+fmt.Sprint(i), ttl)
	}
	return st
}

func randomPath(r *rand.Rand) string {
	dirs := []string{"registry/pods/ns1", "registry/pods/ns2", "registry/events/ns1", "_hidden", "registry/_x", "coreos.com/network", "d"}
	return fmt.Sprintf("/1/%s/k%d", dirs[r.Intn(len(dirs))], r.Intn(40))
}

// randomTail makes committed WAL requests of every kind, on paths that overlap the store's.
func randomTail(r *rand.Rand, now time.Time, n int) []*etcdserverpb.Request {
	var reqs []*etcdserverpb.Request
	for i := 0; i < n; i++ {
		p := randomPath(r)
		val := oddValues[r.Intn(len(oddValues))] + fmt.Sprint("w", i)
		var req etcdserverpb.Request
		switch r.Intn(10) {
		case 0:
			req = etcdserverpb.Request{Method: "POST", Path: filepath.Dir(p), Val: val}
		case 1:
			req = etcdserverpb.Request{Method: "DELETE", Path: p}
		case 2:
			req = etcdserverpb.Request{Method: "DELETE", Path: filepath.Dir(p), Recursive: true, Dir: true}
		case 3:
			req = etcdserverpb.Request{Method: "PUT", Path: p, Val: val, PrevValue: oddValues[r.Intn(len(oddValues))] + fmt.Sprint(r.Intn(300))}
		case 4:
			req = etcdserverpb.Request{Method: "PUT", Path: p, Val: val, PrevExist: bp(r.Intn(2) == 0)}
		case 5:
			req = etcdserverpb.Request{Method: "SYNC", Time: now.Add(time.Duration(r.Intn(1200)-600) * time.Second).UnixNano()}
		case 6:
			req = etcdserverpb.Request{Method: "PUT", Path: p, Val: val, Expiration: now.Add(time.Duration(r.Intn(3600)) * time.Second).UnixNano()}
		case 7:
			req = etcdserverpb.Request{Method: "QGET", Path: p}
		default:
			req = etcdserverpb.Request{Method: "PUT", Path: p, Val: val}
		}
		reqs = append(reqs, &req)
	}
	return reqs
}

func entriesOf(t *testing.T, reqs []*etcdserverpb.Request, first uint64) []raftpb.Entry {
	t.Helper()
	var ents []raftpb.Entry
	for i, req := range reqs {
		var data []byte
		var err error
		if i%3 == 0 { // older WALs: a bare v2 Request
			data, err = req.Marshal()
		} else {
			data, err = (&etcdserverpb.InternalRaftRequest{V2: req}).Marshal()
		}
		if err != nil {
			t.Fatal(err)
		}
		ents = append(ents, raftpb.Entry{Type: raftpb.EntryNormal, Index: first + uint64(i), Data: data})
	}
	return ents
}

type resolved struct {
	Key, Value               string
	Create, Mod, Lease, Vers int64
}

func resolve(t *testing.T, kvs []KV, data []byte) []resolved {
	t.Helper()
	var out []resolved
	for i := range kvs {
		v, err := kvs[i].value(data, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, resolved{string(kvs[i].Key), string(v), kvs[i].CreateRevision, kvs[i].ModRevision, kvs[i].Lease, kvs[i].version})
	}
	return out
}

// TestStreamMatchesFullLoad: streaming the snapshot and replaying the WAL tail on an overlay of
// the nodes it touches must give exactly what loading the whole store and replaying gives.
func TestStreamMatchesFullLoad(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for seed := int64(1); seed <= 40; seed++ {
		r := rand.New(rand.NewSource(seed))
		st := randomStore(r, now)
		snapJSON, err := st.Save()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		writeSnap(t, filepath.Join(dir, "0000000000000002-0000000000000100.snap"), snapJSON, 0x100, false)
		tail := randomTail(r, now, r.Intn(60))
		opts := Options{Now: now, IncludeHidden: seed%2 == 0}
		run := func(all bool) ([]resolved, *v2Result) {
			src := &Source{Entries: entriesOf(t, tail, 0x101)}
			if err := src.loadSnapshot(dir); err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			res, err := readV2(src, opts, false, all, nil, nil)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if err := sortKVs(res.c.kvs); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			return resolve(t, res.c.kvs, src.snap.data), res
		}
		got, gotRes := run(false)
		want, wantRes := run(true)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: streamed keys differ from a full load:\n got %v\nwant %v", seed, got, want)
		}
		if !reflect.DeepEqual(gotRes.c.stats, wantRes.c.stats) || !reflect.DeepEqual(gotRes.c.leases, wantRes.c.leases) {
			t.Fatalf("seed %d: stats %+v leases %v, full load %+v %v", seed, gotRes.c.stats, gotRes.c.leases, wantRes.c.stats, wantRes.c.leases)
		}
		t.Logf("seed %d: %d keys, tail %d, overlay %d of %d, stats %+v", seed, len(got), len(tail), gotRes.replay.Overlay, wantRes.replay.Overlay, gotRes.c.stats)
		if len(tail) > 0 && gotRes.replay.Overlay >= wantRes.replay.Overlay && !hasSync(tail) {
			t.Errorf("seed %d: the overlay held %d of %d nodes", seed, gotRes.replay.Overlay, wantRes.replay.Overlay)
		}
	}
}

func hasSync(reqs []*etcdserverpb.Request) bool {
	for _, r := range reqs {
		if r.Method == "SYNC" {
			return true
		}
	}
	return false
}

// FuzzUnescape: kubefence's JSON string decoder agrees with encoding/json on whatever
// encoding/json writes (the v2 snapshot is written by json.Marshal).
func FuzzUnescape(f *testing.F) {
	for _, v := range oddValues {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, _ := json.Marshal(s)
		var want string
		if err := json.Unmarshal(q, &want); err != nil {
			t.Fatal(err)
		}
		got, err := appendUnescaped(nil, q[1:len(q)-1])
		if err != nil || string(got) != want {
			t.Fatalf("%q: got %q (%v), encoding/json %q", q, got, err, want)
		}
	})
}

func TestUnescapeHandWritten(t *testing.T) {
	for in, want := range map[string]string{
		`\ud83d\ude00`: "😀", `\ud83d`: "\ufffd", `\ud83dx`: "\ufffdx", `\ude00\ud83d`: "\ufffd\ufffd",
		`\/\b\f`: "/\b\f", `\u00e9`: "é",
	} {
		var ref string
		if err := json.Unmarshal([]byte(`"`+in+`"`), &ref); err != nil || ref != want {
			t.Fatalf("test case %q: encoding/json says %q (%v)", in, ref, err)
		}
		if got, err := appendUnescaped(nil, []byte(in)); err != nil || string(got) != want {
			t.Errorf("%q: %q (%v), want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{`\x`, `\u12`, `\`} {
		if _, err := appendUnescaped(nil, []byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestMarshalKV: the streaming encoder writes what the generated code writes.
func TestMarshalKV(t *testing.T) {
	long := bytes.Repeat([]byte(`\"x`), 50) // 150 raw bytes (2-byte varint), 100 decoded (1-byte)
	for _, raw := range [][]byte{[]byte("v"), []byte(`a\"b`), long, bytes.Repeat([]byte("y"), 300), []byte(`\u0041`)} {
		data := append(append([]byte(`x"`), raw...), '"')
		kv := KV{Key: []byte("/k"), raw: span{off: 2, n: int32(len(raw)), esc: bytes.IndexByte(raw, '\\') >= 0}, CreateRevision: 3, ModRevision: 300, Lease: 77}
		got, err := marshalKV(&kv, data)
		if err != nil {
			t.Fatal(err)
		}
		val, _ := appendUnescaped(nil, raw)
		want, _ := (&mvccpb.KeyValue{Key: kv.Key, Value: val, CreateRevision: 3, ModRevision: 300, Version: 1, Lease: 77}).Marshal()
		if !bytes.Equal(got, want) {
			t.Errorf("raw %q:\n got %x\nwant %x", raw, got, want)
		}
	}
}

func TestRewritePrefix(t *testing.T) {
	cases := []struct {
		name, from, to string
		keys           []string
		want           []string
		err            string
	}{
		{"move", "/registry", "/k8s", []string{"/registry/a", "/other", "/registryx"}, []string{"/k8s/a", "/other", "/k8sx"}, ""},
		{"into itself", "/registry/", "/registry/new/", []string{"/registry/a", "/registry/new/a"}, []string{"/registry/new/a", "/registry/new/new/a"}, ""},
		{"clash", "/a/", "/b/", []string{"/a/x", "/b/x"}, nil, "would both become /b/x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var kvs []KV
			for _, k := range tc.keys {
				kvs = append(kvs, KV{Key: []byte(k)})
			}
			_, err := rewritePrefix(kvs, tc.from, tc.to)
			if tc.err != "" {
				if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.err)) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, kv := range kvs {
				if string(kv.Key) != tc.want[i] {
					t.Errorf("%s became %s, want %s", tc.keys[i], kv.Key, tc.want[i])
				}
			}
		})
	}
}

// TestReadsLoadNothing: etcd 3.4's /health puts a QGET of "" (the root) through raft, so most
// WAL tails hold reads; a read changes nothing, so the replay loads none of the nodes it names
// (a read of the root loaded the whole snapshot into memory).
func TestReadsLoadNothing(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	st := randomStore(rand.New(rand.NewSource(7)), now)
	snapJSON, err := st.Save()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeSnap(t, filepath.Join(dir, "0000000000000002-0000000000000100.snap"), snapJSON, 0x100, false)
	overlay := func(tail []*etcdserverpb.Request) int {
		src := &Source{Entries: entriesOf(t, tail, 0x101)}
		if err := src.loadSnapshot(dir); err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		res, err := readV2(src, Options{Now: now}, false, false, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.replay.Overlay
	}
	none := overlay(nil) // the root and the membership tree
	if got := overlay([]*etcdserverpb.Request{{Method: "QGET"}, {Method: "GET", Path: "/1"}, {Method: "HEAD", Path: "/"}}); got != none {
		t.Errorf("the replay of reads held %d snapshot nodes in memory, want %d, as without them", got, none)
	}
}
