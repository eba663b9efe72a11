package v2v3

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"time"
	"unsafe"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	"go.etcd.io/raft/v3/raftpb"
)

// ReplayStats counts what the WAL replay did.
type ReplayStats struct {
	Entries int `json:"entries"`
	Applied int `json:"applied"` // v2 writes and conf changes that changed the store
	Refused int `json:"refused"` // v2 writes the store refused (failed CAS, ...) and conf changes etcd's validation refused, as etcd did
	Syncs   int `json:"syncs"`   // SYNC requests (TTL expiry as of their time)
	Ignored int `json:"ignored"` // reads (QGET), v3-only and empty entries, a removed member's attributes
	// Overlay is how many snapshot nodes the replay needed in memory (the rest were streamed).
	Overlay int `json:"overlayNodes"`
}

// touchSet says which snapshot nodes the WAL replay can change: the paths its writes name,
// everything under them, their ancestors, the membership tree, and (when the tail holds a SYNC,
// which expires keys anywhere) every directory and every TTL node that expires by the last
// SYNC's time (a SYNC deletes the nodes whose expiry is not after its time; a later one
// no SYNC of the tail can reach). Only those nodes are loaded into a v2store for the replay;
// every other node is final as the snapshot has it.
type touchSet struct {
	touched   map[string]bool
	ancestors map[string]bool
	syncs     bool
	lastSync  time.Time
	all       bool // load everything (the tests' reference)
}

func newTouchSet(reqs []*etcdserverpb.Request) *touchSet {
	t := &touchSet{touched: map[string]bool{}, ancestors: map[string]bool{"/": true}}
	for _, r := range reqs {
		switch r.Method {
		case "GET", "QGET", "HEAD": // reads change nothing (etcd 3.4's /health: a QGET of the root)
			continue
		}
		if r.Method == "SYNC" {
			if at := time.Unix(0, r.Time); !t.syncs || at.After(t.lastSync) {
				t.lastSync = at
			}
			t.syncs = true
			continue
		}
		p := path.Clean(path.Join("/", r.Path))
		t.touched[p] = true
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			t.ancestors[d] = true
		}
	}
	return t
}

func (t *touchSet) classify(p string, dir bool, expire time.Time, forced bool) (keep, force bool) {
	switch {
	case forced || t.all || t.touched[p] || p == "/0" || strings.HasPrefix(p, "/0/"):
		return true, true
	case t.syncs && !expire.IsZero() && !expire.After(t.lastSync):
		return true, true
	case p == "/" || t.ancestors[p] || (t.syncs && dir):
		return true, false
	}
	return false, false
}

// ovNode is a node of the overlay store, in the JSON shape v2store's Recovery reads.
type ovNode struct {
	Path          string
	CreatedIndex  uint64
	ModifiedIndex uint64
	ExpireTime    time.Time
	Value         string
	Children      map[string]*ovNode
}

// scanVisit sends each snapshot node either to the overlay or straight to the collector.
type scanVisit struct {
	t     *touchSet
	c     *collector
	data  []byte
	root  *ovNode
	stack []*ovNode
	// expires holds, for each directory the scan is in, when it expires with its ancestors
	// (the earliest of theirs: a directory's expiry deletes everything under it).
	expires []time.Time
	hidden  map[string]bool
	kept    int
	auth    *v2Auth // what the nodes not kept say of v2 auth
}

func (v *scanVisit) node(n *v2Node, forced bool) (bool, bool, error) {
	keep, force := v.t.classify(n.path, n.dir, n.expire, forced)
	expire := n.expire
	if len(v.expires) > 0 {
		expire = earliest(expire, v.expires[len(v.expires)-1])
	}
	if n.dir {
		v.expires = append(v.expires, expire)
	}
	if !keep {
		if strings.HasPrefix(n.path, "/2/") {
			value, err := n.value.bytes(v.data, nil)
			if err != nil {
				return false, false, err
			}
			v.auth.note(n.path, n.dir, string(value))
		}
		if strings.HasPrefix(n.path, "/1/") {
			if n.dir {
				v.c.dir(n.path, n.created, n.modified, expire)
			} else {
				v.c.file(n.path, KV{raw: n.value, CreateRevision: int64(n.created), ModRevision: int64(n.modified)}, expire)
			}
		}
		return false, false, nil
	}
	v.kept++
	o := &ovNode{Path: n.path, CreatedIndex: n.created, ModifiedIndex: n.modified, ExpireTime: n.expire}
	if n.dir {
		o.Children = map[string]*ovNode{}
	} else {
		val, err := n.value.bytes(v.data, nil)
		if err != nil {
			return false, false, fmt.Errorf("value of %s: %w", n.path, err)
		}
		o.Value = string(val)
	}
	if strings.HasPrefix(n.path, "/1/") && strings.Contains(n.path, "/_") {
		v.hidden[n.path] = true
	}
	if n.path == "/" {
		v.root = o
	} else if len(v.stack) > 0 {
		v.stack[len(v.stack)-1].Children[path.Base(n.path)] = o
	} else {
		return false, false, fmt.Errorf("v2 snapshot: node %s outside the root", n.path)
	}
	if n.dir {
		v.stack = append(v.stack, o)
	}
	return true, force, nil
}

