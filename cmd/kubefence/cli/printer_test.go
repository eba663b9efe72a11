package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// TestPrinter: -o is checked in one place, and each output form prints only itself.
func TestPrinter(t *testing.T) {
	type result struct {
		Name string `json:"name"`
	}
	human := func(w io.Writer) { _, _ = io.WriteString(w, "human form\n") }
	for _, tc := range []struct {
		output                string
		usageErr              bool
		print, line, progress string
	}{
		{output: "", print: "human form\n", line: "human form\n", progress: "human form\n"},
		{output: "json", print: "{\n  \"name\": \"x\"\n}\n", line: "{\"name\":\"x\"}\n", progress: ""},
		{output: "yaml", usageErr: true},
	} {
		t.Run("-o "+tc.output, func(t *testing.T) {
			p, err := (&printFlags{format: tc.output}).toPrinter()
			var ue usageError
			if tc.usageErr {
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), `unknown output format "yaml"`) {
					t.Fatalf("toPrinter = %v, want a usage error naming the format", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var print, line, progress bytes.Buffer
			if err := p.print(&print, result{"x"}, human); err != nil {
				t.Fatal(err)
			}
			if err := p.printLine(&line, result{"x"}, human); err != nil {
				t.Fatal(err)
			}
			p.progress(&progress, human)
			if print.String() != tc.print || line.String() != tc.line || progress.String() != tc.progress {
				t.Errorf("print %q, printLine %q, progress %q; want %q, %q, %q", &print, &line, &progress, tc.print, tc.line, tc.progress)
			}
		})
	}
}

// runOptions runs a command's Options as cobra would, without cobra.
func runOptions(t *testing.T, o command, args ...string) error {
	t.Helper()
	if err := o.Complete(args); err != nil {
		return usage(err)
	}
	if err := o.Validate(); err != nil {
		return usage(err)
	}
	return o.Run(t.Context())
}

// TestDetectWithBuffers calls a command's Options with buffers: with -o json stdout holds the
// detections that succeeded and nothing else, and the error names the data dir that failed.
func TestDetectWithBuffers(t *testing.T) {
	root := t.TempDir()
	good, missing := filepath.Join(root, "good"), filepath.Join(root, "missing")
	if err := os.MkdirAll(filepath.Join(good, "member", "snap"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(good, "version.txt"), []byte("3.5.9/etcd3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, output := range []string{"", "json"} {
		t.Run("-o "+output, func(t *testing.T) {
			var out, errOut bytes.Buffer
			o := &detectOptions{printOptions: printOptions{Streams: Streams{Out: &out, ErrOut: &errOut}}, dirs: []string{good, missing}}
			o.output.format = output
			err := runOptions(t, o)
			if err == nil || !strings.Contains(err.Error(), missing) || errors.As(err, new(usageError)) {
				t.Errorf("error %v: want a failure (not a usage error) naming %s", err, missing)
			}
			if errOut.Len() != 0 {
				t.Errorf("stderr: %q", &errOut)
			}
			if output == "" {
				if want := good + ": 3.5.9/etcd3 (from version.txt)"; !strings.HasPrefix(out.String(), want) || strings.Count(out.String(), "\n") != 1 {
					t.Errorf("stdout %q, want one line starting %q", &out, want)
				}
				return
			}
			var dets []datadir.Detection
			if err := json.Unmarshal(out.Bytes(), &dets); err != nil || len(dets) != 1 || dets[0].DataDir != good || dets[0].Version.String() != "3.5.9" {
				t.Errorf("stdout %q (%v), want the one detection of %s", &out, err, good)
			}
		})
	}
}

// TestCutoverStatusSaysWhatNeedsDoing: status of a cutover killed inside its window says writes
// are fenced and that no process runs it; of a finished bake, that blue no longer follows.
func TestCutoverStatusSaysWhatNeedsDoing(t *testing.T) {
	fenced := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		st   cutover.StatusReport
		want []string
		not  []string
	}{
		{"an open window, no process", cutover.StatusReport{ID: "x", State: cutover.StateRunning, WindowOpenSince: fenced},
			[]string{"WRITES FENCED since 2026-11-26T03:00:00Z", "no process runs this cutover", "--resume", "cutover abort"}, nil},
		// Past the switch abort is refused: only --resume (or opening the fence by hand on
		// green) is offered.
		{"an open window past the switch, no process", cutover.StatusReport{ID: "x", State: cutover.StateRunning, WindowOpenSince: fenced, Steps: []cutover.StepRecord{{Step: cutover.StepSwitch}}},
			[]string{"WRITES FENCED", "switched to green", "'kubefence cutover --resume --plan PLAN'", "fence off --expect-backend GREEN_URL"}, []string{"cutover abort"}},
		{"past the switch, the fence lifted by hand, no process", cutover.StatusReport{ID: "x", State: cutover.StateRunning, Steps: []cutover.StepRecord{{Step: cutover.StepSwitch}}},
			[]string{"switched to green", "--resume"}, []string{"cutover abort"}},
		// Its unfence may have reopened every proxy but one it could not reach: the journal
		// keeps the window open until all did; status must not say every proxy is fenced.
		{"an abort that stopped partway", cutover.StatusReport{ID: "x", State: cutover.StateRunning, WindowOpenSince: fenced, Aborting: "step drain failed"},
			[]string{"going back to blue: step drain failed", "the abort did not finish", "cutover abort", "some proxies may be open again", "kubefence fence status"}, []string{"--resume"}},
		// Once its unfence ran, the journal names the proxies it could not reach: only they hold
		// writes, and status names them instead of guessing.
		{"an abort whose unfence missed a proxy", cutover.StatusReport{ID: "x", State: cutover.StateRunning, WindowOpenSince: fenced, Aborting: "step drain failed", StillFenced: []string{"proxy-b", "proxy-c"}},
			[]string{"WRITES FENCED on proxy-b, proxy-c", "the others are open", "cutover abort"}, []string{"may be open again", "--resume"}},
		// A rollback's abort ends, back to the bake, even when a proxy did not acknowledge its
		// unfence: the cutover bakes again, that proxy still fenced.
		{"baking after a rollback's abort missed a proxy", cutover.StatusReport{ID: "x", State: cutover.StateBaking, Bake: &cutover.BakeStatus{}, StillFenced: []string{"proxy-b"}},
			[]string{"WRITES FENCED on proxy-b", "could not unfence", "the others are open"}, nil},
		// A cutover's abort of a fence step that never finished (one proxy took the fence and
		// never answered): going back to blue; nothing about green.
		{"an abort of an unfinished fence that missed a proxy", cutover.StatusReport{ID: "x", State: cutover.StateRunning, FenceStartedAt: fenced, Aborting: "step fence failed", StillFenced: []string{"proxy-b"}},
			[]string{"WRITES FENCED on proxy-b", "going back to blue", "cutover abort"}, []string{"GREEN_URL", "rollback's abort"}},
		{"a rehearsal", cutover.StatusReport{ID: "x", State: cutover.StateRunning, Rehearsal: true, Runner: 42},
			[]string{"(a rehearsal)", "run by pid 42"}, []string{"WRITES FENCED"}},
		{"rolling back, no process", cutover.StatusReport{ID: "x", State: cutover.StateRollingBack, Bake: &cutover.BakeStatus{}},
			[]string{"no process runs the rollback", "rollback --resume"}, nil},
		{"rolling back past its switch, no process", cutover.StatusReport{ID: "x", State: cutover.StateRollingBack, Bake: &cutover.BakeStatus{},
			FinishByHand: "if it cannot run, first 'etcdctl ... user grant-role kube-apiserver-etcd-client kubefence-readwrite'"},
			[]string{"switched to blue", "rollback --resume", "grant-role kube-apiserver-etcd-client"}, []string{"cutover abort"}},
		// Once the rollback stopped blue following green, blue leads (it takes the writes after
		// the rollback's unfence): no lag, and no "follows".
		{"rolling back after blue stopped following", cutover.StatusReport{ID: "x", State: cutover.StateRollingBack, Runner: 42,
			Bake: &cutover.BakeStatus{BakeRecord: cutover.BakeRecord{Revision: 7}, FollowingStopped: true, GreenRevision: 10, BlueRevision: 12}},
			[]string{"blue followed green from revision 7 until the rollback stopped it", "blue at revision 12, green at 10"}, []string{"blue follows green", "lag"}},
		{"a finished bake", cutover.StatusReport{ID: "x", State: cutover.StateDone, Bake: &cutover.BakeStatus{BakeRecord: cutover.BakeRecord{Revision: 7}}},
			[]string{"bake: blue followed green from revision 7"}, []string{"blue follows green"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			printCutoverStatus(&b, &tc.st)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("status %q lacks %q", b.String(), w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(b.String(), w) {
					t.Errorf("status %q says %q", b.String(), w)
				}
			}
		})
	}
}
