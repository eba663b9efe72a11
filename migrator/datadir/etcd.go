package datadir

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/internal/tlsutil"
)

// ConnSpec says how to reach an etcd cluster: its endpoints and TLS files. NewClient makes a
// client of it.
type ConnSpec struct {
	Endpoints []string `yaml:"endpoints" json:"endpoints"`
	CAFile    string   `yaml:"caFile" json:"caFile"`
	CertFile  string   `yaml:"certFile" json:"certFile"`
	KeyFile   string   `yaml:"keyFile" json:"keyFile"`
}

func clientTLS(spec ConnSpec) (*tls.Config, error) {
	if spec.CAFile == "" && spec.CertFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if spec.CAFile != "" {
		var err error
		if cfg.RootCAs, err = tlsutil.LoadCAPool(spec.CAFile); err != nil {
			return nil, err
		}
	}
	if spec.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(spec.CertFile, spec.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// NewClient connects to spec's endpoints, or to the given ones with spec's TLS settings.
func NewClient(spec ConnSpec, endpoints ...string) (*clientv3.Client, error) {
	tc, err := clientTLS(spec)
	if err != nil {
		return nil, fmt.Errorf("etcd TLS: %w", err)
	}
	if len(endpoints) == 0 {
		endpoints = spec.Endpoints
	}
	return newClient(tc, endpoints)
}

func newClient(tc *tls.Config, endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, TLS: tc, Logger: zap.NewNop()})
}

// MemberStatus is what the copy needs of each member.
type MemberStatus struct {
	Endpoint  string `json:"endpoint"`
	RaftIndex uint64 `json:"raftIndex"`
	Revision  int64  `json:"revision"`
	Version   string `json:"version"`
	DBSize    int64  `json:"dbSize"`
}

// ClusterStatus asks every endpoint for its status; an endpoint that does not answer is an error.
func ClusterStatus(ctx context.Context, cli *clientv3.Client, endpoints []string) ([]MemberStatus, error) {
	var out []MemberStatus
	var errs []error
	for _, ep := range endpoints {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("etcd %s: %w", ep, err))
			continue
		}
		if len(st.Errors) > 0 {
			errs = append(errs, fmt.Errorf("etcd %s reports errors: %v", ep, st.Errors))
			continue
		}
		out = append(out, MemberStatus{Endpoint: ep, RaftIndex: st.RaftIndex, Revision: st.Header.Revision, Version: st.Version, DBSize: st.DbSize})
	}
	return out, errors.Join(errs...)
}

// WaitConverged waits until every member answers and their raft indexes are within one of each
// other (etcd's migration guidance), and returns the most advanced member and every member's
// status at that moment.
func WaitConverged(ctx context.Context, cli *clientv3.Client, endpoints []string) (MemberStatus, []MemberStatus, error) {
	var best MemberStatus
	var sts []MemberStatus
	var last error
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if sts, last = ClusterStatus(ctx, cli, endpoints); last != nil {
			return false, nil
		}
		lo, hi := sts[0], sts[0]
		for _, s := range sts {
			if s.RaftIndex < lo.RaftIndex {
				lo = s
			}
			if s.RaftIndex > hi.RaftIndex {
				hi = s
			}
		}
		if hi.RaftIndex-lo.RaftIndex > 1 {
			last = fmt.Errorf("raft indexes not converged: %s at %d, %s at %d", lo.Endpoint, lo.RaftIndex, hi.Endpoint, hi.RaftIndex)
			return false, nil
		}
		best = hi
		return true, nil
	})
	if err != nil {
		return MemberStatus{}, nil, fmt.Errorf("etcd members not healthy and converged in time: %w (last: %v)", err, last)
	}
	return best, sts, nil
}

