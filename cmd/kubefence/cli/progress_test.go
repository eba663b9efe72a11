package cli

import (
	"context"
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
