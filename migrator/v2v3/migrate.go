package v2v3

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
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
	// OnConflict says which store wins for a key present in both: "" (an error), "v3" or "v2".
	OnConflict string
}

// Validate reports every problem with the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is required (a copy of the member's data dir)"))
	}
	if c.OutputDir == "" {
		errs = append(errs, errors.New("--output-dir is required"))
	} else if entries, err := os.ReadDir(c.OutputDir); err == nil && len(entries) > 0 {
		errs = append(errs, fmt.Errorf("--output-dir %s is not empty: refusing to write into it", c.OutputDir))
	}
	if c.DataDir != "" && c.OutputDir != "" {
		if a, b := filepath.Clean(c.DataDir), filepath.Clean(c.OutputDir); a == b || strings.HasPrefix(b, a+string(filepath.Separator)) {
			errs = append(errs, errors.New("--output-dir must not be inside --data-dir: the source is never written"))
		}
	}
	if c.Member.Name == "" || c.Member.InitialCluster == "" || len(c.Member.InitialAdvertisePeerURLs) == 0 {
		errs = append(errs, errors.New("--name, --initial-cluster and --initial-advertise-peer-urls are required, as for etcdutl snapshot restore"))
	}
	switch c.OnConflict {
	case ConflictError, ConflictV3, ConflictV2:
	default:
		errs = append(errs, fmt.Errorf("--on-conflict %q: use v3 or v2", c.OnConflict))
	}
	if c.MarkCompacted && c.RevisionBump == 0 {
		errs = append(errs, errors.New("--mark-compacted needs --bump-revision"))
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
	Verified int            `json:"verified"`
	// V3 says what was carried over from the source\'s v3 store, when it had one.
	V3        *MergeStats              `json:"v3,omitempty"`
	Now       time.Time                `json:"ttlClock"`
	Durations map[string]time.Duration `json:"durationsNanos"`
}

// Run migrates: read, replay, transform, write, verify. Nothing is written to the source; the
// output appears only once complete.
func Run(c Config) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Now.IsZero() {
		c.Now = time.Now()
	}
	// A batch job whose peak memory matters more than its CPU: collect at 1.5x the live heap.
	defer debug.SetGCPercent(debug.SetGCPercent(50))
	rep := &Report{DataDir: c.DataDir, OutputDir: c.OutputDir, Now: c.Now.UTC(), Durations: map[string]time.Duration{}}
	t := time.Now()
	src, err := ReadSource(c.DataDir, c.WALDir)
	if err != nil {
		return nil, err
	}
	var v3 *v3Data
	if src.V3Keys > 0 {
		if v3, err = readV3(filepath.Join(c.DataDir, "member", "snap", "db")); err != nil {
			return nil, err
		}
	}
	rep.Snapshot, rep.SnapshotIdx, rep.CommitIndex, rep.SkippedSnaps = src.SnapshotFile, src.Snapshot.Metadata.Index, src.HardState.Commit, src.Skipped
	rep.Durations["read"] = time.Since(t)

	t = time.Now()
	st, rs, hidden, err := buildStore(src)
	if err != nil {
		return nil, err
	}
	src.Snapshot.Data, src.Entries = nil, nil // the store holds it all now
	rep.Replay = rs
	rep.Durations["replay"] = time.Since(t)

	t = time.Now()
	kvs, leases, ts, err := transform(st, hidden, c.Options)
	if err != nil {
		return nil, err
	}
	debug.FreeOSMemory() // between phases: give back what the store and its JSON took
	if v3 != nil {
		var ms MergeStats
		if kvs, ms, err = renumber(kvs, v3, c.OnConflict); err != nil {
			return nil, err
		}
		rep.V3 = &ms
		leases = moveLeases(kvs, leases, v3.leaseIDs)
	}
	rep.Keys, rep.Leases = ts, len(leases)
	rep.Prefixes = prefixCounts(kvs)
	rep.Durations["transform"] = time.Since(t)

	t = time.Now()
	if err := buildDataDir(c.OutputDir, v3, kvs, leases, c.Member, c.RevisionBump, c.MarkCompacted); err != nil {
		return nil, err
	}
	rep.Durations["write"] = time.Since(t)

	t = time.Now()
	n, err := verifyOutput(filepath.Join(c.OutputDir, "member", "snap", "db"), v3, kvs, leases)
	if err != nil {
		return rep, fmt.Errorf("verification of %s failed: %w", c.OutputDir, err)
	}
	rep.Verified = n
	rep.Durations["verify"] = time.Since(t)
	return rep, nil
}

