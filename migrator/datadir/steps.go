package datadir

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-semver/semver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/storage/backend"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/internal/tlsutil"
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
	storage := e.storageAt(s)
	members, err := e.readMembers()
	if err != nil {
		return err
	}
	defer func() {
		for _, m := range members {
			if m.p != nil {
				m.p.kill()
			}
		}
	}()
	var extra []string
	if s.SnapshotCount > 0 {
		extra = []string{"--snapshot-count", strconv.FormatUint(s.SnapshotCount, 10)}
	}
	pki, err := tlsutil.NewLoopback(runUser)
	if err != nil {
		return err
	}
	defer pki.Close()
	if err := ctx.Err(); err != nil {
		return err // stopped: an etcd started now would be killed on the data at once
	}
	cli, err := e.startMembers(Binary{Path: s.Binary, Version: v}, members, pki, extra)
	if err != nil {
		return err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, e.opts.StepTimeout)
	defer cancel()
	if err := serveCheck(sctx, cli, members, v, storage); err != nil {
		return err
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
	health := "read and write checked"
	if storage == StorageV2 {
		health = "read checked (v2 data: nothing written)"
	}
	if s.SnapshotCount > 0 {
		if err := checkSnapshottedPast(members); err != nil {
			return err
		}
		health += fmt.Sprintf(", ran with --snapshot-count=%d %s", s.SnapshotCount, snapshotPastWhy)
	}
	if err := recordStopped(s, members, VersionFile{Version: v, Storage: storage}, health); err != nil {
		return err
	}
	for _, m := range members {
		// etcd ran as kubefence's user: its new WAL segments and snapshots, and the version
		// file, go to the data dir's owner.
		if err := m.owner.apply(m.dir); err != nil {
			return err
		}
	}
	return nil
}

// checkSnapshottedPast checks that each stopped member's WAL tail no longer holds a v2 request
// etcd 3.6 refuses to replay: the run with --snapshot-count took a snapshot past them.
func checkSnapshottedPast(members []*runMember) error {
	for _, m := range members {
		found, err := v2v3.DetectV2(m.dir, "")
		if err != nil {
			return fmt.Errorf("%s: %w", m.dir, err)
		}
		if found.Replay != "" {
			return fmt.Errorf("%s: etcd ran with --snapshot-count=1 but took no snapshot past the v2 requests etcd 3.6 refuses to replay: %s", m.dir, found.Replay)
		}
	}
	return nil
}

// runMember is one data dir a run step starts etcd on.
type runMember struct {
	dir   string
	owner Owner
	ms    Membership
	peers []string
	p     *etcdProc
}

func (e *executor) readMembers() ([]*runMember, error) {
	var members []*runMember
	for _, d := range e.opts.DataDirs {
		ms, err := ReadMembership(d, "")
		if err != nil {
			return nil, err
		}
		owner, err := ownerOf(d)
		if err != nil {
			return nil, err
		}
		members = append(members, &runMember{dir: d, ms: ms, owner: owner})
	}
	return members, nil
}

// runUser is who a step's checks are, to an etcd whose data has auth on: its client
// certificate's common name. etcd run with --client-cert-auth takes a verified certificate's
// common name as the user, and root exists wherever auth is on (etcd enables auth only with
// it, and keeps it), so the checks read and write whatever root's password; with auth off the
// name is not looked at. The CA that signs it is made for the step and trusted by nothing
// else: while the step runs, no other local process reaches the data through that etcd.
const runUser = "root"

