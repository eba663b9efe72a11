package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// The data-dir lifecycle commands: copy, detect, upgrade, downgrade, restore-backup.

type copyOptions struct {
	printOptions
	endpoints []string
	conn      datadir.ConnSpec
	snapshot  string // snapshot file (endpoints mode)
	dataDirs  []string
	walDir    string
	outputDir string
	live      bool
	memberEPs []string
	timeout   time.Duration

	cmd *cobra.Command
}

// copyResult is `migrate copy -o json`.
type copyResult struct {
	Snapshot *datadir.SnapshotInfo `json:"snapshot,omitempty"`
	Members  []datadir.CopyReport  `json:"members,omitempty"`
}

func newMigrateCopyCommand(g *globals) *cobra.Command {
	o := &copyOptions{printOptions: printOptions{Streams: g.streams}}
	cmd := &cobra.Command{
		Use:   "copy (--endpoints URL,... --snapshot FILE | --data-dir DIR... --output-dir DIR [--live --endpoint URL...])",
		Short: "Take a consistent copy of etcd data: a snapshot of a live cluster, or member data dirs",
		Long: `Two kinds of copy.

From a live cluster (--endpoints): wait until every member answers and their raft indexes are
within one of each other, then stream a snapshot through the maintenance API from the most
advanced member, check the sha256 etcd appends, and rename it into --snapshot. --timeout bounds
all of it, the snapshot stream included: raise it for a large database or a slow link. The
snapshot holds the v3 keyspace only: when a member runs etcd 3.5 or older, whose v2 keys live
outside the v3 backend, the copy warns (in the report and on stderr) that any v2 keys are not
in it; copy those members' data dirs with --live for v2 content.

Of member data dirs (--data-dir, repeatable, for a stopped member): copy every file, fsync it,
and record a sha256 manifest (kubefence-manifest.sha256, sha256sum's format) in the copy. A
running member is refused: its backend is updated in place, so a file copy is not consistent.
With --live and --endpoint (that member's client URL) a running member is copied in an order
that makes the copy a prefix of its log: v2 snapshot files first, then the backend through the
member's snapshot API, then the WAL segments (which only grow). Whatever later replays the copy
stops at the committed index its WAL records; a copy that raced a WAL purge is taken again.

With one --data-dir, --output-dir is the copy; with several, each member's copy is
--output-dir/<data dir name>. The source is never written; a non-empty output is refused.`,
		Args: args(cobra.NoArgs),
		RunE: runE(o),
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.endpoints, "endpoints", nil, "client URLs of every member of a live cluster (snapshot copy)")
	f.StringVar(&o.snapshot, "snapshot", "", "snapshot file to write (with --endpoints)")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "with --endpoints: how long the whole copy may take, checking the members, waiting until they are healthy with converged raft indexes and streaming the snapshot into --snapshot")
	f.StringVar(&o.conn.CAFile, "cacert", "", "CA bundle for etcd's serving certificates")
	f.StringVar(&o.conn.CertFile, "cert", "", "client certificate for etcd")
	f.StringVar(&o.conn.KeyFile, "key", "", "client key for etcd")
	f.StringSliceVar(&o.dataDirs, "data-dir", nil, "member data dir to copy (repeatable)")
	f.StringVar(&o.walDir, "wal-dir", "", "the member's WAL dir, when separate (one --data-dir only)")
	f.StringVar(&o.outputDir, "output-dir", "", "where the data dir copy goes (absent or empty)")
	f.BoolVar(&o.live, "live", false, "copy a running member (needs --endpoint)")
	f.StringSliceVar(&o.memberEPs, "endpoint", nil, "with --live: the member's client URL (one per --data-dir, in order)")
	o.output.addFlags(cmd)
	o.cmd = cmd
	return cmd
}

func (o *copyOptions) Validate() error {
	switch {
	case len(o.endpoints) > 0 && len(o.dataDirs) > 0:
		return UsageErrorf("--endpoints (a snapshot of a live cluster) and --data-dir (a member's files) are two kinds of copy: give one")
	case len(o.endpoints) > 0:
		return o.validateSnapshot()
	case len(o.dataDirs) > 0:
		return o.validateDataDirs()
	}
	return UsageErrorf("give --endpoints (a snapshot of a live cluster) or --data-dir (a member's files)")
}

