package v2v3

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
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

// The test binary doubles as a transformer program: with KUBEFENCE_TEST_TRANSFORMER set it
// speaks etcdctl migrate's protocol in the named way.
func TestMain(m *testing.M) {
	if mode := os.Getenv("KUBEFENCE_TEST_TRANSFORMER"); mode != "" {
		os.Exit(fakeTransformer(mode))
	}
	os.Exit(m.Run())
}

func fakeTransformer(mode string) int {
	dec := json.NewDecoder(os.Stdin)
	out := os.Stdout
	emit := func(kv *mvccpb.KeyValue) {
		b, _ := kv.Marshal()
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		out.Write(n[:])
		out.Write(b)
	}
	for dec.More() {
		var n struct {
			Key, Value                  string
			Dir                         bool
			TTL                         int64
			ModifiedIndex, CreatedIndex int64
		}
		if err := dec.Decode(&n); err != nil {
			fmt.Fprintln(os.Stderr, "decode:", err)
			return 2
		}
		if n.Dir {
			continue
		}
		kv := &mvccpb.KeyValue{Key: []byte("/moved" + n.Key), Value: []byte(strings.ToUpper(n.Value)), CreateRevision: n.CreatedIndex, ModRevision: n.ModifiedIndex, Version: 1}
		switch mode {
		case "upper":
			emit(kv)
		case "duprev":
			emit(kv)
			kv.Key = append(kv.Key, 'x')
			emit(kv)
		case "lease":
			kv.Lease = 5
			emit(kv)
		case "newrev": // a TTL key gets a revision of its own: its lease cannot follow it
			if n.TTL > 0 {
				kv.ModRevision += 1 << 20
			}
			emit(kv)
		case "garbage":
			out.WriteString("this is not a protobuf stream")
			return 0
		}
	}
	if mode == "fail" {
		fmt.Fprintln(os.Stderr, "boom: cannot map this key")
		return 3
	}
	return 0
}

