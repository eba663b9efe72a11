package logging

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// stalledWriter blocks every write until released (a terminal stopped with Ctrl-S, a log pipe
// nobody reads).
type stalledWriter struct {
	release chan struct{}
	mu      sync.Mutex
	buf     strings.Builder
}

func (w *stalledWriter) Write(p []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// TestBufferedWriterNeverWaitsForItsOutput: a log line costs its caller a copy, never a wait for
// the output, even while a flush is stuck writing to it: the proxy logs every refused write, and
// a cutover logs inside its window; a stalled stderr must stall neither. Lines beyond what it
// keeps are left out and counted, and the count is written once the output moves.
func TestBufferedWriterNeverWaitsForItsOutput(t *testing.T) {
	defer func(n int) { maxPending = n }(maxPending)
	maxPending = 1 << 10
	w := &stalledWriter{release: make(chan struct{})}
	b := NewBufferedWriter(w, 5*time.Millisecond)
	line := strings.Repeat("x", 99) + "\n"
	start := time.Now()
	for range 200 { // 20 KB: past what it keeps, with a flush stuck in the output
		if _, err := b.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("200 lines took %s to log with the output stalled, want no wait", took)
	}
	close(w.release)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	out := w.buf.String()
	if !strings.Contains(out, "log line(s) left out") {
		t.Errorf("the output does not say lines were left out:\n%.500s", out)
	}
	if n := strings.Count(out, line); n == 0 || n >= 200 {
		t.Errorf("%d of 200 lines written, want those kept (some, not all)", n)
	}
}
