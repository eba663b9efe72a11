package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/migrator/cutover"
)

// cutoverOptions are the flags every cutover command shares; Complete loads the plan, so every
// problem with it is a usage error (exit 2), found before anything happens.
type cutoverOptions struct {
	printOptions
	planFile string
	logger   func() *slog.Logger

	plan *cutover.Plan
	// shapeOnly: the plan's files are not checked when it is read (abort, cleanup, status
	// must work when some are gone).
	shapeOnly bool
	// goOn: only the files that what is left of the journaled cutover needs are checked
	// (--resume, rollback, finish: past the switch nothing starts green any more).
	goOn bool
}

func (o *cutoverOptions) addFlags(cmd *cobra.Command, planUsage string) {
	cmd.Flags().StringVar(&o.planFile, "plan", "", planUsage)
	o.output.addFlags(cmd)
}

// planSubcommand is a cutover subcommand running run, with --plan and -o and no arguments.
func (o *cutoverOptions) planSubcommand(run command, use, short string) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: args(cobra.NoArgs), RunE: runE(run)}
	o.addFlags(cmd, "the cutover plan (YAML)")
	return cmd
}

func (o *cutoverOptions) Complete([]string) (err error) {
	if err := o.printOptions.Complete(nil); err != nil {
		return err
	}
	if o.planFile != "" {
		withPlanHints(&o.Streams, o.planFile)
	}
	switch {
	case o.planFile == "":
	case o.shapeOnly:
		o.plan, err = cutover.ReadPlan(o.planFile)
	case o.goOn:
		if o.plan, err = cutover.ReadPlan(o.planFile); err == nil {
			if err = o.plan.CheckFilesToGoOn(); err != nil {
				err = fmt.Errorf("plan %s: %w", o.planFile, err)
			}
		}
	default:
		o.plan, err = cutover.LoadPlan(o.planFile)
	}
	return err
}

func (o *cutoverOptions) Validate() error {
	if o.planFile == "" {
		return UsageErrorf("--plan is required")
	}
	return nil
}

// newCutoverOptions are the shared options of a cutover command.
func newCutoverOptions(g *globals) cutoverOptions {
	return cutoverOptions{printOptions: printOptions{Streams: g.streams}, logger: g.logger}
}

// runWithEvents runs a cutover command whose progress the event printer shows; edit sets the
// command's own options.
func (o *cutoverOptions) runWithEvents(ctx context.Context, edit func(*cutover.Options), run func(context.Context, cutover.Options) (*cutover.Report, error)) error {
	ev := newEventPrinter(o.Out, o.printer)
	defer ev.close()
	opts := o.options(ev.emit)
	if edit != nil {
		edit(&opts)
	}
	_, err := run(ctx, opts)
	return err
}

// options are the library's options for the loaded plan, events going to emit.
func (o *cutoverOptions) options(emit func(cutover.Event)) cutover.Options {
	return cutover.Options{Plan: o.plan, Emit: emit, Log: o.logger()}
}

type cutoverRunOptions struct {
	cutoverOptions
	resume      bool
	dryRun      bool
	rehearse    bool
	allowBypass bool
}