// validateSnapshot checks a copy of a live cluster (--endpoints): the flags of a data dir copy
// would be dropped, so they are refused.
func (o *copyOptions) validateSnapshot() error {
	for _, f := range []string{"output-dir", "live", "endpoint", "wal-dir"} {
		if o.cmd.Flags().Changed(f) {
			return UsageErrorf("--%s is for a copy of --data-dir; with --endpoints the copy is a snapshot of the cluster, streamed from a member into --snapshot: leave --%s out", f, f)
		}
	}
	if o.snapshot == "" {
		return UsageErrorf("--snapshot FILE is required with --endpoints")
	}
	if o.timeout <= 0 {
		return UsageErrorf("--timeout must be positive (it bounds the whole copy, the snapshot stream included)")
	}
	if _, err := os.Stat(o.snapshot); err == nil {
		return UsageErrorf("--snapshot %s exists: refusing to overwrite it", o.snapshot)
	}
	return nil
}

// validateDataDirs checks a copy of member data dirs (--data-dir): the flags of a live cluster's
// snapshot, and --endpoint without --live, would be dropped, so they are refused.
func (o *copyOptions) validateDataDirs() error {
	for _, f := range []string{"snapshot", "timeout"} {
		if o.cmd.Flags().Changed(f) {
			return UsageErrorf("--%s is for a copy of a live cluster (--endpoints); a copy of --data-dir goes to --output-dir, unbounded: leave --%s out", f, f)
		}
	}
	switch {
	case o.outputDir == "":
		return UsageErrorf("--output-dir is required with --data-dir")
	case o.walDir != "" && len(o.dataDirs) > 1:
		return UsageErrorf("--wal-dir goes with a single --data-dir")
	case !o.live && len(o.memberEPs) > 0:
		return UsageErrorf("--endpoint is used only with --live: give --live to copy a running member through its snapshot API, or leave --endpoint out for a stopped member")
	case !o.live && (o.conn.CAFile != "" || o.conn.CertFile != "" || o.conn.KeyFile != ""):
		return UsageErrorf("--cacert, --cert and --key are for talking to etcd, which a copy of a stopped member does not: give --live with --endpoint to copy a running one, or leave them out")
	case o.live && len(o.memberEPs) != len(o.dataDirs):
		return UsageErrorf("--live needs one --endpoint per --data-dir (the running member's client URL): its backend can only be copied consistently through etcd's snapshot API")
	}
	if err := o.members().Check(); err != nil {
		return UsageErrorf("%v: the source is never written, so choose an --output-dir outside every --data-dir", err)
	}
	return nil
}

func (o *copyOptions) members() datadir.MemberCopies {
	return datadir.MemberCopies{DataDirs: o.dataDirs, WALDir: o.walDir, OutputDir: o.outputDir, Live: o.live, Endpoints: o.memberEPs, Conn: o.conn}
}

func (o *copyOptions) Run(ctx context.Context) error {
	if len(o.endpoints) > 0 {
		return o.runSnapshot(ctx)
	}
	reps, err := datadir.CopyMembers(ctx, o.members())
	for _, r := range reps {
		for _, w := range r.Warnings {
			fmt.Fprintf(o.ErrOut, "WARNING: %s: %s\n", r.Output, w) // on stderr too: -o json users see it
		}
	}
	perr := o.printer.print(o.Out, copyResult{Members: reps}, func(w io.Writer) { printCopies(w, reps) })
	if perr != nil {
		return errors.Join(err, perr)
	}
	return err
}

