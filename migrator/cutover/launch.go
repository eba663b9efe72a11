package cutover

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

// greenInitialCluster is green's NAME=PEER-URL,... list.
func (p *Plan) greenInitialCluster() string {
	var initial []string
	for _, o := range p.Green.Etcd.Members {
		initial = append(initial, o.Name+"="+o.PeerURL)
	}
	return strings.Join(initial, ",")
}

// etcdCommand is the command line a green member starts with, binary first.
func etcdCommand(p *Plan, m GreenMember) []string {
	args := []string{
		p.Green.Etcd.Binary,
		"--name", m.Name, "--data-dir", m.DataDir,
		"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", p.greenInitialCluster(), "--initial-cluster-token", p.Green.Etcd.ClusterToken,
	}
	if m.MetricsURL != "" {
		args = append(args, "--listen-metrics-urls", m.MetricsURL)
	}
	return append(args, p.Green.Etcd.ExtraArgs...)
}

// daemon starts a process that outlives kubefence (its own session, output to a log file in
// the state dir) and returns its pid.
func daemon(stateDir, name string, argv []string) (int, error) {
	logDir := filepath.Join(stateDir, "logs")
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return 0, err
	}
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fmt.Fprintf(f, "### %s kubefence cutover starts %q\n", time.Now().Format(time.RFC3339Nano), argv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	// Reap it if it exits while we run; after we exit, init does.
	go func() { _ = cmd.Wait() }()
	return pid, nil
}

// alive reports whether pid runs exactly the command line argv: a recycled pid, or another
// process of the same binary (another etcd, say), is not mistaken for ours.
func alive(pid int, argv []string) bool {
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

// stop sends SIGTERM, then SIGKILL after grace, and waits for the process to be gone.
func stop(pid int, argv []string, grace time.Duration) {
	if !alive(pid, argv) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for alive(pid, argv) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid, argv) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 100 && alive(pid, argv); i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// portFree reports whether host:port of a URL can be bound now.
func portFree(rawURL string) error {
	hp := hostPort(rawURL)
	ln, err := net.Listen("tcp", hp)
	if err != nil {
		return fmt.Errorf("%s is in use (%v)", hp, err)
	}
	return ln.Close()
}

// binaryVersion runs `bin --version` and returns its output.
func binaryVersion(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", bin, err, out)
	}
	return string(out), nil
}

// staticPodPath is where the green apiserver's manifest goes in the kubelet's directory.
func staticPodPath(sp *StaticPod) string {
	return filepath.Join(sp.ManifestDir, filepath.Base(sp.Manifest))
}

// placeStaticPod copies the manifest into the kubelet's directory atomically.
func placeStaticPod(sp *StaticPod) error {
	data, err := os.ReadFile(sp.Manifest)
	if err != nil {
		return err
	}
	return atomicfile.Write(staticPodPath(sp), data, 0o600)
}

func readDirIfExists(dir string) ([]os.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	return entries, err
}

// findProcess returns a live process whose command line is exactly argv, or 0. A cutover
// killed between starting a green process and journaling its pid leaves one behind; its
// command line (binary, data dir, ports) is ours alone, so the resume or abort adopts it.
func findProcess(argv []string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && alive(pid, argv) {
			return pid
		}
	}
	return 0
}

// greenPID is the pid of green process name (started with argv): the journaled one if it
// runs, else an orphan found by its command line (journaled from now on), else 0.
func (r *runner) greenPID(name string, argv []string) int {
	if pid, ok := r.j.GreenPIDs[name]; ok && alive(pid, argv) {
		return pid
	}
	pid := findProcess(argv)
	if pid > 0 {
		r.j.GreenPIDs[name] = pid
		if err := r.j.save(r.p.StateDir); err != nil && r.o.Log != nil {
			r.o.Log.Warn("journal the adopted green process", "name", name, "err", err)
		}
	}
	return pid
}
