package cutover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubefence/kubefence/migrator/datadir"
)

// copyStep snapshots blue (every acknowledged write in it: invariant acked-on-green) and, for a
// v2 source, copies a blue member's files next to it and decides the migration (v2.go).
type copyStep struct{}

func (copyStep) name() string                  { return StepCopy }
func (copyStep) timeout(p *Plan) time.Duration { return p.Timeouts.Copy.D() }
func (copyStep) pastNoReturn() bool            { return false }

func (copyStep) describe(r *runner, _ bool) string {
	p := r.p
	s := fmt.Sprintf("check blue.etcd.endpoints are blue's members, take a linearizable read, wait for the raft indexes to converge and the most advanced member to apply what is committed, snapshot it into %s, check its sha256 and that its revision is at least the read's", r.snapshotPath())
	if r.v2Possible() {
		s += fmt.Sprintf("; copy %s's snapshot files, then its WAL, into %s", p.Blue.Etcd.DataDir, r.memberCopyPath())
		if p.Migration.Mode == "auto" {
			s += "; look for v2 user content there (v2-to-v3 if any, snapshot otherwise)"
		}
	}
	return s
}

func (copyStep) run(ctx context.Context, r *runner) (string, error) {
	// A run that ended after the snapshot's rename but before the journal said so took it; a
	// snapshot never replaces a file, so this step's own goes first.
	if err := os.Remove(r.snapshotPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	info, err := datadir.TakeSnapshot(ctx, r.p.Blue.Etcd.EtcdClientSpec, r.snapshotPath())
	if err != nil {
		return "", err
	}
	r.j.Snapshot, r.j.SnapshotRevision, r.j.SnapshotBytes = info.Path, info.Revision, info.Bytes
	when := "after the fence"
	if r.p.Replicating() {
		when = "just before, writes open,"
	}
	msg := fmt.Sprintf("%.1f MB, %d keys at revision %d (a linearizable read %s saw %d) from %s", float64(info.Bytes)/1e6, info.Keys, info.Revision, when, info.ReadRevision, info.Endpoint)
	r.j.Mode = "snapshot"
	if r.p.Replicating() {
		r.j.Mode = ModeReplicate
	}
	if r.v2Possible() {
		m, err := r.copyV2Member(ctx, info.Path, info.ClusterID)
		if err != nil {
			return "", err
		}
		return msg + "; " + m, nil
	}
	return msg + v2NotCopied(info.Warnings), nil
}

// v2NotCopied is the copy step's warning when blue's etcd may hold v2 keys (3.5 or older: the
// snapshot's warnings say so) and the plan copies none (no blue.etcd.dataDir): green would
// start without them, and nothing else would tell.
func v2NotCopied(warnings []string) string {
	if len(warnings) == 0 {
		return ""
	}
	return "; WARNING: " + strings.Join(warnings, "; ") + ". In a cutover: blue's v2 keys, if it has any, will not be on green; a blue with v2 content needs blue.etcd.dataDir in the plan (migration.mode auto or v2-to-v3)"
}

func (r *runner) snapshotPath() string { return filepath.Join(r.p.StateDir, "blue-snapshot.db") }

// v2Possible says whether the copy looks at a blue member's v2 store.
func (r *runner) v2Possible() bool {
	return r.p.Migration.Mode != "snapshot" && !r.p.Replicating() && r.p.Blue.Etcd.DataDir != ""
}