// printCopies is the text report of member copies.
func printCopies(w io.Writer, reps []datadir.CopyReport) {
	for _, r := range reps {
		how := "stopped member"
		if r.Live {
			how = fmt.Sprintf("running member, backend from %s at revision %d, WAL committed to index %d, %d attempt(s)", r.Snapshot.Endpoint, r.Snapshot.Revision, r.CommitIndex, r.Attempts)
		}
		fmt.Fprintf(w, "copied %s -> %s (%s): %d files, %d bytes in %s; manifest %s\n", r.Source, r.Output, how, r.Files, r.Bytes, r.Duration.Round(time.Millisecond), r.Manifest)
		if r.Detection != nil {
			fmt.Fprintf(w, "  holds %s\n", r.Detection)
		}
		for _, warning := range r.Warnings {
			fmt.Fprintf(w, "  WARNING: %s\n", warning)
		}
	}
}

// runSnapshot takes a snapshot of a live cluster once its members have converged.
func (o *copyOptions) runSnapshot(ctx context.Context) error {
	conn := o.conn
	conn.Endpoints = o.endpoints
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	info, err := datadir.TakeSnapshot(ctx, conn, o.snapshot)
	if err != nil {
		return err
	}
	for _, w := range info.Warnings {
		fmt.Fprintf(o.ErrOut, "WARNING: %s\n", w) // on stderr too: -o json users see it
	}
	return o.printer.print(o.Out, copyResult{Snapshot: &info}, func(w io.Writer) {
		fmt.Fprintf(w, "members converged:\n")
		for _, m := range info.Members {
			fmt.Fprintf(w, "  %s  etcd %s  raft index %d  revision %d\n", m.Endpoint, m.Version, m.RaftIndex, m.Revision)
		}
		fmt.Fprintf(w, "snapshot from %s: %s (%d bytes, %d keys, revision %d), sha256 verified\n", info.Endpoint, info.Path, info.Bytes, info.Keys, info.Revision)
	})
}

type detectOptions struct {
	printOptions
	dirs   []string
	walDir string
}

func newMigrateDetectCommand(g *globals) *cobra.Command {
	o := &detectOptions{printOptions: printOptions{Streams: g.streams}}
	cmd := &cobra.Command{
		Use:   "detect --data-dir DIR...",
		Short: "Say which etcd version and storage (etcd2/etcd3) a data dir holds, and how that is known",
		Long: `Read DIR/version.txt ("<etcd version>/<etcd2|etcd3>", the format Kubernetes' etcd image
kept). Without one, infer the version from the backend (storageVersion: 3.6+; the raft term:
3.5; neither: 3.4 or older) and the storage from v2 content in the snapshot and WAL (what etcd
3.6 refuses: keys, v2 auth users and roles), and print the evidence, v2 requests in the WAL that
3.6 only refuses to replay (etcd 3.4's /health reads) included. An empty or garbled version file,
or one the backend contradicts, is an error that says how to fix it. Nothing is written.`,
		Args: args(cobra.NoArgs),
		RunE: runE(o),
	}
	cmd.Flags().StringSliceVar(&o.dirs, "data-dir", nil, "member data dir (repeatable)")
	cmd.Flags().StringVar(&o.walDir, "wal-dir", "", "its WAL dir, when separate (one --data-dir only)")
	o.output.addFlags(cmd)
	return cmd
}

func (o *detectOptions) Validate() error {
	if len(o.dirs) == 0 {
		return UsageErrorf("--data-dir is required")
	}
	if o.walDir != "" && len(o.dirs) > 1 {
		return UsageErrorf("--wal-dir goes with a single --data-dir: each member has its own WAL dir, so run detect once per member with its --wal-dir")
	}
	return nil
}

func (o *detectOptions) Run(context.Context) error {
	var out []datadir.Detection
	var errs []error
	for _, d := range o.dirs {
		det, err := datadir.Detect(d, o.walDir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, det)
	}
	err := o.printer.print(o.Out, out, func(w io.Writer) {
		for _, d := range out {
			fmt.Fprintf(w, "%s: %s\n", d.DataDir, d)
		}
	})
	return errors.Join(append([]error{err}, errs...)...)
}

type lifecycleOptions struct {
	printOptions
	op     datadir.Operation
	opts   datadir.Options
	target string
}