func newCutoverCommand(g *globals) *cobra.Command {
	o := &cutoverRunOptions{cutoverOptions: newCutoverOptions(g)}
	cmd := &cobra.Command{
		Use:   "cutover --plan PLAN",
		Short: "Move the cluster behind the proxy from blue etcd + apiserver to green, journaled",
		Long: `Carry out a cutover plan (docs/plan.md). By default (migration.mode auto, v3 data:
replicate), everything that grows with the data happens with writes open: preflight, a
consistent snapshot of blue's etcd restored as green's at the same revision, green etcd started
and kept in step by replicating every blue revision as one txn, green kube-apiserver started
(read-only in etcd until the switch), every object verified. Then the window, writes fenced
(held in hold mode): drain replication, check the changes since the verify, switch every proxy
to green (watches resumed), let green's apiserver write, fence off. With v2 data (or mode
snapshot) the copy, restore (with a revision bump), green's start and the verify happen with
writes fenced instead.

Each finished step is journaled in the plan's stateDir before the next starts: after a crash,
run the same command with --resume. A failure before the switch aborts: green is stopped and
blue unfenced, as before. After the switch there is no abort; the report says how to reverse.`,
		Args: args(cobra.NoArgs),
		RunE: runE(o),
	}
	o.addFlags(cmd, "the cutover plan (YAML, docs/plan.md)")
	cmd.Flags().BoolVar(&o.resume, "resume", false, "continue the cutover journaled in the plan's stateDir after a crash")
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "print the steps with their exact actions and change nothing")
	cmd.Flags().BoolVar(&o.allowBypass, "allow-bypass", false, "go on although the preflight found writes that went around the proxies or a kubernetes Service endpoint that is not a proxy (they are reported all the same; the plan's preflight.allowBypass does the same)")
	cmd.Flags().BoolVar(&o.rehearse, "rehearse", false, "replicating plans: do everything before the fence (snapshot, green, replication, full verify), measure a drain without fencing, print the window it predicts, then tear green down")
	cmd.AddCommand(newCutoverAbortCommand(g), newCutoverCleanupCommand(g), newCutoverRollbackCommand(g), newCutoverFinishCommand(g), newCutoverStatusCommand(g))
	return cmd
}

// Complete loads the plan; a resume checks only the files what is left of the cutover needs.
func (o *cutoverRunOptions) Complete(args []string) error {
	o.goOn = o.resume
	return o.cutoverOptions.Complete(args)
}

// Validate refuses --rehearse with --resume, or with a plan that does not replicate, here,
// before Run creates and locks the state dir (the library refuses them too, but only then).
func (o *cutoverRunOptions) Validate() error {
	if err := o.cutoverOptions.Validate(); err != nil {
		return err
	}
	switch {
	case o.rehearse && o.resume:
		return UsageErrorf("--rehearse and --resume do not go together: a rehearsal is not resumed; run the rehearsal again, with --rehearse alone")
	case o.dryRun && o.resume:
		// The dry run lists a new cutover's steps; it reads no journal.
		return UsageErrorf("--dry-run shows a new cutover's steps and does not read the journal a --resume continues: 'kubefence cutover status --plan PLAN' shows where that one stands")
	case o.rehearse && !o.plan.Replicating():
		return usage(cutover.ErrRehearseNeedsReplication)
	case o.dryRun:
		if err := cutover.CheckPlan(o.plan); err != nil {
			return usage(fmt.Errorf("plan %s: %w", o.planFile, err))
		}
	}
	return nil
}

func (o *cutoverRunOptions) Run(ctx context.Context) error {
	if o.dryRun {
		steps := cutover.DryRun(o.plan)
		if o.rehearse {
			steps = cutover.DryRunRehearsal(o.plan)
		}
		return o.printer.print(o.Out, steps, func(w io.Writer) {
			fmt.Fprintf(w, "cutover plan %s (dry run: nothing is changed)\n", o.planFile)
			for i, s := range steps {
				fmt.Fprintf(w, "%2d. %-22s %s\n", i+1, s.Step, s.Action)
			}
		})
	}
	return o.runWithEvents(ctx, func(opts *cutover.Options) {
		opts.Resume, opts.Rehearse, opts.AllowBypass = o.resume, o.rehearse, o.allowBypass
	}, cutover.Run)
}

type cutoverCleanupOptions struct {
	cutoverOptions
	removeDataDirs bool
}

func newCutoverCleanupCommand(g *globals) *cobra.Command {
	o := &cutoverCleanupOptions{cutoverOptions: newCutoverOptions(g)}
	o.shapeOnly = true
	cmd := o.planSubcommand(o, "cleanup --plan PLAN", "Stop the green processes an aborted, rehearsed or rolled-back cutover left (never one in progress, baking, rolling back or done)")
	cmd.Flags().BoolVar(&o.removeDataDirs, "remove-data-dirs", false, "also remove the green data dirs that cutover restored (only those: they carry its marker), blue's snapshot in the state dir, and the partial copies an interrupted copy or restore left (*.part, *.kubefence-part: they hold blue's Secrets too)")
	return cmd
}

