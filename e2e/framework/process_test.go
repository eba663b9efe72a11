package framework

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestUntilInterrupted: a run that fails on its own keeps its error; only a run a signal ended
// is reported as interrupted. The benches used to cancel their context before asking, so every
// failure (a cutover aborting, say) read "interrupted".
func TestUntilInterrupted(t *testing.T) {
	boom := errors.New("boom")
	if err := UntilInterrupted(func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("a failing run: %v, want boom", err)
	}
	if err := UntilInterrupted(func(context.Context) error { return nil }); err != nil {
		t.Errorf("a run that succeeded: %v", err)
	}
	err := UntilInterrupted(func(ctx context.Context) error {
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	})
	if err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("a run ended by SIGTERM: %v", err)
	}
}

// TestWaitUntilStopsWhenTheProcessExits: a component that exits at start-up ends the wait for
// it at once, with its exit status and log, instead of after the whole timeout (30-90 s).
func TestWaitUntilStopsWhenTheProcessExits(t *testing.T) {
	env, err := NewEnv(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := env.Start("quitter", "/bin/sh", []string{"-c", "exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	err = WaitUntil(ctx, 10*time.Millisecond, "quitter ready", func(context.Context) (bool, error) {
		if err := p.ExitError(); err != nil {
			return false, err
		}
		return false, errors.New("not ready yet")
	})
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), p.LogPath) {
		t.Errorf("WaitUntil: %v; want ErrExited with the exit status and the log", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("WaitUntil took %s after the process exited", d)
	}
}
