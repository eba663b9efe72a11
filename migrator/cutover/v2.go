package cutover

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// A blue member's v2 store lives in its snapshot files and WAL, which the v3 API does not
// expose. For a v2 source the copy step therefore takes two things: the v3 data as a
// maintenance snapshot after raft convergence (as for any source), and the member's v2 state by
// copying its files while it runs with datadir.CopyMemberFiles — snapshot files first, then WAL
// segments, a consistent prefix of the log (docs/datadir.md). The migration replays the copied
// WAL only up to the committed index it holds. If etcd purged a WAL segment the copied snapshot
// still needed between the two copies, reading the copy fails and the copy is taken again.

func (r *runner) memberCopyPath() string { return filepath.Join(r.p.StateDir, "blue-member") }

// copyV2Member copies blue's member files next to the v3 snapshot (which becomes the copy's
// member/snap/db) and decides, for mode auto, whether the member holds v2 content.
func (r *runner) copyV2Member(ctx context.Context, snapshotDB string, blueCluster uint64) (string, error) {
	e := r.p.Blue.Etcd
	if err := runningMemberDir(e.DataDir); err != nil {
		return "", err
	}
	dst := r.memberCopyPath()
	var last error
	for try := 1; try <= datadir.LiveAttempts; try++ {
		if err := copyLiveMember(ctx, e.DataDir, e.WALDir, snapshotDB, dst); errors.Is(err, datadir.ErrRaced) {
			last = err
			continue
		} else if err != nil {
			return "", err
		}
		found, err := v2v3.DetectV2(dst, "")
		if err == nil {
			if err := sameCluster(e.DataDir, dst, blueCluster); err != nil {
				return "", err
			}
			r.j.Mode = copyMode(r.p.Migration.Mode, found)
			return fmt.Sprintf("member files of %s copied (%s): %s", e.DataDir, found.Why, r.j.Mode), nil
		}
		last = err
		if r.o.Log != nil {
			r.o.Log.Warn("the live member copy is not readable; copying again", "attempt", try, "err", err)
		}
	}
	return "", fmt.Errorf("copy of the running member %s: %w", e.DataDir, last)
}

// copyMode is the mode of a fenced copy of a member whose files hold what found says: v2-to-v3
// when the plan asks for it or the member holds v2 content, snapshot otherwise. v2 requests
// without content that etcd 3.6 refuses to replay (found.Replay) do not count: green is restored
// from a v3 snapshot and never replays blue's WAL.
func copyMode(planned string, found v2v3.V2Findings) string {
	if planned == "v2-to-v3" || found.Content {
		return "v2-to-v3"
	}
	return "snapshot"
}

// copyLiveMember copies the running member's files with the v3 snapshot (without the sha256
// etcd appends) as its backend, into dst (replacing an earlier attempt).
func copyLiveMember(ctx context.Context, dataDir, walDir, snapshotDB, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	_, err := datadir.BuildDir(dst, func(tmp string) (datadir.Manifest, error) {
		return datadir.CopyMemberFiles(ctx, dataDir, walDir, tmp, func() (string, int64, error) {
			st, err := os.Stat(snapshotDB)
			if err != nil {
				return "", 0, err
			}
			return snapshotDB, st.Size() - sha256.Size, nil
		})
	})
	return err
}

func (r *runner) v2ReportPath() string { return filepath.Join(r.p.StateDir, "v2-migration.json") }

// migrateV2 builds every green member's data dir from the member copy with the v2→v3
// migration (v3 keys kept, v2 keys renumbered above them, TTL keys into leases), revisions
// bumped and marked compacted. The migration's report is kept in the state dir, so a resumed
// step whose data dirs are already built still knows what to check on green.
func (r *runner) migrateV2(ctx context.Context) (string, error) {
	p := r.p
	now, err := r.ttlClock()
	if err != nil {
		return "", err
	}
	quota, set := greenQuota(p) // the report warns against green's own, etcd's default if none
	if !set {
		quota = 0
	}
	err = buildGreenDirs(ctx, p, r.j.ID, func(m GreenMember, tmp string) error {
		rep, err := v2v3.RunContext(ctx, v2v3.Config{
			Quota:   quota,
			DataDir: r.memberCopyPath(), OutputDir: tmp,
			Member:       v2v3.Membership{Name: m.Name, InitialCluster: p.greenInitialCluster(), InitialAdvertisePeerURLs: []string{m.PeerURL}, InitialClusterToken: p.Green.Etcd.ClusterToken},
			Options:      v2v3.Options{IncludeHidden: p.Migration.IncludeHidden, Now: now},
			RevisionBump: uint64(p.Migration.RevisionBump), MarkCompacted: p.Migration.RevisionBump > 0,
			OnConflict: p.Migration.OnConflict,
			// blue runs on: what its apiservers write around the copy, past the fence, is what
			// this fenced-copy path leaves behind (the replication cutover does not), and they
			// write again what they need on green.
			DropV3Tail: true,
		})
		if err != nil {
			return err
		}
		b, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		return atomicfile.Write(r.v2ReportPath(), b, 0o600)
	})
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(r.v2ReportPath())
	if err != nil {
		return "", fmt.Errorf("the v2 migration's report: %w", err)
	}
	var rep v2v3.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return "", fmt.Errorf("the v2 migration's report %s: %w", r.v2ReportPath(), err)
	}
	r.j.V2Prefixes, r.j.V2Leased = rep.Prefixes, rep.LeasedPrefixes
	v3 := 0
	if rep.V3 != nil {
		v3 = rep.V3.V3Keys
	}
	detail := fmt.Sprintf("%d member data dir(s) built: %d v3 keys kept, %d v2 keys migrated (%d with a lease, %d hidden left out), verified",
		len(p.Green.Etcd.Members), v3, rep.Keys.Keys, rep.Keys.TTLKeys, rep.Keys.HiddenSkipped)
	for _, w := range rep.Warnings {
		detail += "; " + w
	}
	return detail, nil
}

