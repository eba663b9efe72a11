package v2v3

import (
	"encoding/json"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/membershippb"
	"go.etcd.io/raft/v3/raftpb"
)

// walEntry is one entry of a test WAL tail.
type walEntry func(t *testing.T) raftpb.Entry

func confChange(typ raftpb.ConfChangeType, id uint64, ctx any) walEntry {
	return func(t *testing.T) raftpb.Entry {
		cc := raftpb.ConfChange{Type: typ, NodeID: id}
		if ctx != nil {
			b, err := json.Marshal(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cc.Context = b
		}
		data, err := cc.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return raftpb.Entry{Type: raftpb.EntryConfChange, Data: data}
	}
}

// member is a conf change's context as etcd writes it (membership.ConfigChangeContext).
type member struct {
	ID        uint64   `json:"id"`
	PeerURLs  []string `json:"peerURLs"`
	IsLearner bool     `json:"isLearner,omitempty"`
	IsPromote bool     `json:"isPromote,omitempty"`
}

func add(id uint64, url string) walEntry {
	return confChange(raftpb.ConfChangeAddNode, id, member{ID: id, PeerURLs: []string{url}})
}
func addLearner(id uint64, url string) walEntry {
	return confChange(raftpb.ConfChangeAddLearnerNode, id, member{ID: id, PeerURLs: []string{url}, IsLearner: true})
}
func promote(id uint64, url string) walEntry {
	return confChange(raftpb.ConfChangeAddNode, id, member{ID: id, PeerURLs: []string{url}, IsPromote: true})
}
func remove(id uint64) walEntry { return confChange(raftpb.ConfChangeRemoveNode, id, nil) }
func update(id uint64, url string) walEntry {
	return confChange(raftpb.ConfChangeUpdateNode, id, member{ID: id, PeerURLs: []string{url}})
}

func internal(r *etcdserverpb.InternalRaftRequest) walEntry {
	return func(t *testing.T) raftpb.Entry {
		data, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return raftpb.Entry{Type: raftpb.EntryNormal, Data: data}
	}
}
func v2Put(path, val string) walEntry {
	return internal(&etcdserverpb.InternalRaftRequest{V2: &etcdserverpb.Request{Method: "PUT", Path: path, Val: val}})
}

// TestMemberChangesTakeIndices: etcd writes its membership into the v2 store (/0), and each
// write takes a v2 index like a key's: a conf change adds (or promotes, or updates) a member's
// raftAttributes (1 index) or removes its dir and records it as removed (2); a member's
// attributes and the cluster version are set through v2 PUTs (3.4) or v3 requests (3.5); a
// removed member's attributes and a conf change etcd's validation refuses take none. The key
// after them must get the index etcd gave it. "fresh member" is a real etcd 3.4's WAL before its
// first snapshot: its v2 API gave the key index 4.
func TestMemberChangesTakeIndices(t *testing.T) {
	const a, b, c = "http://10.0.0.1:2380", "http://10.0.0.2:2380", "http://10.0.0.3:2380"
	attrs := func(id uint64) walEntry { return v2Put("/0/members/"+hexID(id)+"/attributes", `{"name":"m"}`) }
	cases := []struct {
		name string
		tail []walEntry
		want int64 // the index of the key written after the tail
	}{
		{"fresh member", []walEntry{add(1, a), attrs(1), v2Put("/0/version", "3.4.0")}, 4},
		{"three members", []walEntry{add(1, a), add(2, b), add(3, c)}, 4},
		{"a removal", []walEntry{add(1, a), add(2, b), remove(2)}, 5},
		{"a removed member's attributes", []walEntry{add(1, a), add(2, b), remove(2), attrs(2)}, 5},
		{"an ID added twice", []walEntry{add(1, a), add(1, b)}, 2},
		{"a removed ID added again", []walEntry{add(1, a), add(2, b), remove(2), add(2, b)}, 5},
		{"a peer URL taken", []walEntry{add(1, a), add(2, a)}, 2},
		{"an unknown member removed", []walEntry{add(1, a), remove(9)}, 2},
		{"a learner promoted", []walEntry{add(1, a), addLearner(2, b), promote(2, b)}, 4},
		{"a voter promoted", []walEntry{add(1, a), promote(1, a)}, 2},
		{"a second learner", []walEntry{add(1, a), addLearner(2, b), addLearner(3, c)}, 3},
		{"an update", []walEntry{add(1, a), update(1, b)}, 3},
		// An update takes the peer URLs only: the learner stays one, and can be promoted.
		{"a learner updated, then promoted", []walEntry{add(1, a), addLearner(2, b), update(2, c), promote(2, c)}, 5},
		{"an update to a taken URL", []walEntry{add(1, a), add(2, b), update(1, b)}, 3},
		{"an unknown member updated", []walEntry{add(1, a), update(5, b)}, 2},
		{"etcd 3.5's attributes and version", []walEntry{add(1, a),
			internal(&etcdserverpb.InternalRaftRequest{ClusterMemberAttrSet: &membershippb.ClusterMemberAttrSetRequest{Member_ID: 1, MemberAttributes: &membershippb.Attributes{Name: "m"}}}),
			internal(&etcdserverpb.InternalRaftRequest{ClusterVersionSet: &membershippb.ClusterVersionSetRequest{Ver: "3.5.0"}})}, 4},
		{"etcd 3.5's attributes of a removed member", []walEntry{add(1, a), add(2, b), remove(2),
			internal(&etcdserverpb.InternalRaftRequest{ClusterMemberAttrSet: &membershippb.ClusterMemberAttrSetRequest{Member_ID: 2, MemberAttributes: &membershippb.Attributes{Name: "m"}}})}, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ents []raftpb.Entry
			for i, e := range append(tc.tail, v2Put("/1/k", "v")) {
				ent := e(t)
				ent.Index = uint64(i + 1)
				ents = append(ents, ent)
			}
			res, err := readV2(&Source{Entries: ents}, Options{Now: time.Now()}, false, false, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.c.kvs) != 1 || res.c.kvs[0].ModRevision != tc.want || res.c.kvs[0].CreateRevision != tc.want {
				t.Fatalf("keys %+v, want /k at revision %d", res.c.kvs, tc.want)
			}
		})
	}
}
