package datadir

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/internal/flock"
	"github.com/kubefence/kubefence/internal/pathguard"
	"github.com/kubefence/kubefence/internal/steprun"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// Operation is what a lifecycle run does.
type Operation string

const (
	OpUpgrade   Operation = "upgrade"
	OpDowngrade Operation = "downgrade"
)

// Step kinds.
const (
	StepBackup    = "backup"
	StepRun       = "run"        // start etcd-<version> on the data dirs, health check, stop cleanly
	StepMigrateV2 = "migrate-v2" // v2 store into v3 keys (before the first 3.6 step)
	StepDowngrade = "downgrade-storage"
)

// Options configure an upgrade or downgrade.
type Options struct {
	// DataDirs are the members' data dirs (stopped); several are started together at each step.
	DataDirs []string
	Target   Version
	BinDir   string
	// BackupDir holds the backups, the journal and the step logs (default: kubefence-backups
	// next to the first data dir).
	BackupDir string
	DryRun    bool
	// ClusterToken is used when a step rebuilds membership (v2 migration, downgrade restore).
	ClusterToken string
	// OnConflict is the v2 migration's rule for a key in both stores ("", "v3", "v2").
	OnConflict string
	// IncludeHidden keeps v2 keys whose names start with "_" (left out by default, as etcdctl does).
	IncludeHidden bool
	StepTimeout   time.Duration
	// Events hears each step start and end; may be nil.
	Events func(Event) `json:"-"`
}

// EventKind is what an Event reports.
type EventKind string

// Event kinds: the plan made, then each step starting, ending, or skipped (done by an earlier
// run), as internal/steprun reports them.
const (
	EventPlan  EventKind = "plan"
	EventStart           = EventKind(steprun.Start)
	EventEnd             = EventKind(steprun.End)
	EventSkip            = EventKind(steprun.Skip)
)

// Event is the plan made (EventPlan, with Report), or a step's progress (with Step).
type Event struct {
	Kind     EventKind
	Report   *Report
	Step     *StepReport
	Duration time.Duration
}

// StepReport is one step and what it did to each member.
type StepReport struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Version string `json:"version,omitempty"`
	Binary  string `json:"binary,omitempty"`
	// Members maps a data dir to what the step did to it.
	Members  map[string]string `json:"members,omitempty"`
	Started  bool              `json:"started,omitempty"`
	Done     bool              `json:"done"`
	Repeated bool              `json:"repeated,omitempty"`
	// Source is what a rebuild step builds every member from, journaled when first chosen.
	Source *RebuildSource `json:"source,omitempty"`
	// Swapped is set once a rebuild step has swapped every member in.
	Swapped bool `json:"swapped,omitempty"`
	// SnapshotCount, when set, is a run step's --snapshot-count (snapshotPastWhy).
	SnapshotCount uint64        `json:"snapshotCount,omitempty"`
	Duration      time.Duration `json:"durationNanos"`
}

// snapshotPastWhy is why the etcd 3.5 run before 3.6 may take --snapshot-count=1: 3.6 panics
// ("detected disallowed v2 WAL") replaying a v2 request other than a member's attributes or the
// cluster version, and etcd 3.4 proposes one (a quorum read) for every /health. Replaying the
// WAL tail and publishing its attributes on start, 3.5 applies more than one entry past its
// last snapshot, so it takes one (triggerSnapshot) and 3.6 replays only what follows. This is
// the remedy of etcd's upgrade guide (https://etcd.io/docs/latest/upgrades/upgrade_3_6).
const snapshotPastWhy = "(a snapshot past the v2 requests in the WAL tail that etcd 3.6 refuses to replay)"

// Report is a whole run.
type Report struct {
	Operation Operation   `json:"operation"`
	Target    string      `json:"target"`
	DataDirs  []string    `json:"dataDirs"`
	Before    []Detection `json:"before"`
	// After is each data dir's version file when the run ends.
	After   map[string]string `json:"after,omitempty"`
	Backups map[string]string `json:"backups,omitempty"`
	// PlannedBackups is where each data dir's backup goes, journaled before it is taken: a
	// run killed after the backup was in place, before Backups recorded it, keeps it.
	PlannedBackups map[string]string `json:"plannedBackups,omitempty"`
	// Options are what the run's rebuild steps build each member with; nil in a journal of an
	// older kubefence.
	Options   *RebuildOptions `json:"rebuildOptions,omitempty"`
	Steps     []*StepReport   `json:"steps"`
	DryRun    bool            `json:"dryRun,omitempty"`
	Resumed   bool            `json:"resumed,omitempty"`
	Journal   string          `json:"journal"`
	BackupDir string          `json:"backupDir"`
	Done      bool            `json:"done"`
	Duration  time.Duration   `json:"durationNanos"`
	// Abandoned says why the run will not be resumed (restore-backup put a backup back in one
	// of its data dirs); such a journal is renamed aside and kept for the record only.
	Abandoned string `json:"abandoned,omitempty"`
}