// startMembers starts etcd bin on every member, serving its clients with pki, and returns a
// client of them all. A single member gets a free loopback peer port; members of a set find
// each other at the peer URLs their data records.
func (e *executor) startMembers(bin Binary, members []*runMember, pki *tlsutil.Loopback, extra []string) (*clientv3.Client, error) {
	var peers []Peer
	for _, m := range members {
		if len(members) == 1 {
			port, err := proc.FreePort()
			if err != nil {
				return nil, err
			}
			m.peers = []string{fmt.Sprintf("http://127.0.0.1:%d", port)}
		} else {
			m.peers = m.ms.Self.PeerURLs
			if err := proc.PortFree(m.peers...); err != nil {
				return nil, fmt.Errorf("%s (member %s): cannot listen on its peer URL: %w; a multi-member upgrade starts all members on this host at the peer URLs their data records, so those must be local and free (for members on separate hosts, upgrade them rolling, one at a time, with etcd itself)", m.dir, m.ms.Self.Name, err)
			}
		}
		peers = append(peers, Peer{Name: m.ms.Self.Name, PeerURLs: m.peers})
	}
	var urls []string
	labels := dirLabels(e.opts.DataDirs)
	for _, m := range members {
		quota := int64(8 << 30)
		if st, err := os.Stat(filepath.Join(m.dir, "member", "snap", "db")); err == nil && 2*st.Size() > quota {
			quota = 2 * st.Size()
		}
		log := filepath.Join(e.opts.BackupDir, "logs", fmt.Sprintf("%s-etcd-%s.log", labels[m.dir], bin.Version))
		var err error
		if m.p, err = startEtcd(bin, m.dir, m.ms, m.peers, InitialCluster(peers), log, quota, pki, extra); err != nil {
			return nil, err
		}
		urls = append(urls, m.p.clientURL)
	}
	return newClient(pki.Client, urls)
}

// serveCheck waits until every member is healthy, checks the cluster serves, and for 3.6+
// waits until each member has recorded its storage version.
func serveCheck(ctx context.Context, cli *clientv3.Client, members []*runMember, v Version, storage Storage) error {
	for _, m := range members {
		if err := m.p.waitHealthy(ctx, cli); err != nil {
			return fmt.Errorf("%s: %w", m.dir, err)
		}
	}
	if err := healthCheck(ctx, cli, storage == StorageV3); err != nil {
		return err
	}
	if v.Minor < 6 {
		return nil
	}
	sv := Version{v.Major, v.Minor, 0}.String()
	for _, m := range members {
		if err := m.p.waitStorageVersion(ctx, cli, sv); err != nil {
			return fmt.Errorf("%s: %w", m.dir, err)
		}
	}
	return nil
}

// recordStopped checks each stopped member's backend carries vf's version markers and writes
// vf into it.
func recordStopped(s *StepReport, members []*runMember, vf VersionFile, health string) error {
	v := vf.Version
	sv := Version{v.Major, v.Minor, 0}.String()
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
	if err := oneWholeCluster(dirs, all, best); err != nil {
		return "", nil, err
	}
	return best, all, nil
}

// checkWholeCluster refuses data dirs that are not every voting member of one cluster, each
// once, before anything is journaled or backed up: a step starts etcd on them together, and one
// member of three has no quorum (the step times out), two of three leave the third at the old
// version, and members still running elsewhere would take the step's etcd in (it dials the
// peer URLs its data records) and get its health checks written.
//
// The members are judged by the most advanced one's membership, as a rebuild builds them: a
// lagging member may still list one removed since, or miss one added.
func checkWholeCluster(dirs []string) error {
	_, all, err := mostAdvanced(dirs)
	if err != nil || len(dirs) == 1 {
		return err // a single member gets a loopback peer URL of the step's own
	}
	for _, d := range dirs {
		for _, u := range all[d].Self.PeerURLs {
			if strings.HasPrefix(u, "https://") {
				return fmt.Errorf("%s (member %s) records the peer URL %s: a multi-member step starts every member on this host at the peer URLs its data records, without peer certificates, and etcd does not listen on https peer URLs without them; upgrade these members rolling, one at a time, with etcd itself (or move to a new cluster with 'kubefence cutover')", d, all[d].Self.Name, u)
			}
		}
	}
	return nil
}

