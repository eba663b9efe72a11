package cli

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSignalCancelsCommand: SIGINT cancels the context Main gives the running command, which
// then returns its error (exit 1) instead of the process dying or the command hanging.
func TestSignalCancelsCommand(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	arrived := make(chan struct{}, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
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
		code, _, errOut := runCLI("fence", "status", "--admin-socket", sock)
		done <- result{code, errOut}
	}()
	select {
	case <-arrived:
	case r := <-done:
		t.Fatalf("fence status returned before its request reached the admin API: %d %s", r.code, r.errOut)
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach the admin API in 10s")
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.code != ExitFailure || !strings.Contains(r.errOut, "interrupt signal received") {
			t.Errorf("after SIGINT: exit %d, stderr %q; want %d and the cancellation", r.code, r.errOut, ExitFailure)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the command was still running 10s after SIGINT")
	}
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