// RebuildOptions are the options that decide what a rebuilt member holds (v2 migration,
// downgrade). They are journaled with the plan, and a resume must give the same: it keeps the
// members the killed run built, so it must build the others the same way.
type RebuildOptions struct {
	ClusterToken  string `json:"initialClusterToken"`
	OnConflict    string `json:"onConflict"`
	IncludeHidden bool   `json:"includeHidden"`
}

func (o *Options) rebuildOptions() *RebuildOptions {
	return &RebuildOptions{ClusterToken: o.ClusterToken, OnConflict: o.OnConflict, IncludeHidden: o.IncludeHidden}
}

// diff names each option that differs between journaled r and now, with both values.
func (r RebuildOptions) diff(now RebuildOptions) []string {
	var out []string
	if r.ClusterToken != now.ClusterToken {
		out = append(out, fmt.Sprintf("--initial-cluster-token: journaled %q, now %q", r.ClusterToken, now.ClusterToken))
	}
	if r.OnConflict != now.OnConflict {
		out = append(out, fmt.Sprintf("--on-conflict: journaled %q, now %q", r.OnConflict, now.OnConflict))
	}
	if r.IncludeHidden != now.IncludeHidden {
		out = append(out, fmt.Sprintf("--include-hidden: journaled %t, now %t", r.IncludeHidden, now.IncludeHidden))
	}
	return out
}

func (o *Options) defaults() error {
	if len(o.DataDirs) == 0 {
		return errors.New("--data-dir is required (repeat it, or separate with commas, for every member of a multi-member cluster)")
	}
	// Before anything runs: a rerun that fixes a bad value would otherwise meet it journaled.
	if err := v2v3.CheckOnConflict(o.OnConflict); err != nil {
		return err
	}
	for i, d := range o.DataDirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return err
		}
		o.DataDirs[i] = abs
	}
	if o.BackupDir == "" {
		o.BackupDir = defaultBackupDir(o.DataDirs[0])
	}
	abs, err := filepath.Abs(o.BackupDir)
	if err != nil {
		return err
	}
	o.BackupDir = abs
	if err := checkLayout(o.DataDirs, o.BackupDir); err != nil {
		return err
	}
	if o.ClusterToken == "" {
		o.ClusterToken = "etcd-cluster"
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = 2 * time.Minute
	}
	return nil
}