// ttlClock is the time every green member's TTLs are measured against (which TTL keys are
// expired, the leases' remaining TTLs): when the copy step finished, as its journaled record
// says. One clock for all members, those a resumed run builds later too, so they hold the same
// keys and leases; a clock per build would keep a key expiring between two builds on one member
// and drop it on the other, and its lease's revoke would put their revisions apart for good.
func (r *runner) ttlClock() (time.Time, error) {
	rec, ok := r.j.record(StepCopy)
	if !ok {
		return time.Time{}, fmt.Errorf("the journal of %s records no finished copy step, which the v2 migration measures TTLs from: abort this cutover and run a new one", r.j.ID)
	}
	return rec.Started.Add(rec.Duration).UTC(), nil
}

// checkV2Keys counts, on green etcd, the keys under each prefix the v2 migration wrote to: at
// least as many as it wrote must be there (v3 keys may share a prefix), but for those with a
// TTL: green's lessor counts their leases down from its start, and a short one may have run out
// by now, as it would have on blue.
func (r *runner) checkV2Keys(ctx context.Context) (string, error) {
	cli, err := datadir.NewClient(r.p.greenConn())
	if err != nil {
		return "", err
	}
	defer cli.Close()
	var wrote, found, short int64
	for prefix, want := range r.j.V2Prefixes {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return "", fmt.Errorf("green etcd: count %s: %w", prefix, err)
		}
		leased := r.j.V2Leased[prefix]
		if resp.Count < int64(want-leased) {
			return "", fmt.Errorf("green etcd holds %d keys under %s, the v2 migration wrote %d (%d of them with a TTL, which may have run out since): keys without one are missing", resp.Count, prefix, want, leased)
		}
		wrote, found = wrote+int64(want), found+resp.Count
		short += max(0, int64(want)-resp.Count)
	}
	if short > 0 {
		return fmt.Sprintf("green etcd serves the migrated v2 keys without a TTL; %d with one ran out since the copy (%d keys under their prefixes, %d migrated)", short, found, wrote), nil
	}
	return fmt.Sprintf("green etcd serves the %d migrated v2 keys (%d keys under their prefixes)", wrote, found), nil
}

// runningMemberDir refuses a blue.etcd.dataDir no running etcd holds (a running member keeps
// a lock on its backend, member/snap/db): a copy of a member (a backup, a dir copied by hand) or
// a stopped one. Its cluster ID is blue's, which is all sameCluster compares, but its v2 store
// is as old as it is: migrated to green as blue's, what blue's v2 store took since would be
// lost without a word (or mode auto decided on content blue no longer has).
func runningMemberDir(dir string) error {
	busy, err := datadir.InUse(dir)
	switch {
	case err != nil:
		return fmt.Errorf("blue.etcd.dataDir %s: %w", dir, err)
	case !busy:
		return fmt.Errorf("blue.etcd.dataDir %s is not held by a running etcd (a running member locks its member/snap/db): a copy of a member, or a stopped one, whose v2 store is as old as it is and would be migrated to green as blue's, losing what blue took since; give the data dir of a blue member running on this host", dir)
	}
	return nil
}

// sameCluster refuses a member copy (of dataDir) whose WAL says it belongs to another cluster
// than the one blue's endpoints reach: its v2 store is not blue's.
func sameCluster(dataDir, memberCopy string, blueCluster uint64) error {
	src, err := v2v3.ReadSource(memberCopy, "")
	if err != nil {
		return fmt.Errorf("the copy of %s: %w", dataDir, err)
	}
	id, cluster := src.NodeID, src.ClusterID
	src.Close()
	if cluster != blueCluster {
		return fmt.Errorf("blue.etcd.dataDir %s is member %x of etcd cluster %x, not of blue's cluster %x (the one blue.etcd.endpoints reach): give the data dir of a blue member on this host", dataDir, id, cluster, blueCluster)
	}
	return nil
}