func (v *scanVisit) leave(_ *v2Node, kept bool) {
	v.expires = v.expires[:len(v.expires)-1]
	if kept {
		v.stack = v.stack[:len(v.stack)-1]
	}
}

// earliest is the earlier of two expiry times, the zero time meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// bytes returns the span's value, unescaped (appended to buf), or a slice of data when it has
// no escapes.
func (s span) bytes(data, buf []byte) ([]byte, error) {
	raw := data[s.off : s.off+int64(s.n)]
	if !s.esc {
		return append(buf, raw...), nil
	}
	return appendUnescaped(buf, raw)
}

// v2Result is the v2 side of a migration.
type v2Result struct {
	c      *collector
	replay ReplayStats
	index  uint64 // the store's index after the replay
	auth   v2Auth
}

// v2Auth is what a v2 store says of v2 auth (under /2), which a migration does not carry: v3
// has an auth store of its own.
type v2Auth struct {
	enabled      bool
	users, roles []string
}

// note takes one node of /2 into account.
func (a *v2Auth) note(path string, dir bool, value string) {
	switch {
	case path == "/2/enabled":
		a.enabled = value == "true"
	case dir:
	case strings.HasPrefix(path, "/2/users/"):
		a.users = append(a.users, strings.TrimPrefix(path, "/2/users/"))
	case strings.HasPrefix(path, "/2/roles/"):
		a.roles = append(a.roles, strings.TrimPrefix(path, "/2/roles/"))
	}
}

// noteStore takes into account the /2 nodes of st (the replay's overlay: those the WAL tail
// touched, which the scan kept and did not note).
func (a *v2Auth) noteStore(st v2store.Store) {
	ev, err := st.Get("/2", true, false)
	if err != nil {
		return // none
	}
	var walk func(n *v2store.NodeExtern)
	walk = func(n *v2store.NodeExtern) {
		value := ""
		if n.Value != nil {
			value = *n.Value
		}
		a.note(n.Key, n.Dir, value)
		for _, ch := range n.Nodes {
			walk(ch)
		}
	}
	for _, n := range ev.Node.Nodes {
		walk(n)
	}
}

// warning says what becomes of v2 auth, "" when there was none (the flag off and nothing else,
// as etcd 3.5 with --enable-v2 writes it). v3Kept says whether the source's v3 store (its auth
// with it) is carried over, enabled whether its v3 auth is on.
func (a *v2Auth) warning(v3Kept, enabled bool) string {
	if !a.enabled && len(a.users) == 0 && len(a.roles) == 0 {
		return ""
	}
	slices.Sort(a.users)
	slices.Sort(a.roles)
	head := fmt.Sprintf("v2 auth was %s (users: %s; roles: %s) and is not carried over: v3 has an auth store of its own", onOff(a.enabled), listOrNone(a.users), listOrNone(a.roles))
	if v3Kept && enabled {
		return head + ", carried over from the source's v3 store with v3 auth on: check that its users and roles give v2's their access"
	}
	return head + ", and on the migrated member v3 auth is off, so any client that reaches etcd reads and writes every key. Set up v3 auth before it serves (etcdctl user add, role add, user grant-role, auth enable)"
}

