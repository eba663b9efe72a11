package v2v3

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/raft/v3/raftpb"
)

// etcd keeps its membership in the v2 store too (/0/members/<id>/raftAttributes and
// attributes, /0/removed_members/<id>, /0/version), and each write there takes a v2 index like
// a key's. So a conf change in the WAL tail (the first entries of every member that has not
// taken a snapshot yet are its initial members' adds) moves the index of every key written
// after it. The replay applies them as etcd does: only if etcd's validation passes, against
// the membership in the same store (etcd's membership.ValidateConfigurationChange), with the
// same store operations.

const (
	membersDir  = "/0/members"
	removedDir  = "/0/removed_members"
	maxLearners = 1 // etcd's
)

// memberAttributesPath is a member's attributes key, which 3.4 members publish with a v2 PUT.
var memberAttributesPath = regexp.MustCompile(`^/0/members/([0-9a-f]+)/attributes$`)

// hexID is a member ID as etcd names it in the store: hex, without padding (types.ID).
func hexID(id uint64) string { return strconv.FormatUint(id, 16) }

// raftAttributes is a member's raftAttributes value, in etcd's JSON.
type raftAttributes struct {
	PeerURLs  []string `json:"peerURLs"`
	IsLearner bool     `json:"isLearner,omitempty"`
}

// memberChange is a conf change entry: its context is the member (membership.Member, or
// ConfigChangeContext with isPromote for an add), empty for a removal.
type memberChange struct {
	typ     raftpb.ConfChangeType
	id      uint64
	attrs   raftAttributes
	promote bool
}

func decodeConfChange(data []byte) (*memberChange, error) {
	var cc raftpb.ConfChange
	if err := cc.Unmarshal(data); err != nil {
		return nil, fmt.Errorf("conf change: %w", err)
	}
	m := &memberChange{typ: cc.Type, id: cc.NodeID}
	if cc.Type == raftpb.ConfChangeRemoveNode {
		return m, nil
	}
	var ctx struct {
		raftAttributes
		ID        uint64 `json:"id"`
		IsPromote bool   `json:"isPromote"`
	}
	if err := json.Unmarshal(cc.Context, &ctx); err != nil {
		return nil, fmt.Errorf("conf change %v of member %s: its context is no member: %w", cc.Type, hexID(cc.NodeID), err)
	}
	m.attrs, m.promote = ctx.raftAttributes, ctx.IsPromote
	return m, nil
}

// membership reads the members and the removed members from the store's /0.
func membership(st v2store.Store) (members map[uint64]raftAttributes, removed map[uint64]bool) {
	members, removed = map[uint64]raftAttributes{}, map[uint64]bool{}
	if ev, err := st.Get(membersDir, true, true); err == nil {
		for _, n := range ev.Node.Nodes {
			id, err := strconv.ParseUint(path.Base(n.Key), 16, 64)
			if err != nil {
				continue
			}
			var a raftAttributes
			for _, c := range n.Nodes {
				if path.Base(c.Key) == "raftAttributes" && c.Value != nil {
					_ = json.Unmarshal([]byte(*c.Value), &a)
				}
			}
			members[id] = a
		}
	}
	if ev, err := st.Get(removedDir, false, false); err == nil {
		for _, n := range ev.Node.Nodes {
			if id, err := strconv.ParseUint(path.Base(n.Key), 16, 64); err == nil {
				removed[id] = true
			}
		}
	}
	return members, removed
}

// applyMemberChange applies a conf change to the store as etcd does, if etcd's validation lets
// it: an add writes the member's raftAttributes, a promotion or an update rewrites them, a
// removal deletes the member's dir and records it as removed.
func applyMemberChange(st v2store.Store, m *memberChange) outcome {
	members, removed := membership(st)
	cur, exists := members[m.id]
	key := path.Join(membersDir, hexID(m.id), "raftAttributes")
	if removed[m.id] {
		return outcomeRefused
	}
	var err error
	switch {
	case m.typ == raftpb.ConfChangeRemoveNode && exists:
		if _, err = st.Delete(path.Join(membersDir, hexID(m.id)), true, true); err == nil {
			_, err = st.Create(path.Join(removedDir, hexID(m.id)), false, "", false, permanent)
		}
	case m.typ == raftpb.ConfChangeUpdateNode && exists && !peerURLTaken(members, m.attrs.PeerURLs, m.id):
		cur.PeerURLs = m.attrs.PeerURLs // etcd updates the peer URLs only: a learner stays one
		_, err = st.Update(key, marshalAttrs(cur), permanent)
	case m.typ != raftpb.ConfChangeAddNode && m.typ != raftpb.ConfChangeAddLearnerNode:
		return outcomeRefused
	case m.promote && exists && cur.IsLearner:
		cur.IsLearner = false
		_, err = st.Update(key, marshalAttrs(cur), permanent)
	case !m.promote && !exists && !peerURLTaken(members, m.attrs.PeerURLs, 0) && (!m.attrs.IsLearner || learners(members) < maxLearners):
		_, err = st.Create(key, false, marshalAttrs(m.attrs), false, permanent)
	default:
		return outcomeRefused
	}
	if err != nil {
		return outcomeRefused
	}
	return outcomeApplied
}

var permanent = v2store.TTLOptionSet{ExpireTime: v2store.Permanent}

func marshalAttrs(a raftAttributes) string {
	b, _ := json.Marshal(a) // a struct of strings and a bool
	return string(b)
}

// peerURLTaken says whether a member other than except already has one of urls.
func peerURLTaken(members map[uint64]raftAttributes, urls []string, except uint64) bool {
	for id, a := range members {
		if id != except && slices.ContainsFunc(urls, func(u string) bool { return slices.Contains(a.PeerURLs, u) }) {
			return true
		}
	}
	return false
}

func learners(members map[uint64]raftAttributes) int {
	n := 0
	for _, a := range members {
		if a.IsLearner {
			n++
		}
	}
	return n
}

// removedMemberAttributes says whether r publishes the attributes of a removed member, which
// etcd skips (it takes no index).
func removedMemberAttributes(st v2store.Store, r *etcdserverpb.Request) bool {
	m := memberAttributesPath.FindStringSubmatch(r.Path)
	if m == nil {
		return false
	}
	_, err := st.Get(path.Join(removedDir, m[1]), false, false)
	return err == nil
}

// membershipRequest is etcd 3.5's v3 request that sets a member's attributes or the cluster
// version, as the v2 PUT of 3.4 that writes the same into the store (nil for any other).
func membershipRequest(irr *etcdserverpb.InternalRaftRequest) *etcdserverpb.Request {
	switch {
	case irr.ClusterMemberAttrSet != nil:
		a := irr.ClusterMemberAttrSet.MemberAttributes
		var name string
		var urls []string
		if a != nil {
			name, urls = a.Name, a.ClientUrls
		}
		b, _ := json.Marshal(struct {
			Name       string   `json:"name,omitempty"`
			ClientURLs []string `json:"clientURLs,omitempty"`
		}{name, urls})
		return &etcdserverpb.Request{Method: "PUT", Path: path.Join(membersDir, hexID(irr.ClusterMemberAttrSet.Member_ID), "attributes"), Val: string(b)}
	case irr.ClusterVersionSet != nil:
		return &etcdserverpb.Request{Method: "PUT", Path: "/0/version", Val: irr.ClusterVersionSet.Ver}
	}
	return nil
}
