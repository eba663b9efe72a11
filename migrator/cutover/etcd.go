package cutover

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubefence/kubefence/internal/atomicfile"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

func etcdTLS(spec EtcdClientSpec) (*tls.Config, error) {
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

func etcdClient(spec EtcdClientSpec, endpoints ...string) (*clientv3.Client, error) {
	tc, err := etcdTLS(spec)
	if err != nil {
		return nil, fmt.Errorf("etcd TLS: %w", err)
	}
	if len(endpoints) == 0 {
		endpoints = spec.Endpoints
	}
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, TLS: tc, Logger: zap.NewNop()})
}

// memberStatus is what the copy needs of each member.
type memberStatus struct {
	Endpoint  string
	RaftIndex uint64
	Revision  int64
	Version   string
	DBSize    int64
}

// clusterStatus asks every endpoint for its status; an endpoint that does not answer is an error.
func clusterStatus(ctx context.Context, cli *clientv3.Client, endpoints []string) ([]memberStatus, error) {
	var out []memberStatus
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
		out = append(out, memberStatus{Endpoint: ep, RaftIndex: st.RaftIndex, Revision: st.Header.Revision, Version: st.Version, DBSize: st.DbSize})
	}
	return out, errors.Join(errs...)
}

// waitConverged waits until every member answers and their raft indexes are within one of each
// other (etcd's migration guidance), and returns the most advanced member.
func waitConverged(ctx context.Context, cli *clientv3.Client, endpoints []string) (memberStatus, error) {
	var last error
	for {
		sts, err := clusterStatus(ctx, cli, endpoints)
		if err == nil {
			lo, hi := sts[0], sts[0]
			for _, s := range sts {
				if s.RaftIndex < lo.RaftIndex {
					lo = s
				}
				if s.RaftIndex > hi.RaftIndex {
					hi = s
				}
			}
			if hi.RaftIndex-lo.RaftIndex <= 1 {
				return hi, nil
			}
			last = fmt.Errorf("raft indexes not converged: %s at %d, %s at %d", lo.Endpoint, lo.RaftIndex, hi.Endpoint, hi.RaftIndex)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return memberStatus{}, fmt.Errorf("blue etcd: %w (last: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// SnapshotInfo describes a copy of blue.
type SnapshotInfo struct {
	Path     string
	Endpoint string
	Revision int64
	Bytes    int64
	Keys     int
}

// takeSnapshot streams a snapshot from the most advanced converged member into dst (through a
// temp file renamed into place) and checks the sha256 the server appends.
func takeSnapshot(ctx context.Context, spec EtcdClientSpec, dst string) (SnapshotInfo, error) {
	cli, err := etcdClient(spec)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer cli.Close()
	best, err := waitConverged(ctx, cli, spec.Endpoints)
	if err != nil {
		return SnapshotInfo{}, err
	}
	one, err := etcdClient(spec, best.Endpoint)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer one.Close()
	rc, err := one.Snapshot(ctx)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot from %s: %w", best.Endpoint, err)
	}
	defer rc.Close()
	tmp := dst + ".part"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
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
		return SnapshotInfo{}, fmt.Errorf("snapshot from %s: %w", best.Endpoint, err)
	}
	if err := verifySnapshotHash(tmp, n); err != nil {
		os.Remove(tmp)
		return SnapshotInfo{}, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return SnapshotInfo{}, err
	}
	if err := atomicfile.SyncDir(filepath.Dir(dst)); err != nil {
		return SnapshotInfo{}, err
	}
	st, err := snapshot.NewV3(zap.NewNop()).Status(dst)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("read snapshot %s: %w", dst, err)
	}
	return SnapshotInfo{Path: dst, Endpoint: best.Endpoint, Revision: st.Revision, Bytes: n, Keys: st.TotalKey}, nil
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

// restoreGreen builds every green member's data dir from the snapshot with etcd's restore,
// revisions bumped and marked compacted.
func (r *runner) restoreGreen() error {
	p := r.p
	return buildGreenDirs(p, r.j.ID, func(m GreenMember, tmp string) error {
		return snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
			SnapshotPath:        r.j.Snapshot,
			Name:                m.Name,
			OutputDataDir:       tmp,
			PeerURLs:            []string{m.PeerURL},
			InitialCluster:      p.greenInitialCluster(),
			InitialClusterToken: p.Green.Etcd.ClusterToken,
			RevisionBump:        uint64(p.Migration.RevisionBump),
			MarkCompacted:       p.Migration.RevisionBump > 0,
		})
	})
}

// buildGreenDirs builds every green member's data dir with build, into a temp dir (absent when
// build starts) that gets this run's marker and is renamed into place. A member dir that
// already holds this run's build is kept, so a resumed run does not redo it; any other
// non-empty dir is refused.
func buildGreenDirs(p *Plan, runID string, build func(m GreenMember, tmp string) error) error {
	for _, m := range p.Green.Etcd.Members {
		marker := filepath.Join(m.DataDir, restoreMarker)
		if b, err := os.ReadFile(marker); err == nil && string(b) == runID {
			continue
		}
		if entries, err := os.ReadDir(m.DataDir); err == nil && len(entries) > 0 {
			return fmt.Errorf("green data dir %s is not empty: refusing to overwrite it (move it away if it is not needed)", m.DataDir)
		}
		if err := os.MkdirAll(filepath.Dir(m.DataDir), 0o700); err != nil {
			return err
		}
		tmp := m.DataDir + ".kubefence-tmp"
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		if err := build(m, tmp); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("build %s: %w", m.Name, err)
		}
		if err := os.WriteFile(filepath.Join(tmp, restoreMarker), []byte(runID), 0o600); err != nil {
			return err
		}
		if err := os.Remove(m.DataDir); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("green data dir %s: %w", m.DataDir, err)
		}
		if err := os.Rename(tmp, m.DataDir); err != nil {
			return err
		}
		if err := atomicfile.SyncDir(filepath.Dir(m.DataDir)); err != nil {
			return err
		}
	}
	return nil
}

// restoreMarker records, inside a green data dir, which cutover restored it.
const restoreMarker = "kubefence-restore-id"