// prefixCounts counts keys per /registry/<resource> (or per first path segment elsewhere).
func prefixCounts(kvs []KV) map[string]int {
	out := map[string]int{}
	for _, kv := range kvs {
		out[topPrefix(string(kv.Key))]++
	}
	return out
}

func topPrefix(k string) string {
	parts := strings.SplitN(strings.TrimPrefix(k, "/"), "/", 3)
	if parts[0] == "registry" && len(parts) > 1 {
		return "/registry/" + parts[1]
	}
	return "/" + parts[0]
}

// verifyOutput reads the written backend back and checks every key and lease.
func verifyOutput(dbPath string, v3 *v3Data, kvs []KV, leases map[int64]*Lease) (int, error) {
	db, err := bolt.Open(dbPath, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	want := make(map[string]*KV, len(kvs))
	for i := range kvs {
		want[string(kvs[i].Key)] = &kvs[i]
	}
	// The v3 store's entries must be there byte for byte; the v2 keys are checked below.
	v3rev := map[string][]byte{}
	if v3 != nil {
		for _, e := range v3.entries {
			v3rev[string(e[0])] = e[1]
		}
	}
	v3seen := 0
	var problems []string
	seen := 0
	gotLeases := map[int64]bool{}
	err = db.View(func(tx *bolt.Tx) error {
		kb := tx.Bucket([]byte("key"))
		if kb == nil {
			return errors.New("no key bucket")
		}
		if err := kb.ForEach(func(k, v []byte) error {
			if wantV, ok := v3rev[string(k)]; ok {
				if !bytes.Equal(wantV, v) {
					problems = append(problems, fmt.Sprintf("v3 revision %x differs", k))
				}
				v3seen++
				return nil
			}
			if len(v) == 0 {
				return nil // the marker a revision bump leaves at the bumped revision
			}
			var kv mvccpb.KeyValue
			if err := kv.Unmarshal(v); err != nil {
				return err
			}
			w := want[string(kv.Key)]
			switch {
			case w == nil:
				problems = append(problems, fmt.Sprintf("unexpected key %q", kv.Key))
			case !bytes.Equal(w.Value, kv.Value) || w.CreateRevision != kv.CreateRevision || w.ModRevision != kv.ModRevision || w.Lease != kv.Lease:
				problems = append(problems, fmt.Sprintf("key %q differs", kv.Key))
			default:
				seen++
			}
			return nil
		}); err != nil {
			return err
		}
		if lb := tx.Bucket([]byte("lease")); lb != nil {
			return lb.ForEach(func(_, v []byte) error {
				var l leasepb.Lease
				if err := l.Unmarshal(v); err != nil {
					return err
				}
				if v3 != nil && v3.leaseIDs[l.ID] {
					return nil
				}
				if w := leases[l.ID]; w == nil || w.TTL != l.TTL {
					problems = append(problems, fmt.Sprintf("lease %d unexpected or with TTL %d", l.ID, l.TTL))
				}
				gotLeases[l.ID] = true
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return seen, err
	}
	if seen != len(kvs) {
		problems = append(problems, fmt.Sprintf("%d of %d keys present", seen, len(kvs)))
	}
	if v3 != nil && v3seen != len(v3.entries) {
		problems = append(problems, fmt.Sprintf("%d of %d v3 revisions present", v3seen, len(v3.entries)))
	}
	for id := range leases {
		if !gotLeases[id] {
			problems = append(problems, fmt.Sprintf("lease %d missing", id))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > 20 {
			problems = append(problems[:20], fmt.Sprintf("... %d more", len(problems)-20))
		}
		return seen, errors.New(strings.Join(problems, "; "))
	}
	return seen, nil
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