func (o *cutoverCleanupOptions) Run(ctx context.Context) error {
	rep, err := cutover.Cleanup(ctx, o.options(nil), o.removeDataDirs)
	if rep == nil {
		return err
	}
	perr := o.printer.print(o.Out, rep, func(w io.Writer) {
		fmt.Fprintf(w, "cutover %s (%s): ", rep.ID, rep.State)
		if len(rep.Stopped) == 0 {
			fmt.Fprintln(w, "no green process was running")
		} else {
			fmt.Fprintf(w, "stopped %s\n", strings.Join(rep.Stopped, ", "))
		}
		switch {
		case rep.RemovedDataDirs:
			fmt.Fprintf(w, "green data dirs it restored: removed %s\n", strings.Join(rep.RemovedDirs, ", "))
		case o.removeDataDirs:
			fmt.Fprintln(w, "green data dirs it restored: none was there")
		}
		if rep.RemovedSnapshot != "" {
			fmt.Fprintf(w, "blue's snapshot: removed %s\n", rep.RemovedSnapshot)
		}
		if len(rep.LeftOnHosts) > 0 {
			fmt.Fprintf(w, "their hosts started %s, which kubefence does not stop: stop them there\n", strings.Join(rep.LeftOnHosts, ", "))
		}
	})
	return errors.Join(err, perr)
}

type cutoverAbortOptions struct {
	cutoverOptions
}

func newCutoverAbortCommand(g *globals) *cobra.Command {
	o := &cutoverAbortOptions{newCutoverOptions(g)}
	o.shapeOnly = true
	return o.planSubcommand(o, "abort --plan PLAN", "Stop a cutover before its switch: unfence blue, stop green")
}

func (o *cutoverAbortOptions) Run(ctx context.Context) error {
	return o.runWithEvents(ctx, nil, cutover.Abort)
}

// eventQueue is how many events wait for a stalled output before the next are left out.
const eventQueue = 1024

// eventPrinter prints cutover events: one JSON object per line with -o json, else plain lines
// with each step's duration and a final summary. On a terminal, a status line under the running
// step shows how long it has run and how long writes have been fenced; elsewhere only the plain
// lines are written.
//
// The cutover never waits for its output: emit queues the event and returns, and one goroutine
// writes. A terminal stopped with Ctrl-S, an ssh session that no longer drains or a blocked tee
// holds that goroutine only, and the status line, drawn by it, is simply not redrawn meanwhile.
// Once eventQueue events wait, the next are left out (step lines too) until the queue has been
// written, and then one line says how many: the journal (cutover status) has every step. With
// -o json each line is one whole event, written in the order emitted. close writes what is
// queued and stops the status line.
type eventPrinter struct {
	w       io.Writer
	printer printer
	tty     *os.File
	start   time.Time

	queue chan queuedEvent
	done  chan struct{} // closed when the writer has written the queue out

	mu      sync.Mutex // guards what emit and the writer share: never held while writing
	dropped int        // events left out since the queue filled; emit queues none until it is written out
	// kept are the aborts and reports emitted meanwhile: never left out (they say what failed
	// and what to do next, which 'cutover status' does not), written after the queue.
	kept   []queuedEvent
	closed bool

	// The writer's own.
	n        int       // steps started or skipped so far
	fencedAt time.Time // when writes were fenced, zero while they flow
	running  string    // the step the status line is about, "" when none is drawn
	began    time.Time // when it started
}

// queuedEvent is an event and when it was emitted, for the times printed: the output may be
// written well after.
type queuedEvent struct {
	cutover.Event
	at time.Time
}

func newEventPrinter(w io.Writer, p printer) *eventPrinter {
	ep := &eventPrinter{w: w, printer: p, tty: terminal(w), start: time.Now(), queue: make(chan queuedEvent, eventQueue), done: make(chan struct{})}
	go ep.write()
	return ep
}

