package cutover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	if err := r.restoreGreen(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d member data dir(s) built; green starts at revision %d", len(r.p.seeds()), r.j.SnapshotRevision+r.p.revisionBump()), nil
}

// restoreGreen builds every green member's data dir from the snapshot with etcd's restore,
// revisions bumped and marked compacted (not in mode replicate: Plan.revisionBump).
func (r *runner) restoreGreen(ctx context.Context) error {
	p := r.p
	return buildGreenDirs(ctx, p, r.j.ID, func(m GreenMember, tmp string) error {
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
// non-empty dir is refused. ctx ending (the step's timeout, a signal) ends it at once
// (buildGreenDir).
func buildGreenDirs(ctx context.Context, p *Plan, runID string, build func(m GreenMember, tmp string) error) error {
	for _, m := range p.seeds() {
		marker := filepath.Join(m.DataDir, restoreMarker)
		if b, err := os.ReadFile(marker); err == nil && string(b) == runID {
			continue
		}
		if entries, err := os.ReadDir(m.DataDir); err == nil && len(entries) > 0 {
			return fmt.Errorf("green data dir %s is not empty: refusing to overwrite it (move it away if it is not needed)", m.DataDir)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("building %s's data dir %s: not begun: %w", m.Name, m.DataDir, err)
		}
		if err := buildGreenDir(ctx, m, runID, build); err != nil {
			return err
		}
	}
	return nil
}

// errBuildAbandoned ends a build whose step gave up on it: its output is discarded.
var errBuildAbandoned = errors.New("abandoned: the step ended first")

// buildGreenDir builds m's data dir with build in a goroutine of its own, so that the step's
// timeout and a signal are acted on at once although build may not stop for them (etcd's
// restore takes no context). Abandoned, the build runs to its end in the background and is then
// discarded (BuildInto removes its temp dir; nothing is renamed into m.DataDir), so no later
// step, nor a resume, takes a dir restored partly, or after the step gave up. A build already
// placing its output when ctx ends is waited for: that takes a marker write and a rename.
func buildGreenDir(ctx context.Context, m GreenMember, runID string, build func(m GreenMember, tmp string) error) error {
	var mu sync.Mutex
	placing, abandoned := false, false
	done := make(chan error, 1)
	go func() {
		done <- datadir.BuildInto(m.DataDir, func(tmp string) error {
			if err := build(m, tmp); err != nil {
				return fmt.Errorf("build %s: %w", m.Name, err)
			}
			mu.Lock()
			placing = !abandoned
			mu.Unlock()
			if !placing {
				return errBuildAbandoned
			}
			// The marker is what lets a resumed run keep this dir: written durably (temp,
			// fsync, rename, fsync dir) before the dir is renamed into place.
			return atomicfile.Write(filepath.Join(tmp, restoreMarker), []byte(runID), 0o600)
		})
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	mu.Lock()
	abandoned = !placing
	mu.Unlock()
	if !abandoned {
		return <-done
	}
	return fmt.Errorf("building %s's data dir %s did not finish: %w; the build is abandoned: it goes on in the background and its temp dir beside %s is removed when it ends (a kubefence that exits first leaves it: 'kubefence cutover cleanup --remove-data-dirs' removes it); %s was not created",
		m.Name, m.DataDir, context.Cause(ctx), m.DataDir, m.DataDir)
}

// restoreMarker records, inside a green data dir, which cutover restored it.
const restoreMarker = "kubefence-restore-id"
