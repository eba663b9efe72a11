// Package logging builds kubefence's structured logger (log/slog) and the buffered stderr writer
// behind it.
package logging

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// ParseLevel turns a --log-level value into a slog level.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q: use debug, info, warn or error", s)
}

// New returns a text logger writing to w at the given level.
func New(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// BufferedWriter batches log lines so that a burst (one line per refused write, tens of thousands
// a second while fenced) costs a memory copy, not a syscall, per line. It flushes every interval
// and on Close. Writes are serialised; it is safe for concurrent use.
type BufferedWriter struct {
	mu   sync.Mutex
	buf  *bufio.Writer
	stop chan struct{}
	done chan struct{}
}

// NewBufferedWriter wraps w, flushing at least every interval.
func NewBufferedWriter(w io.Writer, interval time.Duration) *BufferedWriter {
	b := &BufferedWriter{buf: bufio.NewWriterSize(w, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				b.Flush()
			case <-b.stop:
				return
			}
		}
	}()
	return b
}

// Write implements io.Writer.
func (b *BufferedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Flush writes out what is buffered.
func (b *BufferedWriter) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Flush()
}

// Close stops the flusher and flushes what is left.
func (b *BufferedWriter) Close() error {
	close(b.stop)
	<-b.done
	return b.Flush()
}
