package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/proc"
)

// Env is one test's (or one demo's) world: a work dir for data, a log dir kept on failure, and
// every process started in it, stopped on Close.
type Env struct {
	Dir    string // data, PKI, kubeconfigs
	LogDir string
	// Logf reports progress (t.Logf in tests, the demo's printer).
	Logf func(format string, args ...any)

	mu    sync.Mutex
	procs []*Process
}

// NewEnv makes an Env under base (a temp dir when empty). Logs go to base/logs.
func NewEnv(base string, logf func(string, ...any)) (*Env, error) {
	if base == "" {
		var err error
		if base, err = os.MkdirTemp("", "kubefence-e2e-"); err != nil {
			return nil, err
		}
	}
	e := &Env{Dir: base, LogDir: filepath.Join(base, "logs"), Logf: logf}
	if e.Logf == nil {
		e.Logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(e.LogDir, 0o755); err != nil {
		return nil, err
	}
	return e, nil
}

// Close stops every process still running, last started first, and reports any left behind.
func (e *Env) Close() error {
	e.mu.Lock()
	procs := append([]*Process(nil), e.procs...)
	e.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Running lists the processes of this Env that have not exited.
func (e *Env) Running() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, p := range e.procs {
		if !p.Exited() {
			out = append(out, fmt.Sprintf("%s (pid %d)", p.Name, p.Pid()))
		}
	}
	return out
}

// Process is a started component.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// Start runs bin with args, logging stdout and stderr to LogDir/name.log. The process gets its
// own process group so that Stop reaches its children.
func (e *Env) Start(name, bin string, args []string, env ...string) (*Process, error) {
	logPath := filepath.Join(e.LogDir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "### %s %s %q\n", time.Now().Format(time.RFC3339Nano), bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	DiesWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p, nil
}

// DiesWithParent gives cmd, not yet started, SIGKILL as its parent-death signal, and returns
// it: a kubefence or kubectl a test starts ends with the test binary (killed at go test's
// -timeout, which runs no cleanup, or by hand) instead of living on against a cluster that is
// gone. The kernel sends it when the thread that started cmd ends; Go ends a thread only when a
// goroutine locked to it returns, which nothing here does. It is not inherited: the processes
// cmd starts (green etcd and kube-apiserver, which kubefence daemonizes) are not affected.
func DiesWithParent(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return cmd
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ErrExited says that a process a waiter waits for has exited: WaitUntil stops at once on it.
var ErrExited = errors.New("exited")

// ExitError is nil while the process runs; once it has exited, an error that wraps ErrExited
// and says how it exited and where its log is.
func (p *Process) ExitError() error {
	if !p.Exited() {
		return nil
	}
	how := "with status 0"
	if p.err != nil {
		how = "(" + p.err.Error() + ")"
	}
	return fmt.Errorf("%s (pid %d) %w %s; see %s", p.Name, p.Pid(), ErrExited, how, p.LogPath)
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.Pid())
	}
}

// Kill sends SIGKILL (a crash) and waits for the process to end. A process that has ended is
// not signalled: its pid, as a process group, may name others' processes by now.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.done
}

// FreePorts returns n distinct TCP ports no one listens on, on any address, outside the
// kernel's ephemeral range (proc.FreePorts): fixtures bind them on 127.0.0.1 or on the other
// loopback addresses that stand for hosts, soon after.
func FreePorts(n int) ([]int, error) { return proc.FreePorts(n) }

// WaitUntil polls cond every interval until it returns true or ctx ends. An error from cond is
// kept for the message and polling goes on, except one that wraps ErrExited (the process waited
// for has exited, see ExitError): that ends the wait at once.
func WaitUntil(ctx context.Context, interval time.Duration, what string, cond func(context.Context) (bool, error)) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if errors.Is(err, ErrExited) {
			return false, err
		}
		if err != nil {
			last = err
		}
		return ok, nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrExited) || last == nil:
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w (last error: %v)", what, err, last)
}

func itoa(i int) string { return strconv.Itoa(i) }

func ensureDir(dir string) error { return os.MkdirAll(dir, 0o755) }
