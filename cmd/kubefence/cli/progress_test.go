package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/migrator/cutover"
)

// openPTY opens a pseudo-terminal pair: what is written to tty can be read from master.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminal on this machine: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// TestLiveView: on a terminal the cutover printer keeps a status line under the running step
// (with the fenced time once writes are fenced) and clears it when the step ends; on a pipe it
// writes the plain lines only.
func TestLiveView(t *testing.T) {
	master, tty := openPTY(t)
	var mu sync.Mutex
	var seen strings.Builder
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		for { // ends with EIO once the tty side is closed: not a failure
			n, err := master.Read(buf)
			mu.Lock()
			seen.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				break
			}
		}
		mu.Lock()
		defer mu.Unlock()
		got <- seen.String()
	}()
	ep := newEventPrinter(tty, printer{})
	emit := ep.emit
	emit(cutover.Event{Type: "step-start", Step: cutover.StepFence, Detail: "fence on"})
	emit(cutover.Event{Type: "step-end", Step: cutover.StepFence, Detail: "fenced"})
	emit(cutover.Event{Type: "step-start", Step: cutover.StepCopy, Detail: "snapshot"})
	// The status line, drawn by its ticker, before the step ends (however slow the machine).
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(seen.String(), "... copy running"), nil
	})
	if err != nil {
		t.Fatalf("no status line drawn under the running step within 10 s: %v", err)
	}
	emit(cutover.Event{Type: "step-end", Step: cutover.StepCopy, Duration: 700 * time.Millisecond, Detail: "copied"})
	time.Sleep(300 * time.Millisecond) // no status line after the step ended
	ep.close()
	tty.Close()
	var out string
	select {
	case out = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the terminal's output did not end 10s after the tty was closed")
	}
	i, j := strings.Index(out, "... copy running"), strings.Index(out, "done in 700ms: copied")
	if i < 0 || j < i || !strings.Contains(out, "writes fenced for") {
		t.Fatalf("terminal output lacks the live line before the step's end:\n%q", out)
	}
	if strings.Contains(out[j:], "running") {
		t.Errorf("a status line was drawn after the step ended:\n%q", out[j:])
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ep = newEventPrinter(w, printer{})
	ep.emit(cutover.Event{Type: "step-start", Step: cutover.StepCopy, Detail: "snapshot"})
	time.Sleep(300 * time.Millisecond)
	ep.emit(cutover.Event{Type: "step-end", Step: cutover.StepCopy, Detail: "copied"})
	ep.close()
	w.Close()
	plain, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(plain), "done in 0s: copied") {
		t.Errorf("a pipe did not get the plain lines: %q", plain)
	}
	if strings.Contains(string(plain), "running") || strings.Contains(string(plain), "\033") {
		t.Errorf("a pipe got terminal output: %q", plain)
	}
}

// blockedWriter is an output nobody reads: a stalled ssh session, a pipe into a stopped
// process. Its writes block until release is closed.
type blockedWriter struct {
	release chan struct{}
	mu      sync.Mutex
	buf     strings.Builder
}

func (w *blockedWriter) Write(p []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// emitWithin emits events on ep and fails unless every emit returned within d: the cutover
// calls emit between its steps, writes fenced in its window, and must never wait for its output.
func emitWithin(t *testing.T, ep *eventPrinter, d time.Duration, events ...cutover.Event) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, e := range events {
			ep.emit(e)
		}
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("emitting %d events to an output that does not move took over %s: the cutover waits for its output", len(events), d)
	}
}

