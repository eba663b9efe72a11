package datadir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coreos/go-semver/semver"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/storage/backend"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// storageAt is the storage kind when step s runs: etcd2 until a v2 migration before it is done.
func (e *executor) storageAt(s *StepReport) Storage {
	v2 := false
	for _, d := range e.rep.Before {
		v2 = v2 || d.Storage == StorageV2
	}
	for _, o := range e.rep.Steps {
		if o == s {
			break
		}
		if o.Kind == StepMigrateV2 || o.Kind == StepDowngrade {
			v2 = false
		}
	}
	if v2 {
		return StorageV2
	}
	return StorageV3
}

// runStep starts the step's etcd on every data dir together (on loopback client ports no one
// else uses), waits until the cluster is healthy, checks it serves (v3 data: a write to a
// reserved key, deleted at once; v2 data: a read only), waits for 3.6+ to record its storage
// version, stops it cleanly, checks the backend now carries that version's markers, and writes
// the version file.
func (e *executor) runStep(ctx context.Context, s *StepReport) error {
	v, err := ParseVersion(s.Version)
	if err != nil {
		return err
	}
	bin := Binary{Path: s.Binary, Version: v}
	storage := e.storageAt(s)
	type member struct {
		dir string
		ms  Membership
		p   *etcdProc
	}
	var members []*member
	for _, d := range e.opts.DataDirs {
		ms, err := ReadMembership(d, "")
		if err != nil {
			return err
		}
		members = append(members, &member{dir: d, ms: ms})
	}
	defer func() {
		for _, m := range members {
			if m.p != nil {
				m.p.kill()
			}
		}
	}()
	var initial []string
	peers := map[string][]string{}
	for _, m := range members {
		if len(members) == 1 {
			port, err := freePort()
			if err != nil {
				return err
			}
			peers[m.dir] = []string{fmt.Sprintf("http://127.0.0.1:%d", port)}
		} else {
			// Members find each other at the peer URLs their data records.
			peers[m.dir] = m.ms.Self.PeerURLs
			if err := bindable(m.ms.Self.PeerURLs); err != nil {
				return fmt.Errorf("%s (member %s): %w; a multi-member upgrade starts all members on this host at the peer URLs their data records, so those must be local and free (for members on separate hosts, upgrade them rolling, one at a time, with etcd itself)", m.dir, m.ms.Self.Name, err)
			}
		}
		for _, u := range peers[m.dir] {
			initial = append(initial, m.ms.Self.Name+"="+u)
		}
	}
	var urls []string
	for _, m := range members {
		quota := int64(8 << 30)
		if st, err := os.Stat(filepath.Join(m.dir, "member", "snap", "db")); err == nil && 2*st.Size() > quota {
			quota = 2 * st.Size()
		}
		log := filepath.Join(e.opts.BackupDir, "logs", fmt.Sprintf("%s-etcd-%s.log", filepath.Base(m.dir), v))
		if m.p, err = startEtcd(bin, m.dir, m.ms, peers[m.dir], strings.Join(initial, ","), log, quota); err != nil {
			return err
		}
		urls = append(urls, m.p.clientURL)
	}
	cli, err := NewClient(Client{}, urls...)
	if err != nil {
		return err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, e.opts.StepTimeout)
	defer cancel()
	for _, m := range members {
		if err := m.p.waitHealthy(sctx, cli); err != nil {
			return fmt.Errorf("%s: %w", m.dir, err)
		}
	}
	if err := healthCheck(sctx, cli, storage == StorageV3); err != nil {
		return err
	}
	health := "read and write checked"
	if storage == StorageV2 {
		health = "read checked (v2 data: nothing written)"
	}
	sv := Version{v.Major, v.Minor, 0}.String()
	if v.Minor >= 6 {
		for _, m := range members {
			if err := m.p.waitStorageVersion(sctx, cli, sv); err != nil {
				return fmt.Errorf("%s: %w", m.dir, err)
			}
		}
	}
	var errs []error
	for _, m := range members {
		m.p.terminate() // all at once: members stop together
	}
	for _, m := range members {
		errs = append(errs, m.p.stop(time.Minute))
		m.p = nil
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	vf := VersionFile{Version: v, Storage: storage}
	for _, m := range members {
		meta, err := readMeta(filepath.Join(m.dir, "member", "snap", "db"))
		if err != nil {
			return err
		}
		switch {
		case v.Minor == 5 && !meta.hasTerm:
			return fmt.Errorf("%s: etcd %s stopped without recording the raft term in its backend; etcd 3.6 could not tell this data's version", m.dir, v)
		case v.Minor >= 6 && meta.storageVersion != sv:
			return fmt.Errorf("%s: etcd %s stopped with storage version %q, want %s", m.dir, v, meta.storageVersion, sv)
		}
		if err := WriteVersionFile(m.dir, vf); err != nil {
			return diskHint(err, m.dir)
		}
		s.Members[m.dir] = fmt.Sprintf("started as %s, healthy, %s, stopped cleanly; %s", m.ms.Self.Name, health, vf)
	}
	return nil
}

// mostAdvanced is the member whose WAL has the highest committed index: a multi-member set is
// rebuilt from it, as etcd's own restore asks for one snapshot for all members.
func mostAdvanced(dirs []string) (string, map[string]Membership, error) {
	all := map[string]Membership{}
	best := ""
	for _, d := range dirs {
		ms, err := ReadMembership(d, "")
		if err != nil {
			return "", nil, err
		}
		all[d] = ms
		if best == "" || ms.CommitIndex > all[best].CommitIndex {
			best = d
		}
	}
	return best, all, nil
}

// migrateV2 turns every member's data into v3-only data with the v2→v3 migration, from the
// most advanced member, keeping each member's name and peer URLs; each new dir is swapped in
// once every one is built and verified.
func (e *executor) migrateV2(ctx context.Context, s *StepReport) error {
	src, all, err := mostAdvanced(e.opts.DataDirs)
	if err != nil {
		return err
	}
	for _, d := range e.opts.DataDirs {
		ms := all[d]
		tmp := newPath(d)
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		rep, err := v2v3.RunContext(ctx, v2v3.Config{
			DataDir: src, OutputDir: tmp,
			Member:     v2v3.Membership{Name: ms.Self.Name, InitialCluster: ms.InitialCluster(), InitialAdvertisePeerURLs: ms.Self.PeerURLs, InitialClusterToken: e.opts.ClusterToken},
			Options:    v2v3.Options{IncludeHidden: e.opts.IncludeHidden, Now: time.Now()},
			OnConflict: e.opts.OnConflict,
		})
		if err != nil {
			os.RemoveAll(tmp)
			return diskHint(err, filepath.Dir(d))
		}
		if v, err := ParseVersion(s.Version); err == nil {
			if err := WriteVersionFile(tmp, VersionFile{Version: v, Storage: StorageV3}); err != nil {
				return err
			}
		}
		v3 := 0
		if rep.V3 != nil {
			v3 = rep.V3.V3Keys
		}
		s.Members[d] = fmt.Sprintf("from %s: %d v2 keys migrated (%d with a lease, %d hidden left out), %d v3 keys kept, verified",
			src, rep.Keys.Keys, rep.Keys.TTLKeys, rep.Keys.HiddenSkipped, v3)
		if err := markReady(tmp); err != nil {
			return err
		}
	}
	return e.swapAll()
}

// downgradeStorage rebuilds every member for etcd 3.5: etcd's restore of the most advanced
// member's backend (which is complete, the step before stopped etcd cleanly) into a fresh
// member with the same name and peer URLs, then etcd's schema migration of the new backend to
// 3.5, refused when the WAL holds entries 3.5 cannot read. The restore is what drops the 3.6
// cluster version the v2 store kept, which etcd 3.5 refuses to start under.
func (e *executor) downgradeStorage(s *StepReport) error {
	target, err := ParseVersion(s.Version)
	if err != nil {
		return err
	}
	src, all, err := mostAdvanced(e.opts.DataDirs)
	if err != nil {
		return err
	}
	walv, err := walVersion(src)
	if err != nil {
		return err
	}
	if min := walv.MinimalEtcdVersion(); min != nil && (semver.Version{Major: int64(target.Major), Minor: int64(target.Minor)}).LessThan(*min) {
		return fmt.Errorf("etcd cannot downgrade %s to %s: its WAL holds entries only etcd %s reads (etcdutl migrate refuses the same)", src, target.MinorString(), min)
	}
	for _, d := range e.opts.DataDirs {
		ms := all[d]
		tmp := newPath(d)
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
			SnapshotPath: filepath.Join(src, "member", "snap", "db"), SkipHashCheck: true,
			Name: ms.Self.Name, OutputDataDir: tmp, PeerURLs: ms.Self.PeerURLs,
			InitialCluster: ms.InitialCluster(), InitialClusterToken: e.opts.ClusterToken,
		})
		if err == nil {
			err = migrateSchema(filepath.Join(tmp, "member", "snap", "db"), walv, target)
		}
		if err != nil {
			os.RemoveAll(tmp)
			return diskHint(err, filepath.Dir(d))
		}
		s.Members[d] = fmt.Sprintf("rebuilt from %s as %s with storage version %s", src, ms.Self.Name, target.MinorString())
		if err := markReady(tmp); err != nil {
			return err
		}
	}
	return e.swapAll()
}