// oneWholeCluster refuses data dirs that are not, one each, every member of one cluster: a
// rebuild builds them all from the most advanced (best) with its membership, so another
// cluster's member would get this one's data, a member left out could never rejoin, and one the
// most advanced does not record (removed since) could not be built.
func oneWholeCluster(dirs []string, all map[string]Membership, best string) error {
	src := all[best]
	seen := map[uint64]string{}
	for _, d := range dirs {
		ms := all[d]
		if ms.ClusterID != src.ClusterID {
			return fmt.Errorf("%s belongs to cluster %x, %s to cluster %x: give the data dirs of one cluster's members", d, ms.ClusterID, best, src.ClusterID)
		}
		if other, ok := seen[ms.Self.ID]; ok {
			return fmt.Errorf("%s and %s are the same member (%s, %x) twice: give each member's data dir once", other, d, ms.Self.Name, ms.Self.ID)
		}
		seen[ms.Self.ID] = d
		if _, err := src.as(ms); err != nil {
			return fmt.Errorf("%s: %w: give only the data dirs of its members", d, err)
		}
	}
	for _, p := range src.Peers {
		if _, ok := seen[p.ID]; !ok {
			return fmt.Errorf("member %s (%x) of the cluster is not among the data dirs given: every member's data dir is needed, stopped (add it with another --data-dir; for members on separate hosts, upgrade them rolling, one at a time, with etcd itself)", p.Name, p.ID)
		}
	}
	return nil
}

// migrateV2 turns every member's data into v3-only data with the v2→v3 migration, from the
// most advanced member, keeping each member's name and peer URLs; each new dir is swapped in
// once every one is built and verified. Every member's TTLs are measured against the one clock
// journaled with the source (a clock per build would keep a key expiring between two builds
// on one member and drop it on the other).
func (e *executor) migrateV2(ctx context.Context, s *StepReport) error {
	return e.rebuild(ctx, s, func(src, tmp string, ms Membership) (string, error) {
		rep, err := v2v3.RunContext(ctx, v2v3.Config{
			DataDir: src, OutputDir: tmp,
			Member:     v2v3.Membership{Name: ms.Self.Name, InitialCluster: ms.InitialCluster(), InitialAdvertisePeerURLs: ms.Self.PeerURLs, InitialClusterToken: e.opts.ClusterToken},
			Options:    v2v3.Options{IncludeHidden: e.opts.IncludeHidden, Now: s.Source.TTLClock},
			OnConflict: e.opts.OnConflict,
		})
		if err != nil {
			return "", err
		}
		if v, err := ParseVersion(s.Version); err == nil {
			if err := WriteVersionFile(tmp, VersionFile{Version: v, Storage: StorageV3}); err != nil {
				return "", err
			}
		}
		v3 := 0
		if rep.V3 != nil {
			v3 = rep.V3.V3Keys
		}
		detail := fmt.Sprintf("from %s: %d v2 keys migrated (%d with a lease, %d hidden left out), %d v3 keys kept, verified",
			src, rep.Keys.Keys, rep.Keys.TTLKeys, rep.Keys.HiddenSkipped, v3)
		for _, w := range rep.Warnings {
			detail += "; WARNING: " + w
		}
		return detail, nil
	})
}

// downgradeStorage rebuilds every member for etcd 3.5: etcd's restore of the most advanced
// member's backend (which is complete, the step before stopped etcd cleanly) into a fresh
// member with the same name and peer URLs, then etcd's schema migration of the new backend to
// 3.5, refused when the WAL holds entries 3.5 cannot read. The restore is what drops the 3.6
// cluster version the v2 store kept, which etcd 3.5 refuses to start under.
func (e *executor) downgradeStorage(ctx context.Context, s *StepReport) error {
	target, err := ParseVersion(s.Version)
	if err != nil {
		return err
	}
	var walv wal.Version
	return e.rebuild(ctx, s, func(src, tmp string, ms Membership) (string, error) {
		if walv == nil {
			if walv, err = walVersion(src); err != nil {
				return "", err
			}
			if min := walv.MinimalEtcdVersion(); min != nil && (semver.Version{Major: int64(target.Major), Minor: int64(target.Minor)}).LessThan(*min) {
				return "", fmt.Errorf("etcd cannot downgrade %s to %s: its WAL holds entries only etcd %s reads (etcdutl migrate refuses the same)", src, target.MinorString(), min)
			}
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
			return "", err
		}
		return fmt.Sprintf("rebuilt from %s as %s with storage version %s", src, ms.Self.Name, target.MinorString()), nil
	})
}

