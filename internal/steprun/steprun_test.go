package steprun

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// fakeJournal records the calls; failBegin/failFinish make the named step's call fail.
type fakeJournal struct {
	calls                 []string
	failBegin, failFinish string
	names                 []string
}

func (f *fakeJournal) Begin(i int) error {
	f.calls = append(f.calls, "begin "+f.names[i])
	if f.names[i] == f.failBegin {
		return errors.New("disk full")
	}
	return nil
}

func (f *fakeJournal) Finish(rec Record) error {
	f.calls = append(f.calls, fmt.Sprintf("finish %s %q", rec.Step, rec.Detail))
	if rec.Step == f.failFinish {
		return errors.New("disk full")
	}
	return nil
}

func TestRun(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name       string
		done       []string // finished by an earlier run
		fail       string   // this step's run fails
		failBegin  string
		failFinish string
		wantCalls  []string
		wantEvents []string
		wantErr    string // step named by the *Error
	}{
		{name: "all run",
			wantCalls:  []string{"begin a", `finish a "did a"`, "begin b", `finish b "did b"`, "begin c", `finish c "did c"`},
			wantEvents: []string{"step-start a", "step-end a", "step-start b", "step-end b", "step-start c", "step-end c"}},
		{name: "resume skips done steps", done: []string{"a", "b"},
			wantCalls:  []string{"begin c", `finish c "did c"`},
			wantEvents: []string{"step-skip a", "step-skip b", "step-start c", "step-end c"}},
		{name: "a failed step stops the walk, unjournaled", fail: "b",
			wantCalls:  []string{"begin a", `finish a "did a"`, "begin b"},
			wantEvents: []string{"step-start a", "step-end a", "step-start b"}, wantErr: "b"},
		{name: "a step whose begin is not journaled does not run", failBegin: "b",
			wantCalls:  []string{"begin a", `finish a "did a"`, "begin b"},
			wantEvents: []string{"step-start a", "step-end a"}, wantErr: "b"},
		{name: "a step not journaled as done fails, and no end is said", failFinish: "a",
			wantCalls:  []string{"begin a", `finish a "did a"`},
			wantEvents: []string{"step-start a"}, wantErr: "a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var steps []Step
			ran := map[string]bool{}
			for _, n := range []string{"a", "b", "c"} {
				steps = append(steps, Step{Name: n, Detail: "will " + n, Done: slices.Contains(tc.done, n), Run: func(context.Context) (string, error) {
					ran[n] = true
					if n == tc.fail {
						return "", boom
					}
					return "did " + n, nil
				}})
			}
			j := &fakeJournal{failBegin: tc.failBegin, failFinish: tc.failFinish, names: []string{"a", "b", "c"}}
			var events []string
			err := Run(t.Context(), steps, j, func(e Event) { events = append(events, string(e.Kind)+" "+e.Step) })
			if !slices.Equal(j.calls, tc.wantCalls) {
				t.Errorf("journal calls %q, want %q", j.calls, tc.wantCalls)
			}
			if !slices.Equal(events, tc.wantEvents) {
				t.Errorf("events %q, want %q", events, tc.wantEvents)
			}
			for _, n := range tc.done {
				if ran[n] {
					t.Errorf("step %s done before ran again", n)
				}
			}
			var serr *Error
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr != "" && (!errors.As(err, &serr) || serr.Step != tc.wantErr || steps[serr.Index].Name != tc.wantErr):
				t.Fatalf("error %v, want a step error naming %s", err, tc.wantErr)
			case tc.fail != "" && !errors.Is(err, boom):
				t.Fatalf("error %v does not wrap the step's", err)
			}
		})
	}
}

// TestTimeout: a step runs under its own timeout, the others under the caller's context.
func TestTimeout(t *testing.T) {
	var deadlines []bool
	run := func(ctx context.Context) (string, error) {
		_, ok := ctx.Deadline()
		deadlines = append(deadlines, ok)
		return "", nil
	}
	steps := []Step{{Name: "bounded", Timeout: time.Minute, Run: run}, {Name: "unbounded", Run: run}}
	if err := Run(t.Context(), steps, &fakeJournal{names: []string{"bounded", "unbounded"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deadlines, []bool{true, false}) {
		t.Errorf("deadlines %v, want [true false]", deadlines)
	}
}

// TestStopBetweenSteps: a walk stopped (its context cancelled, a Ctrl-C) while a step finishes
// journals that step done. An Interruptible step after it is not begun: neither journaled as
// started nor run, and the error names it and wraps the context's (begun, it would run on a
// cancelled context, started and cut off halfway: an etcd of a newer version opened for write on
// the data, then SIGKILLed). Any other step is begun and run as before: the cutover's steps past
// its switch must still close the window.
func TestStopBetweenSteps(t *testing.T) {
	for _, tc := range []struct {
		name          string
		interruptible bool
		wantCalls     []string
		wantEvents    []string
	}{
		{"an interruptible step is not begun", true,
			[]string{"begin a", `finish a "did a"`}, []string{"step-start a", "step-end a"}},
		{"another step is begun and runs", false,
			[]string{"begin a", `finish a "did a"`, "begin b", `finish b "did b"`},
			[]string{"step-start a", "step-end a", "step-start b", "step-end b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ran := map[string]bool{}
			step := func(n string) Step {
				return Step{Name: n, Interruptible: tc.interruptible, Run: func(context.Context) (string, error) {
					ran[n] = true
					cancel() // the signal arrives as the step ends
					return "did " + n, nil
				}}
			}
			j := &fakeJournal{names: []string{"a", "b"}}
			var events []string
			err := Run(ctx, []Step{step("a"), step("b")}, j, func(e Event) { events = append(events, string(e.Kind)+" "+e.Step) })
			var serr *Error
			if tc.interruptible && (!errors.As(err, &serr) || serr.Step != "b" || !errors.Is(err, context.Canceled)) {
				t.Fatalf("error %v, want a step error naming b that wraps context.Canceled", err)
			}
			if !tc.interruptible && err != nil {
				t.Fatalf("error %v", err)
			}
			if !slices.Equal(j.calls, tc.wantCalls) {
				t.Errorf("journal calls %q, want %q", j.calls, tc.wantCalls)
			}
			if !slices.Equal(events, tc.wantEvents) {
				t.Errorf("events %q, want %q", events, tc.wantEvents)
			}
			if ran["b"] != !tc.interruptible {
				t.Errorf("step b ran: %v", ran["b"])
			}
		})
	}
}