// walVersion is the newest etcd version the committed WAL entries after the snapshot need.
func walVersion(dir string) (wal.Version, error) {
	src, err := v2v3.ReadSource(dir, "")
	if err != nil {
		return nil, err
	}
	defer src.Close()
	return entriesVersion{wal.MinimalEtcdVersion(src.Entries)}, nil
}

type entriesVersion struct{ v *semver.Version }

func (e entriesVersion) MinimalEtcdVersion() *semver.Version { return e.v }

// migrateSchema moves a stopped backend's storage schema to target with etcd's own migration.
func migrateSchema(path string, w wal.Version, target Version) error {
	be := backend.NewDefaultBackend(zap.NewNop(), path)
	err := schema.Migrate(zap.NewNop(), be.BatchTx(), w, semver.Version{Major: int64(target.Major), Minor: int64(target.Minor)})
	be.ForceCommit()
	return errors.Join(err, be.Close())
}

// A step that replaces data dirs builds each new one at <dir>.kubefence-new, marks it ready, and
// swaps: <dir> → <dir>.kubefence-old, new → <dir>, old removed. recoverSwap, run first on every
// start, finishes or undoes a swap a crash interrupted, so <dir> is always a whole data dir
// (old or new) that etcd opens.
const readyMarker = "kubefence-swap-ready"