// RebuildSource is the member a rebuild step (v2 migration, downgrade) builds every member
// from. It is journaled when first chosen, before anything is built, so a resumed step uses
// the same member at the same commit index: after some swaps, the most advanced member on
// disk may be a rebuilt one or a less advanced one.
type RebuildSource struct {
	DataDir     string `json:"dataDir"`
	Name        string `json:"name"`
	CommitIndex uint64 `json:"commitIndex"`
	// TTLClock (v2 migration) is the time every member's TTLs are measured against: which TTL
	// keys are expired, and the leases' remaining TTLs.
	TTLClock time.Time `json:"ttlClock,omitzero"`
	// Members is every data dir's state (the source's too) when the source was chosen. A data
	// dir is swapped only while it is still so: one an etcd ran on since holds writes the dirs
	// rebuilt from the source lack, and the swap would delete them. An older kubefence
	// journaled none.
	Members map[string]MemberState `json:"members,omitempty"`
}

// MemberState is what a data dir's WAL says of it: the member it holds and how far its raft log
// is. An etcd that runs on the dir moves it on (a new term, entries committed).
type MemberState struct {
	Name        string `json:"name"`
	CommitIndex uint64 `json:"commitIndex"`
	Term        uint64 `json:"term"`
}

func stateOf(ms Membership) MemberState {
	return MemberState{Name: ms.Self.Name, CommitIndex: ms.CommitIndex, Term: ms.Term}
}

func (m MemberState) String() string {
	return fmt.Sprintf("member %s at commit index %d (term %d)", m.Name, m.CommitIndex, m.Term)
}

// same says whether r and o name the same source (a member built from one is built from the
// other). The members' states are not compared: they say whether a member may still be swapped.
func (r RebuildSource) same(o RebuildSource) bool {
	return r.DataDir == o.DataDir && r.Name == o.Name && r.CommitIndex == o.CommitIndex && r.TTLClock.Equal(o.TTLClock)
}

func (r RebuildSource) String() string {
	return fmt.Sprintf("member %s (%s) at commit index %d", r.Name, r.DataDir, r.CommitIndex)
}

// buildFunc fills tmp with a new data dir for member ms from src and says what it did.
type buildFunc func(src, tmp string, ms Membership) (string, error)

