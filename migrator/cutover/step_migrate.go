package cutover

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// migrateStep builds every green member's data dir from the copy: a snapshot restore, or the
// v2→v3 migration when the copy chose it (v2.go).
type migrateStep struct{}

func (migrateStep) name() string                  { return StepMigrate }
func (migrateStep) timeout(p *Plan) time.Duration { return p.Timeouts.Migrate.D() }
func (migrateStep) pastNoReturn() bool            { return false }

func (migrateStep) describe(r *runner, _ bool) string {
	p := r.p
	var dirs []string
	for _, m := range p.seeds() {
		dirs = append(dirs, m.DataDir)
	}
	if r.v2Possible() {
		return fmt.Sprintf("kubefence migrate v2-to-v3 from %s into %s (v3 keys kept, v2 keys renumbered above them, TTLs as leases measured from when the copy finished, the same for every member; revision +%d, marked compacted), or for auto without v2 content a snapshot restore",
			r.memberCopyPath(), strings.Join(dirs, ", "), p.Migration.RevisionBump)
	}
	if p.Replicating() {
		return fmt.Sprintf("restore the snapshot into %s without a revision bump (green at the snapshot's revision, for replication)", strings.Join(dirs, ", "))
	}
	return fmt.Sprintf("restore the snapshot into %s (revision +%d, marked compacted)", strings.Join(dirs, ", "), p.Migration.RevisionBump)
}

func (migrateStep) run(ctx context.Context, r *runner) (string, error) {
	if r.j.Mode == "v2-to-v3" {
		return r.migrateV2(ctx)
	}
	if err := r.restoreGreen(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d member data dir(s) built; green starts at revision %d", len(r.p.seeds()), r.j.SnapshotRevision+r.p.revisionBump()), nil
}

// restoreGreen builds every green member's data dir from the snapshot with etcd's restore,
// revisions bumped and marked compacted (not in mode replicate: Plan.revisionBump).
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
			RevisionBump:        uint64(p.revisionBump()),
			MarkCompacted:       p.revisionBump() > 0,
		})
	})
}

// buildGreenDirs builds every green member's data dir with build, through a temp dir
// (datadir.BuildInto) that gets this run's marker before it is renamed into place. A member dir
// that already holds this run's build is kept, so a resumed run does not redo it; any other
// non-empty dir is refused.
func buildGreenDirs(p *Plan, runID string, build func(m GreenMember, tmp string) error) error {
	for _, m := range p.seeds() {
		marker := filepath.Join(m.DataDir, restoreMarker)
		if b, err := os.ReadFile(marker); err == nil && string(b) == runID {
			continue
		}
		if entries, err := os.ReadDir(m.DataDir); err == nil && len(entries) > 0 {
			return fmt.Errorf("green data dir %s is not empty: refusing to overwrite it (move it away if it is not needed)", m.DataDir)
		}
		err := datadir.BuildInto(m.DataDir, func(tmp string) error {
			if err := build(m, tmp); err != nil {
				return fmt.Errorf("build %s: %w", m.Name, err)
			}
			// The marker is what lets a resumed run keep this dir: written durably (temp,
			// fsync, rename, fsync dir) before the dir is renamed into place.
			return atomicfile.Write(filepath.Join(tmp, restoreMarker), []byte(runID), 0o600)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// restoreMarker records, inside a green data dir, which cutover restored it.
const restoreMarker = "kubefence-restore-id"
