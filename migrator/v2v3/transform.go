package v2v3

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unsafe"

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
	version        int64 // 0 means 1 (a new key)
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

// transform turns the user tree (/1) of the store into v3 keys and leases, sorted by revision.
// It walks the store's own nodes through Get (keys and values share the store's memory), then
// looks up the hidden paths by name, since Get does not list them.
func transform(st v2store.Store, hidden map[string]bool, o Options) ([]KV, map[int64]*Lease, TransformStats, error) {
	var stats TransformStats
	w := &walker{o: o, leases: map[int64]*Lease{}, stats: &stats, seen: map[string]bool{}}
	ev, err := st.Get("/1", true, true)
	if err != nil {
		return nil, nil, stats, fmt.Errorf("read the v2 store: %w", err)
	}
	for _, n := range ev.Node.Nodes {
		w.walk(n)
	}
	// Hidden subtrees: shortest first, so that a path under an already walked one is skipped.
	paths := make([]string, 0, len(hidden))
	for p := range hidden {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		root := hiddenRoot(p)
		if w.seen[root] {
			continue
		}
		w.seen[root] = true
		ev, err := st.Get(root, true, true)
		if err != nil {
			continue // deleted since
		}
		w.walk(ev.Node)
	}
	kvs := w.kvs
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].ModRevision < kvs[j].ModRevision })
	for i := 1; i < len(kvs); i++ {
		if kvs[i].ModRevision == kvs[i-1].ModRevision {
			return nil, nil, stats, fmt.Errorf("keys %q and %q share modified index %d: the v2 store is inconsistent", kvs[i-1].Key, kvs[i].Key, kvs[i].ModRevision)
		}
	}
	stats.Keys = len(kvs)
	return kvs, w.leases, stats, nil
}

// hiddenRoot is the path up to and including its first hidden segment.
func hiddenRoot(p string) string {
	i := strings.Index(p, "/_")
	if j := strings.IndexByte(p[i+1:], '/'); j >= 0 {
		return p[:i+1+j]
	}
	return p
}

type walker struct {
	o      Options
	kvs    []KV
	leases map[int64]*Lease
	stats  *TransformStats
	seen   map[string]bool
}

func (w *walker) walk(n *v2store.NodeExtern) {
	if n.Dir {
		w.stats.Dirs++
		for _, c := range n.Nodes {
			w.walk(c)
		}
		return
	}
	var expire time.Time
	if n.Expiration != nil {
		expire = *n.Expiration
	}
	value := ""
	if n.Value != nil {
		value = *n.Value
	}
	w.file(n.Key, value, n.CreatedIndex, n.ModifiedIndex, expire)
}

func (w *walker) file(path, value string, created, modified uint64, expire time.Time) {
	key := strings.TrimPrefix(path, "/1")
	if strings.Contains(key, "/_") {
		w.stats.Hidden++
		if !w.o.IncludeHidden {
			w.stats.HiddenSkipped++
			return
		}
	}
	// Keys and values share the decoded strings' memory (never modified) instead of copying.
	kv := KV{Key: unsafe.Slice(unsafe.StringData(key), len(key)), Value: unsafe.Slice(unsafe.StringData(value), len(value)), CreateRevision: int64(created), ModRevision: int64(modified)}
	if !expire.IsZero() {
		if w.o.NoTTL {
			w.stats.TTLDropped++
			return
		}
		// Keys that expire in the same second share a lease; its ID is that second.
		sec := expire.Unix()
		if expire.Nanosecond() > 0 {
			sec++
		}
		ttl := sec - w.o.Now.Unix()
		if !expire.After(w.o.Now) || ttl <= 0 {
			w.stats.ExpiredDropped++
			return
		}
		l := w.leases[sec]
		if l == nil {
			l = &Lease{ID: sec, TTL: ttl}
			w.leases[sec] = l
		}
		l.Keys++
		kv.Lease = sec
		w.stats.TTLKeys++
	}
	w.kvs = append(w.kvs, kv)
}
