package cutover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// A blue member's v2 store lives in its snapshot files and WAL, which the v3 API does not
// expose. For a v2 source the copy step therefore takes two things: the v3 data as a
// maintenance snapshot after raft convergence (as for any source), and the member's v2 state by
// copying its files while it runs — snapshot files first, then WAL segments. etcd only appends
// to the WAL and writes snapshot files whole, so the copied WAL covers everything after the
// newest copied snapshot; the migration replays it only up to the committed index it holds, so
// the copy is a consistent prefix of the log (a torn last record is ignored). If etcd purged a
// WAL segment the copied snapshot still needed between the two copies, reading the copy fails
// and the copy is taken again.

func (r *runner) memberCopyPath() string { return filepath.Join(r.p.StateDir, "blue-member") }

// copyAttempts bounds retries of a live member copy that raced a WAL purge.
const copyAttempts = 3

// copyV2Member copies blue's member files next to the v3 snapshot (which becomes the copy's
// member/snap/db) and decides, for mode auto, whether the member holds v2 user content.
func (r *runner) copyV2Member(snapshotDB string) (string, error) {
	e := r.p.Blue.Etcd
	dst := r.memberCopyPath()
	var last error
	for try := 1; try <= copyAttempts; try++ {
		if err := copyLiveMember(e.DataDir, e.WALDir, snapshotDB, dst); err != nil {
			return "", err
		}
		has, why, err := v2v3.DetectV2(dst, "")
		if err == nil {
			r.j.Mode = "snapshot"
			if r.p.Migration.Mode == "v2-to-v3" || has {
				r.j.Mode = "v2-to-v3"
			}
			r.j.MemberCopy = dst
			return fmt.Sprintf("member files of %s copied (%s): %s", e.DataDir, why, r.j.Mode), nil
		}
		last = err
		if r.o.Log != nil {
			r.o.Log.Warn("the live member copy is not readable; copying again", "attempt", try, "err", err)
		}
	}
	return "", fmt.Errorf("copy of the running member %s: %w", e.DataDir, last)
}

// copyLiveMember copies member/snap/*.snap, then the WAL segments, then the v3 snapshot
// (without the sha256 etcd appends) as member/snap/db, into a temp dir renamed to dst.
func copyLiveMember(dataDir, walDir, snapshotDB, dst string) error {
	if walDir == "" {
		walDir = filepath.Join(dataDir, "member", "wal")
	}
	tmp := dst + ".part"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	snapDst, walDst := filepath.Join(tmp, "member", "snap"), filepath.Join(tmp, "member", "wal")
	for _, d := range []string{snapDst, walDst} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	snaps, _ := filepath.Glob(filepath.Join(dataDir, "member", "snap", "*.snap"))
	wals, _ := filepath.Glob(filepath.Join(walDir, "*.wal"))
	if len(wals) == 0 {
		return fmt.Errorf("no WAL files in %s: is blue.etcd.dataDir (or walDir) a member of blue?", walDir)
	}
	sort.Strings(wals)
	for _, f := range snaps {
		if err := copyFile(f, filepath.Join(snapDst, filepath.Base(f)), -1); err != nil {
			return err
		}
	}
	for _, f := range wals {
		if err := copyFile(f, filepath.Join(walDst, filepath.Base(f)), -1); err != nil {
			return err
		}
	}
	st, err := os.Stat(snapshotDB)
	if err != nil {
		return err
	}
	if err := copyFile(snapshotDB, filepath.Join(snapDst, "db"), st.Size()-32); err != nil {
		return err
	}
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(dst))
}

// copyFile copies src (its first n bytes when n >= 0) to dst and syncs it. A file that grows
// while copied is copied as far as it was read.
func copyFile(src, dst string, n int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	var r io.Reader = in
	if n >= 0 {
		r = io.LimitReader(in, n)
	}
	_, err = io.Copy(out, r)
	if err == nil {
		err = out.Sync()
	}
	return errors.Join(err, out.Close())
}

// migrateV2 builds every green member's data dir from the member copy with the v2→v3
// migration (v3 keys kept, v2 keys renumbered above them, TTL keys into leases), revisions
// bumped and marked compacted, each in a temp dir renamed into place with this run's marker.
func (r *runner) migrateV2(ctx context.Context) (string, error) {
	p := r.p
	var initial []string
	for _, m := range p.Green.Etcd.Members {
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	var rep *v2v3.Report
	for _, m := range p.Green.Etcd.Members {
		if b, err := os.ReadFile(filepath.Join(m.DataDir, restoreMarker)); err == nil && string(b) == r.j.ID {
			continue
		}
		if entries, err := os.ReadDir(m.DataDir); err == nil && len(entries) > 0 {
			return "", fmt.Errorf("green data dir %s is not empty: refusing to overwrite it (move it away if it is not needed)", m.DataDir)
		}
		tmp := m.DataDir + ".kubefence-tmp"
		if err := os.RemoveAll(tmp); err != nil {
			return "", err
		}
		var err error
		rep, err = v2v3.RunContext(ctx, v2v3.Config{
			DataDir: r.j.MemberCopy, OutputDir: tmp,
			Member:       v2v3.Membership{Name: m.Name, InitialCluster: strings.Join(initial, ","), InitialAdvertisePeerURLs: []string{m.PeerURL}, InitialClusterToken: p.Green.Etcd.ClusterToken},
			Options:      v2v3.Options{IncludeHidden: p.Migration.IncludeHidden, Now: time.Now()},
			RevisionBump: uint64(p.Migration.RevisionBump), MarkCompacted: p.Migration.RevisionBump > 0,
			OnConflict: p.Migration.OnConflict,
		})
		if err != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("migrate for %s: %w", m.Name, err)
		}
		if err := os.WriteFile(filepath.Join(tmp, restoreMarker), []byte(r.j.ID), 0o600); err != nil {
			return "", err
		}
		if err := os.Remove(m.DataDir); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("green data dir %s: %w", m.DataDir, err)
		}
		if err := os.Rename(tmp, m.DataDir); err != nil {
			return "", err
		}
		if err := atomicfile.SyncDir(filepath.Dir(m.DataDir)); err != nil {
			return "", err
		}
		r.j.V2Keys, r.j.V2Prefixes = rep.Keys.Keys, rep.Prefixes
	}
	if rep == nil {
		return fmt.Sprintf("%d member data dir(s) already built by this run", len(p.Green.Etcd.Members)), nil
	}
	v3 := 0
	if rep.V3 != nil {
		v3 = rep.V3.V3Keys
	}
	return fmt.Sprintf("%d member data dir(s) built: %d v3 keys kept, %d v2 keys migrated (%d with a lease, %d hidden left out), verified",
		len(p.Green.Etcd.Members), v3, rep.Keys.Keys, rep.Keys.TTLKeys, rep.Keys.HiddenSkipped), nil
}

// checkV2Keys counts, on green etcd, the keys under each prefix the v2 migration wrote to: at
// least as many as it wrote must be there (v3 keys may share a prefix).
func (r *runner) checkV2Keys(ctx context.Context) (int64, error) {
	var eps []string
	for _, m := range r.p.Green.Etcd.Members {
		eps = append(eps, m.ClientURL)
	}
	cli, err := etcdClient(EtcdClientSpec{}, eps...)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	var total int64
	for prefix, want := range r.j.V2Prefixes {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, fmt.Errorf("green etcd: count %s: %w", prefix, err)
		}
		if resp.Count < int64(want) {
			return 0, fmt.Errorf("green etcd holds %d keys under %s, the v2 migration wrote %d", resp.Count, prefix, want)
		}
		total += resp.Count
	}
	return total, nil
}