// rebuild builds a new data dir for every member with build, marks each ready, and swaps them
// in, the source's last (ctx is checked before each build and before the swaps: a member's
// build, etcd's restore of a whole backend, is not stopped halfway): until every other member is swapped, the source's data is still there
// to build from. A repeated step keeps what the interrupted one finished: members swapped in
// and new dirs marked ready from the same source. Every data dir still to be swapped must be
// as it was when the source was chosen, checked before the builds and again right before the
// first swap, whether or not anything is left to build.
func (e *executor) rebuild(ctx context.Context, s *StepReport, build buildFunc) error {
	if s.Swapped {
		return e.clearMarkers() // killed after the last swap: only the markers are left
	}
	if err := e.chooseSource(s); err != nil {
		return err
	}
	src, want := *s.Source, specOf(s, *e.opts.rebuildOptions())
	swapped, todo, notes := keptSwapped(e.opts.DataDirs, src, want)
	for _, d := range swapped {
		s.Members[d] = "rebuilt from " + src.String() + ", swapped in by the interrupted run"
	}
	if err := e.checkUnchanged(src, swapped, todo); err != nil {
		return err
	}
	var srcMS Membership
	if len(todo) > 0 { // the source is among them, swapped last: its data is still there
		ms, err := ReadMembership(src.DataDir, "")
		if err != nil {
			return err
		}
		srcMS = ms
	}
	for _, d := range todo {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := e.buildMember(s, src, srcMS, d, want, build); err != nil {
			return err
		}
		if notes[d] != "" {
			s.Members[d] = notes[d] + "; built again: " + s.Members[d]
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := e.checkUnchanged(src, swapped, todo); err != nil { // the builds took a while
		return err
	}
	if err := e.swap(todo); err != nil {
		return err
	}
	s.Swapped = true
	if err := e.save(); err != nil {
		return err
	}
	return e.clearMarkers()
}

// buildMember builds data dir d's new dir from src with want and marks it ready, unless an
// earlier run did so the same way (keeps); a new dir there built otherwise is built again, and
// the member's line says why. The member is built with the source's membership (srcMS), as the
// source records it: etcd's restore derives the member IDs and the cluster ID from
// --initial-cluster and the token, so a lagging member's own view (a member removed or a peer
// URL changed since) would build it into another cluster than the others.
func (e *executor) buildMember(s *StepReport, src RebuildSource, srcMS Membership, d string, want builtWith, build buildFunc) error {
	tmp := newPath(d)
	own, err := ReadMembership(d, "")
	if err != nil {
		return err
	}
	ms, err := srcMS.as(own)
	if err != nil {
		return fmt.Errorf("%s: %w", d, err)
	}
	want = want.as(ms)
	note := ""
	if m, ok := readMark(tmp); ok {
		keep, why := m.keeps(src, want)
		if keep {
			s.Members[d] = "rebuilt from " + src.String() + " by the interrupted run"
			return nil
		}
		note = fmt.Sprintf("the member an earlier run rebuilt (%s) was not taken: %s; built again: ", tmp, why)
	}
	owner, err := ownerOf(d)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	what, err := build(src.DataDir, tmp, ms)
	if err == nil {
		err = owner.applyBuilt(tmp)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return diskHint(err, filepath.Dir(d))
	}
	s.Members[d] = note + what
	return markReady(tmp, readyMark{RebuildSource: src, Built: &want})
}

// keptSwapped sorts the data dirs, the source last, into those holding a member an earlier run
// of the step rebuilt from src and swapped in, kept as it would be built now (want, but for the
// member's own part: a swapped-in member's membership is its rebuilt one), and those to build
// (todo). A swapped-in member built otherwise is built again (its old data is gone, and the
// source's is there: it is swapped last), with a note why; unless an older kubefence, which did
// not record what it built with, swapped in every member, the source's too: nothing can be
// built again, and the resumed journal's options were checked against the ones given
// (checkOptions).
func keptSwapped(dirs []string, src RebuildSource, want builtWith) (swapped, todo []string, notes map[string]string) {
	notes = map[string]string{}
	allIn := markedFrom(src.DataDir, src)
	for _, d := range swapOrder(dirs, src.DataDir) {
		m, ok := readMark(d)
		if !ok {
			todo = append(todo, d)
			continue
		}
		keep, why := m.keeps(src, want)
		if keep || (allIn && m.Built == nil && m.same(src)) {
			swapped = append(swapped, d)
			continue
		}
		notes[d] = "the member an earlier run rebuilt and swapped in was not kept: " + why
		todo = append(todo, d)
	}
	return swapped, todo, notes
}

// chooseSource journals the most advanced member as the step's source, with every member's
// state and the TTL clock of a v2 migration: the first time, and again when nothing was built
// from the journaled one (it binds nothing, and the data dirs may have moved on since).
//
// A v2 migration's source journaled without a clock (by an older kubefence) gets one now: the
// members that run built, with clocks of their own, no longer match it and are built again.
// Unless that run swapped in the source itself (the last swap, so every member is in): the
// source's v2 data is gone and nothing can be built again, so the source keeps its zero clock,
// which the ready markers that run wrote name too, and the step finishes as that version would
// have. A source journaled without the members' states gets them now (journalStates).
func (e *executor) chooseSource(s *StepReport) error {
	if s.Source != nil && !e.builtFrom(*s.Source) {
		s.Source = nil
	}
	if s.Source == nil {
		src, all, err := mostAdvanced(e.opts.DataDirs)
		if err != nil {
			return err
		}
		s.Source = &RebuildSource{DataDir: src, Name: all[src].Self.Name, CommitIndex: all[src].CommitIndex, Members: map[string]MemberState{}}
		for d, ms := range all {
			s.Source.Members[d] = stateOf(ms)
		}
		if s.Kind == StepMigrateV2 {
			s.Source.TTLClock = e.clock().UTC()
		}
		return e.save()
	}
	if s.Kind == StepMigrateV2 && s.Source.TTLClock.IsZero() && !markedFrom(s.Source.DataDir, *s.Source) {
		s.Source.TTLClock = e.clock().UTC()
	}
	if s.Source.Members == nil {
		if err := e.journalStates(s.Source); err != nil {
			return err
		}
	}
	return e.save()
}

// builtFrom reports whether a data dir, or a new dir beside one, holds a ready marker naming src.
func (e *executor) builtFrom(src RebuildSource) bool {
	swapped, ready := readyFrom(e.opts.DataDirs, src)
	return len(swapped) > 0 || len(ready) > 0
}

// readyFrom lists the data dirs that hold a member rebuilt from src (swapped in), and the new
// dirs beside the others that are marked ready from it.
func readyFrom(dirs []string, src RebuildSource) (swapped, ready []string) {
	for _, d := range dirs {
		switch {
		case markedFrom(d, src):
			swapped = append(swapped, d)
		case markedFrom(newPath(d), src):
			ready = append(ready, newPath(d))
		}
	}
	return swapped, ready
}

// journalStates gives a source an older kubefence journaled the members' states it lacks. New
// dirs that run made ready might be stale (an etcd may have run on the data dirs since), and
// nothing tells: they are refused, and are only a build to make again. Without them, the
// states are taken now: the source's commit index, journaled, is still checked.
func (e *executor) journalStates(src *RebuildSource) error {
	if _, stale := readyFrom(e.opts.DataDirs, *src); len(stale) > 0 {
		return fmt.Errorf("the interrupted run (an older kubefence) did not journal the members' states, so whether the dirs it rebuilt from %s (%s) still match the data dirs cannot be checked (an etcd may have run on them since); they were not swapped in: remove them and run the same command again to build them again",
			src, strings.Join(stale, ", "))
	}
	src.Members = map[string]MemberState{}
	for _, d := range e.opts.DataDirs {
		ms, err := ReadMembership(d, "")
		if err != nil {
			return err
		}
		src.Members[d] = stateOf(ms)
	}
	return nil
}

// checkUnchanged refuses to go on when a data dir still to be swapped (the source among them)
// is no longer as it was when the source was chosen: the dirs rebuilt from the source would be
// swapped in over newer data, and the old dirs deleted. A dir holding a ready marker was
// swapped in by an earlier run of the step (its old data is gone) and is built again.
func (e *executor) checkUnchanged(src RebuildSource, swapped, todo []string) error {
	if len(todo) == 0 {
		return nil
	}
	errs := []error{checkSource(src)}
	for _, d := range todo {
		if d != src.DataDir && !exists(filepath.Join(d, readyMarker)) {
			errs = append(errs, checkMember(d, src.Members[d]))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w\n%s", err, e.staleAdvice(src, swapped, todo))
	}
	return nil
}

// staleAdvice says what to do when a data dir changed under a rebuild.
func (e *executor) staleAdvice(src RebuildSource, swapped, todo []string) string {
	if len(swapped) > 0 {
		return fmt.Sprintf("nothing more was swapped: %s already hold(s) members rebuilt from %s, and their old data dirs are gone, so the step cannot go on: restore every member's backup (kubefence migrate restore-backup; the journal %s names them; copy a changed data dir first if you need its newer writes), then delete the journal and run again",
			strings.Join(swapped, ", "), src, e.rep.Journal)
	}
	_, stale := readyFrom(todo, src)
	return fmt.Sprintf("nothing was swapped, so every data dir still holds its own data: the dirs rebuilt from %s are stale: remove them (%s) and run the same command again, which rebuilds every member from the data dirs as they are now",
		src, strings.Join(stale, ", "))
}

// checkSource refuses to build from a journaled source that is gone or not as it was chosen.
func checkSource(src RebuildSource) error {
	if !exists(src.DataDir) || markedFrom(src.DataDir, src) {
		return fmt.Errorf("the rebuild's source, %s, chosen by the interrupted run, is gone, and the members not yet rebuilt need it: put it back", src)
	}
	ms, err := ReadMembership(src.DataDir, "")
	switch {
	case err != nil:
		return fmt.Errorf("the rebuild's source, %s, chosen by the interrupted run, cannot be read: %w", src, err)
	case ms.Self.Name != src.Name:
		return fmt.Errorf("%s now holds member %s, not %s, the rebuild's source chosen by the interrupted run (%s)", src.DataDir, ms.Self.Name, src.Name, src)
	case ms.CommitIndex < src.CommitIndex:
		return fmt.Errorf("the rebuild's source, %s, is now at commit index %d: less advanced than when the interrupted run chose it (%d), so rebuilding from it would lose writes", src, ms.CommitIndex, src.CommitIndex)
	case ms.CommitIndex > src.CommitIndex:
		return fmt.Errorf("the rebuild's source, %s, is now at commit index %d: it changed since the interrupted run chose it at %d (did an etcd run on it?), and the members rebuilt from it hold the older data", src, ms.CommitIndex, src.CommitIndex)
	}
	return compareState(src.DataDir, src.Members[src.DataDir], ms)
}

// checkMember refuses data dir d unless it is still in state want.
func checkMember(d string, want MemberState) error {
	ms, err := ReadMembership(d, "")
	if err != nil {
		return fmt.Errorf("%s cannot be read: %w", d, err)
	}
	return compareState(d, want, ms)
}

func compareState(d string, want MemberState, ms Membership) error {
	if got := stateOf(ms); got != want {
		return fmt.Errorf("%s changed since the rebuild's source was chosen: it held %s, now %s (did an etcd run on it?), and the dir rebuilt for it holds the older data", d, want, got)
	}
	return nil
}

// swapOrder is dirs with the source last.
func swapOrder(dirs []string, src string) []string {
	var out []string
	for _, d := range dirs {
		if d != src {
			out = append(out, d)
		}
	}
	return append(out, src)
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

// A step that replaces data dirs builds each new one at <dir>.kubefence-new, marks it ready
// (the marker names the source it was built from and what with: readyMark), and swaps:
// <dir> → <dir>.kubefence-old, new → <dir>, old removed. The marker stays in <dir> until every member is swapped, so a
// repeated step knows which members are done. recoverSwap, run first on every start, finishes
// or undoes a swap a crash interrupted, so <dir> is always a whole data dir (old or new) that
// etcd opens.
const readyMarker = "kubefence-swap-ready"

func newPath(dir string) string { return filepath.Clean(dir) + ".kubefence-new" }
func oldPath(dir string) string { return filepath.Clean(dir) + ".kubefence-old" }

// builtWith is what a rebuilt member holds besides its source's data, recorded in its ready
// marker: the step and version it was built for, the options that shape it, and the member it
// was built as. A run keeps a member an earlier run rebuilt only when it would build it the
// same way: a run planned afresh, once a journal was deleted or abandoned (restore-backup of
// some members), may be given other options, and the source alone (the same member at the
// same commit index) does not tell the runs apart.
type builtWith struct {
	Step         string `json:"step"`
	Version      string `json:"version"`
	ClusterToken string `json:"initialClusterToken"`
	// OnConflict and IncludeHidden shape a v2 migration's members only.
	OnConflict    string `json:"onConflict,omitempty"`
	IncludeHidden bool   `json:"includeHidden,omitempty"`
	// Name and InitialCluster are the member it was built as (etcd's restore derives its ID,
	// and the cluster's, from them and the token).
	Name           string `json:"name,omitempty"`
	InitialCluster string `json:"initialCluster,omitempty"`
}

// specOf is what rebuild step s builds every member with, given o; as adds the member.
func specOf(s *StepReport, o RebuildOptions) builtWith {
	b := builtWith{Step: s.Kind, Version: s.Version, ClusterToken: o.ClusterToken}
	if s.Kind == StepMigrateV2 {
		b.OnConflict, b.IncludeHidden = o.OnConflict, o.IncludeHidden
	}
	return b
}

// as is b for the member ms.
func (b builtWith) as(ms Membership) builtWith {
	b.Name, b.InitialCluster = ms.Self.Name, ms.InitialCluster()
	return b
}

// diff names what differs between b (a marker's) and now, with both values. The member's own
// part is compared only when now names one.
func (b builtWith) diff(now builtWith) []string {
	if now.Name == "" {
		b.Name, b.InitialCluster = "", ""
	}
	var out []string
	for _, f := range []struct {
		what     string
		got, now any
	}{
		{"step", b.Step, now.Step},
		{"version", b.Version, now.Version},
		{"--initial-cluster-token", b.ClusterToken, now.ClusterToken},
		{"--on-conflict", b.OnConflict, now.OnConflict},
		{"--include-hidden", b.IncludeHidden, now.IncludeHidden},
		{"member", b.Name, now.Name},
		{"initial cluster", b.InitialCluster, now.InitialCluster},
	} {
		if f.got != f.now {
			out = append(out, fmt.Sprintf("%s: built with %#v, now %#v", f.what, f.got, f.now))
		}
	}
	return out
}

// readyMark is a ready marker: the source the member was built from, and what with (nil in a
// marker an older kubefence wrote).
type readyMark struct {
	RebuildSource
	Built *builtWith `json:"builtWith,omitempty"`
}

// keeps says whether a run building from src with want keeps the member marked m, and if not,
// why. One an older kubefence marked is not kept: what it was built with, nothing says.
func (m readyMark) keeps(src RebuildSource, want builtWith) (bool, string) {
	switch {
	case !m.same(src):
		return false, fmt.Sprintf("it was built from %s, not from this run's source, %s", m.RebuildSource, src)
	case m.Built == nil:
		return false, "it was built by an older kubefence, which did not record the options it built with"
	}
	if diff := m.Built.diff(want); len(diff) > 0 {
		return false, "it was built otherwise (" + strings.Join(diff, "; ") + ")"
	}
	return true, ""
}

func markReady(dir string, m readyMark) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	// What built dir (etcd's restore, the v2 migration) synced its files, not every directory
	// naming them: the marker says the member is whole, so the tree is made durable first.
	if err := atomicfile.SyncDirs(dir); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, readyMarker), append(b, '\n'), 0o600); err != nil {
		return diskHint(err, dir)
	}
	return nil
}

// readMark reads dir's ready marker; false when there is none (or it cannot be read).
func readMark(dir string) (readyMark, bool) {
	var m readyMark
	b, err := os.ReadFile(filepath.Join(dir, readyMarker))
	return m, err == nil && json.Unmarshal(b, &m) == nil
}

// markedFrom reports whether dir holds a ready marker naming src, whatever the member was built
// with: a data dir so marked no longer holds its old data.
func markedFrom(dir string, src RebuildSource) bool {
	m, ok := readMark(dir)
	return ok && m.same(src)
}

// swap puts each dir's ready new dir in its place, in order, once none is in use: a copy or
// backup started after the run's own check may be reading one (renamed under it, it would mix
// two dirs' files).
func (e *executor) swap(dirs []string) error {
	locks, err := lockForSwap(dirs)
	if err != nil {
		return err
	}
	defer func() {
		for _, l := range locks {
			l.Close()
		}
	}()
	for _, d := range dirs {
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
		if e.afterSwap != nil {
			if err := e.afterSwap(d); err != nil {
				return err
			}
		}
	}
	return nil
}

// lockForSwap takes an exclusive lock on each dir's backend, as etcd does, held until the swaps
// are done: a copy or backup (a shared lock) cannot start on a dir between the check and its
// rename. A dir whose backend is locked already is in use: nothing is swapped.
func lockForSwap(dirs []string) ([]*os.File, error) {
	var locks []*os.File
	for _, d := range dirs {
		f, busy, err := lockBackend(d, unix.LOCK_EX)
		if err == nil && busy {
			err = inUseError(d, "nothing more was swapped; run the same command again once it is not")
		}
		if err != nil {
			for _, l := range locks {
				l.Close()
			}
			return nil, err
		}
		if f != nil {
			locks = append(locks, f)
		}
	}
	return locks, nil
}

// clearMarkers removes the ready markers from the swapped-in data dirs once all are swapped.
func (e *executor) clearMarkers() error {
	for _, d := range e.opts.DataDirs {
		if err := os.Remove(filepath.Join(d, readyMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
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
	// A ready marker in dir stays: the step removes it once every member is swapped.
	return nil
}
