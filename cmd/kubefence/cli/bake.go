package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	fmt.Fprintf(w, "cutover %s: %s (started %s)\n", st.ID, st.State, st.Started.Format(time.RFC3339))
	for _, s := range st.Steps {
		fmt.Fprintf(w, "  %-22s %10s\n", s.Step, s.Duration.Round(time.Millisecond))
	}
	if b := st.Bake; b != nil {
		fmt.Fprintf(w, "  bake: blue follows green from revision %d (since %s)\n", b.Revision, b.Started.Format(time.RFC3339))
		switch {
		case b.Error != "":
			fmt.Fprintf(w, "  revisions: %s\n", b.Error)
		case b.GreenRevision > 0:
			fmt.Fprintf(w, "  green at revision %d, blue at %d: lag %d revisions\n", b.GreenRevision, b.BlueRevision, b.LagRevisions)
		}
		if st.State == cutover.StateBaking && b.Follower == 0 {
			fmt.Fprintln(w, "  WARNING: no process keeps blue in step: run 'kubefence cutover --resume --plan PLAN' (blue's leases are not kept alive meanwhile)")
		} else if b.Follower > 0 {
			fmt.Fprintf(w, "  kept in step by pid %d\n", b.Follower)
		}
	}
	if st.Rollback != "" {
		fmt.Fprintf(w, "  rollback: %s\n", st.Rollback)
	}
}