func newMigrateLifecycleCommand(g *globals, op datadir.Operation) *cobra.Command {
	o := &lifecycleOptions{printOptions: printOptions{Streams: g.streams}, op: op}
	cmd := &cobra.Command{Args: args(cobra.NoArgs), RunE: runE(o)}
	switch op {
	case datadir.OpUpgrade:
		cmd.Use = "upgrade --data-dir DIR... --target-version V --bin-dir B"
		cmd.Short = "Upgrade stopped members' data dirs one etcd minor at a time, with a backup first"
		cmd.Long = `Detect the data dirs' version (version.txt, or inferred), back each one up (a copy with a
sha256 manifest, never overwritten), then for every minor after the detected one up to
--target-version: start B/etcd-<version> on the data dirs (all members together, clients on
loopback ports no one else uses, over TLS with a client certificate made for the run, whose
user is root: data with etcd auth on is checked as root, whatever root's password), wait
until healthy, check it serves (v3 data: a write to a
key under /kubefence.io/migrate-health/, deleted at once; v2 data: a read only, nothing
written), wait for etcd 3.6+ to record its storage version, stop it cleanly, check the backend
carries that version's markers, and write version.txt atomically. Intermediate minors use the
newest etcd-<minor>.* in B; the target uses etcd-<target> exactly.

v2 content is migrated to v3 keys (kubefence migrate v2-to-v3, revisions kept, TTL keys into
leases) before the first 3.6 step, since 3.6 refuses v2 data; each new data dir is built and
verified beside the old one and swapped in.

Every step is journaled in --backup-dir. Killed at any point, the same command resumes,
repeating at most the step that was running, with no second backup; a data dir is always one
that etcd opens. --dry-run prints the plan.`
	case datadir.OpDowngrade:
		cmd.Use = "downgrade --data-dir DIR... --target-version 3.5.x --bin-dir B"
		cmd.Short = "Downgrade stopped members' data dirs from etcd 3.6 to 3.5, with a backup first"
		cmd.Long = `etcd can downgrade storage from 3.6 to 3.5 only, one minor, and only when the WAL holds no
entry 3.5 cannot read. kubefence backs each data dir up, runs etcd 3.6 once so the backend
holds the whole WAL, rebuilds each member from the most advanced member's backend with etcd's
restore (same names and peer URLs, a new cluster ID), migrates the new backend's schema to 3.5
with etcd's own migration, swaps it in, then starts B/etcd-<target>, checks it serves, stops it
and writes version.txt. Anything else (3.5 to 3.4, two minors, v2 data) is refused with the
reason; to go back further, restore the backup taken before the upgrade.

Journaled and resumable like upgrade.`
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.opts.DataDirs, "data-dir", nil, "member data dir (repeatable: all members of a multi-member cluster, started together)")
	f.StringVar(&o.target, "target-version", "", "etcd version to end at, e.g. 3.6.16")
	f.StringVar(&o.opts.BinDir, "bin-dir", "", "dir holding etcd-<version> binaries")
	f.StringVar(&o.opts.BackupDir, "backup-dir", "", "where backups, the journal and etcd's logs go (default: kubefence-backups next to the first data dir); it and the directories above it must be writable by no user but root or this one")
	f.BoolVar(&o.opts.DryRun, "dry-run", false, "print the plan and change nothing")
	f.DurationVar(&o.opts.StepTimeout, "step-timeout", 2*time.Minute, "how long each etcd may take to become healthy")
	f.StringVar(&o.opts.ClusterToken, "initial-cluster-token", "etcd-cluster", "token for members rebuilt by a restore (v2 migration, downgrade)")
	if op == datadir.OpUpgrade {
		f.StringVar(&o.opts.OnConflict, "on-conflict", "", "v2 migration: for a key in both stores, v3 or v2 wins (default: refuse)")
		f.BoolVar(&o.opts.IncludeHidden, "include-hidden", false, "v2 migration: keep hidden keys (a path segment starting with _)")
	}
	o.output.addFlags(cmd)
	return cmd
}

