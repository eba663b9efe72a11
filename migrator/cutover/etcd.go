package cutover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

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
		// The marker is what lets a resumed run keep this dir: written durably (temp, fsync,
		// rename, fsync dir) before the dir is renamed into place.
		if err := atomicfile.Write(filepath.Join(tmp, restoreMarker), []byte(runID), 0o600); err != nil {
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
