package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/migrator/cutover"
)

// The bake's commands (docs/rollback.md): rollback, finish, status.

type cutoverRollbackOptions struct {
	cutoverOptions
	resume bool
}

func newCutoverRollbackCommand(g *globals) *cobra.Command {
	o := &cutoverRollbackOptions{cutoverOptions: newCutoverOptions(g)}
	o.goOn = true
	cmd := o.planSubcommand(o, "rollback --plan PLAN", "During a bake, go back to blue: fence, drain green into blue, switch every proxy to blue, unfence")
	cmd.Long = `Go back to blue while the cutover bakes (plan bake.enabled): the window of the cutover run
backwards. The process keeping blue in step with green is asked to stop (SIGTERM) and this one
picks replication up; then fence on (hold), wait until blue is at green's revision, switch every
proxy to blue with open watches resumed there, keep green's apiserver from writing, stop
replication, let blue's apiserver write, fence off. Journaled in the state dir's rollback/; after
a crash run it again with --resume. A failure before the switch unfences green and leaves the
bake to be resumed ('kubefence cutover --resume').`
	cmd.Flags().BoolVar(&o.resume, "resume", false, "continue the rollback journaled in the state dir after a crash")
	return cmd
}

func (o *cutoverRollbackOptions) Run(ctx context.Context) error {
	return o.runWithEvents(ctx, func(opts *cutover.Options) { opts.Resume = o.resume }, cutover.Rollback)
}

type cutoverFinishOptions struct {
	cutoverOptions
}

func newCutoverFinishCommand(g *globals) *cobra.Command {
	o := &cutoverFinishOptions{newCutoverOptions(g)}
	o.goOn = true
	return o.planSubcommand(o, "finish --plan PLAN", "End a bake: blue stops following green (its data dir is kept), the cutover is done")
}

func (o *cutoverFinishOptions) Run(ctx context.Context) error {
	return o.runWithEvents(ctx, nil, cutover.Finish)
}

type cutoverStatusOptions struct {
	cutoverOptions
}

func newCutoverStatusCommand(g *globals) *cobra.Command {
	o := &cutoverStatusOptions{newCutoverOptions(g)}
	o.shapeOnly = true
	return o.planSubcommand(o, "status --plan PLAN", "Show where the cutover in the plan's state dir stands; during a bake, blue's lag behind green")
}

func (o *cutoverStatusOptions) Run(ctx context.Context) error {
	st, err := cutover.Status(ctx, o.plan)
	if st == nil {
		return err
	}
	return errors.Join(err, o.printer.print(o.Out, st, func(w io.Writer) { printCutoverStatus(w, st) }))
}

func printCutoverStatus(w io.Writer, st *cutover.StatusReport) {
	what := ""
	if st.Rehearsal {
		what = " (a rehearsal)"
	}
	fmt.Fprintf(w, "cutover %s%s: %s (started %s)\n", st.ID, what, st.State, st.Started.Format(time.RFC3339))
	for _, s := range st.Steps {
		fmt.Fprintf(w, "  %-22s %10s\n", s.Step, s.Duration.Round(time.Millisecond))
	}
	printRunner(w, st)
	if b := st.Bake; b != nil {
		printBake(w, st.State, b)
	}
	if st.Rollback != "" {
		fmt.Fprintf(w, "  rollback: %s\n", st.Rollback)
	}
}