// v3AuthWarning says that the source's v3 auth is not carried over, "" when it holds none or
// is (v3Kept: the source's v3 store, which holds keys, is the base of the output).
func v3AuthWarning(a v3AuthState, v3Kept bool) string {
	if v3Kept || !a.set() {
		return ""
	}
	return fmt.Sprintf("the source's v3 auth was %s (%d users, %d roles) but its v3 store holds no keys, so the output's v3 store is built afresh (keeping the v2 revisions) without it: on the migrated member v3 auth is off, and any client that reaches etcd reads and writes every key. Set up v3 auth again before it serves (etcdctl user add, role add, user grant-role, auth enable)",
		onOff(a.enabled), a.users, a.roles)
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// readV2 builds the final v2 state: the snapshot, streamed, with the committed WAL tail
// replayed by kubefence's applier on an overlay store that holds only the nodes the tail
// touches. Every v2 file node ends up in the collector.
func readV2(src *Source, o Options, keepNodes bool, all bool, progress Progress, clock *phaseClock) (*v2Result, error) {
	res := &v2Result{c: newCollector(o, keepNodes)}
	rs := &res.replay
	hidden := map[string]bool{}
	steps, reqs, err := decodeTail(src, rs, hidden)
	if err != nil {
		return nil, err
	}
	clock.lap("readWAL")
	t := newTouchSet(reqs)
	t.all = all

	st := v2store.New("/0", "/1")
	if sf := src.snap; sf != nil {
		v := &scanVisit{t: t, c: res.c, data: sf.data, hidden: hidden, auth: &res.auth}
		sc := &scanner{b: sf.data, v: v, tick: func(pos int) {
			sf.release()
			progress.report("read snapshot", int64(pos), int64(len(sf.data)))
		}}
		if err := sc.store(); err != nil {
			return nil, fmt.Errorf("%s: %w", src.SnapshotFile, err)
		}
		sf.release()
		rs.Overlay = v.kept
		if v.root == nil {
			return nil, fmt.Errorf("%s: the v2 store has no root node", src.SnapshotFile)
		}
		state, err := json.Marshal(struct {
			Root         *ovNode
			CurrentIndex uint64
		}{v.root, sc.index})
		if err != nil {
			return nil, err
		}
		v.root, v.stack = nil, nil // the store is rebuilt from state
		if err := st.Recovery(state); err != nil {
			return nil, fmt.Errorf("load the v2 snapshot's replayed part: %w", err)
		}
	}
	clock.lap("scanSnapshot")
	for i, step := range steps {
		var o outcome
		if step.member != nil {
			o = applyMemberChange(st, step.member)
		} else {
			o = applyV2(st, step.req)
		}
		switch o {
		case outcomeApplied:
			rs.Applied++
		case outcomeRefused:
			rs.Refused++
		case outcomeSync:
			rs.Syncs++
		default:
			rs.Ignored++
		}
		if i%4096 == 0 {
			progress.report("replay WAL", int64(i), int64(len(steps)))
		}
	}
	res.index = st.Index()
	res.auth.noteStore(st)
	walkStore(st, hidden, res.c)
	clock.lap("replayWAL")
	return res, nil
}

// walStep is a committed entry of the WAL tail that changes the v2 store: a v2 request (etcd
// 3.5's membership requests as the v2 PUTs they amount to) or a conf change.
type walStep struct {
	req    *etcdserverpb.Request
	member *memberChange
}

// decodeTail decodes the committed WAL tail into the steps the replay applies, also returning
// their v2 requests (what the overlay must load) and noting the hidden paths they name.
func decodeTail(src *Source, rs *ReplayStats, hidden map[string]bool) ([]walStep, []*etcdserverpb.Request, error) {
	var steps []walStep
	var reqs []*etcdserverpb.Request
	for i := range src.Entries {
		e := &src.Entries[i]
		rs.Entries++
		var step walStep
		var err error
		switch {
		case len(e.Data) == 0:
		case e.Type == raftpb.EntryConfChange:
			step.member, err = decodeConfChange(e.Data)
		case e.Type == raftpb.EntryNormal:
			var v3 v3Write
			step.req, v3, err = decodeEntry(e.Data)
			src.noteV3Write(v3, e.Index)
		}
		e.Data = nil // decoded: the garbage collector may free it while the rest is decoded
		if err != nil {
			return nil, nil, fmt.Errorf("WAL entry %d: %w", e.Index, err)
		}
		if step.req == nil && step.member == nil {
			rs.Ignored++
			continue
		}
		if r := step.req; r != nil {
			if strings.HasPrefix(r.Path, "/1/") && strings.Contains(r.Path, "/_") {
				hidden[r.Path] = true
			}
			reqs = append(reqs, r)
		}
		steps = append(steps, step)
	}
	src.Entries = nil
	return steps, reqs, nil
}

// walkStore hands the user tree (/1) of a store to the collector. It walks the store's nodes
// through Get, then looks up the hidden paths by name, since Get does not list them.
func walkStore(st v2store.Store, hidden map[string]bool, c *collector) {
	seen := map[string]bool{}
	ev, err := st.Get("/1", true, true)
	if err != nil {
		return // no user tree (left)
	}
	// inherited is when the node's directories expire (the earliest of theirs).
	var walk func(n *v2store.NodeExtern, inherited time.Time)
	walk = func(n *v2store.NodeExtern, inherited time.Time) {
		expire := inherited
		if n.Expiration != nil {
			expire = earliest(*n.Expiration, inherited)
		}
		if n.Dir {
			c.dir(n.Key, n.CreatedIndex, n.ModifiedIndex, expire)
			for _, ch := range n.Nodes {
				walk(ch, expire)
			}
			return
		}
		value := ""
		if n.Value != nil {
			value = *n.Value
		}
		// Values share the store's strings (never modified) instead of copying them.
		c.file(n.Key, KV{Value: unsafe.Slice(unsafe.StringData(value), len(value)), CreateRevision: int64(n.CreatedIndex), ModRevision: int64(n.ModifiedIndex)}, expire)
	}
	for _, n := range ev.Node.Nodes {
		walk(n, time.Time{})
	}
	// Hidden nodes, asked for by name: every prefix of a hidden path that ends in a hidden
	// segment. A walk from one takes what is under it but its hidden descendants (Get lists
	// none), which come by their own prefixes: each node is walked once.
	var roots []string
	for p := range hidden {
		for _, r := range hiddenPrefixes(p) {
			if !seen[r] {
				seen[r] = true
				roots = append(roots, r)
			}
		}
	}
	sort.Strings(roots)
	for _, r := range roots {
		if ev, err := st.Get(r, true, true); err == nil {
			walk(ev.Node, ancestorsExpire(st, r))
		}
	}
}

// ancestorsExpire is when the directories above p (below /1) expire: the earliest of theirs.
func ancestorsExpire(st v2store.Store, p string) time.Time {
	var expire time.Time
	for d := path.Dir(p); d != "/1" && d != "/"; d = path.Dir(d) {
		if ev, err := st.Get(d, false, false); err == nil && ev.Node.Expiration != nil {
			expire = earliest(expire, *ev.Node.Expiration)
		}
	}
	return expire
}

// v2Request decodes an entry: an InternalRaftRequest whose V2 field is set, or (older WALs) a
// bare v2 Request; etcd 3.5's requests that set a member's attributes or the cluster version
// come back as the v2 PUTs that write the same into the store. It returns nil for other v3
// requests.
func v2Request(data []byte) (*etcdserverpb.Request, error) {
	r, _, err := decodeEntry(data)
	return r, err
}

// v3Write is what a v3 request may change in the v3 backend.
type v3Write uint8

const (
	noV3Write v3Write = iota
	// v3KeyWrite changes or may change keys, users or roles: a put, a delete, a txn holding a
	// put or a delete (in either branch: which one runs depends on its compares), a lease revoke
	// (it deletes the lease's keys), an auth change. etcd 3.4 saves its consistent index only
	// with a write that changed keys, and never with an auth change, so past that index such an
	// entry may be missing from a 3.4 backend.
	v3KeyWrite
	// v3OtherWrite may change the backend but no key: a txn that only reads, a compaction, a
	// lease grant or checkpoint.
	v3OtherWrite
)

// decodeEntry is v2Request, also saying what the entry, as a v3 request, may change in the v3
// backend.
func decodeEntry(data []byte) (*etcdserverpb.Request, v3Write, error) {
	var irr etcdserverpb.InternalRaftRequest
	if err := irr.Unmarshal(data); err == nil {
		if irr.V2 == nil {
			return membershipRequest(&irr), v3WriteOf(&irr), nil
		}
		return irr.V2, noV3Write, nil
	}
	var r etcdserverpb.Request
	if err := r.Unmarshal(data); err != nil {
		return nil, noV3Write, fmt.Errorf("neither a raft request nor a v2 request: %w", err)
	}
	return &r, noV3Write, nil
}

func v3WriteOf(r *etcdserverpb.InternalRaftRequest) v3Write {
	switch {
	case r.Put != nil, r.DeleteRange != nil, r.LeaseRevoke != nil, r.Txn != nil && txnWrites(r.Txn), authChange(r):
		return v3KeyWrite
	case r.Txn != nil, r.Compaction != nil, r.LeaseGrant != nil, r.LeaseCheckpoint != nil:
		return v3OtherWrite
	}
	return noV3Write
}

// txnWrites says whether a txn holds a put or a delete, in either branch or a nested txn.
func txnWrites(t *etcdserverpb.TxnRequest) bool {
	for _, ops := range [][]*etcdserverpb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			if op.GetRequestPut() != nil || op.GetRequestDeleteRange() != nil {
				return true
			}
			if n := op.GetRequestTxn(); n != nil && txnWrites(n) {
				return true
			}
		}
	}
	return false
}

// authChange says whether a request changes auth: users, roles, or whether auth is on.
func authChange(r *etcdserverpb.InternalRaftRequest) bool {
	return r.AuthEnable != nil || r.AuthDisable != nil ||
		r.AuthUserAdd != nil || r.AuthUserDelete != nil || r.AuthUserChangePassword != nil ||
		r.AuthUserGrantRole != nil || r.AuthUserRevokeRole != nil ||
		r.AuthRoleAdd != nil || r.AuthRoleDelete != nil ||
		r.AuthRoleGrantPermission != nil || r.AuthRoleRevokePermission != nil
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
		case removedMemberAttributes(st, r): // etcd skips it: no index
			return outcomeIgnored
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