func (o *lifecycleOptions) Complete([]string) (err error) {
	if err := o.printOptions.Complete(nil); err != nil {
		return err
	}
	if o.target != "" {
		if o.opts.Target, err = datadir.ParseVersion(o.target); err != nil {
			return fmt.Errorf("--target-version: %w", err)
		}
	}
	return nil
}

// Validate checks what datadir.Run would otherwise refuse only once it has taken its lock (and
// made the backup dir for it), as a failure (exit 1).
func (o *lifecycleOptions) Validate() error {
	switch {
	case len(o.opts.DataDirs) == 0:
		return UsageErrorf("--data-dir is required (repeat it, or separate with commas, for every member of a multi-member cluster)")
	case o.target == "":
		return UsageErrorf("--target-version is required (e.g. 3.6.16)")
	case o.opts.StepTimeout <= 0:
		return UsageErrorf("--step-timeout must be positive (how long each etcd may take to become healthy)")
	}
	if err := v2v3.CheckOnConflict(o.opts.OnConflict); err != nil {
		return usage(err)
	}
	// --bin-dir is not required here: a resumed run takes the binaries its journal names, and
	// data already at the target needs none; the plan says when one is missing.
	return nil
}

// Run carries out the upgrade or downgrade. Stopped by SIGINT/SIGTERM (the context), any etcd
// it started is killed with it, as after a crash, and the same command resumes.
func (o *lifecycleOptions) Run(ctx context.Context) error {
	lp := &lifecycleProgress{}
	o.opts.Events = func(e datadir.Event) {
		o.printer.progress(o.Out, func(w io.Writer) { lp.print(w, e) })
	}
	rep, err := datadir.Run(ctx, o.op, o.opts)
	if rep == nil {
		return err
	}
	perr := o.printer.print(o.Out, rep, func(w io.Writer) { printLifecycleResult(w, o.op, rep, err) })
	if perr != nil {
		return errors.Join(err, perr)
	}
	return err
}

// lifecycleProgress prints an upgrade's or downgrade's steps as they start and end.
type lifecycleProgress struct {
	n, total int
}

func (lp *lifecycleProgress) print(w io.Writer, e datadir.Event) {
	switch e.Kind {
	case datadir.EventPlan:
		lp.total = len(e.Report.Steps)
		if !e.Report.DryRun {
			printPlanHeader(w, e.Report)
		}
	case datadir.EventStart:
		lp.n++
		fmt.Fprintf(w, "[%d/%d] %s ...", lp.n, lp.total, e.Step.Name)
		if e.Step.Repeated {
			fmt.Fprint(w, " (repeated: the last run stopped in this step)")
		}
		fmt.Fprintln(w)
	case datadir.EventSkip:
		lp.n++
		fmt.Fprintf(w, "[%d/%d] %s: done by an earlier run\n", lp.n, lp.total, e.Step.Name)
	case datadir.EventEnd:
		printMembers(w, e.Step.Members)
		fmt.Fprintf(w, "      done in %s\n", e.Duration.Round(time.Millisecond))
	}
}

// printLifecycleResult prints the end of a run in the human form: the plan of a dry run, or
// what the data dirs hold after a run that succeeded (a failed run's error says the rest).
func printLifecycleResult(w io.Writer, op datadir.Operation, rep *datadir.Report, err error) {
	switch {
	case rep.DryRun:
		printPlanHeader(w, rep)
		for i, s := range rep.Steps {
			state := ""
			if s.Done {
				state = " (done by an earlier run)"
			}
			fmt.Fprintf(w, "[%d/%d] %s%s\n", i+1, len(rep.Steps), s.Name, state)
			if s.Binary != "" {
				fmt.Fprintf(w, "      with %s\n", s.Binary)
			}
		}
		fmt.Fprintln(w, "dry run: nothing was changed")
	case err == nil:
		if len(rep.Steps) == 0 {
			fmt.Fprintf(w, "nothing to do: already at %s\n", rep.Target)
		}
		for _, d := range slices.Sorted(maps.Keys(rep.After)) {
			fmt.Fprintf(w, "%s: %s\n", d, rep.After[d])
		}
		fmt.Fprintf(w, "%s to %s done in %s; backups: %s\n", op, rep.Target, rep.Duration.Round(time.Millisecond), rep.BackupDir)
	}
}