// TestEventsNeverWaitForTheOutput: with the output stalled (a terminal stopped with Ctrl-S, an
// ssh session that no longer drains, tee blocked), emit returns at once: the events queue, and
// those past the queue are left out, which the output says once it moves again. With -o json
// every line written is a whole event, in order.
func TestEventsNeverWaitForTheOutput(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%t", asJSON), func(t *testing.T) {
			w := &blockedWriter{release: make(chan struct{})}
			var released sync.Once
			release := func() { released.Do(func() { close(w.release) }) }
			t.Cleanup(release)
			ep := newEventPrinter(w, printer{json: asJSON})
			var events []cutover.Event
			for i := range 3 * eventQueue {
				events = append(events, cutover.Event{Type: cutover.EventNote, Detail: fmt.Sprintf("note %d", i)})
			}
			emitWithin(t, ep, time.Second, events...)
			release()
			// Once the output has caught up (it says how many it left out), events are
			// printed again.
			err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				w.mu.Lock()
				defer w.mu.Unlock()
				return strings.Contains(w.buf.String(), "not printed"), nil
			})
			if err != nil {
				t.Fatalf("the output did not say, once it moved, that events were left out: %v", err)
			}
			ep.emit(cutover.Event{Type: cutover.EventNote, Detail: "after"})
			ep.close()
			lines := strings.Split(strings.TrimSuffix(w.buf.String(), "\n"), "\n")
			last, left := -1, ""
			for _, l := range lines {
				if asJSON {
					var e cutover.Event
					if err := json.Unmarshal([]byte(l), &e); err != nil {
						t.Fatalf("line %q is not a whole event: %v", l, err)
					}
					l = e.Detail
				}
				var n int
				switch i := strings.Index(l, "note "); {
				case strings.Contains(l, "not printed"):
					left = l
				case i >= 0:
					if _, err := fmt.Sscanf(l[i:], "note %d", &n); err != nil {
						t.Fatalf("line %q: %v", l, err)
					}
					if n <= last || left != "" {
						t.Fatalf("note %d printed after note %d (or after the line saying some were left out, %q): out of order", n, last, left)
					}
					last = n
				}
			}
			if last < 0 || left == "" || !strings.Contains(left, fmt.Sprint(3*eventQueue-1-last)) {
				t.Errorf("output: last note %d, line for those left out %q; want the queued notes, then one line saying %d were not printed", last, left, 3*eventQueue-1-last)
			}
			if !strings.Contains(lines[len(lines)-1], "after") {
				t.Errorf("the event emitted once the output moved is not the last line: %q", lines[len(lines)-1])
			}
		})
	}
}

// TestStatusLineNeverHoldsEvents: a terminal stopped with Ctrl-S (XOFF) blocks the status
// line's writes; the events emitted meanwhile return at once all the same.
func TestStatusLineNeverHoldsEvents(t *testing.T) {
	master, tty := openPTY(t)
	var mu sync.Mutex
	var seen strings.Builder
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			seen.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	ep := newEventPrinter(tty, printer{})
	ep.emit(cutover.Event{Type: "step-start", Step: cutover.StepCopy, Detail: "snapshot"})
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(seen.String(), "... copy running"), nil
	})
	if err != nil {
		t.Fatalf("no status line drawn within 10 s: %v", err)
	}
	if err := unix.IoctlSetInt(int(tty.Fd()), unix.TCXONC, unix.TCOOFF); err != nil {
		t.Fatalf("stop the terminal's output: %v", err)
	}
	restart := func() { _ = unix.IoctlSetInt(int(tty.Fd()), unix.TCXONC, unix.TCOON) }
	t.Cleanup(restart)
	time.Sleep(500 * time.Millisecond) // the status line's next writes block
	emitWithin(t, ep, time.Second,
		cutover.Event{Type: "step-end", Step: cutover.StepCopy, Duration: 700 * time.Millisecond, Detail: "copied"},
		cutover.Event{Type: "step-start", Step: cutover.StepFence, Detail: "fence on"})
	restart()
	ep.emit(cutover.Event{Type: "step-end", Step: cutover.StepFence, Detail: "fenced"})
	ep.close()
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(seen.String(), "done in 0s: fenced"), nil
	})
	if err != nil {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the events emitted while the terminal was stopped were not printed once it went on: %q", seen.String())
	}
}

// TestReportNeverLeftOut: an abort and the final report are printed even when the output fell so
// far behind that other events were left out: they say what failed and what to do next, which
// 'kubefence cutover status' does not show.
func TestReportNeverLeftOut(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%t", asJSON), func(t *testing.T) {
			w := &blockedWriter{release: make(chan struct{})}
			ep := newEventPrinter(w, printer{json: asJSON})
			var events []cutover.Event
			for i := range eventQueue + 1 {
				events = append(events, cutover.Event{Type: cutover.EventNote, Detail: fmt.Sprintf("note %d", i)})
			}
			events = append(events, cutover.Event{Type: cutover.EventAbort, Step: "switch", Detail: "the abort's reason"},
				cutover.Event{Type: cutover.EventReport, Report: &cutover.Report{Error: "the report's error"}})
			emitWithin(t, ep, time.Second, events...)
			close(w.release)
			ep.close()
			out := w.buf.String()
			for _, want := range []string{"the abort's reason", "the report's error"} {
				if !strings.Contains(out, want) {
					t.Errorf("%q not printed:\n%.2000s", want, out[max(0, len(out)-2000):])
				}
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if last := lines[len(lines)-1]; asJSON && !strings.Contains(last, `"report"`) {
				t.Errorf("the last line is %q, want the report", last)
			}
		})
	}
}
