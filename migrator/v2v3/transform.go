package v2v3

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// Options change how v2 nodes become v3 keys.
type Options struct {
	// NoTTL drops keys with a TTL (etcdctl migrate's --no-ttl) instead of giving them leases.
	NoTTL bool
	// IncludeHidden migrates hidden keys (a path segment starting with "_"); etcdctl migrate
	// loses them silently, kubefence counts them and leaves them out unless asked.
	IncludeHidden bool
	// Now is the clock TTLs are measured against (--ttl-clock pins it for repeatable runs).
	Now time.Time
}

// KV is one v3 key to write.
type KV struct {
	Key, Value     []byte
	CreateRevision int64
	ModRevision    int64
	Lease          int64
}

// Lease is a v3 lease for the keys that expire in the same second.
type Lease struct {
	ID   int64 `json:"id"`
	TTL  int64 `json:"ttlSeconds"`
	Keys int   `json:"keys"`
}

// TransformStats counts what became of the v2 nodes.
type TransformStats struct {
	Keys           int `json:"keys"`           // v3 keys written
	Dirs           int `json:"dirs"`           // v2 directories (no v3 key)
	TTLKeys        int `json:"ttlKeys"`        // keys given a lease
	ExpiredDropped int `json:"expiredDropped"` // TTL keys already expired at Now
	TTLDropped     int `json:"ttlDropped"`     // TTL keys dropped by NoTTL
	Hidden         int `json:"hidden"`         // hidden keys found
	HiddenSkipped  int `json:"hiddenSkipped"`  // ... and left out
}

// storeNode is v2store's own JSON shape of a node (Save's output).
type storeNode struct {
	Path          string
	CreatedIndex  uint64
	ModifiedIndex uint64
	ExpireTime    time.Time
	Value         string
	Children      map[string]*storeNode
}

// transform turns the user tree (/1) of the store into v3 keys and leases, sorted by revision.
func transform(st v2store.Store, o Options) ([]KV, map[int64]*Lease, TransformStats, error) {
	var stats TransformStats
	data, err := st.SaveNoCopy()
	if err != nil {
		return nil, nil, stats, err
	}
	var root struct{ Root *storeNode }
	if err := json.Unmarshal(data, &root); err != nil {
		return nil, nil, stats, fmt.Errorf("read back the v2 store: %w", err)
	}
	user := root.Root.Children["1"]
	if user == nil {
		return nil, nil, stats, nil
	}
	var kvs []KV
	leases := map[int64]*Lease{}
	var walk func(n *storeNode, hidden bool)
	walk = func(n *storeNode, hidden bool) {
		name := n.Path[strings.LastIndexByte(n.Path, '/')+1:]
		hidden = hidden || strings.HasPrefix(name, "_")
		if n.Children != nil {
			stats.Dirs++
			for _, c := range n.Children {
				walk(c, hidden)
			}
			return
		}
		if hidden {
			stats.Hidden++
			if !o.IncludeHidden {
				stats.HiddenSkipped++
				return
			}
		}
		kv := KV{Key: []byte(strings.TrimPrefix(n.Path, "/1")), Value: []byte(n.Value), CreateRevision: int64(n.CreatedIndex), ModRevision: int64(n.ModifiedIndex)}
		if !n.ExpireTime.IsZero() {
			if o.NoTTL {
				stats.TTLDropped++
				return
			}
			// Keys that expire in the same second share a lease; its ID is that second.
			sec := n.ExpireTime.Unix()
			if n.ExpireTime.Nanosecond() > 0 {
				sec++
			}
			ttl := sec - o.Now.Unix()
			if !n.ExpireTime.After(o.Now) || ttl <= 0 {
				stats.ExpiredDropped++
				return
			}
			l := leases[sec]
			if l == nil {
				l = &Lease{ID: sec, TTL: ttl}
				leases[sec] = l
			}
			l.Keys++
			kv.Lease = sec
			stats.TTLKeys++
		}
		kvs = append(kvs, kv)
	}
	for _, c := range user.Children {
		walk(c, false)
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].ModRevision < kvs[j].ModRevision })
	for i := 1; i < len(kvs); i++ {
		if kvs[i].ModRevision == kvs[i-1].ModRevision {
			return nil, nil, stats, fmt.Errorf("keys %q and %q share modified index %d: the v2 store is inconsistent", kvs[i-1].Key, kvs[i].Key, kvs[i].ModRevision)
		}
	}
	stats.Keys = len(kvs)
	return kvs, leases, stats, nil
}