// SnapshotInfo describes a snapshot taken through the maintenance API.
type SnapshotInfo struct {
	Path     string `json:"path"`
	Endpoint string `json:"endpoint"`
	Revision int64  `json:"revision"`
	Bytes    int64  `json:"bytes"`
	Keys     int    `json:"keys"`
	// Members is every member's status when the raft indexes had converged.
	Members []MemberStatus `json:"members,omitempty"`
	// ClusterID is the cluster's; ReadRevision is the revision of the linearizable read taken
	// before the snapshot (Revision is at least that).
	ClusterID    uint64 `json:"clusterID,omitempty"`
	ReadRevision int64  `json:"readRevision,omitempty"`
	// Warnings are what the snapshot may lack (v2 content).
	Warnings []string `json:"warnings,omitempty"`
}

// TakeSnapshot streams a snapshot of the cluster into dst that holds every write acknowledged
// before the call: it checks spec's endpoints are exactly the cluster's members (CheckMembers),
// takes a linearizable read (its revision covers every acknowledged write), waits until every
// member is healthy and converged, then until the most advanced one has applied every entry
// committed at that moment, streams the snapshot from it (through a temp file renamed into
// place, the sha256 the server appends checked), and refuses a snapshot whose revision is
// below the read's.
func TakeSnapshot(ctx context.Context, spec ConnSpec, dst string) (SnapshotInfo, error) {
	cli, err := NewClient(spec)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer cli.Close()
	clusterID, err := CheckMembers(ctx, spec)
	if err != nil {
		return SnapshotInfo{}, err
	}
	read, err := cli.Get(ctx, HealthPrefix+"snapshot-barrier") // linearizable: the default
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("etcd: linearizable read before the snapshot: %w", err)
	}
	best, all, err := WaitConverged(ctx, cli, spec.Endpoints)
	if err != nil {
		return SnapshotInfo{}, err
	}
	var last error
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		st, err := cli.Status(ctx, best.Endpoint)
		last = err
		return err == nil && st.RaftAppliedIndex >= best.RaftIndex, nil
	})
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("etcd %s has not applied up to its committed index %d (last: %v): %w", best.Endpoint, best.RaftIndex, last, err)
	}
	info, err := SnapshotFrom(ctx, spec, best.Endpoint, dst)
	info.Members, info.ClusterID, info.ReadRevision = all, clusterID, read.Header.Revision
	info.Warnings = v2Warnings(all)
	if err == nil && info.Revision < info.ReadRevision {
		err = fmt.Errorf("the snapshot from %s is at revision %d, below the revision %d a linearizable read saw before it: it would miss acknowledged writes; run again", best.Endpoint, info.Revision, info.ReadRevision)
	}
	return info, err
}

// v2Warnings says what a snapshot of members lacks: the maintenance snapshot is the v3 backend
// only, and a member on etcd 3.5 or older may hold v2 keys (in its v2 snapshot files and WAL),
// which no v3 API shows. It warns rather than refuses: whether v2 keys exist cannot be asked
// over the v3 API, most such clusters (Kubernetes') hold none, and `etcdctl snapshot save` has
// the same v3-only content.
func v2Warnings(members []MemberStatus) []string {
	var old []string
	for _, m := range members {
		if v, err := ParseVersion(m.Version); err != nil || v.Major < 3 || (v.Major == 3 && v.Minor <= 5) {
			old = append(old, fmt.Sprintf("%s (etcd %s)", m.Endpoint, m.Version))
		}
	}
	if len(old) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("the snapshot holds the v3 keyspace only: any v2 keys of %s are NOT in it (etcd 3.5 and older keep them outside the v3 backend, and the v3 API cannot tell whether there are any). For v2 content, copy each member's data dir instead: kubefence migrate copy --data-dir DIR --output-dir OUT --live --endpoint URL",
		strings.Join(old, ", "))}
}

