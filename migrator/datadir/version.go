// Package datadir manages an etcd member data dir's lifecycle offline: consistent copies,
// version detection, backups with a sha256 manifest, minor-by-minor upgrades and the 3.6 → 3.5
// downgrade, each crash-safe and resumable.
package datadir

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// Version is an etcd release, MAJOR.MINOR.PATCH.
type Version struct{ Major, Minor, Patch int }

// ParseVersion parses "3.5.17" (a leading "v" is allowed).
func ParseVersion(s string) (Version, error) {
	parts := strings.Split(strings.TrimPrefix(s, "v"), ".")
	if len(parts) != 3 {
		return Version{}, fmt.Errorf("%q is not an etcd version (want MAJOR.MINOR.PATCH, e.g. 3.5.17)", s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || p == "" || strings.Trim(p, "0123456789") != "" || (len(p) > 1 && p[0] == '0') {
			return Version{}, fmt.Errorf("%q is not an etcd version (want MAJOR.MINOR.PATCH, e.g. 3.5.17)", s)
		}
		n[i] = v
	}
	return Version{n[0], n[1], n[2]}, nil
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// MarshalText writes "3.5.17" (journals and -o json).
func (v Version) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (v *Version) UnmarshalText(b []byte) error {
	p, err := ParseVersion(string(b))
	*v = p
	return err
}

// MinorString is "3.5".
func (v Version) MinorString() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// Less orders releases.
func (v Version) Less(o Version) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

// SameMinor reports whether both are the same MAJOR.MINOR.
func (v Version) SameMinor(o Version) bool { return v.Major == o.Major && v.Minor == o.Minor }

// Storage says which API's data the member holds, as Kubernetes' etcd image wrote it.
type Storage string

const (
	// StorageV2 means v2 user content is present (it may hold v3 content too).
	StorageV2 Storage = "etcd2"
	// StorageV3 means only v3 content.
	StorageV3 Storage = "etcd3"
)

// VersionFileName is the version file inside a data dir, as Kubernetes' etcd image kept it.
const VersionFileName = "version.txt"

// VersionFile is the content of version.txt: "<etcd version>/<etcd2|etcd3>".
type VersionFile struct {
	Version Version
	Storage Storage
}

func (f VersionFile) String() string { return f.Version.String() + "/" + string(f.Storage) }

// ParseVersionFile parses version.txt's content. Surrounding whitespace is allowed; anything
// else that is not exactly one version and one storage is an error.
func ParseVersionFile(content string) (VersionFile, error) {
	s := strings.TrimSpace(content)
	if s == "" {
		return VersionFile{}, errors.New("it is empty (a full disk when it was written leaves it so)")
	}
	ver, st, ok := strings.Cut(s, "/")
	if !ok || strings.ContainsAny(s, " \t\n") {
		return VersionFile{}, fmt.Errorf("%q is not <etcd version>/<etcd2|etcd3>", s)
	}
	v, err := ParseVersion(ver)
	if err != nil {
		return VersionFile{}, fmt.Errorf("%q: %w", s, err)
	}
	switch Storage(st) {
	case StorageV2, StorageV3:
	default:
		return VersionFile{}, fmt.Errorf("%q: storage %q is neither etcd2 nor etcd3", s, st)
	}
	return VersionFile{Version: v, Storage: Storage(st)}, nil
}

// WriteVersionFile replaces dir/version.txt atomically.
func WriteVersionFile(dir string, f VersionFile) error {
	return atomicfile.Write(filepath.Join(dir, VersionFileName), []byte(f.String()+"\n"), 0o600)
}

// Detection is what a data dir holds, and how kubefence knows.
type Detection struct {
	DataDir string `json:"dataDir"`
	// Version is the version file's, or the inferred storage version (patch 0 when inferred:
	// only the minor is known).
	Version Version `json:"version"`
	Storage Storage `json:"storage"`
	// Source is "version.txt" or "inferred".
	Source string `json:"source"`
	// Why lists the evidence for an inference.
	Why []string `json:"why,omitempty"`
	// V2Replay names v2 requests without content in the WAL tail that etcd 3.6 refuses to
	// replay (v2v3.V2Findings.Replay): an upgrade to 3.6 snapshots past them first. Set by an
	// inference, and by an upgrade's plan to 3.6 for a version file's data dir.
	V2Replay string `json:"v2Replay,omitempty"`
}

// VersionText is "3.5.17", or "3.5" when the version was inferred (only the minor is known).
func (d Detection) VersionText() string {
	if d.Source == "inferred" {
		return d.Version.MinorString()
	}
	return d.Version.String()
}

// String is how the detection prints.
func (d Detection) String() string {
	s := fmt.Sprintf("%s/%s (from %s)", d.VersionText(), d.Storage, d.Source)
	if len(d.Why) > 0 {
		s += ": " + strings.Join(d.Why, "; ")
	}
	return s
}

// Detect reads dir/version.txt or, when there is none, infers the version and storage from the
// data. An empty or garbled version file is an error that says how to fix it: a silent default
// would step the wrong versions.
func Detect(dir, walDir string) (Detection, error) {
	d := Detection{DataDir: dir}
	if _, err := os.Stat(filepath.Join(dir, "member")); err != nil {
		return d, fmt.Errorf("%s is not an etcd member data dir (no member/ directory)", dir)
	}
	b, err := os.ReadFile(filepath.Join(dir, VersionFileName))
	switch {
	case err == nil:
		f, perr := ParseVersionFile(string(b))
		if perr != nil {
			return d, fmt.Errorf("%s: %w. Fix it by hand (e.g. echo 3.4.23/etcd2 > %[1]s, the etcd version that last ran on this data dir and etcd2 if it holds v2 data), or delete it to have kubefence infer the version from the data and print what it found",
				filepath.Join(dir, VersionFileName), perr)
		}
		d.Version, d.Storage, d.Source = f.Version, f.Storage, VersionFileName
		d.Why, err = crossCheck(dir, f)
		return d, err
	case !errors.Is(err, os.ErrNotExist):
		return d, err
	}
	return infer(dir, walDir)
}

// StaleVersionFileError is a version file its backend contradicts: a newer etcd ran on the data
// dir since the file was written (outside kubefence, or a run killed before it wrote the file).
type StaleVersionFileError struct {
	File    string
	Says    VersionFile
	Backend Version // the minor the backend's markers show
	Marker  string
}

func (e *StaleVersionFileError) Error() string {
	return fmt.Sprintf("%s says %s, but member/snap/db has %s, which etcd %s writes: an etcd of that minor ran on this data dir after the file was written, so steps planned from the file would be wrong. Write the version that ran last into it (e.g. echo %s.<patch>/%s > %[1]s), or delete it to have kubefence infer the version from the data and print what it found",
		e.File, e.Says, e.Marker, e.Backend.MinorString(), e.Backend.MinorString(), e.Says.Storage)
}

// crossCheck refuses version file f of dir when the backend's schema markers show a later
// minor ran on it (storageVersion of another minor; the raft term, which etcd 3.5+ writes, on a
// file of 3.4 or older). A backend that cannot be read (absent, locked by a running etcd, not a
// bbolt file) leaves the file's word, with a note.
func crossCheck(dir string, f VersionFile) ([]string, error) {
	db := filepath.Join(dir, "member", "snap", "db")
	if !exists(db) {
		return nil, nil
	}
	meta, err := readMeta(db)
	if err != nil {
		return []string{fmt.Sprintf("%s not checked against the backend (%v)", VersionFileName, err)}, nil
	}
	stale := &StaleVersionFileError{File: filepath.Join(dir, VersionFileName), Says: f}
	switch sv, perr := ParseVersion(meta.storageVersion); {
	case meta.storageVersion != "" && perr != nil:
		return nil, fmt.Errorf("member/snap/db: storageVersion %q: %w", meta.storageVersion, perr)
	case meta.storageVersion != "" && !sv.SameMinor(f.Version):
		stale.Backend, stale.Marker = sv, "storageVersion "+meta.storageVersion
		return nil, stale
	case meta.storageVersion == "" && meta.hasTerm && f.Version.Major == 3 && f.Version.Minor < 5:
		stale.Backend, stale.Marker = Version{3, 5, 0}, "the raft term"
		return nil, stale
	}
	return nil, nil
}

// infer derives the storage version from the backend's meta bucket (etcd 3.6 writes
// storageVersion; 3.5 adds the raft term next to the consistent index; 3.4 has neither) and the
// storage kind from v2 content in the snapshot and WAL (v2v3.DetectV2).
func infer(dir, walDir string) (Detection, error) {
	d := Detection{DataDir: dir, Source: "inferred"}
	meta, err := readMeta(filepath.Join(dir, "member", "snap", "db"))
	if err != nil {
		return d, err
	}
	switch {
	case meta.storageVersion != "":
		v, err := ParseVersion(meta.storageVersion)
		if err != nil {
			return d, fmt.Errorf("member/snap/db: storageVersion %q: %w", meta.storageVersion, err)
		}
		d.Version = v
		d.Why = append(d.Why, "member/snap/db has storageVersion "+meta.storageVersion+" (written by etcd 3.6+)")
	case meta.hasTerm:
		d.Version = Version{3, 5, 0}
		d.Why = append(d.Why, "member/snap/db has the raft term but no storageVersion (etcd 3.5)")
	default:
		d.Version = Version{3, 4, 0}
		d.Why = append(d.Why, "member/snap/db has neither storageVersion nor the raft term (etcd 3.4 or older; assumed 3.4, write version.txt if it is older)")
	}
	if meta.clusterVersion != "" {
		d.Why = append(d.Why, "cluster version "+meta.clusterVersion)
	}
	found, err := v2v3.DetectV2(dir, walDir)
	if err != nil {
		return d, err
	}
	d.Storage = StorageV3
	if found.Content {
		d.Storage = StorageV2
	}
	d.Why = append(d.Why, found.Why)
	if found.Replay != "" {
		d.V2Replay = found.Replay
		d.Why = append(d.Why, found.Replay)
	}
	return d, nil
}

// beUint64 decodes etcd's 8-byte big-endian counters; anything else is 0.
func beUint64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

type metaInfo struct {
	storageVersion string
	hasTerm        bool
	clusterVersion string
	consistentIdx  uint64
}

// readMeta reads the backend's schema markers read-only. etcd holds the file's lock while it
// runs, so a lock not granted in time means the data dir is in use.
func readMeta(path string) (metaInfo, error) {
	var m metaInfo
	if _, err := os.Stat(path); err != nil {
		return m, fmt.Errorf("%s: %w (every etcd 3 member has one)", path, err)
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return m, fmt.Errorf("%s is locked: a running etcd uses this data dir; stop it first", path)
	}
	if err != nil {
		return m, fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte("meta")); b != nil {
			m.storageVersion = string(b.Get([]byte("storageVersion")))
			m.hasTerm = beUint64(b.Get([]byte("term"))) != 0
			m.consistentIdx = beUint64(b.Get([]byte("consistent_index")))
		}
		if b := tx.Bucket([]byte("cluster")); b != nil {
			m.clusterVersion = string(b.Get([]byte("clusterVersion")))
		}
		return nil
	})
	return m, err
}
