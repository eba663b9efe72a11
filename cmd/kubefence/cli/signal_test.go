package cli

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestSignalCancelsCommand: SIGINT cancels the context Main gives the running command, which
// then returns its error (exit 1) instead of the process dying or the command hanging. A change
// interrupted before the proxy answered is not said to have failed to reach it: the proxy may
// have made it (it fences before the barrier's wait, switches before the drain).
func TestSignalCancelsCommand(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    []string
		wantNot string
	}{
		{[]string{"fence", "status"}, []string{"interrupt signal received"}, ""},
		{[]string{"fence", "on", "--reason", "x"}, []string{"interrupt signal received", "whether it fenced writes is unknown", "kubefence fence status"}, "cannot reach"},
		{[]string{"backend", "set", "https://10.0.0.2:6443"}, []string{"interrupt signal received", "is unknown", "kubefence fence status"}, "cannot reach"},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			code, errOut := interruptedCommand(t, tc.args...)
			if code != ExitFailure {
				t.Errorf("after SIGINT: exit %d, want %d", code, ExitFailure)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("after SIGINT: stderr %q lacks %q", errOut, w)
				}
			}
			if tc.wantNot != "" && strings.Contains(errOut, tc.wantNot) {
				t.Errorf("after SIGINT: stderr %q says %q", errOut, tc.wantNot)
			}
		})
	}
}

// interruptedCommand runs kubefence args against an admin API that takes the request and never
// answers, sends SIGINT once the request arrived, and returns the exit code and stderr.
func interruptedCommand(t *testing.T, args ...string) (int, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "admin.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	arrived := make(chan struct{}, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-r.Context().Done() // an admin API that never answers
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	type result struct {
		code   int
		errOut string
	}
	done := make(chan result, 1)
	go func() {
		code, _, errOut := runCLI(append(args, "--admin-socket", sock)...)
		done <- result{code, errOut}
	}()
	select {
	case <-arrived:
	case r := <-done:
		t.Fatalf("%v returned before its request reached the admin API: %d %s", args, r.code, r.errOut)
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach the admin API in 10s")
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		return r.code, r.errOut
	case <-time.After(10 * time.Second):
		t.Fatal("the command was still running 10s after SIGINT")
	}
	return 0, ""
}

// TestSecondSignalExits: the first SIGINT cancels the command's context (a cutover past its
// switch still finishes its window's last steps); a second one exits at once, for an operator
// who cannot wait for them.
func TestSecondSignalExits(t *testing.T) {
	var errOut strings.Builder
	exited := make(chan int, 1)
	ctx, stop := signalContext(&errOut, func(code int) { exited <- code })
	defer stop()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the first SIGINT did not cancel the context in 10s")
	}
	select {
	case code := <-exited:
		t.Fatalf("exited (%d) on the first signal", code)
	case <-time.After(100 * time.Millisecond):
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exited:
		if code != ExitFailure || !strings.Contains(errOut.String(), "second interrupt signal") {
			t.Errorf("exit %d, stderr %q; want %d and the reason", code, errOut.String(), ExitFailure)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second SIGINT did not exit in 10s")
	}
}

// TestHangupIsAStop: a closed terminal or a dropped SSH session (SIGHUP) stops a command as
// Ctrl-C does, through its context: a cutover then aborts, or finishes its window, instead of
// dying with writes fenced.
func TestHangupIsAStop(t *testing.T) {
	var errOut strings.Builder
	var exited atomic.Bool
	ctx, stop := signalContext(&errOut, func(int) { exited.Store(true) })
	defer stop()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
		if cause := context.Cause(ctx); !strings.Contains(cause.Error(), "hangup") {
			t.Errorf("cause %v, want the hangup named", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP did not cancel the context in 10s")
	}
	// The kernel's SIGHUP after the shell's: not an operator's second signal.
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if exited.Load() {
		t.Error("a second SIGHUP exited at once; want only a second SIGINT or SIGTERM to")
	}
}

// TestBrokenPipeIsAnError: output piped into a reader that went away (`| tee log` whose tee was
// killed with the terminal) makes writes fail, not the process die of SIGPIPE in the middle of a
// cutover's window.
func TestBrokenPipeIsAnError(t *testing.T) {
	if os.Getenv("KUBEFENCE_TEST_BROKEN_PIPE") == "1" {
		_, stop := signalContext(io.Discard, os.Exit)
		defer stop()
		for range 100 {
			if _, err := os.Stdout.Write([]byte("a line\n")); err != nil {
				os.Exit(3)
			}
			time.Sleep(10 * time.Millisecond)
		}
		os.Exit(4)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // nobody reads
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenPipeIsAnError$")
	cmd.Env = append(os.Environ(), "KUBEFENCE_TEST_BROKEN_PIPE=1")
	cmd.Stdout = w
	err = cmd.Run()
	w.Close()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("the command writing to a broken pipe ended with %v; want exit 3 (its write failed), not death by SIGPIPE", err)
	}
}