func printPlanHeader(w io.Writer, rep *datadir.Report) {
	for _, d := range rep.Before {
		fmt.Fprintf(w, "%s: %s\n", d.DataDir, d)
	}
	if rep.Resumed {
		fmt.Fprintf(w, "resuming the %s journaled in %s\n", rep.Operation, rep.Journal)
	}
	fmt.Fprintf(w, "plan: %s to %s in %d step(s)\n", rep.Operation, rep.Target, len(rep.Steps))
}

func printMembers(w io.Writer, m map[string]string) {
	for _, d := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(w, "      %s: %s\n", d, m[d])
	}
}

type restoreBackupOptions struct {
	printOptions
	backup  string
	dataDir string
}

func newMigrateRestoreBackupCommand(g *globals) *cobra.Command {
	o := &restoreBackupOptions{printOptions: printOptions{Streams: g.streams}}
	cmd := &cobra.Command{
		Use:   "restore-backup --backup DIR --data-dir DIR",
		Short: "Put a backup back in place of a data dir, verified against its sha256 manifest",
		Long: `Verify the backup against its manifest (a damaged backup restores nothing), copy it next to
--data-dir, verify the copy, and rename it into place. A data dir already there is kept,
renamed to <data dir>.replaced-<time>; it must not be in use by a running etcd, nor read by a
kubefence copy or backup (checked before the copy and again before the rename).`,
		Args: args(cobra.NoArgs),
		RunE: runE(o),
	}
	cmd.Flags().StringVar(&o.backup, "backup", "", "backup dir (as printed by upgrade or downgrade)")
	cmd.Flags().StringVar(&o.dataDir, "data-dir", "", "data dir to restore into")
	o.output.addFlags(cmd)
	return cmd
}

func (o *restoreBackupOptions) Validate() error {
	if o.backup == "" || o.dataDir == "" {
		return UsageErrorf("--backup and --data-dir are required")
	}
	return nil
}

// Run restores the backup. A restore that fails after it changed something (the old data dir
// moved aside, the backup in place, a verified copy left beside it) prints what it did too,
// before the error: the error alone does not say what is where now.
func (o *restoreBackupOptions) Run(ctx context.Context) error {
	rep, err := datadir.RestoreBackup(ctx, o.backup, o.dataDir, time.Now())
	if err != nil && !rep.Changed() {
		return err
	}
	perr := o.printer.print(o.Out, rep, func(w io.Writer) { printRestore(w, rep) })
	return errors.Join(err, perr)
}

// printRestore prints what a restore did, in the human form.
func printRestore(w io.Writer, rep datadir.RestoreReport) {
	if rep.Restored {
		fmt.Fprintf(w, "restored %s -> %s: %d files verified against the manifest in %s\n", rep.Backup, rep.DataDir, rep.Files, rep.Duration.Round(time.Millisecond))
	} else {
		fmt.Fprintf(w, "NOT restored: %s was not put in %s\n", rep.Backup, rep.DataDir)
	}
	if rep.Copy != "" {
		fmt.Fprintf(w, "the verified copy of the backup is at %s\n", rep.Copy)
	}
	if rep.Replaced != "" {
		fmt.Fprintf(w, "the data dir that was there is kept at %s\n", rep.Replaced)
	}
	if rep.RemovedRebuild != "" {
		fmt.Fprintf(w, "removed %s, the member an interrupted upgrade or downgrade had rebuilt from the data that was there: the next one builds it again from the restored data\n", rep.RemovedRebuild)
	}
	for _, j := range rep.Abandoned {
		fmt.Fprintf(w, "the unfinished upgrade or downgrade of this data dir is abandoned (its journal kept at %s): the next one plans afresh from the restored data\n", j)
	}
	for _, j := range rep.Unread {
		fmt.Fprintf(w, "WARNING: %s is in a backup dir other users can write to, so it was not read: if it journals an unfinished upgrade or downgrade of this data dir, rename it away before the next one, which would resume it on the restored data\n", j)
	}
}
