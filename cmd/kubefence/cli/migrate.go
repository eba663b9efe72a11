package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

func newMigrateCommand(g *globals) *cobra.Command {
	return groupCommand(&cobra.Command{
		Use:   "migrate",
		Short: "Offline etcd data work: copy, detect, back up, upgrade, downgrade, migrate v2 stores to v3",
	}, newMigrateV2ToV3Command(g), newMigrateCopyCommand(g), newMigrateDetectCommand(g),
		newMigrateLifecycleCommand(g, datadir.OpUpgrade), newMigrateLifecycleCommand(g, datadir.OpDowngrade),
		newMigrateRestoreBackupCommand(g))
}

type migrateV2Options struct {
	printOptions
	cfg      v2v3.Config
	peerURLs string
	clock    string
}

func newMigrateV2ToV3Command(g *globals) *cobra.Command {
	o := &migrateV2Options{printOptions: printOptions{Streams: g.streams}}
	cmd := &cobra.Command{
		Use:   "v2-to-v3 --data-dir SRC --output-dir DST --name N --initial-cluster N=URL --initial-advertise-peer-urls URL",
		Short: "Convert a copy of a member's v2 store into a new etcd v3 member data dir",
		Long: `Read a copy of an etcd member data dir (etcd 2.2 through 3.5), load its newest valid v2
snapshot, replay the WAL up to the committed index, and write the v2 keys into a new v3 member
data dir that etcd 3.5 and 3.6 start on: keys keep their create/mod revisions (the v2 indexes),
TTL keys become leases with their remaining TTL, directories are dropped, hidden keys are
counted (and kept with --include-hidden). The output is read back and every key checked.

A source that also holds v3 keys (member/snap/db) keeps them unchanged, with their revisions,
history and leases; the v2 keys are renumbered above the v3 revision, in their original order.
A key in both stores is an error unless --on-conflict says which wins.

For a cluster of several members (--initial-cluster names them all), build every member's
output from one source copy, the most advanced member's (the highest commit index), with the
same --ttl-clock and flags: one run per member, changing only --name and
--initial-advertise-peer-urls. Do not run it on each member's own data dir, as etcdctl
migrate was run: members stopped at different points hold different data, and the new cluster
would start with members that disagree. The report's "content crc32c" line must be the
same for every member.

--prefix-from/--prefix-to rewrite the start of v2 keys (an apiserver --etcd-prefix change); a
source with v3 keys under --prefix-from is refused, since its v3 store is carried over as it is.
--transformer runs a program with etcdctl migrate's protocol instead of the default mapping:
the v2 nodes as concatenated JSON objects on its stdin, length-prefixed (8-byte little-endian)
mvccpb.KeyValue messages on its stdout; a key keeps its lease when the program keeps its
modifiedIndex as mod_revision.

Memory grows with the number of keys, not with the data: the snapshot is mapped and streamed,
and only the nodes the WAL tail touches are loaded for the replay. On a terminal, progress
(phase, keys/s) is drawn on stderr.

The source is never written; the output is built and verified next to --output-dir and
renamed into place, and a non-empty --output-dir is refused.`,
		Args: args(cobra.NoArgs),
		RunE: runE(o),
	}
	f := cmd.Flags()
	f.StringVar(&o.cfg.DataDir, "data-dir", "", "copy of the member data dir to read (never written)")
	f.StringVar(&o.cfg.WALDir, "wal-dir", "", "its WAL dir, when separate (default DATA-DIR/member/wal)")
	f.StringVar(&o.cfg.OutputDir, "output-dir", "", "new member data dir to create (absent or empty)")
	f.StringVar(&o.cfg.Member.Name, "name", "", "the new member's name")
	f.StringVar(&o.cfg.Member.InitialCluster, "initial-cluster", "", "the new cluster's members, NAME=PEER-URL,...; build every one from the same source copy")
	f.StringVar(&o.peerURLs, "initial-advertise-peer-urls", "", "the new member's peer URLs")
	f.StringVar(&o.cfg.Member.InitialClusterToken, "initial-cluster-token", "etcd-cluster", "the new cluster's token")
	f.BoolVar(&o.cfg.NoTTL, "no-ttl", false, "drop keys that have a TTL instead of giving them leases")
	f.StringVar(&o.clock, "ttl-clock", "", "measure remaining TTLs against this time (RFC 3339, with the zone: Z is UTC) instead of now, for repeatable runs: the time the source stopped, not later than now; required, the same for each, when --initial-cluster names several members")
	f.BoolVar(&o.cfg.IncludeHidden, "include-hidden", false, "migrate hidden v2 keys (a path segment starting with _) too")
	f.StringVar(&o.cfg.OnConflict, "on-conflict", "", "for a key in both the v2 and the v3 store: v3 keeps the v3 key, v2 writes the v2 value over it (default: refuse)")
	f.Uint64Var(&o.cfg.RevisionBump, "bump-revision", 0, "add this to the revision of the new store (with --mark-compacted, as etcdutl snapshot restore)")
	f.BoolVar(&o.cfg.MarkCompacted, "mark-compacted", false, "mark the revisions up to the bumped one compacted (with --bump-revision)")
	f.StringVar(&o.cfg.PrefixFrom, "prefix-from", "", "rewrite keys that start with this prefix (with --prefix-to)")
	f.StringVar(&o.cfg.PrefixTo, "prefix-to", "", "the prefix those keys get instead (an apiserver --etcd-prefix change)")
	f.StringVar(&o.cfg.Transformer, "transformer", "", "program that maps v2 nodes to v3 keys, with etcdctl migrate's protocol")
	o.output.addFlags(cmd)
	return cmd
}

