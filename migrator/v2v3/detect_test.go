package v2v3

import (
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// TestDetectV2AsEtcd36Does: DetectV2 finds what etcd 3.6 refuses to start on (its
// IsMetaStoreOnly and the v2 requests its WAL replay panics on), not only v2 keys: v2 auth
// users and roles, any top-level v2 directory other than the membership's with content, and
// any v2 request in the WAL tail other than a member's attributes or the cluster version. What
// 3.6 takes (membership, an auth tree left empty, those two kinds of request) is no v2 content.
func TestDetectV2AsEtcd36Does(t *testing.T) {
	membership := []*etcdserverpb.Request{
		{Method: "PUT", Path: "/0/members/8e9e05c52164694d/attributes", Val: `{"name":"m","clientURLs":["http://127.0.0.1:2379"]}`},
		{Method: "PUT", Path: "/0/version", Val: "3.4.0"},
	}
	cases := []struct {
		name  string
		store func(t *testing.T, st v2store.Store)
		tail  []*etcdserverpb.Request
		want  bool
		why   string
	}{
		{"membership only", nil, membership, false, "no v2 user content"},
		{"an empty auth tree", func(t *testing.T, st v2store.Store) {
			set(t, st, "/2/enabled", "false")
			mkdir(t, st, "/2/users")
			mkdir(t, st, "/2/roles")
		}, membership, false, "no v2 user content"},
		{"a v2 key", func(t *testing.T, st v2store.Store) { set(t, st, "/1/registry/pods/a", "a") }, nil, true, "v2 keys in snapshot"},
		{"a v2 auth user", func(t *testing.T, st v2store.Store) {
			set(t, st, "/2/enabled", "false")
			set(t, st, "/2/users/alice", `{"user":"alice"}`)
		}, nil, true, "v2 keys in snapshot"},
		{"another top-level directory", func(t *testing.T, st v2store.Store) { set(t, st, "/3/x", "x") }, nil, true, "v2 keys in snapshot"},
		{"a v2 write in the WAL", nil, []*etcdserverpb.Request{{Method: "PUT", Path: "/1/registry/pods/a", Val: "a"}}, true, "in the WAL"},
		{"a v2 auth write in the WAL", nil, []*etcdserverpb.Request{{Method: "PUT", Path: "/2/users/alice", Val: `{"user":"alice"}`}}, true, "in the WAL"},
		{"a v2 quorum read in the WAL", nil, []*etcdserverpb.Request{{Method: "QGET", Path: "/1/registry/pods/a"}}, true, "in the WAL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := v2store.New("/0", "/1")
			set(t, st, "/0/members/8e9e05c52164694d/raftAttributes", `{"peerURLs":["http://127.0.0.1:2380"]}`)
			if tc.store != nil {
				tc.store(t, st)
			}
			dir := writeMember(t, st, tc.tail)
			has, why, err := DetectV2(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			if has != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("DetectV2: %v (%s), want %v (%q)", has, why, tc.want, tc.why)
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
