package proc

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/testenv"
)

// TestAliveMatchesWholeCommandLine: a process of the same binary with other arguments (another
// etcd on this host) is not ours.
func TestAliveMatchesWholeCommandLine(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		testenv.SkipOrFail(t, "no sleep binary on PATH")
	}
	cmd := exec.Command(sleep, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	// Until the child has exec'd, its command line is the test binary's.
	for deadline := time.Now().Add(5 * time.Second); !Alive(pid, []string{sleep, "30"}) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cases := []struct {
		argv []string
		want bool
	}{
		{[]string{sleep, "30"}, true},
		{[]string{sleep, "31"}, false},
		{[]string{sleep}, false},
		{[]string{sleep, "30", "--more"}, false},
	}
	for _, tc := range cases {
		if got := Alive(pid, tc.argv); got != tc.want {
			t.Errorf("Alive(%d, %q) = %v, want %v", pid, tc.argv, got, tc.want)
		}
	}
	if got := Find([]string{sleep, "30"}); got != pid {
		t.Errorf("Find = %d, want %d", got, pid)
	}
}

// TestDaemonStop: a daemon's output goes to its log after a line naming the starter; Stop ends
// it with SIGTERM, and with SIGKILL one that ignores SIGTERM.
func TestDaemonStop(t *testing.T) {
	cases := []struct {
		name   string
		script string
	}{
		{"exits on SIGTERM", "echo hello; sleep 30; true"},
		{"ignores SIGTERM", "trap '' TERM; echo hello; sleep 30; true"},
		// A wrapper (a shell that runs the real program without exec): the program is in the
		// daemon's process group and must go with it, or it is left running, unknown to all.
		{"a wrapper and its child", "sleep 30 & echo hello; wait"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			log := t.TempDir() + "/logs/x.log"
			argv := []string{"/bin/sh", "-c", tc.script}
			pid, err := Daemon(argv, log, "test")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { Stop(pid, argv, 0) })
			// Once it said hello, it has set its trap.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if b, _ := os.ReadFile(log); strings.Contains(string(b), "hello\n") && Alive(pid, argv) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("pid %d not running and saying hello in its log", pid)
				}
			}
			start := time.Now()
			Stop(pid, argv, 300*time.Millisecond)
			if Alive(pid, argv) {
				t.Fatalf("pid %d alive after Stop (%s)", pid, time.Since(start))
			}
			// Its group (setsid: the pid is its id) is gone too, once init has reaped it.
			if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 3*time.Second, true, func(context.Context) (bool, error) {
				return errors.Is(syscall.Kill(-pid, 0), syscall.ESRCH), nil
			}); err != nil {
				t.Fatalf("a process of pid %d's group still runs after Stop", pid)
			}
			if b, err := os.ReadFile(log); err != nil || !strings.HasPrefix(string(b), "### ") || !strings.Contains(string(b), "kubefence test starts") {
				t.Errorf("log %q, %v: want the start line first", b, err)
			}
		})
	}
}

func TestPortFree(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	u := "http://127.0.0.1:" + strconv.Itoa(port)
	if err := PortFree(u, u); err != nil {
		t.Fatalf("free port %s: %v", u, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := PortFree(u); err == nil || !strings.Contains(err.Error(), "is in use") {
		t.Errorf("port in use: %v", err)
	}
	if got := HostPort("https://example.com"); got != "example.com:443" {
		t.Errorf("HostPort = %q", got)
	}
	// An address this host does not have (TEST-NET-1) is no port in use.
	if err := PortFree("http://192.0.2.1:2379"); err == nil || strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "not an address of this host") {
		t.Errorf("an address not of this host: %v", err)
	}
}

// TestDaemonRefusesAScript: a script runs as its interpreter (/bin/sh SCRIPT ...), or, once it
// execs, as another program: never with the command line it was started with, by which Alive,
// Find and Stop know it. Started, it would be reported gone while it runs, and never stopped.
// So does a program that execs the one it is given (env, nice, taskset...): the process goes on
// under the second program's command line.
func TestDaemonRefusesAScript(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "etcd")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{script, "--name", "g0"}, "is a script"},
		{[]string{"/usr/bin/env", "GOMEMLIMIT=8GiB", "sleep", "30"}, "execs the program it is given"},
		{[]string{"nice", "-n", "5", "sleep", "30"}, "execs the program it is given"},
	} {
		pid, err := Daemon(tc.argv, filepath.Join(dir, "log"), "test")
		if err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("%v was started", tc.argv)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%v: error %v: want it to say %q", tc.argv, err, tc.want)
		}
	}
}

// TestStartWritesNoLinkedLog: a step's log is appended to, never through a link another user
// put at its path (in a backup dir that user can write): the start is refused and what the link
// leads to is left as it was.
func TestStartWritesNoLinkedLog(t *testing.T) {
	dir := t.TempDir()
	target, logPath := filepath.Join(dir, "secret"), filepath.Join(dir, "step.log")
	if err := os.WriteFile(target, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, logPath); err != nil {
		t.Fatal(err)
	}
	if cmd, err := Start([]string{"/bin/true"}, logPath, "test", nil); err == nil {
		_ = cmd.Wait()
		t.Error("Start appended its log through a link")
	}
	if got, _ := os.ReadFile(target); string(got) != "secret\n" {
		t.Errorf("the link's target now holds %q", got)
	}
}