// emit queues e for the writer and returns at once; a full queue leaves e out (and counts it).
func (ep *eventPrinter) emit(e cutover.Event) {
	at := e.Time
	if at.IsZero() {
		at = time.Now()
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed {
		return
	}
	if ep.dropped == 0 && len(ep.kept) == 0 {
		select {
		case ep.queue <- queuedEvent{e, at}:
			return
		default:
		}
	}
	if e.Type == cutover.EventAbort || e.Type == cutover.EventReport {
		ep.kept = append(ep.kept, queuedEvent{e, at})
		return
	}
	ep.dropped++
}

// close writes out what is queued and clears the status line, if one is drawn. It waits for
// the output: the cutover is over by then.
func (ep *eventPrinter) close() {
	ep.mu.Lock()
	if !ep.closed {
		ep.closed = true
		close(ep.queue)
	}
	ep.mu.Unlock()
	<-ep.done
}

// write is the one goroutine that writes: the events in the order emitted, the line saying how
// many were left out once the queue is written out, and the status line every 200 ms while a
// step runs on a terminal.
func (ep *eventPrinter) write() {
	defer close(ep.done)
	var ticks <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for {
		select {
		case qe, ok := <-ep.queue:
			if !ok {
				ep.printLeftOut()
				ep.clearStatus()
				return
			}
			ep.print(qe)
			if ep.running != "" && ticker == nil {
				ticker = time.NewTicker(200 * time.Millisecond)
				ticks = ticker.C
			}
			ep.printLeftOut()
		case <-ticks:
			if ep.running == "" {
				continue
			}
			line := fmt.Sprintf("    ... %s running %.1fs", ep.running, time.Since(ep.began).Seconds())
			if !ep.fencedAt.IsZero() {
				line += fmt.Sprintf(", writes fenced for %.1fs", time.Since(ep.fencedAt).Seconds())
			}
			fmt.Fprint(ep.tty, "\r\033[K"+line)
		}
	}
}

// printLeftOut says how many events were left out and writes the aborts and reports kept
// meanwhile, once every event queued before them is written.
func (ep *eventPrinter) printLeftOut() {
	n, kept := ep.takeLeftOut()
	if n > 0 {
		ep.print(queuedEvent{cutover.Event{Time: time.Now(), Type: cutover.EventNote,
			Detail: fmt.Sprintf("%d event(s) not printed: the output did not keep up, and the cutover does not wait for it ('kubefence cutover status' shows every step)", n)}, time.Now()})
	}
	for _, qe := range kept {
		ep.print(qe)
	}
}

// takeLeftOut is how many events were left out and the aborts and reports kept meanwhile, once
// every event queued before them is written (nothing is queued while some are left out or
// kept); emit queues again from then on.
func (ep *eventPrinter) takeLeftOut() (int, []queuedEvent) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	n, kept := ep.dropped, ep.kept
	if n == 0 && len(kept) == 0 || len(ep.queue) > 0 {
		return 0, nil
	}
	ep.dropped, ep.kept = 0, nil
	return n, kept
}

// print writes one event; the writer's.
func (ep *eventPrinter) print(qe queuedEvent) {
	e := qe.Event
	_ = ep.printer.printLine(ep.w, e, func(w io.Writer) {
		ep.clearStatus()
		at := fmt.Sprintf("[%7.2fs]", qe.at.Sub(ep.start).Seconds())
		switch e.Type {
		case "step-start":
			ep.n++
			fmt.Fprintf(w, "%s %d. %s: %s\n", at, ep.n, e.Step, e.Detail)
			if ep.tty != nil {
				ep.running, ep.began = e.Step, qe.at
			}
		case "step-end":
			switch e.Step {
			case cutover.StepFence:
				ep.fencedAt = qe.at
			case cutover.StepUnfence:
				ep.fencedAt = time.Time{}
			}
			fmt.Fprintf(w, "%s    done in %s: %s\n", at, e.Duration.Round(time.Millisecond), e.Detail)
		case "step-skip":
			ep.n++
			fmt.Fprintf(w, "%s %d. %s: already done (%s)\n", at, ep.n, e.Step, e.Detail)
		case "note":
			fmt.Fprintf(w, "%s %s\n", at, e.Detail)
		case "abort":
			fmt.Fprintf(w, "%s ABORT at %s: %s\n", at, e.Step, e.Detail)
		case "report":
			printReport(w, e.Report)
		}
	})
}