// printRunner says who runs the cutover, and what to do when no one does while it needs it.
func printRunner(w io.Writer, st *cutover.StatusReport) {
	switch {
	case !st.WindowOpenSince.IsZero() && len(st.StillFenced) > 0:
		fmt.Fprintf(w, "  WRITES FENCED on %s since %s (%s ago) by this cutover: its abort could not unfence them; the others are open\n", strings.Join(st.StillFenced, ", "), st.WindowOpenSince.Format(time.RFC3339), time.Since(st.WindowOpenSince).Round(time.Second))
	case !st.WindowOpenSince.IsZero() && st.Aborting != "":
		// Its unfence is journaled once every proxy reopened: one it could not reach keeps the
		// window open in the journal while the others are open.
		fmt.Fprintf(w, "  WRITES FENCED since %s (%s ago) by this cutover; its abort unfences every proxy it reaches first, so some proxies may be open again ('kubefence fence status' on each says)\n", st.WindowOpenSince.Format(time.RFC3339), time.Since(st.WindowOpenSince).Round(time.Second))
	case !st.WindowOpenSince.IsZero():
		fmt.Fprintf(w, "  WRITES FENCED since %s (%s ago) by this cutover\n", st.WindowOpenSince.Format(time.RFC3339), time.Since(st.WindowOpenSince).Round(time.Second))
	case len(st.StillFenced) > 0 && st.State == cutover.StateRunning:
		// A cutover's abort of a fence that never finished: going back to blue (said below).
		fmt.Fprintf(w, "  WRITES FENCED on %s by this cutover: its abort could not unfence them; the others are open\n", strings.Join(st.StillFenced, ", "))
	case len(st.StillFenced) > 0:
		// A rollback's abort that ended, back to the bake, with proxies it could not reach.
		fmt.Fprintf(w, "  WRITES FENCED on %s: the rollback's abort could not unfence them; the others are open ('kubefence fence off --expect-backend GREEN_URL' on each once it answers; 'kubefence backend set GREEN_URL' first if it is on blue)\n", strings.Join(st.StillFenced, ", "))
	}
	if !st.FenceStartedAt.IsZero() {
		fmt.Fprintf(w, "  the fence was being turned on at %s: 'kubefence fence status' shows whether the proxies hold it\n", st.FenceStartedAt.Format(time.RFC3339))
	}
	if st.Aborting != "" {
		fmt.Fprintf(w, "  going back to blue: %s\n", st.Aborting)
	}
	switch {
	case st.Runner > 0:
		fmt.Fprintf(w, "  run by pid %d\n", st.Runner)
	case st.Aborting != "":
		fmt.Fprintln(w, "  WARNING: the abort did not finish: run 'kubefence cutover abort --plan PLAN'")
	case st.State == cutover.StateRunning && switched(st):
		// Abort refuses from here: the proxies send requests to green.
		fmt.Fprintf(w, "  WARNING: no process runs this cutover, and it has switched to green: run 'kubefence cutover --resume --plan PLAN' now to finish it (writes reopen on green); %s. There is no abort past the switch\n", cmp.Or(st.FinishByHand, "if it cannot run, 'kubefence fence off --expect-backend GREEN_URL' on each proxy reopens writes where the proxy is on green"))
	case st.State == cutover.StateRunning && (!st.WindowOpenSince.IsZero() || !st.FenceStartedAt.IsZero()):
		fmt.Fprintln(w, "  WARNING: no process runs this cutover: run 'kubefence cutover --resume --plan PLAN' to finish the window, or 'kubefence cutover abort --plan PLAN' to go back to blue, now")
	case st.State == cutover.StateRunning && st.Rehearsal:
		fmt.Fprintln(w, "  no process runs this rehearsal: 'kubefence cutover abort --plan PLAN' stops what it started")
	case st.State == cutover.StateRunning:
		fmt.Fprintln(w, "  no process runs this cutover: 'kubefence cutover --resume --plan PLAN' continues it, 'kubefence cutover abort --plan PLAN' goes back to blue")
	case st.State == cutover.StateRollingBack && st.FinishByHand != "":
		fmt.Fprintf(w, "  WARNING: no process runs the rollback, and it has switched to blue: run 'kubefence cutover rollback --resume --plan PLAN' now to finish it (writes reopen on blue); %s\n", st.FinishByHand)
	case st.State == cutover.StateRollingBack:
		fmt.Fprintln(w, "  WARNING: no process runs the rollback: run 'kubefence cutover rollback --resume --plan PLAN'")
	}
}

// switched says whether the cutover's switch to green is journaled.
func switched(st *cutover.StatusReport) bool {
	return slices.ContainsFunc(st.Steps, func(s cutover.StepRecord) bool { return s.Step == cutover.StepSwitch })
}

// printBake says where blue stands against green in a bake, and whether anything keeps it so.
func printBake(w io.Writer, state string, b *cutover.BakeStatus) {
	if state != cutover.StateBaking && state != cutover.StateRollingBack {
		fmt.Fprintf(w, "  bake: blue followed green from revision %d (since %s)\n", b.Revision, b.Started.Format(time.RFC3339))
		return
	}
	if b.FollowingStopped {
		fmt.Fprintf(w, "  bake: blue followed green from revision %d until the rollback stopped it; blue leads now\n", b.Revision)
	} else {
		fmt.Fprintf(w, "  bake: blue follows green from revision %d (since %s)\n", b.Revision, b.Started.Format(time.RFC3339))
	}
	switch {
	case b.Error != "":
		fmt.Fprintf(w, "  revisions: %s\n", b.Error)
	case b.FollowingStopped && b.GreenRevision > 0:
		fmt.Fprintf(w, "  blue at revision %d, green at %d\n", b.BlueRevision, b.GreenRevision)
	case b.GreenRevision > 0:
		fmt.Fprintf(w, "  green at revision %d, blue at %d: lag %d revisions\n", b.GreenRevision, b.BlueRevision, b.LagRevisions)
	}
	if state == cutover.StateBaking && b.Follower == 0 {
		fmt.Fprintln(w, "  WARNING: no process keeps blue in step: run 'kubefence cutover --resume --plan PLAN' "+cutover.PickupHorizon)
	}
}
