package v2v3

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/raft/v3/raftpb"
)

// ReplayStats counts what the WAL replay did.
type ReplayStats struct {
	Entries int `json:"entries"`
	Applied int `json:"applied"` // v2 writes that changed the store
	Refused int `json:"refused"` // v2 writes the store refused (failed CAS, ...), as etcd did
	Syncs   int `json:"syncs"`   // SYNC requests (TTL expiry as of their time)
	Ignored int `json:"ignored"` // reads (QGET), conf changes, v3-only and empty entries
}

// buildStore loads the snapshot's v2 store and replays the committed WAL entries on it. It also
// returns every user path with a hidden segment ("/_") that the snapshot or the WAL mentions:
// v2store's Get hides such nodes, so the transform looks them up by name.
func buildStore(src *Source) (v2store.Store, ReplayStats, map[string]bool, error) {
	st := v2store.New("/0", "/1")
	var rs ReplayStats
	hidden := hiddenPaths(src.Snapshot.Data)
	if len(src.Snapshot.Data) > 0 {
		if err := st.Recovery(src.Snapshot.Data); err != nil {
			return nil, rs, nil, fmt.Errorf("load v2 snapshot %s: %w", src.SnapshotFile, err)
		}
	}
	for _, e := range src.Entries {
		rs.Entries++
		if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
			rs.Ignored++
			continue
		}
		req, err := v2Request(e.Data)
		if err != nil {
			return nil, rs, nil, fmt.Errorf("WAL entry %d: %w", e.Index, err)
		}
		if req == nil {
			rs.Ignored++
			continue
		}
		if strings.HasPrefix(req.Path, "/1/") && strings.Contains(req.Path, "/_") {
			hidden[req.Path] = true
		}
		switch applyV2(st, req) {
		case outcomeApplied:
			rs.Applied++
		case outcomeRefused:
			rs.Refused++
		case outcomeSync:
			rs.Syncs++
		default:
			rs.Ignored++
		}
	}
	return st, rs, hidden, nil
}

// hiddenPaths finds the user paths with a hidden segment in a v2 snapshot's JSON by scanning
// its "Path" fields, without decoding it.
func hiddenPaths(snapJSON []byte) map[string]bool {
	out := map[string]bool{}
	marker := []byte(`"Path":"/1/`)
	for rest := snapJSON; ; {
		i := bytes.Index(rest, marker)
		if i < 0 {
			return out
		}
		rest = rest[i+len(`"Path":"`):]
		end := bytes.IndexByte(rest, '"')
		if end < 0 {
			return out
		}
		if p := rest[:end]; bytes.Contains(p, []byte("/_")) {
			out[string(p)] = true
		}
		rest = rest[end:]
	}
}

// v2Request decodes an entry: an InternalRaftRequest whose V2 field is set, or (older WALs) a
// bare v2 Request. It returns nil for v3 requests.
func v2Request(data []byte) (*etcdserverpb.Request, error) {
	var irr etcdserverpb.InternalRaftRequest
	if err := irr.Unmarshal(data); err == nil {
		return irr.V2, nil
	}
	var r etcdserverpb.Request
	if err := r.Unmarshal(data); err != nil {
		return nil, fmt.Errorf("neither a raft request nor a v2 request: %w", err)
	}
	return &r, nil
}

type outcome int

const (
	outcomeIgnored outcome = iota
	outcomeApplied
	outcomeRefused
	outcomeSync
)

// applyV2 applies one v2 request with etcd's semantics: which store operation a method and its
// preconditions mean. A refused operation (failed compare, missing key, ...) leaves the store
// and its index unchanged, as it did on the member.
func applyV2(st v2store.Store, r *etcdserverpb.Request) outcome {
	ttl := v2store.TTLOptionSet{Refresh: r.Refresh != nil && *r.Refresh}
	if r.Expiration != 0 {
		ttl.ExpireTime = time.Unix(0, r.Expiration)
	}
	var err error
	switch r.Method {
	case "POST":
		_, err = st.Create(r.Path, r.Dir, r.Val, true, ttl)
	case "PUT":
		switch {
		case r.PrevExist != nil && *r.PrevExist:
			if r.PrevIndex == 0 && r.PrevValue == "" {
				_, err = st.Update(r.Path, r.Val, ttl)
			} else {
				_, err = st.CompareAndSwap(r.Path, r.PrevValue, r.PrevIndex, r.Val, ttl)
			}
		case r.PrevExist != nil:
			_, err = st.Create(r.Path, r.Dir, r.Val, false, ttl)
		case r.PrevIndex > 0 || r.PrevValue != "":
			_, err = st.CompareAndSwap(r.Path, r.PrevValue, r.PrevIndex, r.Val, ttl)
		default:
			_, err = st.Set(r.Path, r.Dir, r.Val, ttl)
		}
	case "DELETE":
		if r.PrevIndex > 0 || r.PrevValue != "" {
			_, err = st.CompareAndDelete(r.Path, r.PrevValue, r.PrevIndex)
		} else {
			_, err = st.Delete(r.Path, r.Dir, r.Recursive)
		}
	case "SYNC":
		st.DeleteExpiredKeys(time.Unix(0, r.Time))
		return outcomeSync
	default: // QGET, GET, HEAD: reads
		return outcomeIgnored
	}
	if err != nil {
		return outcomeRefused
	}
	return outcomeApplied
}