// clearStatus clears the status line, if one is drawn; the writer's.
func (ep *eventPrinter) clearStatus() {
	if ep.running != "" {
		ep.running = ""
		fmt.Fprint(ep.tty, "\r\033[K")
	}
}

func printReport(w io.Writer, r *cutover.Report) {
	if r.Cutover != "" {
		fmt.Fprintf(w, "\nrollback %s of cutover %s: %s\n", r.ID, r.Cutover, r.Result)
	} else {
		fmt.Fprintf(w, "\ncutover %s: %s\n", r.ID, r.Result)
	}
	if r.WriteUnavailability > 0 {
		fmt.Fprintf(w, "  write-unavailability window (fence on -> fence off): %s", r.WriteUnavailability.Round(time.Millisecond))
		if r.FenceBarrier > 0 {
			fmt.Fprintf(w, ", of which %s the fence waiting for the writes admitted before it", r.FenceBarrier.Round(100*time.Microsecond))
		}
		fmt.Fprintln(w)
	}
	for _, s := range r.Steps {
		fmt.Fprintf(w, "  %-22s %10s\n", s.Step, s.Duration.Round(time.Millisecond))
	}
	if r.WriteUnavailability > 0 || r.RefusedWrites > 0 { // a run that never fenced has none
		fmt.Fprintf(w, "  %s\n", cutover.RefusedWritesLine(r.RefusedWrites))
	}
	if rp := r.Replication; rp != nil {
		if f := rp.AtFence; f != nil {
			fmt.Fprintf(w, "  replication at the fence: lag %d revisions (%.2fs), %d revisions applied (%.0f/s)\n", f.LagRevisions, f.LagSeconds, f.Revisions, f.RevisionsPerSecond)
		}
		if rp.Rebuilds > 0 {
			fmt.Fprintf(w, "  green rebuilt from a new snapshot %d time(s): blue compacted what replication needed\n", rp.Rebuilds)
		}
	}
	if rh := r.Rehearsal; rh != nil {
		fmt.Fprintf(w, "  rehearsal: predicted window %s = writes in flight %s + drain %s + check %s + 3 proxy round trips of %s + green etcd auth request %s + %d state saves of %s%s; after it, green answering the %d watches moved off blue %s\n",
			rh.PredictedWindow.Round(time.Microsecond), rh.Barrier.Round(time.Microsecond), rh.Drain.Round(time.Microsecond), rh.Check.Round(time.Microsecond), rh.ProxyRoundTrip.Round(time.Microsecond), rh.EtcdRoundTrip.Round(time.Microsecond), rh.WindowSteps+3, rh.StateSave.Round(time.Microsecond), rh.BakeText(" + "), rh.Watches, rh.WatchMoveText())
	}
	if v := r.Verified; v != nil {
		fmt.Fprintf(w, "  objects verified identical: %d across %d resource types\n", v.Objects, v.ResourceTypes)
		for _, c := range v.ChangedAfterCopy {
			fmt.Fprintf(w, "    explained difference (not a loss): %s\n", c)
		}
		for _, m := range v.Mismatches {
			fmt.Fprintf(w, "    MISMATCH: %s\n", m)
		}
	}
	if r.Backend != "" {
		fmt.Fprintf(w, "  proxy backend: %s\n", r.Backend)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", r.Error)
	}
	if r.Next != "" {
		fmt.Fprintf(w, "  next: %s\n", r.Next)
	}
}