// CheckMembers checks that spec's endpoints reach exactly the voting members of one cluster
// (the first endpoint's), each once, and returns the cluster's ID: an endpoint of another
// cluster, two endpoints of one member, or a member no endpoint reaches is an error naming it.
func CheckMembers(ctx context.Context, spec ConnSpec) (uint64, error) {
	endpoints := spec.Endpoints
	if len(endpoints) == 0 {
		return 0, errors.New("no etcd endpoints")
	}
	cli, err := NewClient(spec, endpoints[0])
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		return 0, fmt.Errorf("etcd %s: member list: %w", endpoints[0], err)
	}
	reached := map[uint64]string{}
	for _, ep := range endpoints {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("etcd %s: %w", ep, err)
		}
		if st.Header.ClusterId != ml.Header.ClusterId {
			return 0, fmt.Errorf("etcd %s belongs to cluster %x, not to cluster %x of the first endpoint %s: list the members of one cluster", ep, st.Header.ClusterId, ml.Header.ClusterId, endpoints[0])
		}
		if other, ok := reached[st.Header.MemberId]; ok {
			return 0, fmt.Errorf("etcd %s and %s are the same member %x: list each member once", other, ep, st.Header.MemberId)
		}
		reached[st.Header.MemberId] = ep
	}
	for _, m := range ml.Members {
		if _, ok := reached[m.ID]; !ok && !m.IsLearner {
			return 0, fmt.Errorf("etcd member %s (%x, client URLs %v) is not among the endpoints %v: list every member", m.Name, m.ID, m.ClientURLs, endpoints)
		}
	}
	return ml.Header.ClusterId, nil
}

// SnapshotFrom streams a snapshot from one member into dst, verified and renamed into place.
// It never replaces a file: dst must not exist when the stream ends (a caller that retakes
// its own snapshot removes the old one first).
func SnapshotFrom(ctx context.Context, spec ConnSpec, endpoint, dst string) (SnapshotInfo, error) {
	one, err := NewClient(spec, endpoint)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer one.Close()
	rc, err := one.Snapshot(ctx)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot from %s: %w", endpoint, err)
	}
	defer rc.Close()
	// This snapshot's own temp file: what a killed run left there (a file, or a link, never
	// written through) is removed, and a new file made.
	tmp := dst + ".part"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return SnapshotInfo{}, err
	}
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return SnapshotInfo{}, err
	}
	n, err := io.Copy(f, rc)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return SnapshotInfo{}, fmt.Errorf("snapshot from %s: %w", endpoint, err)
	}
	if err := verifySnapshotHash(tmp, n); err != nil {
		os.Remove(tmp)
		return SnapshotInfo{}, err
	}
	if err := atomicfile.RenameNoReplace(tmp, dst); err != nil {
		os.Remove(tmp)
		if errors.Is(err, fs.ErrExist) {
			return SnapshotInfo{}, fmt.Errorf("snapshot from %s: %w: it appeared while the snapshot streamed and is left as it is", endpoint, err)
		}
		// Another reason (ErrNoReplaceUnsupported: NFS) says what it is.
		return SnapshotInfo{}, fmt.Errorf("snapshot from %s, placing it: %w", endpoint, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(dst)); err != nil {
		return SnapshotInfo{}, err
	}
	st, err := snapshot.NewV3(zap.NewNop()).Status(dst)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("read snapshot %s: %w", dst, err)
	}
	return SnapshotInfo{Path: dst, Endpoint: endpoint, Revision: st.Revision, Bytes: n, Keys: st.TotalKey}, nil
}

// verifySnapshotHash checks the sha256 that etcd appends to a snapshot stream.
func verifySnapshotHash(path string, size int64) error {
	if size < sha256.Size || (size-sha256.Size)%512 != 0 {
		return fmt.Errorf("snapshot %s: %d bytes is not a database plus its sha256", path, size)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, size-sha256.Size); err != nil {
		return err
	}
	want := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, want); err != nil {
		return err
	}
	if got := h.Sum(nil); string(got) != string(want) {
		return fmt.Errorf("snapshot %s: sha256 mismatch (the copy is damaged)", path)
	}
	return nil
}