func (o *migrateV2Options) Complete([]string) error {
	if err := o.printOptions.Complete(nil); err != nil {
		return err
	}
	if o.peerURLs != "" {
		o.cfg.Member.InitialAdvertisePeerURLs = strings.Split(o.peerURLs, ",")
	}
	if o.clock != "" {
		t, err := time.Parse(time.RFC3339, o.clock)
		if err != nil {
			return UsageErrorf("--ttl-clock %q: want RFC 3339, like 2026-11-21T10:00:00Z", o.clock)
		}
		o.cfg.Now = t
	}
	return nil
}

// ttlClockSkew is how far past now a --ttl-clock may be: clocks of two machines apart.
const ttlClockSkew = time.Minute

func (o *migrateV2Options) Validate() error {
	if ahead := time.Until(o.cfg.Now); o.clock != "" && ahead > ttlClockSkew {
		return UsageErrorf("--ttl-clock %s is %s in the future (now is %s): it must be the time the source stopped (or the copy was taken), not later than now, or every TTL key expiring before it is dropped and the rest get TTLs short by the difference. Write a local time with its offset (2026-11-21T10:00:00+09:00, not Z), or leave --ttl-clock out to measure against now",
			o.clock, ahead.Round(time.Second), time.Now().UTC().Format(time.RFC3339))
	}
	if n := clusterMembers(o.cfg.Member.InitialCluster); n > 1 && o.clock == "" && !o.cfg.NoTTL {
		return UsageErrorf("--initial-cluster names %d members: build every one with the same --ttl-clock (RFC 3339, e.g. the time of the first: --ttl-clock %s), or each measures TTLs against its own now, keeps a key expiring in between that another dropped, and the members' revisions part for good at its lease's revoke; or --no-ttl",
			n, time.Now().UTC().Format(time.RFC3339))
	}
	return o.cfg.Validate()
}

// clusterMembers counts the members an --initial-cluster names (NAME=PEER-URL,...; a member
// with several peer URLs is named once for each).
func clusterMembers(initialCluster string) int {
	names := map[string]bool{}
	for _, m := range strings.Split(initialCluster, ",") {
		if name, _, ok := strings.Cut(m, "="); ok {
			names[name] = true
		}
	}
	return len(names)
}

func (o *migrateV2Options) Run(ctx context.Context) error {
	progress, clear := terminalProgress(o.ErrOut)
	o.cfg.Progress = progress
	rep, err := v2v3.RunContext(ctx, o.cfg)
	clear()
	if err != nil {
		return err
	}
	return o.printer.print(o.Out, rep, func(w io.Writer) { printMigrateReport(w, rep) })
}

func printMigrateReport(w io.Writer, r *v2v3.Report) {
	fmt.Fprintf(w, "migrated %s -> %s\n", r.DataDir, r.OutputDir)
	if r.Snapshot != "" {
		fmt.Fprintf(w, "  v2 snapshot: %s (index %d)\n", r.Snapshot, r.SnapshotIdx)
	}
	for _, s := range r.SkippedSnaps {
		fmt.Fprintf(w, "  skipped unreadable snapshot: %s\n", s)
	}
	fmt.Fprintf(w, "  WAL replayed to commit index %d: %d entries, %d writes applied, %d refused (as on the member), %d expiry syncs\n",
		r.CommitIndex, r.Replay.Entries, r.Replay.Applied, r.Replay.Refused, r.Replay.Syncs)
	k := r.Keys
	fmt.Fprintf(w, "  keys: %d written (%d with a TTL, in %d leases), %d directories dropped, %d expired TTL keys dropped",
		k.Keys, k.TTLKeys, r.Leases, k.Dirs, k.ExpiredDropped)
	if k.TTLDropped > 0 {
		fmt.Fprintf(w, ", %d TTL keys dropped (--no-ttl)", k.TTLDropped)
	}
	if k.Rewritten > 0 {
		fmt.Fprintf(w, ", %d keys given the new prefix", k.Rewritten)
	}
	if k.TransformerIn > 0 {
		fmt.Fprintf(w, ", transformer: %d nodes in, %d keys out", k.TransformerIn, k.TransformerOut)
	}
	if k.LeaseLost > 0 {
		fmt.Fprintf(w, ", %d TTL keys without a lease (the transformer changed their revision)", k.LeaseLost)
	}
	if k.Hidden > 0 {
		fmt.Fprintf(w, ", %d hidden keys (%d left out; --include-hidden keeps them)", k.Hidden, k.HiddenSkipped)
	}
	fmt.Fprintf(w, "\n  verified: %d of %d keys read back identical\n", r.Verified, k.Keys)
	fmt.Fprintf(w, "  content crc32c %08x (source at commit index %d): every member of the new cluster, built from one source copy with the same flags, shows the same\n", r.ContentCRC, r.CommitIndex)
	if k.TTLKeys > 0 || k.ExpiredDropped > 0 {
		fmt.Fprintf(w, "  TTLs measured against %s (--ttl-clock)\n", r.Now.UTC().Format(time.RFC3339Nano))
	}
	if r.V3 != nil {
		fmt.Fprintf(w, "  v3 store carried over: %d live keys, %d revisions; v2 keys renumbered above it; %d key(s) in both\n",
			r.V3.V3Keys, r.V3.V3Revisions, len(r.V3.Conflicts))
	}
	for _, warning := range r.Warnings {
		fmt.Fprintf(w, "  WARNING: %s\n", warning)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  PREFIX\tKEYS")
	for _, p := range slices.Sorted(maps.Keys(r.Prefixes)) {
		fmt.Fprintf(tw, "  %s\t%d\n", p, r.Prefixes[p])
	}
	_ = tw.Flush()
}
