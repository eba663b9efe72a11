package v2v3

import (
	"fmt"
	"sort"
	"strings"
	"time"
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
	// PrefixFrom/PrefixTo rewrite the start of every v2 key that begins with PrefixFrom (an
	// apiserver --etcd-prefix change). Keys outside PrefixFrom are kept as they are; a source
	// whose v3 store has a live key under PrefixFrom is refused (checkPrefixRewrite).
	PrefixFrom, PrefixTo string
	// Transformer is a program speaking etcdctl migrate's transformer protocol.
	Transformer string
}

// KV is one v3 key to write. Its value is either Value or, for a key streamed from the
// snapshot, the JSON string at raw in the snapshot (decoded when written).
type KV struct {
	Key, Value     []byte
	raw            span
	CreateRevision int64
	ModRevision    int64
	Lease          int64
	version        int64 // 0 means 1 (a new key)
}

func (kv *KV) streamed() bool { return kv.raw.n > 0 || kv.raw.off > 0 }

// value returns the key's value, decoding it from the snapshot data when streamed.
func (kv *KV) value(data, buf []byte) ([]byte, error) {
	if !kv.streamed() {
		return kv.Value, nil
	}
	return kv.raw.bytes(data, buf)
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
	Rewritten      int `json:"prefixRewritten,omitempty"`
	// TransformerIn/Out count the nodes a transformer was given and the keys it returned (it
	// may leave nodes out on purpose; the report shows both).
	TransformerIn  int `json:"transformerIn,omitempty"`
	TransformerOut int `json:"transformerOut,omitempty"`
	// LeaseLost counts TTL keys a transformer gave a new revision, so no lease could follow them.
	LeaseLost int `json:"transformerLeaseLost,omitempty"`
}

// node is a v2 node kept for a transformer: every node it will see, directories too.
type node struct {
	key    string // without the /1 prefix
	dir    bool
	kv     KV
	expire time.Time
	lease  int64
}

// collector turns v2 nodes of the user tree (/1) into v3 keys and leases (or, for a
// transformer, keeps the nodes).
type collector struct {
	o      Options
	kvs    []KV
	nodes  []node // with a transformer
	keep   bool
	leases map[int64]*Lease
	stats  TransformStats
}

func newCollector(o Options, keepNodes bool) *collector {
	return &collector{o: o, keep: keepNodes, leases: map[int64]*Lease{}}
}

func (c *collector) dir(path string, created, modified uint64, expire time.Time) {
	c.stats.Dirs++
	if c.keep && c.visible(path) {
		c.nodes = append(c.nodes, node{key: strings.TrimPrefix(path, "/1"), dir: true, kv: KV{CreateRevision: int64(created), ModRevision: int64(modified)}, expire: expire})
	}
}

// visible says whether a path is migrated as far as hidden segments go.
func (c *collector) visible(path string) bool {
	return c.o.IncludeHidden || !strings.Contains(path, "/_")
}

func (c *collector) file(path string, kv KV, expire time.Time) {
	key := strings.TrimPrefix(path, "/1")
	if strings.Contains(key, "/_") {
		c.stats.Hidden++
		if !c.o.IncludeHidden {
			c.stats.HiddenSkipped++
			return
		}
	}
	kv.Key = []byte(key)
	if !expire.IsZero() {
		if c.o.NoTTL {
			c.stats.TTLDropped++
			return
		}
		// Keys that expire in the same second share a lease; its ID is that second.
		sec := expire.Unix()
		if expire.Nanosecond() > 0 {
			sec++
		}
		ttl := sec - c.o.Now.Unix()
		if !expire.After(c.o.Now) || ttl <= 0 {
			c.stats.ExpiredDropped++
			return
		}
		l := c.leases[sec]
		if l == nil {
			l = &Lease{ID: sec, TTL: ttl}
			c.leases[sec] = l
		}
		l.Keys++
		kv.Lease = sec
		c.stats.TTLKeys++
	}
	if c.keep {
		c.nodes = append(c.nodes, node{key: key, kv: kv, expire: expire, lease: kv.Lease})
		return
	}
	c.kvs = append(c.kvs, kv)
}

// sortKVs orders keys by revision and refuses two keys on one revision.
func sortKVs(kvs []KV) error {
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].ModRevision < kvs[j].ModRevision })
	for i := 1; i < len(kvs); i++ {
		if kvs[i].ModRevision == kvs[i-1].ModRevision {
			return fmt.Errorf("keys %q and %q share revision %d", kvs[i-1].Key, kvs[i].Key, kvs[i].ModRevision)
		}
	}
	return nil
}

// rewritePrefix moves keys under from to under to, refusing a rewrite after which two keys
// would be the same.
func rewritePrefix(kvs []KV, from, to string) (int, error) {
	if from == to {
		return 0, nil
	}
	final := make(map[string]string, len(kvs)) // new key -> old key
	n := 0
	for i := range kvs {
		k := string(kvs[i].Key)
		nk := k
		if strings.HasPrefix(k, from) {
			nk = to + k[len(from):]
			kvs[i].Key = []byte(nk)
			n++
		}
		if old, dup := final[nk]; dup {
			return 0, fmt.Errorf("--prefix-from %s --prefix-to %s: %s and %s would both become %s", from, to, old, k, nk)
		}
		final[nk] = k
	}
	return n, nil
}

// hiddenPrefixes are the prefixes of p that end in a hidden segment, shortest first.
func hiddenPrefixes(p string) []string {
	var out []string
	for i := 0; i < len(p); {
		j := strings.IndexByte(p[i+1:], '/')
		end := len(p)
		if j >= 0 {
			end = i + 1 + j
		}
		if strings.HasPrefix(p[i:], "/_") {
			out = append(out, p[:end])
		}
		i = end
	}
	return out
}

// Progress reports a phase's progress (done of total; total 0 when unknown). Nil is silent.
type Progress func(phase string, done, total int64)

func (p Progress) report(phase string, done, total int64) {
	if p != nil {
		p(phase, done, total)
	}
}
