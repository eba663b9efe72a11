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
