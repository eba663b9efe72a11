package v2v3

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/kubefence/kubefence/internal/pathguard"
)

// Config is one migration.
type Config struct {
	DataDir   string
	WALDir    string
	OutputDir string
	Member    Membership
	Options
	RevisionBump  uint64
	MarkCompacted bool
	// Progress, when set, hears each phase's progress.
	Progress Progress `json:"-"`
	// OnConflict says which store wins for a key present in both: "" (an error), "v3" or "v2".
	OnConflict string
	// DropV3Tail leaves out, with a warning, v3 writes the WAL committed past the backend's
	// consistent index, which are otherwise refused: the cutover's copy of a running blue,
	// whose apiservers write around the copy and write again what they need.
	DropV3Tail bool
	// Quota is the --quota-backend-bytes the new members will run with, which the report
	// warns the new database comes near: 0 for etcd's default (2 GiB), negative for none.
	Quota int64
}

// CheckOnConflict refuses an --on-conflict value other than "", v3 and v2.
func CheckOnConflict(policy string) error {
	switch policy {
	case ConflictError, ConflictV3, ConflictV2:
		return nil
	}
	return fmt.Errorf("--on-conflict %q: use v3 or v2 (or leave it out to refuse a key in both stores)", policy)
}

// Validate reports every problem with the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is required (a copy of the member's data dir)"))
	}
	if c.OutputDir == "" {
		errs = append(errs, errors.New("--output-dir is required"))
	} else if err := pathguard.CheckFresh("--output-dir", c.OutputDir); err != nil {
		errs = append(errs, err)
	}
	if c.OutputDir != "" {
		for flag, src := range map[string]string{"--data-dir": c.DataDir, "--wal-dir": c.WALDir} {
			if src == "" {
				continue
			}
			if err := pathguard.CheckApart("--output-dir", c.OutputDir, flag, src); err != nil {
				errs = append(errs, fmt.Errorf("%w: the source is never written, so choose an output outside it", err))
			} else if err := pathguard.CheckApart("the working dir next to --output-dir", workPath(c.OutputDir), flag, src); err != nil {
				errs = append(errs, fmt.Errorf("%w: it is removed before each run, and the source is never written, so choose another output", err))
			}
		}
	}
	if c.Member.Name == "" || c.Member.InitialCluster == "" || len(c.Member.InitialAdvertisePeerURLs) == 0 {
		errs = append(errs, errors.New("--name, --initial-cluster and --initial-advertise-peer-urls are required, as for etcdutl snapshot restore"))
	}
	if err := CheckOnConflict(c.OnConflict); err != nil {
		errs = append(errs, err)
	}
	if c.MarkCompacted != (c.RevisionBump > 0) {
		errs = append(errs, errors.New("--bump-revision and --mark-compacted go together (etcd's restore ignores a bump that is not marked compacted)"))
	}
	if (c.PrefixFrom == "") != (c.PrefixTo == "") {
		errs = append(errs, errors.New("--prefix-from and --prefix-to go together"))
	}
	if c.Transformer != "" {
		if _, err := exec.LookPath(c.Transformer); err != nil {
			errs = append(errs, fmt.Errorf("--transformer: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Report is what a migration did and found.
type Report struct {
	DataDir      string         `json:"dataDir"`
	OutputDir    string         `json:"outputDir"`
	Snapshot     string         `json:"snapshot,omitempty"`
	SnapshotIdx  uint64         `json:"snapshotIndex"`
	CommitIndex  uint64         `json:"commitIndex"`
	SkippedSnaps []string       `json:"skippedSnapshots,omitempty"`
	Replay       ReplayStats    `json:"replay"`
	Keys         TransformStats `json:"keys"`
	Leases       int            `json:"leases"`
	// Prefixes counts keys per top-level prefix (/registry/<resource> for Kubernetes data).
	Prefixes map[string]int `json:"prefixes"`
	// LeasedPrefixes counts, of those, the keys with a TTL (a lease), per prefix.
	LeasedPrefixes map[string]int `json:"leasedPrefixes,omitempty"`
	Verified       int            `json:"verified"`
	// ContentCRC is a CRC-32C of the output's key and lease buckets, read back: the same for
	// every member built from one source copy with the same --ttl-clock and flags, to compare
	// across the members of one new cluster (their membership differs, their data must not).
	ContentCRC uint32 `json:"contentCRC32C"`
	// V2Index is the v2 store's index after the replay: the last one v2 clients could see.
	V2Index uint64 `json:"v2Index"`
	// Warnings say what the migration did that a reader must act on.
	Warnings []string `json:"warnings,omitempty"`
	// V3 says what was carried over from the source\'s v3 store, when it had one.
	V3        *MergeStats              `json:"v3,omitempty"`
	Now       time.Time                `json:"ttlClock"`
	Durations map[string]time.Duration `json:"durationsNanos"`
	// Phases is where the time went, in seconds: readSnapshot (map the snapshot file, check its
	// checksum), readV3 (index the source's v3 backend, when it has keys), readWAL (read the WAL
	// and decode its v2 requests), scanSnapshot (walk the snapshot's JSON, load the nodes the WAL
	// touches into the replay store), replayWAL (apply the WAL tail, collect the replayed
	// nodes), transform, restoreBase (etcd's restore of the membership), writeKeys (bbolt
	// appends, one sync), verify (read everything back, rename into place).
	Phases map[string]float64 `json:"phases"`
}

// phaseClock adds up the seconds spent in named phases, one lap after the other.
type phaseClock struct {
	last time.Time
	secs map[string]float64
}

func newPhaseClock() *phaseClock {
	return &phaseClock{last: time.Now(), secs: map[string]float64{}}
}

// lap charges the time since the previous lap to phase.
func (p *phaseClock) lap(phase string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.secs[phase] += now.Sub(p.last).Seconds()
	p.last = now
}

// Run migrates: read, replay, transform, write, verify. Nothing is written to the source; the
// output appears only once complete and verified.
func Run(c Config) (*Report, error) {
	return RunContext(context.Background(), c)
}

// RunContext is Run with a context: for the transformer program, and checked between the
// phases (a long read, replay or write runs to its end), so that a run stopped places nothing.
func RunContext(ctx context.Context, c Config) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	lock, err := lockOutput(&c)
	if err != nil {
		return nil, err
	}
	defer lock.ReleaseRemove() // last: after m.close removed the working dir
	if c.Now.IsZero() {
		c.Now = time.Now()
	}
	// A batch job whose peak memory matters more than its CPU: collect at 1.5x the live heap.
	defer debug.SetGCPercent(debug.SetGCPercent(50))
	m := &migration{c: c, clock: newPhaseClock(), rep: &Report{DataDir: c.DataDir, OutputDir: c.OutputDir, Now: c.Now.UTC(), Durations: map[string]time.Duration{}}}
	defer m.close()
	for _, ph := range []struct {
		name string
		run  func(context.Context) error
	}{{"read", m.read}, {"replay", m.replay}, {"transform", m.transform}, {"write", m.write}, {"verify", m.verify}} {
		if err := context.Cause(ctx); err != nil { // stopped: between phases, nothing placed
			return nil, fmt.Errorf("v2-to-v3 stopped before its %s phase (nothing was written to %s): %w", ph.name, c.OutputDir, err)
		}
		t := time.Now()
		if err := ph.run(ctx); err != nil {
			if ph.name == "verify" && ctx.Err() == nil {
				return m.rep, err
			}
			return nil, err
		}
		m.rep.Durations[ph.name] = time.Since(t)
	}
	m.rep.Phases = m.clock.secs
	return m.rep, nil
}

// migration is one run's state, passed from phase to phase: read the source, replay the v2
// store, transform its keys into v3 keys, write the new member, verify it.
type migration struct {
	c      Config
	clock  *phaseClock
	rep    *Report
	src    *Source
	v3     *v3Data
	v3path string
	res    *v2Result
	data   []byte // the v2 snapshot's JSON
	kvs    []KV
	leases map[int64]*Lease
	work   string // the output being built
	member string // its member dir
	dbPath string
	marker int64
}

func (m *migration) close() {
	if m.src != nil {
		m.src.Close()
	}
	if m.work != "" {
		os.RemoveAll(m.work)
	}
}

// read opens the member's snapshot and WAL, and its v3 backend when it holds v3 keys.
func (m *migration) read(context.Context) (err error) {
	c := m.c
	if m.src, err = readSource(c.DataDir, c.WALDir, m.clock); err != nil {
		return err
	}
	if m.src.V3Keys > 0 {
		m.v3path = filepath.Join(c.DataDir, "member", "snap", "db")
		if m.v3, err = readV3(m.v3path); err != nil {
			return err
		}
		m.clock.lap("readV3")
		if err := m.v3.checkPrefixRewrite(c.PrefixFrom, c.PrefixTo); err != nil {
			return err
		}
	}
	m.rep.Snapshot, m.rep.SnapshotIdx, m.rep.CommitIndex, m.rep.SkippedSnaps = m.src.SnapshotFile, m.src.Meta.Index, m.src.HardState.Commit, m.src.Skipped
	if m.src.snap != nil {
		m.data = m.src.snap.data
	}
	return nil
}

// replay builds the final v2 state: the snapshot with the committed WAL tail replayed.
func (m *migration) replay(context.Context) (err error) {
	if m.res, err = readV2(m.src, m.c.Options, m.c.Transformer != "", false, m.c.Progress, m.clock); err != nil {
		return err
	}
	m.rep.Replay = m.res.replay
	for _, w := range []string{m.res.auth.warning(m.v3 != nil, m.src.v3Auth.enabled), v3AuthWarning(m.src.v3Auth, m.v3 != nil)} {
		if w != "" {
			m.rep.Warnings = append(m.rep.Warnings, w)
		}
	}
	if err := m.checkV3Tail(); err != nil {
		return err
	}
	debug.FreeOSMemory() // the WAL tail and the replay's garbage: give it back before writing
	return nil
}

// checkV3Tail refuses v3 writes the WAL committed past the backend's consistent index (the
// backend is carried over as it is, so they would be lost), or with DropV3Tail warns that they
// are left out.
func (m *migration) checkV3Tail() error {
	w := m.src.unappliedV3()
	if w == 0 {
		return nil
	}
	why := "the member stopped before committing them, or the copy took the backend before the WAL"
	what := fmt.Sprintf("the WAL holds v3 writes up to entry %#x that the v3 backend has not applied (it applied up to %#x; %s)", w, m.src.consistentIndex, why)
	if !m.src.indexEveryEntry {
		what = fmt.Sprintf("the WAL holds v3 writes up to entry %#x that the v3 backend may not have applied: etcd 3.4 records how far it applied (%#x here) only with a write that changed keys, so a txn or delete past that either changed nothing (a failed compare, no such key) or is missing (%s)", w, m.src.consistentIndex, why)
	}
	if !m.c.DropV3Tail {
		return errors.New(what + ": they would be lost, since the backend is carried over as it is. Start this member's own etcd version once on a copy of the data dir with --snapshot-count=1, so that it applies its WAL and records how far in a snapshot (etcd 3.4 too), stop it, and migrate that copy")
	}
	m.rep.Warnings = append(m.rep.Warnings, what+": those not applied are left out")
	return nil
}

// transform turns the v2 nodes into v3 keys: the transformer or the built-in mapping, the
// prefix rewrite, and the renumbering around v3 keys already there.
func (m *migration) transform(ctx context.Context) (err error) {
	c, res := m.c, m.res
	m.kvs = res.c.kvs
	if c.Transformer != "" {
		if m.kvs, err = runTransformer(ctx, c.Transformer, res.c, m.data); err != nil {
			return err
		}
		res.c.nodes = nil
	} else if err := sortKVs(m.kvs); err != nil {
		return fmt.Errorf("the v2 store is inconsistent: %w", err)
	}
	m.leases = res.c.leases
	ts := res.c.stats
	if c.PrefixFrom != "" {
		if ts.Rewritten, err = rewritePrefix(m.kvs, c.PrefixFrom, c.PrefixTo); err != nil {
			return err
		}
	}
	if m.v3 != nil {
		var ms MergeStats
		if m.kvs, ms, err = renumber(m.kvs, m.v3, c.OnConflict); err != nil {
			return err
		}
		m.rep.V3 = &ms
	}
	ts.Keys = len(m.kvs)
	ts.TTLKeys, m.leases = leasesHeld(m.kvs, m.leases)
	if m.v3 != nil {
		m.leases = moveLeases(m.kvs, m.leases, m.v3.leaseIDs)
	}
	m.rep.Keys, m.rep.Leases = ts, len(m.leases)
	m.rep.V2Index = res.index
	if m.v3 == nil {
		m.warnIndexGap()
	}
	m.rep.Prefixes, m.rep.LeasedPrefixes = prefixCounts(m.kvs)
	m.clock.lap("transform")
	return nil
}

// warnIndexGap warns when the v2 store's index is past the newest key's revision (its last
// writes deleted keys, or expired them, or changed the membership): etcd's next revision is
// the newest key's + 1, so the first writes after the migration would take revisions that v2
// clients may have seen, and a client resuming a watch from one would miss them.
func (m *migration) warnIndexGap() {
	var top uint64
	if n := len(m.kvs); n > 0 {
		top = uint64(m.kvs[n-1].ModRevision)
	}
	if m.rep.V2Index <= top || m.rep.V2Index-top <= m.c.RevisionBump {
		return
	}
	gap := m.rep.V2Index - top
	m.rep.Warnings = append(m.rep.Warnings, fmt.Sprintf("the v2 store's index is %d but the newest key's revision is %d: the first writes after the migration would take revisions %d to %d, which v2 clients may have seen (a delete, an expiry, a membership change), and a client resuming a watch from one would miss them. To have such clients told to relist instead, run migrate v2-to-v3 with --bump-revision %d --mark-compacted (or more)", m.rep.V2Index, top, top+1, m.rep.V2Index, gap))
}

// write builds the new member in a temp dir: etcd's restore of the base, then the keys.
func (m *migration) write(context.Context) (err error) {
	if m.work, m.member, err = restoreBase(m.c.OutputDir, m.v3path, m.c.Member); err != nil {
		return err
	}
	m.dbPath = filepath.Join(m.member, "member", "snap", "db")
	m.clock.lap("restoreBase")
	var bump uint64
	if m.c.MarkCompacted {
		bump = m.c.RevisionBump
	}
	if m.marker, err = appendKeys(m.dbPath, m.data, m.src.snap.release, m.kvs, m.leases, bump, m.c.Progress); err != nil {
		return fmt.Errorf("write the v3 backend: %w", err)
	}
	debug.FreeOSMemory()
	if err := m.warnQuota(); err != nil {
		return err
	}
	m.clock.lap("writeKeys")
	return nil
}

// DefaultQuota is etcd's --quota-backend-bytes when none is given (or 0): 2 GiB.
const DefaultQuota int64 = 2 << 30

// defaultQuota is DefaultQuota where this package uses it (a var: tests lower it).
var defaultQuota = DefaultQuota

// PastQuotaShare reports whether a database of size bytes is past 80% of quota (negative: no
// quota, never): an etcd whose database reaches its quota refuses writes (the NOSPACE alarm),
// and one restored or migrated that near it would reach it soon after. The migration warns
// past it, the cutover's preflight refuses.
func PastQuotaShare(size, quota int64) bool {
	return quota >= 0 && size > quota/5*4
}

// QuotaFor is the smallest quota a database of size bytes is not past 80% of (PastQuotaShare),
// to the 5 bytes its fifths are counted in.
func QuotaFor(size int64) int64 { return (size + 3) / 4 * 5 }

// warnQuota warns when the new backend is past 80% of the members' quota (Config.Quota, else
// etcd's default of 2 GiB; PastQuotaShare), so the new members need a larger one.
func (m *migration) warnQuota() error {
	quota, whose := m.c.Quota, "the quota given (--quota-backend-bytes)"
	switch {
	case quota < 0:
		return nil
	case quota == 0:
		quota, whose = defaultQuota, "etcd's default quota"
	}
	st, err := os.Stat(m.dbPath)
	if err != nil {
		return err
	}
	if size := st.Size(); PastQuotaShare(size, quota) {
		m.rep.Warnings = append(m.rep.Warnings, fmt.Sprintf("the new database is %d bytes (%.1f GiB), past 80%% of %s of %.1f GiB: an etcd whose database reaches its quota refuses writes (NOSPACE alarm). Start the new members with --quota-backend-bytes of at least %d (etcd suggests at most 8 GiB)",
			size, float64(size)/(1<<30), whose, float64(quota)/(1<<30), QuotaFor(size)))
	}
	return nil
}

// verify reads the new backend back against what was meant to be written, then renames the
// member into place, unless ctx ended meanwhile.
func (m *migration) verify(ctx context.Context) error {
	n, sum, err := verifyOutput(m.dbPath, expected{data: m.data, release: m.src.snap.release, v3: m.v3, kvs: m.kvs, leases: m.leases, marker: m.marker}, m.c.Progress)
	if err != nil {
		return fmt.Errorf("verification of the new data dir failed (nothing was written to %s): %w", m.c.OutputDir, err)
	}
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("v2-to-v3 stopped before placing its output (nothing was written to %s): %w", m.c.OutputDir, err)
	}
	m.rep.Verified, m.rep.ContentCRC = n, sum
	err = finish(m.member, m.c.OutputDir)
	m.clock.lap("verify")
	return err
}

// prefixCounts counts keys per /registry/<resource> (or per first path segment elsewhere), and
// of those the keys with a lease.
func prefixCounts(kvs []KV) (all, leased map[string]int) {
	all, leased = map[string]int{}, map[string]int{}
	for _, kv := range kvs {
		p := topPrefix(string(kv.Key))
		all[p]++
		if kv.Lease != 0 {
			leased[p]++
		}
	}
	return all, leased
}

func topPrefix(k string) string {
	parts := strings.SplitN(strings.TrimPrefix(k, "/"), "/", 3)
	if parts[0] == "registry" && len(parts) > 1 {
		return "/registry/" + parts[1]
	}
	return "/" + parts[0]
}

// leasesHeld counts, from the keys to be written, the keys that hold a lease and each lease's
// keys, and keeps only the leases some key holds: whatever left keys out (a transformer that
// gave a TTL key another revision or dropped it, --on-conflict=v3 keeping the v3 key), the
// leases written and the report's counts follow the keys, with no count kept by hand.
func leasesHeld(kvs []KV, leases map[int64]*Lease) (ttlKeys int, held map[int64]*Lease) {
	held = make(map[int64]*Lease, len(leases))
	for _, kv := range kvs {
		if kv.Lease == 0 {
			continue
		}
		l := held[kv.Lease]
		if l == nil {
			if l = leases[kv.Lease]; l == nil {
				continue // cannot happen: only the collector gives keys leases, with the lease
			}
			l.Keys = 0
			held[kv.Lease] = l
		}
		l.Keys++
		ttlKeys++
	}
	return ttlKeys, held
}

// moveLeases gives the TTL leases IDs that no lease of the source's v3 store has (an ID is the
// expiry second; on a clash it moves to the next free second-number) and points the keys at them.
func moveLeases(kvs []KV, leases map[int64]*Lease, taken map[int64]bool) map[int64]*Lease {
	ids := make([]int64, 0, len(leases))
	for id := range leases {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := make(map[int64]*Lease, len(leases))
	moved := map[int64]int64{}
	for _, id := range ids {
		n := id
		for taken[n] || out[n] != nil {
			n++
		}
		l := leases[id]
		l.ID = n
		out[n] = l
		if n != id {
			moved[id] = n
		}
	}
	if len(moved) > 0 {
		for i := range kvs {
			if n, ok := moved[kvs[i].Lease]; ok {
				kvs[i].Lease = n
			}
		}
	}
	return out
}

var errFound = errors.New("found")

// findUser finds a node etcd 3.6 refuses to start on (its membership.IsMetaStoreOnly).
type findUser struct{}

func (findUser) node(n *v2Node, _ bool) (bool, bool, error) {
	if isContent(n.path) {
		return false, false, errFound
	}
	return false, false, nil
}

func (findUser) leave(*v2Node, bool) {}

// isContent says whether v2 path p is content, as etcd 3.6's membership.IsMetaStoreOnly judges
// a store: a node inside a top-level directory other than the membership's (/0), except that
// v2 auth's (/2) may hold its flag and its users and roles directories while those are empty.
func isContent(p string) bool {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	switch {
	case len(parts) < 2 || parts[0] == "0":
		return false
	case parts[0] == "2" && len(parts) == 2:
		return false
	}
	return true
}

// writesContent says whether v2 request req changes content (isContent): a write (any method
// but the reads GET, QGET, HEAD and SYNC) to a content path.
func writesContent(req *etcdserverpb.Request) bool {
	switch req.Method {
	case "GET", "QGET", "HEAD", "SYNC":
		return false
	}
	return isContent(req.Path)
}

// refusedBy36 says whether etcd 3.6 refuses to replay a v2 request from the WAL: it replays a
// PUT of a member's attributes or of the cluster version (/0/version) and panics on any other
// ("detected disallowed v2 WAL"), a read too, whether or not the entry is already in its
// backend.
func refusedBy36(req *etcdserverpb.Request) bool {
	return req.Method != "PUT" || !memberAttributesPath.MatchString(req.Path) && req.Path != "/0/version"
}

// V2Findings is what DetectV2 finds in a member data dir.
type V2Findings struct {
	// Content is set when the member holds v2 content, which a migration must carry to v3 and
	// etcd 3.6 refuses: a node outside the membership in the v2 snapshot (isContent) or a v2
	// write to one in the committed WAL tail.
	Content bool
	// Why says what content was found, or that there is none.
	Why string
	// Replay, when not empty, names the v2 requests in the committed WAL tail that etcd 3.6
	// refuses to replay and that carry no content (etcd 3.4 answers /health with a v2 quorum
	// read that lands in the WAL; 3.5 with --enable-v2 too, and writes v2 auth's flag). Without
	// content there is nothing to migrate, but 3.6 cannot start on such a WAL tail until a
	// snapshot past those entries is taken (etcd 3.5 with --snapshot-count=1).
	Replay string
}

// DetectV2 reads a member data dir as a migration would (so an unreadable copy is an error)
// and says whether it holds v2 content and whether its WAL tail holds v2 requests etcd 3.6
// refuses to replay without content (V2Findings).
func DetectV2(dataDir, walDir string) (V2Findings, error) {
	var f V2Findings
	src, err := ReadSource(dataDir, walDir)
	if err != nil {
		return f, err
	}
	defer src.Close()
	var writes, refused int
	var firstWrite, firstRefused *etcdserverpb.Request
	for _, e := range src.Entries {
		if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
			continue
		}
		req, err := v2Request(e.Data)
		switch {
		case err != nil || req == nil:
		case writesContent(req):
			writes++
			firstWrite = cmp.Or(firstWrite, req)
		case refusedBy36(req):
			refused++
			firstRefused = cmp.Or(firstRefused, req)
		}
	}
	if refused > 0 {
		f.Replay = fmt.Sprintf("%d v2 requests without v2 content in the WAL after index %d that etcd 3.6 refuses to replay (the first: %s)", refused, src.Meta.Index, describe(firstRefused))
	}
	if writes > 0 {
		f.Content, f.Why = true, fmt.Sprintf("%d v2 writes in the WAL after index %d (the first: %s)", writes, src.Meta.Index, describe(firstWrite))
		return f, nil
	}
	if src.snap != nil {
		err := (&scanner{b: src.snap.data, v: findUser{}}).store()
		src.snap.release()
		switch {
		case errors.Is(err, errFound):
			f.Content, f.Why = true, fmt.Sprintf("v2 keys in snapshot %s", filepath.Base(src.SnapshotFile))
			return f, nil
		case err != nil:
			return f, fmt.Errorf("%s: %w", src.SnapshotFile, err)
		}
	}
	f.Why = fmt.Sprintf("no v2 content (%d v3 keys)", src.V3Keys)
	return f, nil
}

// describe is a v2 request's method and path.
func describe(req *etcdserverpb.Request) string {
	switch {
	case req.Method == "QGET" && req.Path == "":
		return "QGET with no path (etcd 3.4's /health)"
	case req.Path == "":
		return req.Method
	}
	return req.Method + " " + req.Path
}