// writeMember makes a member data dir: a v2 snapshot of st at index 0x100 and a WAL whose
// tail (after the snapshot) holds reqs, all committed.
func writeMember(t *testing.T, st v2store.Store, reqs []*etcdserverpb.Request) string {
	t.Helper()
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
	w, err := wal.Create(zap.NewNop(), filepath.Join(dir, "member", "wal"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SaveSnapshot(walpb.Snapshot{Index: 0x100, Term: 1, ConfState: &raftpb.ConfState{Voters: []uint64{1}}}); err != nil {
		t.Fatal(err)
	}
	ents := entriesOf(t, reqs, 0x101)
	for i := range ents {
		ents[i].Term = 1
	}
	last := uint64(0x100 + len(ents))
	if err := w.Save(raftpb.HardState{Term: 1, Commit: last}, ents); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func smallMember(t *testing.T, now time.Time) string {
	st := v2store.New("/0", "/1")
	for i, p := range []string{"/1/registry/pods/a", "/1/registry/pods/b", "/1/other/c"} {
		if _, err := st.Set(p, false, fmt.Sprintf(`{"n":%d,"s":"é<&>"}`, i), v2store.TTLOptionSet{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Set("/1/registry/events/e", false, "event", v2store.TTLOptionSet{ExpireTime: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	return writeMember(t, st, []*etcdserverpb.Request{
		{Method: "PUT", Path: "/1/registry/pods/b", Val: "b2"},
		{Method: "PUT", Path: "/1/registry/pods/new", Val: "new"},
	})
}

func testConfig(t *testing.T, src string, now time.Time) Config {
	return Config{DataDir: src, OutputDir: filepath.Join(t.TempDir(), "out"), Options: Options{Now: now},
		Member: Membership{Name: "m", InitialCluster: "m=http://127.0.0.1:2380", InitialAdvertisePeerURLs: []string{"http://127.0.0.1:2380"}, InitialClusterToken: "t"}}
}

func TestRunOptions(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	src := smallMember(t, now)
	self, _ := os.Executable()
	cases := []struct {
		name      string
		mode      string
		edit      func(*Config)
		err       string
		wantKeys  []string
		wantValue map[string]string
	}{
		{name: "default", wantKeys: []string{"/registry/pods/a", "/registry/pods/b", "/other/c", "/registry/events/e", "/registry/pods/new"},
			wantValue: map[string]string{"/registry/pods/b": "b2", "/registry/pods/a": `{"n":0,"s":"é<&>"}`}},
		{name: "prefix", edit: func(c *Config) { c.PrefixFrom, c.PrefixTo = "/registry/", "/k8s/" },
			wantKeys: []string{"/k8s/pods/a", "/k8s/pods/b", "/other/c", "/k8s/events/e", "/k8s/pods/new"}},
		{name: "transformer", mode: "upper", edit: func(c *Config) { c.Transformer = self },
			wantKeys:  []string{"/moved/registry/pods/a", "/moved/registry/pods/b", "/moved/other/c", "/moved/registry/events/e", "/moved/registry/pods/new"},
			wantValue: map[string]string{"/moved/registry/pods/b": "B2", "/moved/registry/pods/a": `{"N":0,"S":"É<&>"}`}},
		{name: "transformer fails", mode: "fail", edit: func(c *Config) { c.Transformer = self }, err: "boom: cannot map this key"},
		{name: "transformer garbage", mode: "garbage", edit: func(c *Config) { c.Transformer = self }, err: "is not a KeyValue length"},
		{name: "transformer duplicate revision", mode: "duprev", edit: func(c *Config) { c.Transformer = self }, err: "share revision"},
		{name: "transformer sets a lease", mode: "lease", edit: func(c *Config) { c.Transformer = self }, err: "lease 5 set by the transformer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBEFENCE_TEST_TRANSFORMER", tc.mode)
			c := testConfig(t, src, now)
			if tc.edit != nil {
				tc.edit(&c)
			}
			rep, err := Run(c)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				if _, serr := os.Stat(c.OutputDir); !os.IsNotExist(serr) {
					t.Fatal("a failed migration left an output dir")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := readOutput(t, c.OutputDir)
			if len(got) != len(tc.wantKeys) || rep.Verified != len(tc.wantKeys) {
				t.Fatalf("keys %v (verified %d), want %v", got, rep.Verified, tc.wantKeys)
			}
			for _, k := range tc.wantKeys {
				if _, ok := got[k]; !ok {
					t.Errorf("key %s missing: %v", k, got)
				}
			}
			for k, v := range tc.wantValue {
				if string(got[k].Value) != v {
					t.Errorf("%s = %q, want %q", k, got[k].Value, v)
				}
			}
			if c.Transformer != "" && (rep.Keys.TransformerIn != 9 || rep.Keys.TransformerOut != 5) {
				t.Errorf("transformer saw %d nodes and gave %d keys, want 9 (4 dirs) and 5", rep.Keys.TransformerIn, rep.Keys.TransformerOut)
			}
			if rep.Leases != 1 {
				t.Errorf("leases %d: the event key keeps its lease", rep.Leases)
			}
			for _, p := range []string{"readSnapshot", "readWAL", "scanSnapshot", "replayWAL", "transform", "restoreBase", "writeKeys", "verify"} {
				if s, ok := rep.Phases[p]; !ok || s <= 0 {
					t.Errorf("phase %s: %v seconds in the report (%v)", p, s, rep.Phases)
				}
			}
			for k, kv := range got {
				if strings.HasSuffix(k, "/events/e") && kv.Lease == 0 {
					t.Errorf("%s lost its lease", k)
				}
			}
		})
	}
	entries, _ := os.ReadDir(filepath.Join(src, "member", "snap"))
	if len(entries) != 1 {
		t.Errorf("the source's snap dir changed: %v", entries)
	}
}

// TestTransformerLeaseLostCounts: a TTL key to which the transformer gave another revision is
// written without a lease; the report counts it as such (transformerLeaseLost), not among the
// keys given a lease (ttlKeys), and its lease, left with no key, is neither counted nor written.
func TestTransformerLeaseLostCounts(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	self, _ := os.Executable()
	t.Setenv("KUBEFENCE_TEST_TRANSFORMER", "newrev")
	c := testConfig(t, smallMember(t, now), now)
	c.Transformer = self
	rep, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if k := rep.Keys; k.LeaseLost != 1 || k.TTLKeys != 0 || rep.Leases != 0 {
		t.Errorf("report: %d keys given a lease, in %d leases, %d that lost theirs; want 0, 0 and 1 (the event key)", k.TTLKeys, rep.Leases, k.LeaseLost)
	}
	out := readOutput(t, c.OutputDir)
	if e := out["/moved/registry/events/e"]; e == nil || e.Lease != 0 {
		t.Errorf("the event key %v: want it written without a lease", e)
	}
}

// readOutput reads the latest value of every key in a member data dir's backend.
func readOutput(t *testing.T, dir string) map[string]*mvccpb.KeyValue {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "member", "snap", "db"), 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]*mvccpb.KeyValue{}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("key")).ForEach(func(_, v []byte) error {
			kv := &mvccpb.KeyValue{}
			if err := kv.Unmarshal(v); err != nil {
				return err
			}
			if len(kv.Key) > 0 {
				out[string(kv.Key)] = kv
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
