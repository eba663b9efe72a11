// Package proc starts, finds and stops the etcd and kube-apiserver processes the migrator and
// the cutover run, and probes the ports they listen on.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/pathguard"
)

// Start starts argv (binary first) with its output appended to logPath, after a line saying
// who started what and when; attr says how the process relates to kubefence (its own session,
// or killed with it).
func Start(argv []string, logPath, who string, attr *syscall.SysProcAttr) (*exec.Cmd, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return nil, err
	}
	f, err := pathguard.OpenOwn(logPath, os.O_WRONLY|os.O_APPEND)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "### %s kubefence %s starts %q\n", time.Now().Format(time.RFC3339Nano), who, argv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return cmd, nil
}

// Daemon starts a process that outlives kubefence (its own session; output to logPath) and
// returns its pid. While kubefence runs it reaps the process if it exits; after, init does.
// A script is refused: it runs as its interpreter, or, once it execs, as another program,
// never with the command line by which Alive, Find and Stop know it.
func Daemon(argv []string, logPath, who string) (int, error) {
	if len(argv) > 0 {
		if err := CheckNotScript(argv[0]); err != nil {
			return 0, err
		}
	}
	if err := CheckNoExecWrapper(argv); err != nil {
		return 0, err
	}
	cmd, err := Start(argv, logPath, who, &syscall.SysProcAttr{Setsid: true})
	if err != nil {
		return 0, err
	}
	go func() { _ = cmd.Wait() }()
	return cmd.Process.Pid, nil
}

// CheckNotScript refuses a script (#!) as the program of a process Daemon starts: it runs as
// its interpreter, or, once it execs, as another program, never with the command line by which
// Alive, Find and Stop know it. A caller that starts processes later checks with it first (and
// with CheckNoExecWrapper), before anything it would do for them.
func CheckNotScript(program string) error {
	if isScript(program) {
		return fmt.Errorf("%s is a script: its process runs under another command line, by which kubefence could not find, check or stop it; give the program itself (with its flags)", program)
	}
	return nil
}

// execWrappers are programs that exec the program they are given (after setting its
// environment, priority, CPUs, user, namespaces...): the process goes on under that program's
// command line.
var execWrappers = map[string]bool{
	"env": true, "nice": true, "ionice": true, "taskset": true, "chrt": true, "setpriv": true,
	"numactl": true, "stdbuf": true, "prlimit": true, "unshare": true, "nsenter": true,
	"chroot": true, "runuser": true, "setsid": true, "nohup": true, "sudo": true, "doas": true,
	"su": true, "timeout": true, "flock": true, "cgexec": true, "systemd-run": true,
}

// CheckNoExecWrapper refuses a command line whose program is one that execs another (env,
// nice, taskset, sudo...; not a shell, which may stay the parent of what it runs): kubefence
// knows the processes it starts by their command line, which would then be another's, and could
// not find, check or stop them.
func CheckNoExecWrapper(argv []string) error {
	if len(argv) == 0 || !execWrappers[filepath.Base(argv[0])] {
		return nil
	}
	return fmt.Errorf("%s execs the program it is given, which then runs under another command line, by which kubefence could not find, check or stop it; give the program itself (with its flags; an environment variable such as GOMEMLIMIT in kubefence's own environment, which the processes it starts inherit)", argv[0])
}

// isScript says whether path starts with "#!" (the kernel then runs its interpreter).
func isScript(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 2)
	n, _ := io.ReadFull(f, head)
	return n == 2 && string(head) == "#!"
}

// Alive reports whether pid runs exactly the command line argv: a recycled pid, or another
// process of the same binary (another etcd, say), is not mistaken for ours. A zombie is not
// alive.
func Alive(pid int, argv []string) bool {
	if pid <= 0 || len(argv) == 0 {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Equal(cmdline, cmdlineOf(argv)) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// state is the field after the ")" of the command name; Z is a zombie.
	i := bytes.LastIndexByte(stat, ')')
	return !(i > 0 && i+2 < len(stat) && stat[i+2] == 'Z')
}

// cmdlineOf is argv as /proc/PID/cmdline shows it.
func cmdlineOf(argv []string) []byte { return []byte(strings.Join(argv, "\x00") + "\x00") }

// Find returns a live process whose command line is exactly argv, or 0.
func Find(argv []string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && Alive(pid, argv) {
			return pid
		}
	}
	return 0
}

// Stop sends SIGTERM, then SIGKILL after grace, and waits (up to 5s more) for the process to
// be gone. A process that leads its own process group (Daemon's, by setsid) is signalled with
// its group: a wrapper's child (a shell running the real program without exec) goes with it.
func Stop(pid int, argv []string, grace time.Duration) {
	if !Alive(pid, argv) {
		return
	}
	target := pid
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		target = -pid
	}
	gone := func(context.Context) (bool, error) {
		if Alive(pid, argv) {
			return false, nil
		}
		return target == pid || errors.Is(syscall.Kill(target, 0), syscall.ESRCH), nil
	}
	_ = syscall.Kill(target, syscall.SIGTERM)
	if wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, grace, true, gone) == nil {
		return
	}
	_ = syscall.Kill(target, syscall.SIGKILL)
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 5*time.Second, true, gone)
}
