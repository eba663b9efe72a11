// Package steprun walks a list of journaled steps in order, the one loop the cutover and the
// data dir upgrades share: a step an earlier run finished is skipped; any other is begun
// (journaled), run under its timeout, and recorded as done (journaled) before the next starts.
// The first failure stops the walk; what follows it (abort, advice to run again) is the
// caller's.
package steprun

import (
	"context"
	"fmt"
	"time"
)

// Kind is what an Event reports. The values are the JSON wire values `-o json` prints.
type Kind string

const (
	// Start: the step begins; Detail says what it will do.
	Start Kind = "step-start"
	// End: the step finished and is journaled; Detail says what it did.
	End Kind = "step-end"
	// Skip: an earlier run finished the step.
	Skip Kind = "step-skip"
)

// Event is one step starting, ending or being skipped.
type Event struct {
	Kind Kind
	// Index is the step's position in the list given to Run.
	Index    int
	Step     string
	Detail   string
	Duration time.Duration
}

// Step is one step of a walk.
type Step struct {
	Name string
	// Detail says what the step will do (the Start event's detail).
	Detail string
	// Timeout bounds Run; 0 leaves it to the caller's context.
	Timeout time.Duration
	// Done says an earlier run finished the step: it is skipped.
	Done bool
	// Interruptible: once the walk is stopped (ctx done, a Ctrl-C during the step before), the
	// step is not begun: not journaled as started, not run; Run returns an *Error naming it that
	// wraps ctx's error. Begun, it would run on a stopped context and be cut off halfway (a
	// process launched on the data, then killed). A step that must still run once the walk got
	// this far (the cutover's past its switch, which close the window) leaves it false and is
	// begun and run on the stopped context, deciding for itself.
	Interruptible bool
	// Run does the step and says what it did.
	Run func(ctx context.Context) (detail string, err error)
}

// Record is a finished step.
type Record struct {
	Index    int
	Step     string
	Started  time.Time
	Duration time.Duration
	Detail   string
}

// Journal persists the walk's progress; each call returns only once its change is durable.
type Journal interface {
	// Begin is called before step i runs.
	Begin(i int) error
	// Finish records step i as done.
	Finish(rec Record) error
}

// Error is the failure of one step (its run, or journaling it).
type Error struct {
	Index int
	Step  string
	Err   error
}

func (e *Error) Error() string { return fmt.Sprintf("step %s: %v", e.Step, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// Run walks steps in order; emit (may be nil) hears each start, end and skip. It returns nil
// when every step is done, or an *Error naming the step that failed, or the Interruptible step
// a stopped walk (ctx done) did not begin.
func Run(ctx context.Context, steps []Step, j Journal, emit func(Event)) error {
	if emit == nil {
		emit = func(Event) {}
	}
	for i, s := range steps {
		if s.Done {
			emit(Event{Kind: Skip, Index: i, Step: s.Name, Detail: "finished before the resume"})
			continue
		}
		if err := ctx.Err(); err != nil && s.Interruptible {
			return &Error{Index: i, Step: s.Name, Err: fmt.Errorf("stopped before it began: %w", err)}
		}
		if err := j.Begin(i); err != nil {
			return &Error{Index: i, Step: s.Name, Err: fmt.Errorf("write journal: %w", err)}
		}
		emit(Event{Kind: Start, Index: i, Step: s.Name, Detail: s.Detail})
		start := time.Now()
		detail, err := runOne(ctx, s)
		if err != nil {
			return &Error{Index: i, Step: s.Name, Err: err}
		}
		rec := Record{Index: i, Step: s.Name, Started: start.UTC(), Duration: time.Since(start), Detail: detail}
		if err := j.Finish(rec); err != nil {
			return &Error{Index: i, Step: s.Name, Err: fmt.Errorf("write journal: %w", err)}
		}
		emit(Event{Kind: End, Index: i, Step: s.Name, Duration: rec.Duration, Detail: detail})
	}
	return nil
}

func runOne(ctx context.Context, s Step) (string, error) {
	if s.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.Timeout)
		defer cancel()
	}
	return s.Run(ctx)
}
