package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/migrator/cutover"
)

type cutoverOptions struct {
	plan   string
	resume bool
	dryRun bool
	output string
}

// load checks the flags every cutover command shares and reads the plan; every problem is a
// usage error (exit 2), found before anything happens.
func (o *cutoverOptions) load() (*cutover.Plan, error) {
	if err := validateOutput(o.output); err != nil {
		return nil, err
	}
	if o.plan == "" {
		return nil, UsageErrorf("--plan is required")
	}
	p, err := cutover.LoadPlan(o.plan)
	if err != nil {
		return nil, usage(err)
	}
	return p, nil
}

func newCutoverCommand(g *globals) *cobra.Command {
	o := &cutoverOptions{}
	cmd := &cobra.Command{
		Use:   "cutover --plan PLAN",
		Short: "Move the cluster behind the proxy from blue etcd + apiserver to green, journaled",
		Long: `Carry out a cutover plan (docs/plan.md): preflight, fence on, copy blue's etcd (a consistent
snapshot), build green's data dir (restore with a revision bump), start green etcd and green
kube-apiserver, verify every object, switch the proxy to green, fence off.

Each finished step is journaled in the plan's stateDir before the next starts: after a crash,
run the same command with --resume. A failure before the switch aborts: green is stopped and
blue unfenced, as before. After the switch there is no abort; the report says how to reverse.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := o.load()
			if err != nil {
				return err
			}
			if o.dryRun {
				steps := cutover.DryRun(p)
				if o.output == "json" {
					return printJSON(g.streams.Out, steps)
				}
				fmt.Fprintf(g.streams.Out, "cutover plan %s (dry run: nothing is changed)\n", o.plan)
				for i, s := range steps {
					fmt.Fprintf(g.streams.Out, "%2d. %-22s %s\n", i+1, s.Step, s.Action)
				}
				return nil
			}
			emit := eventPrinter(g.streams.Out, o.output)
			_, err = cutover.Run(cmd.Context(), cutover.Options{Plan: p, Resume: o.resume, Emit: emit, Log: g.logger()})
			return err
		},
	}
	cmd.Flags().StringVar(&o.plan, "plan", "", "the cutover plan (YAML, docs/plan.md)")
	cmd.Flags().BoolVar(&o.resume, "resume", false, "continue the cutover journaled in the plan's stateDir after a crash")
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "print the steps with their exact actions and change nothing")
	addOutputFlag(cmd, &o.output)
	cmd.AddCommand(newCutoverAbortCommand(g))
	return cmd
}

func newCutoverAbortCommand(g *globals) *cobra.Command {
	o := &cutoverOptions{}
	cmd := &cobra.Command{
		Use:   "abort --plan PLAN",
		Short: "Stop a cutover before its switch: stop green, unfence blue",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := o.load()
			if err != nil {
				return err
			}
			_, err = cutover.Abort(cmd.Context(), cutover.Options{Plan: p, Emit: eventPrinter(g.streams.Out, o.output), Log: g.logger()})
			return err
		},
	}
	cmd.Flags().StringVar(&o.plan, "plan", "", "the cutover plan (YAML)")
	addOutputFlag(cmd, &o.output)
	return cmd
}

// eventPrinter prints cutover events: one JSON object per line with -o json, else plain lines
// with each step's duration and a final summary.
func eventPrinter(w io.Writer, output string) func(cutover.Event) {
	var mu sync.Mutex
	start := time.Now()
	n := 0
	enc := json.NewEncoder(w)
	// On a terminal, a status line under the running step shows how long it has run and how
	// long writes have been fenced; elsewhere only the plain lines are written.
	tty := terminal(w)
	var tick chan struct{}
	var fencedAt time.Time
	stopTick := func() {
		if tick != nil {
			close(tick)
			tick = nil
			fmt.Fprint(tty, "\r\033[K")
		}
	}
	startTick := func(step string) {
		if tty == nil {
			return
		}
		stop, began := make(chan struct{}), time.Now()
		tick = stop
		go func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				mu.Lock()
				if tick == stop {
					line := fmt.Sprintf("    ... %s running %.1fs", step, time.Since(began).Seconds())
					if !fencedAt.IsZero() {
						line += fmt.Sprintf(", writes fenced for %.1fs", time.Since(fencedAt).Seconds())
					}
					fmt.Fprint(tty, "\r\033[K"+line)
				}
				mu.Unlock()
			}
		}()
	}
	return func(e cutover.Event) {
		mu.Lock()
		defer mu.Unlock()
		if output == "json" {
			_ = enc.Encode(e)
			return
		}
		stopTick()
		at := fmt.Sprintf("[%7.2fs]", time.Since(start).Seconds())
		switch e.Type {
		case "step-start":
			n++
			fmt.Fprintf(w, "%s %d. %s: %s\n", at, n, e.Step, e.Detail)
			startTick(e.Step)
		case "step-end":
			switch e.Step {
			case cutover.StepFence:
				fencedAt = time.Now()
			case cutover.StepUnfence:
				fencedAt = time.Time{}
			}
			fmt.Fprintf(w, "%s    done in %s: %s\n", at, e.Duration.Round(time.Millisecond), e.Detail)
		case "step-skip":
			n++
			fmt.Fprintf(w, "%s %d. %s: already done (%s)\n", at, n, e.Step, e.Detail)
		case "note":
			fmt.Fprintf(w, "%s %s\n", at, e.Detail)
		case "abort":
			fmt.Fprintf(w, "%s ABORT at %s: %s\n", at, e.Step, e.Detail)
		case "report":
			printReport(w, e.Report)
		}
	}
}

func printReport(w io.Writer, r *cutover.Report) {
	fmt.Fprintf(w, "\ncutover %s: %s\n", r.ID, r.Result)
	if r.WriteUnavailability > 0 {
		fmt.Fprintf(w, "  write-unavailability window (fence on -> fence off): %s\n", r.WriteUnavailability.Round(time.Millisecond))
	}
	for _, s := range r.Steps {
		fmt.Fprintf(w, "  %-22s %10s\n", s.Step, s.Duration.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "  %s\n", cutover.RefusedWritesLine(r.RefusedWrites))
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
