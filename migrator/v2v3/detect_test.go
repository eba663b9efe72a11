package v2v3

import (
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// TestDetectV2AsEtcd36Does: DetectV2 tells v2 content (what a migration must carry, and what
// etcd 3.6 refuses to start on: its IsMetaStoreOnly) from v2 requests in the WAL tail that 3.6
// refuses to replay but that carry no content. Content is a node outside the membership (/0)
// in the snapshot, v2 auth users and roles and any other top-level directory with content
// included, or a v2 write to such a node in the WAL tail. A v2 read (QGET: etcd 3.4 answers
// /health with one; GET, SYNC) or a write of v2 auth's flag or empty directories is no content,
// yet 3.6 panics replaying it ("detected disallowed v2 WAL"): DetectV2 names it apart.
func TestDetectV2AsEtcd36Does(t *testing.T) {
	membership := []*etcdserverpb.Request{
		{Method: "PUT", Path: "/0/members/8e9e05c52164694d/attributes", Val: `{"name":"m","clientURLs":["http://127.0.0.1:2379"]}`},
		{Method: "PUT", Path: "/0/version", Val: "3.4.0"},
	}
	wal := func(reqs ...*etcdserverpb.Request) []*etcdserverpb.Request {
		return append(append([]*etcdserverpb.Request{}, membership...), reqs...)
	}
	cases := []struct {
		name       string
		store      func(t *testing.T, st v2store.Store)
		tail       []*etcdserverpb.Request
		content    bool
		why        string
		wantReplay string // "": no request 3.6 refuses to replay without content
	}{
		{"membership only", nil, membership, false, "no v2 content", ""},
		{"an empty auth tree", func(t *testing.T, st v2store.Store) {
			set(t, st, "/2/enabled", "false")
			mkdir(t, st, "/2/users")
			mkdir(t, st, "/2/roles")
		}, membership, false, "no v2 content", ""},
		{"a v2 key", func(t *testing.T, st v2store.Store) { set(t, st, "/1/registry/pods/a", "a") }, nil, true, "v2 keys in snapshot", ""},
		{"a v2 auth user", func(t *testing.T, st v2store.Store) {
			set(t, st, "/2/enabled", "false")
			set(t, st, "/2/users/alice", `{"user":"alice"}`)
		}, nil, true, "v2 keys in snapshot", ""},
		{"another top-level directory", func(t *testing.T, st v2store.Store) { set(t, st, "/3/x", "x") }, nil, true, "v2 keys in snapshot", ""},
		{"a v2 write in the WAL", nil, wal(&etcdserverpb.Request{Method: "PUT", Path: "/1/x", Val: "a"}), true, "v2 writes in the WAL", ""},
		{"a v2 delete in the WAL", nil, wal(&etcdserverpb.Request{Method: "DELETE", Path: "/1/registry/pods/a"}), true, "v2 writes in the WAL", ""},
		{"a v2 auth write in the WAL", nil, wal(&etcdserverpb.Request{Method: "PUT", Path: "/2/users/alice", Val: `{"user":"alice"}`}), true, "v2 writes in the WAL", ""},
		{"etcd 3.4's /health in the WAL", nil, wal(&etcdserverpb.Request{Method: "QGET"}), false, "no v2 content", "QGET"},
		{"a v2 quorum read in the WAL", nil, wal(&etcdserverpb.Request{Method: "QGET", Path: "/1/registry/pods/a"}), false, "no v2 content", "QGET /1/registry/pods/a"},
		{"a v2 sync in the WAL", nil, wal(&etcdserverpb.Request{Method: "SYNC"}), false, "no v2 content", "SYNC"},
		{"v2 auth's flag in the WAL", nil, wal(
			&etcdserverpb.Request{Method: "PUT", Path: "/2/enabled", Val: "false"},
			&etcdserverpb.Request{Method: "PUT", Path: "/2/users", Dir: true},
			&etcdserverpb.Request{Method: "PUT", Path: "/2/roles", Dir: true},
		), false, "no v2 content", "PUT /2/enabled"},
		{"a read and a write in the WAL", nil, wal(&etcdserverpb.Request{Method: "QGET"}, &etcdserverpb.Request{Method: "PUT", Path: "/1/x", Val: "a"}), true, "v2 writes in the WAL", "QGET"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := v2store.New("/0", "/1")
			set(t, st, "/0/members/8e9e05c52164694d/raftAttributes", `{"peerURLs":["http://127.0.0.1:2380"]}`)
			if tc.store != nil {
				tc.store(t, st)
			}
			dir := writeMember(t, st, tc.tail)
			f, err := DetectV2(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			if f.Content != tc.content || !strings.Contains(f.Why, tc.why) {
				t.Errorf("DetectV2: content %v (%s), want %v (%q)", f.Content, f.Why, tc.content, tc.why)
			}
			switch {
			case tc.wantReplay == "" && f.Replay != "":
				t.Errorf("DetectV2 names v2 requests 3.6 refuses to replay (%s), want none", f.Replay)
			case tc.wantReplay != "" && (!strings.Contains(f.Replay, tc.wantReplay) || !strings.Contains(f.Replay, "etcd 3.6 refuses to replay")):
				t.Errorf("DetectV2: replay %q, want it to name %q and etcd 3.6's refusal", f.Replay, tc.wantReplay)
			}
		})
	}
}

func set(t *testing.T, st v2store.Store, path, val string) {
	t.Helper()
	if _, err := st.Set(path, false, val, v2store.TTLOptionSet{}); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, st v2store.Store, path string) {
	t.Helper()
	if _, err := st.Set(path, true, "", v2store.TTLOptionSet{}); err != nil {
		t.Fatal(err)
	}
}
