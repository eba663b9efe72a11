// Package logging builds kubefence's structured logger (log/slog) and the buffered stderr writer
// behind it.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"k8s.io/klog/v2"
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
// and on Close. A line never waits for the output: while a flush is stuck writing (a terminal
// stopped with Ctrl-S, a log pipe nobody reads), lines are kept, up to maxPending bytes, and
// those beyond are left out and counted, the count written once the output moves. It is safe
// for concurrent use.
type BufferedWriter struct {
	out io.Writer
	// flushing is held by the one flush writing to out at a time; mu only while lines are
	// appended or taken, never across a write to out.
	flushing sync.Mutex
	mu       sync.Mutex
	pending  []byte // lines not written yet
	spare    []byte // the buffer the last flush wrote, reused
	left     int    // lines left out since the last flush
	stop     chan struct{}
	done     chan struct{}
}

// maxPending is the most a BufferedWriter keeps while its output does not move (a var: the
// tests lower it).
var maxPending = 4 << 20

// NewBufferedWriter wraps w, flushing at least every interval.
func NewBufferedWriter(w io.Writer, interval time.Duration) *BufferedWriter {
	b := &BufferedWriter{out: w, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = b.Flush()
			case <-b.stop:
				return
			}
		}
	}()
	return b
}

// Write implements io.Writer: it keeps p for the next flush, or leaves it out (counted) when
// maxPending bytes wait already.
func (b *BufferedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pending)+len(p) > maxPending {
		b.left++
		return len(p), nil
	}
	b.pending = append(b.pending, p...)
	return len(p), nil
}

// Flush writes out what is kept; lines written meanwhile wait for the next flush.
func (b *BufferedWriter) Flush() error {
	b.flushing.Lock()
	defer b.flushing.Unlock()
	b.mu.Lock()
	full, left := b.pending, b.left
	b.pending, b.spare, b.left = b.spare[:0], nil, 0
	b.mu.Unlock()
	var err error
	if left > 0 {
		_, err = fmt.Fprintf(b.out, "kubefence: %d log line(s) left out: the log output did not keep up, and kubefence does not wait for it\n", left)
	}
	if len(full) > 0 {
		_, err = b.out.Write(full)
	}
	b.mu.Lock()
	b.spare = full[:0]
	b.mu.Unlock()
	return err
}

// Close stops the flusher and flushes what is left.
func (b *BufferedWriter) Close() error {
	close(b.stop)
	<-b.done
	return b.Flush()
}

// maxValue is the most of one value a line carries from a library logging through klog.
const maxValue = 256

// RouteKlog sends what the Kubernetes libraries log with klog (kube-apiserver's request info,
// the x509 authenticator, client-go) through log, in its format, each value cut to maxValue
// bytes: much of it a client chooses (a request's whole query), which klog wrote to stderr whole.
func RouteKlog(log *slog.Logger) {
	klog.SetSlogLogger(slog.New(clipHandler{log.Handler()}))
}

// clipHandler cuts every attribute's value to maxValue bytes.
type clipHandler struct{ h slog.Handler }

func (c clipHandler) Enabled(ctx context.Context, l slog.Level) bool { return c.h.Enabled(ctx, l) }

func (c clipHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Clip(r.Message, maxValue), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(clipAttr(a))
		return true
	})
	return c.h.Handle(ctx, out)
}

func (c clipHandler) WithAttrs(as []slog.Attr) slog.Handler {
	clipped := make([]slog.Attr, len(as))
	for i, a := range as {
		clipped[i] = clipAttr(a)
	}
	return clipHandler{c.h.WithAttrs(clipped)}
}

func (c clipHandler) WithGroup(name string) slog.Handler { return clipHandler{c.h.WithGroup(name)} }

func clipAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		g := v.Group()
		clipped := make([]any, len(g))
		for i, ga := range g {
			clipped[i] = clipAttr(ga)
		}
		return slog.Group(a.Key, clipped...)
	}
	if v.Kind() == slog.KindString || v.Kind() == slog.KindAny {
		return slog.String(a.Key, Clip(v.String(), maxValue))
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// Clip cuts s to max bytes, at a character's start (if s is UTF-8 there), saying how long it
// was: for a log line carrying a string someone else chose.
func Clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > max-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if !utf8.RuneStart(s[cut]) {
		cut = max
	}
	return s[:cut] + "...(" + strconv.Itoa(len(s)) + " bytes)"
}