// checkLayout refuses a backup dir that overlaps a data dir, and data dirs (or the temp dirs
// a rebuild makes next to them) that overlap each other: a step writes into each of these
// while it reads the others.
func checkLayout(dataDirs []string, backupDir string) error {
	for i, d := range dataDirs {
		if err := apart("--backup-dir", backupDir, "the data dir", d); err != nil {
			return err
		}
		for j, other := range dataDirs {
			if i != j {
				if err := apart("the data dir", d, "the data dir", other); err != nil {
					return err
				}
			}
			for _, tmp := range []string{newPath(d), oldPath(d)} {
				if err := apart("the rebuild's temp dir", tmp, "the data dir", other); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// dirLabels names each data dir in the files a run makes for it in the backup dir (backups,
// etcd's logs): its base name, followed by its position in --data-dir for every data dir when
// two have the same name (/a/etcd, /b/etcd: etcd-1, etcd-2; the last "-" part tells any two
// apart).
func dirLabels(dirs []string) map[string]string {
	labels, seen, dup := map[string]string{}, map[string]bool{}, false
	for _, d := range dirs {
		base := filepath.Base(filepath.Clean(d))
		dup = dup || seen[base]
		seen[base] = true
		labels[d] = base
	}
	if dup {
		for i, d := range dirs {
			labels[d] = fmt.Sprintf("%s-%d", labels[d], i+1)
		}
	}
	return labels
}

// journalPath is the journal of these data dirs: named after the first, with a hash of them
// all, so that two clusters sharing a backup dir, whose first data dirs have the same name, keep
// a journal each.
func (o *Options) journalPath() string {
	h := sha256.Sum256([]byte(strings.Join(o.DataDirs, "\x00")))
	return filepath.Join(o.BackupDir, fmt.Sprintf("journal-%s-%x.json", filepath.Base(o.DataDirs[0]), h[:4]))
}

// olderJournalPath is where an older kubefence kept the journal: named after the first data dir
// only.
func (o *Options) olderJournalPath() string {
	return filepath.Join(o.BackupDir, "journal-"+filepath.Base(o.DataDirs[0])+".json")
}

// lockPath is the lock one run of these data dirs holds (next to its journal).
func (o *Options) lockPath() string { return o.journalPath() + ".lock" }

// runLock is what one run holds: the lock next to its journal and one beside each data dir.
type runLock struct {
	journal *flock.Lock
	dirs    []*flock.Lock
}

// release releases every lock; removeJournal removes the journal's lock file too (a run refused
// before it changed anything leaves nothing behind). The data dirs' lock files hold nothing.
func (l *runLock) release(removeJournal bool) {
	for _, d := range l.dirs {
		d.ReleaseRemove()
	}
	if removeJournal {
		l.journal.ReleaseRemove()
	} else {
		l.journal.Release()
	}
}

// trustBackupDir refuses a backup dir another user could write to: kubefence, often as root,
// reads its journal back (which names the etcd binaries it runs) and appends to its step logs.
// The default, beside the data dirs, is in a directory the etcd user owns on distros that run
// etcd as its own user. For one not made yet, the directory it would be made in.
func trustBackupDir(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return pathguard.CheckTrustedParent("--backup-dir", dir) // checked again once made (lock)
	}
	return pathguard.CheckTrustedDir("--backup-dir", dir)
}

// dirLockPath is the lock beside data dir d, whatever the backup dir or the other members named.
// migrate v2-to-v3 takes the same name beside its output (v2v3's lockPath, which cannot import
// this package), so a run to an output and one here on a data dir at that path exclude each other.
func dirLockPath(d string) string { return filepath.Clean(d) + ".kubefence-lock" }

// lock takes the run's locks: a second upgrade or downgrade of one of these data dirs (with
// another backup dir, the members in another order, or a subset) would finish this one's swaps,
// or remove the dir it is building. The data dirs' locks are taken in sorted order.
func (o *Options) lock() (*runLock, error) {
	if err := os.MkdirAll(o.BackupDir, 0o700); err != nil {
		return nil, err
	}
	if err := trustBackupDir(o.BackupDir); err != nil {
		return nil, err
	}
	l := &runLock{}
	paths := []string{o.lockPath()}
	dirs := slices.Sorted(slices.Values(o.DataDirs))
	for _, d := range dirs {
		paths = append(paths, dirLockPath(d))
	}
	for i, path := range paths {
		fl, err := flock.Take(path)
		if err != nil {
			l.release(true)
			var held *flock.HeldError
			if errors.As(err, &held) {
				return nil, fmt.Errorf("another kubefence upgrade, downgrade or restore-backup (pid %s) works on %v (it holds %s): wait for it to finish, or stop that process", held.PID(), o.DataDirs, held.Path)
			}
			return nil, err
		}
		if i == 0 {
			l.journal = fl
		} else {
			l.dirs = append(l.dirs, fl)
		}
	}
	return l, nil
}

// Run upgrades or downgrades the data dirs to opts.Target, resuming a journaled run that did
// not finish.
func Run(ctx context.Context, op Operation, opts Options) (*Report, error) {
	start := time.Now()
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := trustBackupDir(opts.BackupDir); err != nil { // before its journal is read
		return nil, err
	}
	if !opts.DryRun {
		l, err := opts.lock()
		if err != nil {
			return nil, err
		}
		// Refused before it changed anything (no journal), it leaves nothing behind.
		defer func() { l.release(!exists(opts.journalPath())) }()
	}
	for _, d := range opts.DataDirs {
		if opts.DryRun {
			break // it changes nothing: a swap a killed run left is the real run's to finish
		}
		if err := recoverSwap(d); err != nil {
			return nil, err
		}
	}
	rep, err := planOrResume(ctx, op, opts)
	if err != nil {
		return rep, err
	}
	if err := checkReplaceable(rep); err != nil {
		return rep, err
	}
	rep.DryRun = opts.DryRun
	if opts.Events != nil {
		opts.Events(Event{Kind: EventPlan, Report: rep})
	}
	if opts.DryRun {
		return rep, nil
	}
	for _, d := range opts.DataDirs {
		if busy, err := InUse(d); err != nil {
			return rep, err
		} else if busy {
			return rep, inUseError(d, fmt.Sprintf("kubefence %s works on stopped members, and nothing was changed", op))
		}
	}
	if _, err := checkOwners(opts.DataDirs...); err != nil {
		return rep, err
	}
	if err := os.MkdirAll(opts.BackupDir, 0o700); err != nil {
		return rep, err
	}
	e := &executor{opts: opts, rep: rep}
	if err := e.walk(ctx); err != nil {
		return rep, err
	}
	rep.After = map[string]string{}
	for _, d := range opts.DataDirs {
		b, _ := os.ReadFile(filepath.Join(d, VersionFileName))
		rep.After[d] = strings.TrimSpace(string(b))
	}
	rep.Done, rep.Duration = true, time.Since(start)
	return rep, e.save()
}

// planOrResume is the run journaled for these data dirs, its binaries checked again, or a new
// plan, refused unless the data dirs are one whole cluster.
func planOrResume(ctx context.Context, op Operation, opts Options) (*Report, error) {
	rep, err := loadJournal(opts.journalPath(), op, opts)
	if err != nil {
		return nil, err
	}
	if rep == nil {
		if rep, err = plan(ctx, op, opts); err != nil {
			return rep, err
		}
		// A new run with something to do, dry or not; not a resumed one, whose members a swap
		// may already have made another cluster's (a rebuild's new IDs).
		if len(rep.Steps) > 0 {
			if err := checkWholeCluster(opts.DataDirs); err != nil {
				return rep, err
			}
		}
	} else {
		if err := checkResumedVersions(rep); err != nil {
			return rep, err
		}
		// The binaries may have moved since the journal was written: check them again.
		for _, s := range rep.Steps {
			if s.Binary != "" && !s.Done {
				v, _ := ParseVersion(s.Version)
				if err := checkBinary(ctx, Binary{Path: s.Binary, Version: v}); err != nil {
					return rep, err
				}
			}
		}
	}
	return rep, nil
}

// loadJournal returns the unfinished run journaled for these data dirs, or nil. Without a
// journal at path, an older kubefence's unfinished one of these data dirs is resumed (and kept
// where it is); one of other data dirs there is another cluster's, not a refusal. Without
// either, an unfinished run of any of these data dirs journaled under another name (the same
// dirs in another order, some of them) is refused: a new plan would start over a cluster that
// run left half done.
func loadJournal(path string, op Operation, opts Options) (*Report, error) {
	rep, err := loadOwnJournal(path, op, opts)
	if rep != nil || err != nil {
		return rep, err
	}
	return nil, unfinishedOverlap(path, opts)
}

// defaultBackupDir is where a run of data dirs whose first is dataDir keeps its backups and
// journal without --backup-dir.
func defaultBackupDir(dataDir string) string {
	return filepath.Join(filepath.Dir(dataDir), "kubefence-backups")
}

// unfinishedOverlap is an otherRunError for an unfinished run of one of opts' data dirs,
// journaled other than at own: in the backup dir, or in the default one beside any of the data
// dirs (the same dirs given in another order default to another); nil when there is none. A
// default dir another user could write to is not read (trustBackupDir).
func unfinishedOverlap(own string, opts Options) error {
	dirs := []string{opts.BackupDir}
	for _, d := range opts.DataDirs {
		if b := defaultBackupDir(d); !slices.Contains(dirs, b) && trustBackupDir(b) == nil {
			dirs = append(dirs, b)
		}
	}
	var paths []string
	for _, d := range dirs {
		found, err := filepath.Glob(filepath.Join(d, "journal-*.json"))
		if err != nil {
			return err
		}
		paths = append(paths, found...)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if p == own || err != nil {
			continue
		}
		var rep Report
		if json.Unmarshal(b, &rep) != nil || rep.Done {
			continue
		}
		if slices.ContainsFunc(rep.DataDirs, func(d string) bool { return slices.Contains(opts.DataDirs, d) }) {
			return &otherRunError{rep: rep, path: p}
		}
	}
	return nil
}

// loadOwnJournal is loadJournal from path, or the older kubefence's journal of these data dirs.
func loadOwnJournal(path string, op Operation, opts Options) (*Report, error) {
	if !exists(path) && exists(opts.olderJournalPath()) {
		rep, err := readJournal(opts.olderJournalPath(), op, opts)
		var other *otherRunError
		if errors.As(err, &other) {
			return nil, nil
		}
		return rep, err
	}
	return readJournal(path, op, opts)
}

// otherRunError is a journal's unfinished run of other data dirs, or another operation or target.
type otherRunError struct {
	rep  Report
	path string
}

func (e *otherRunError) Error() string {
	return fmt.Sprintf("an unfinished %s of %v to %s is journaled in %s: finish it (run that command again), or restore the backups it names and delete the journal",
		e.rep.Operation, e.rep.DataDirs, e.rep.Target, e.path)
}

// readJournal is loadJournal from path.
func readJournal(path string, op Operation, opts Options) (*Report, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("journal %s is damaged (%v): move it away to plan afresh (the version files say where each data dir is)", path, err)
	}
	if rep.Done {
		return nil, nil
	}
	if rep.Operation != op || rep.Target != opts.Target.String() || !slices.Equal(rep.DataDirs, opts.DataDirs) {
		return nil, &otherRunError{rep: rep, path: path}
	}
	if err := checkOptions(path, &rep, opts); err != nil {
		return nil, err
	}
	rep.Resumed = true
	return &rep, nil
}

// checkOptions refuses a resume whose options would build members other than the journaled
// run built. While no rebuild step has built a member, the options bind nothing, and the
// resume takes (and journals) the ones given now: a v2 migration refused for a key in both
// stores is rerun with --on-conflict. A journal of an older kubefence has none: it takes the
// options given now, unless one of its rebuild steps built members already, whose options
// nothing records.
func checkOptions(path string, rep *Report, opts Options) error {
	now := opts.rebuildOptions()
	if rep.Options == nil {
		if err := olderRebuildUnderway(path, rep, opts.DataDirs); err != nil {
			return err
		}
		rep.Options = now
		return nil
	}
	diff := rep.Options.diff(*now)
	switch {
	case len(diff) == 0:
		return nil
	case !rebuiltAny(rep, opts.DataDirs):
		rep.Options = now
		return nil
	}
	return fmt.Errorf("the unfinished %s journaled in %s was started with other options (%s). They decide what each rebuilt member holds (v2 migration, downgrade), and a resumed run keeps the members the first one built, so it must build the others the same way: run the same command with the journaled values, or restore the backups it names and delete the journal",
		rep.Operation, path, strings.Join(diff, "; "))
}

// rebuiltAny says whether a rebuild step of rep (v2 migration, downgrade) has built a member:
// it is done or swapped in, or a data dir or a new dir beside one is marked ready from its
// source. A step without a source has built nothing: the source is journaled first.
func rebuiltAny(rep *Report, dirs []string) bool {
	for _, s := range rep.Steps {
		if s.Kind != StepMigrateV2 && s.Kind != StepDowngrade {
			continue
		}
		if s.Done || s.Swapped {
			return true
		}
		if s.Source == nil {
			continue
		}
		if swapped, ready := readyFrom(dirs, *s.Source); len(swapped) > 0 || len(ready) > 0 {
			return true
		}
	}
	return false
}

// olderRebuildUnderway refuses to resume an older kubefence's journal whose unfinished rebuild
// step built members: with what --initial-cluster-token, --on-conflict and --include-hidden,
// nothing says.
func olderRebuildUnderway(path string, rep *Report, dirs []string) error {
	for _, s := range rep.Steps {
		if s.Done || s.Swapped || s.Source == nil {
			continue
		}
		swapped, ready := readyFrom(dirs, *s.Source)
		const why = "the journal %s was written by an older kubefence, which did not record --initial-cluster-token, --on-conflict and --include-hidden, and its step %q rebuilt members with options this run cannot check"
		switch {
		case len(swapped) > 0:
			return fmt.Errorf(why+" (%s swapped in): finish the run with the kubefence version that started it (the same command), or restore the backups it names and delete the journal", path, s.Name, strings.Join(swapped, ", "))
		case len(ready) > 0:
			return fmt.Errorf(why+"; nothing was swapped: remove %s and run the same command again, which builds them again", path, s.Name, strings.Join(ready, ", "))
		}
	}
	return nil
}

// plan detects where the data dirs are and lists the steps to the target.
// checkReplaceable refuses, before anything runs, data dirs that a step still to run puts in
// place by a rename (a v2 migration, a storage downgrade: each member is rebuilt beside its
// data dir, then swapped in) and that cannot be: a symlink or a mount point.
func checkReplaceable(rep *Report) error {
	rebuilds := slices.ContainsFunc(rep.Steps, func(s *StepReport) bool {
		return !s.Done && (s.Kind == StepMigrateV2 || s.Kind == StepDowngrade)
	})
	if !rebuilds {
		return nil
	}
	for _, d := range rep.DataDirs {
		if err := pathguard.CheckReplaceable("the data dir", d); err != nil {
			return fmt.Errorf("%w (this plan rebuilds each member beside its data dir and swaps it in)", err)
		}
	}
	return nil
}

func plan(ctx context.Context, op Operation, opts Options) (*Report, error) {
	rep := &Report{Operation: op, Target: opts.Target.String(), DataDirs: opts.DataDirs, Journal: opts.journalPath(), BackupDir: opts.BackupDir, Options: opts.rebuildOptions()}
	var cur Detection
	var err error
	v2 := false
	for i, d := range opts.DataDirs {
		det, err := Detect(d, "")
		if err != nil {
			return rep, err
		}
		rep.Before = append(rep.Before, det)
		if i == 0 {
			cur = det
		} else if !det.Version.SameMinor(cur.Version) {
			return rep, fmt.Errorf("members are at different versions (%s: %s, %s: %s): bring them to one version first", opts.DataDirs[0], cur.VersionText(), d, det.VersionText())
		}
		v2 = v2 || det.Storage == StorageV2
	}
	if cur.Version.Major != 3 || opts.Target.Major != 3 {
		return rep, fmt.Errorf("from %s to %s: kubefence steps etcd 3 minors only", cur.VersionText(), opts.Target)
	}
	replay := false
	if op == OpUpgrade && opts.Target.Minor >= 6 {
		if replay, err = lookForV2(rep.Before); err != nil {
			return rep, err
		}
	}
	rep.Steps = append(rep.Steps, &StepReport{Name: "back up every data dir", Kind: StepBackup, Version: cur.VersionText()})
	var steps []*StepReport
	switch op {
	case OpUpgrade:
		steps, err = planUpgrade(ctx, opts, cur, v2, replay)
		if err == nil && steps == nil {
			rep.Steps = nil // already there: nothing to do, and no backup either
			return rep, nil
		}
	case OpDowngrade:
		steps, err = planDowngrade(ctx, opts, cur)
	}
	rep.Steps = append(rep.Steps, steps...)
	return rep, err
}

// lookForV2 checks, before an upgrade to 3.6, what etcd 3.6 refuses. A version file's word
// that its data holds no v2 content is not taken: it is looked for. Every detection of etcd3
// data notes the v2 requests without content that its WAL tail holds and 3.6 refuses to replay
// (etcd 3.4's /health reads); replay says whether any does.
func lookForV2(before []Detection) (replay bool, err error) {
	for i := range before {
		det := &before[i]
		if det.Storage == StorageV2 {
			continue
		}
		if det.Source == VersionFileName {
			found, err := v2v3.DetectV2(det.DataDir, "")
			if err != nil {
				return false, err
			}
			if found.Content {
				return false, fmt.Errorf("%s says %s/etcd3, but the data holds v2 content (%s): write %s/etcd2 into it, and the upgrade migrates that content before etcd 3.6",
					filepath.Join(det.DataDir, VersionFileName), det.VersionText(), found.Why, det.VersionText())
			}
			det.V2Replay = found.Replay
		}
		replay = replay || det.V2Replay != ""
	}
	return replay, nil
}

// Min35For36 is the oldest etcd 3.5 etcd's upgrade guide allows before 3.6
// (https://etcd.io/docs/latest/upgrades/upgrade_3_6): 3.5.1–3.5.19 did not persist a learner's
// promotion, and 3.5.26 is the first to clean up the zombie members older releases left. etcd
// 3.6 repairs the learner flag only (SyncLearnerPromotionIfNeeded).
var Min35For36 = Version{3, 5, 26}

// planUpgrade lists the steps from cur to opts.Target: one run step per minor after the
// data's; the data's own minor too when the target is a newer patch of it (or the patch is
// unknown), or when its v2 content must go first, or when it is 3.5 data on its way to 3.6 not
// known to have run on Min35For36 or later, whose WAL tail holds v2 requests 3.6 refuses to
// replay (replay, without v2 content: its 3.5 run snapshots past them), or that holds v2 content
// (its 3.5 run applies the WAL to the backend first). None when the data is there already.
func planUpgrade(ctx context.Context, opts Options, cur Detection, v2, replay bool) ([]*StepReport, error) {
	if opts.Target.Minor < cur.Version.Minor {
		return nil, fmt.Errorf("the data is at %s, newer than --target-version %s: use kubefence migrate downgrade", cur.VersionText(), opts.Target)
	}
	first := cur.Version.Minor + 1
	if opts.Target.SameMinor(cur.Version) {
		if cur.Source == VersionFileName && !cur.Version.Less(opts.Target) && !(v2 && opts.Target.Minor >= 6) {
			return nil, nil
		}
		first = cur.Version.Minor
	}
	if cur.Version.SameMinor(Min35For36) && opts.Target.Minor >= 6 && (cur.Source != VersionFileName || cur.Version.Less(Min35For36)) {
		first = cur.Version.Minor // an inferred 3.5 has no known patch: assume an older one
	}
	snapshotPast := replay && !v2 && opts.Target.Minor >= 6 // a v2 migration rebuilds the WAL
	// With v2 content, a 3.5 run first also applies the WAL to the v3 backend: the v2 migration
	// carries the backend over as it is and refuses v3 writes of a member stopped uncleanly
	// that only its WAL holds, which running the same command again would not change.
	if (snapshotPast || v2 && opts.Target.Minor >= 6) && cur.Version.SameMinor(Min35For36) {
		first = cur.Version.Minor
	}
	var steps []*StepReport
	at, migrated := cur.VersionText(), false
	for minor := first; minor <= opts.Target.Minor; minor++ {
		if v2 && minor >= 6 && !migrated {
			steps = append(steps, &StepReport{Name: "migrate the v2 store to v3 keys (etcd 3.6 refuses v2 data)", Kind: StepMigrateV2, Version: at})
			migrated = true
		}
		want, exact := Version{3, minor, 0}, minor == opts.Target.Minor
		if exact {
			want = opts.Target
		}
		b, err := findBinary(ctx, opts.BinDir, want, exact)
		if err != nil {
			return steps, err
		}
		if b.Version.SameMinor(Min35For36) && b.Version.Less(Min35For36) && opts.Target.Minor >= 6 {
			return steps, fmt.Errorf("%s is etcd %s, and before 3.6 every member must run etcd %s or later (https://etcd.io/docs/latest/upgrades/upgrade_3_6: older 3.5 releases lose learner promotions and leave zombie members, which 3.6 does not repair): put etcd-%[3]s or a newer 3.5 in %s",
				b.Path, b.Version, Min35For36, opts.BinDir)
		}
		s := &StepReport{Name: "run etcd " + b.Version.String(), Kind: StepRun, Version: b.Version.String(), Binary: b.Path}
		if snapshotPast && minor == 5 {
			s.SnapshotCount = 1
			s.Name += " with --snapshot-count=1 " + snapshotPastWhy
		}
		steps = append(steps, s)
		at = b.Version.String()
	}
	return steps, nil
}

// planDowngrade lists the steps from cur down to opts.Target: settle the WAL on cur's etcd,
// downgrade the storage, run the target's etcd.
func planDowngrade(ctx context.Context, opts Options, cur Detection) ([]*StepReport, error) {
	if err := checkDowngrade(cur, opts.Target); err != nil {
		return nil, err
	}
	settle, err := findBinary(ctx, opts.BinDir, cur.Version, cur.Source == VersionFileName)
	if err != nil {
		return nil, err
	}
	b, err := findBinary(ctx, opts.BinDir, opts.Target, true)
	if err != nil {
		return nil, err
	}
	return []*StepReport{
		{Name: "run etcd " + settle.Version.String() + " (apply the whole WAL, so the backend is complete)", Kind: StepRun, Version: settle.Version.String(), Binary: settle.Path},
		{Name: "downgrade the storage version to " + opts.Target.MinorString() + " and rebuild the member from its backend", Kind: StepDowngrade, Version: opts.Target.String()},
		{Name: "run etcd " + b.Version.String(), Kind: StepRun, Version: b.Version.String(), Binary: b.Path},
	}, nil
}

// checkDowngrade refuses what etcd cannot do, with the reason.
func checkDowngrade(cur Detection, target Version) error {
	switch {
	case !target.Less(cur.Version) || target.SameMinor(cur.Version):
		return fmt.Errorf("the data is at %s; %s is not an older minor: use kubefence migrate upgrade", cur.VersionText(), target)
	case target.Minor < 5:
		return fmt.Errorf("etcd cannot downgrade a data dir to %s: storage downgrades exist from 3.6 to 3.5 only (etcdutl migrate's minimum target is 3.5), and 3.5 data is not readable by 3.4. Restore the backup taken before the upgrade instead: kubefence migrate restore-backup", target.MinorString())
	case cur.Storage == StorageV2:
		return fmt.Errorf("the data holds v2 content (%s), which etcd 3.6 cannot have written: fix %s", cur, VersionFileName)
	case cur.Version.Minor-target.Minor > 1:
		return fmt.Errorf("etcd downgrades one minor at a time; %s to %s skips one: downgrade to 3.%d first", cur.VersionText(), target, cur.Version.Minor-1)
	case cur.Version.Minor != 6:
		return fmt.Errorf("kubefence knows the 3.6 → 3.5 downgrade only; the data is at %s", cur.VersionText())
	}
	return nil
}

type executor struct {
	opts Options
	rep  *Report
	// afterSwap, when set (by tests), runs after each member's data dir is swapped; an error
	// stops the step there, as a crash would.
	afterSwap func(dir string) error
	// afterBackup, when set (by tests), runs after each data dir's backup is in place, before
	// the journal records it; an error stops the step there, as a crash would.
	afterBackup func(dir string) error
	// now, when set (by tests), is the wall clock.
	now func() time.Time
	// taken are the data dirs this run backed up itself; backupsChecked is set once the
	// backups are checked before the first step that changes the data dirs.
	taken          map[string]bool
	backupsChecked bool
}

func (e *executor) clock() time.Time {
	if e.now != nil {
		return e.now()
	}
	return time.Now()
}

// walk runs the steps the journal has not finished.
func (e *executor) walk(ctx context.Context) error {
	var walk []steprun.Step
	for _, s := range e.rep.Steps {
		// Interruptible: a stop (Ctrl-C) during a step's tail (etcd's graceful stop, the
		// chown walk, a backup's fsyncs) begins no further step, which would start an etcd of
		// the next version on the data only to kill it.
		walk = append(walk, steprun.Step{Name: s.Name, Done: s.Done, Interruptible: true, Run: func(ctx context.Context) (string, error) {
			return "", e.do(ctx, s)
		}})
	}
	err := steprun.Run(ctx, walk, e, func(ev steprun.Event) {
		if e.opts.Events != nil {
			e.opts.Events(Event{Kind: EventKind(ev.Kind), Step: e.rep.Steps[ev.Index], Duration: ev.Duration})
		}
	})
	var serr *steprun.Error
	if errors.As(err, &serr) {
		return fmt.Errorf("step %s: %w (nothing later was done; run the same command again to repeat this step, or restore the backup: kubefence migrate restore-backup)", serr.Step, serr.Err)
	}
	return err
}

// Begin journals that step i started (a step started before is repeated).
func (e *executor) Begin(i int) error {
	s := e.rep.Steps[i]
	if s.Started {
		s.Repeated = true
	}
	s.Started = true
	return e.save()
}

// Finish journals step i as done.
func (e *executor) Finish(rec steprun.Record) error {
	s := e.rep.Steps[rec.Index]
	s.Done, s.Duration = true, rec.Duration
	return e.save()
}

func (e *executor) save() error {
	b, err := json.MarshalIndent(e.rep, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(e.rep.Journal, b, 0o600)
}

// backup backs data dir d up once per run: where it goes is journaled first, so that a
// resumed run keeps a backup that a killed one finished (its manifest verifies) and takes it
// there otherwise.
func (e *executor) backup(ctx context.Context, s *StepReport, d string) error {
	if e.rep.Backups == nil {
		e.rep.Backups = map[string]string{}
	}
	if e.rep.PlannedBackups == nil {
		e.rep.PlannedBackups = map[string]string{}
	}
	if b, ok := e.rep.Backups[d]; ok {
		s.Members[d] = "backed up to " + b + " (earlier)"
		return nil
	}
	dst, planned := e.rep.PlannedBackups[d]
	note := ""
	if planned {
		_, err := VerifyManifest(ctx, dst)
		switch origin := backupOrigin(dst); {
		case err == nil && origin == d:
			e.rep.Backups[d] = dst
			s.Members[d] = "backed up to " + dst + " (earlier)"
			return e.save()
		case err == nil:
			// Another data dir's backup took the name (another cluster's sharing the backup dir,
			// or one an older kubefence took, which does not say where from): not this one's.
			planned, note = false, fmt.Sprintf("; %s, where it was planned, holds a backup not taken from this data dir (%q)", dst, origin)
		}
	}
	if !planned {
		dst = backupPath(dirLabels(e.opts.DataDirs)[d], e.opts.BackupDir, s.Version, e.clock())
		e.rep.PlannedBackups[d] = dst
		if err := e.save(); err != nil {
			return err
		}
	}
	br, err := backupTo(ctx, d, e.opts.BackupDir, dst)
	if err != nil {
		return err
	}
	if e.afterBackup != nil {
		if err := e.afterBackup(d); err != nil {
			return err
		}
	}
	e.rep.Backups[d] = br.Backup
	if e.taken == nil {
		e.taken = map[string]bool{}
	}
	e.taken[d] = true
	s.Members[d] = fmt.Sprintf("backed up to %s (%d files, %d bytes, sha256 manifest)%s", br.Backup, br.Files, br.Bytes, note)
	return e.save()
}

// checkBackups verifies, before the first step that changes the data dirs (each step after
// the backup: etcd's runs change them in place, rebuilds swap them and delete the old), every
// journaled backup this run did not take itself: a resumed run's backups were taken maybe days
// ago, and without them the steps ahead cannot be undone.
func (e *executor) checkBackups(ctx context.Context, s *StepReport) error {
	if e.backupsChecked {
		return nil
	}
	var errs []error
	for _, d := range e.opts.DataDirs {
		b, ok := e.rep.Backups[d]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s has no backup in the journal", d))
		case !e.taken[d]:
			errs = append(errs, checkBackup(ctx, b, d))
		}
	}
	if err := errors.Join(errs...); err != nil && ctx.Err() != nil {
		return err // stopped (a signal): nothing is known to be wrong with the backups
	} else if err != nil {
		return fmt.Errorf("%w\nthe backups are the way back to the data before this %s, and step %q changes the data dirs, so nothing was changed: put each backup back where the journal %s says. If one is lost and no step is half done (one the journal marks started, not done), move the journal away and run the same command again: it backs up the data dirs as they are now and goes on from there",
			err, e.rep.Operation, s.Name, e.rep.Journal)
	}
	e.backupsChecked = true
	return nil
}

// checkBackup refuses backup b of data dir d unless it is there, whole, and taken from d.
func checkBackup(ctx context.Context, b, d string) error {
	if !exists(b) {
		return fmt.Errorf("the backup of %s, %s, is missing", d, b)
	}
	if _, err := VerifyManifest(ctx, b); err != nil {
		if ctx.Err() != nil {
			return err // stopped (a signal), not damaged
		}
		return fmt.Errorf("the backup of %s, %s, is damaged: %w", d, b, err)
	}
	if o := backupOrigin(b); o != "" && o != d {
		return fmt.Errorf("the backup of %s, %s, was taken from %s", d, b, o)
	}
	return nil
}

func (e *executor) do(ctx context.Context, s *StepReport) error {
	s.Members = map[string]string{}
	if s.Kind != StepBackup {
		if err := e.checkBackups(ctx, s); err != nil {
			return err
		}
	}
	switch s.Kind {
	case StepBackup:
		for _, d := range e.opts.DataDirs {
			if err := e.backup(ctx, s, d); err != nil {
				return err
			}
		}
		return nil
	case StepRun:
		return e.runStep(ctx, s)
	case StepMigrateV2:
		return e.migrateV2(ctx, s)
	case StepDowngrade:
		return e.downgradeStorage(ctx, s)
	}
	return fmt.Errorf("unknown step kind %q", s.Kind)
}
