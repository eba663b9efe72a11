package framework

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The HA fixtures bind ports FreePorts gave on other loopback addresses (127.0.0.2-4, standing
// for hosts), so a port must be free on every address, not only on 127.0.0.1: a port blue's
// etcd holds on 127.0.0.4 handed out again for green's member there made the cutover's
// preflight refuse ("127.0.0.4:NNNN is in use").
func TestFreePortsFreeOnEveryAddress(t *testing.T) {
	const n = 300 // of 500 picked on 127.0.0.1 alone, 35-40 collided
	held := map[int]bool{}
	for range n {
		l, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		held[l.Addr().(*net.TCPAddr).Port] = true
	}
	ports, err := FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	var taken []int
	for _, p := range ports {
		if held[p] {
			taken = append(taken, p)
		}
	}
	if len(taken) > 0 {
		t.Fatalf("FreePorts gave %d ports already listened on at 127.0.0.2, e.g. %d", len(taken), taken[0])
	}
}

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