func newPath(dir string) string { return filepath.Clean(dir) + ".kubefence-new" }
func oldPath(dir string) string { return filepath.Clean(dir) + ".kubefence-old" }

func markReady(dir string) error {
	if err := atomicfile.Write(filepath.Join(dir, readyMarker), []byte("ready\n"), 0o600); err != nil {
		return diskHint(err, dir)
	}
	return nil
}

func (e *executor) swapAll() error {
	for _, d := range e.opts.DataDirs {
		if err := os.Rename(d, oldPath(d)); err != nil {
			return err
		}
		if err := os.Rename(newPath(d), d); err != nil {
			return err
		}
		if err := atomicfile.SyncDir(filepath.Dir(d)); err != nil {
			return err
		}
		if err := recoverSwap(d); err != nil {
			return err
		}
	}
	return nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// recoverSwap brings dir to a whole data dir after a crash during a swap, and cleans up.
func recoverSwap(dir string) error {
	n, o := newPath(dir), oldPath(dir)
	switch {
	case !exists(dir) && exists(filepath.Join(n, readyMarker)):
		if err := os.Rename(n, dir); err != nil {
			return err
		}
	case !exists(dir) && exists(o):
		if err := os.Rename(o, dir); err != nil {
			return err
		}
	case !exists(dir):
		return nil // nothing of ours; the caller reports the missing data dir
	}
	if err := atomicfile.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return err
	}
	if exists(o) {
		if err := os.RemoveAll(o); err != nil {
			return err
		}
	}
	if exists(n) && !exists(filepath.Join(n, readyMarker)) {
		if err := os.RemoveAll(n); err != nil {
			return err
		}
	}
	if err := os.Remove(filepath.Join(dir, readyMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
