package datadir

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/internal/tlsutil"
)

// HealthPrefix is the reserved key prefix of the health check's write: a step writes one key
// under it and deletes the prefix before it stops etcd.
const HealthPrefix = "/kubefence.io/migrate-health/"

// Binary is an etcd release in the bin dir.
type Binary struct {
	Path    string  `json:"path"`
	Version Version `json:"-"`
}

// findBinary returns bin-dir/etcd-<want> for an exact version, or the newest etcd-<minor>.* when
// only the minor matters. The binary must report the version its name says.
func findBinary(ctx context.Context, binDir string, want Version, exact bool) (Binary, error) {
	if binDir == "" {
		return Binary{}, errors.New("--bin-dir is required: a dir holding etcd-<version> binaries, one per minor the data dir steps through")
	}
	var found []Version
	names, _ := filepath.Glob(filepath.Join(binDir, "etcd-*"))
	for _, n := range names {
		if v, err := ParseVersion(strings.TrimPrefix(filepath.Base(n), "etcd-")); err == nil {
			found = append(found, v)
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[j].Less(found[i]) })
	for _, v := range found {
		if (exact && v == want) || (!exact && v.SameMinor(want)) {
			b := Binary{Path: filepath.Join(binDir, "etcd-"+v.String()), Version: v}
			return b, checkBinary(ctx, b)
		}
	}
	var have []string
	for _, v := range found {
		have = append(have, "etcd-"+v.String())
	}
	name := "etcd-" + want.String()
	if !exact {
		name = "etcd-" + want.MinorString() + ".*"
	}
	list := "no etcd-<version> binaries"
	if len(have) > 0 {
		list = "it has " + strings.Join(have, ", ")
	}
	return Binary{}, fmt.Errorf("%s has no %s binary (%s); put one there (hack/e2e-deps.sh builds etcd-3.5.x and etcd-3.6.x; Debian's etcd-server is 3.4)",
		binDir, name, list)
}

// checkBinary runs `etcd --version` and checks it names the version the file name says.
func checkBinary(ctx context.Context, b Binary) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, b.Path, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --version: %v: %s", b.Path, err, bytes.TrimSpace(out))
	}
	if !strings.Contains(string(out), "etcd Version: "+b.Version.String()+"\n") {
		return fmt.Errorf("%s reports %q, not etcd Version: %s", b.Path, firstLine(out), b.Version)
	}
	return nil
}

// CheckBinaryVersion runs `bin --version` and checks it reports exactly version (3.6.1 is not
// 3.6.16); version must be a plain MAJOR.MINOR.PATCH.
func CheckBinaryVersion(ctx context.Context, bin, version string) error {
	v, err := ParseVersion(version)
	if err != nil {
		return err
	}
	return checkBinary(ctx, Binary{Path: bin, Version: v})
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(bytes.TrimSpace(b)), "\n")
	return s
}

// etcdProc is an etcd kubefence runs on a data dir for a step.
type etcdProc struct {
	cmd       *exec.Cmd
	clientURL string
	logPath   string
	done      chan struct{}
	err       error
	// terminated is set once kubefence asked etcd to stop, so its exit is expected.
	terminated bool
}

// startEtcd starts bin on a member's data dir, clients on a free loopback port over TLS with
// client certificates from pki (runTLS), peers on peerURLs (recorded ones for a multi-member
// set, else a free loopback port). It dies with kubefence (SIGKILL on parent death), so a
// killed run leaves no etcd holding the dir. extra are more flags (--snapshot-count).
func startEtcd(bin Binary, dataDir string, ms Membership, peerURLs []string, initialCluster, logPath string, quota int64, pki *tlsutil.Loopback, extra []string) (*etcdProc, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	client := "https://127.0.0.1:" + strconv.Itoa(port)
	argv := []string{
		bin.Path,
		"--name", ms.Self.Name, "--data-dir", dataDir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--cert-file", pki.CertFile, "--key-file", pki.KeyFile, "--trusted-ca-file", pki.CAFile, "--client-cert-auth",
		"--listen-peer-urls", strings.Join(peerURLs, ","), "--initial-advertise-peer-urls", strings.Join(peerURLs, ","),
		"--initial-cluster", initialCluster,
		"--quota-backend-bytes", strconv.FormatInt(quota, 10),
	}
	argv = append(argv, extra...)
	cmd, err := proc.Start(argv, logPath, "migrate", &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true})
	if err != nil {
		return nil, err
	}
	p := &etcdProc{cmd: cmd, clientURL: client, logPath: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// exited reports the process's end, with the tail of its log.
func (p *etcdProc) exited() error {
	return fmt.Errorf("etcd exited (%v); the end of its log %s:\n%s", p.err, p.logPath, logTail(p.logPath, 12))
}

// terminate asks etcd to stop: it commits its backend and exits.
func (p *etcdProc) terminate() {
	p.terminated = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
}

// stop terminates etcd and waits. Killed after grace, which is an error (the data dir is then
// as after a crash, and the step is repeated on the next run).
func (p *etcdProc) stop(grace time.Duration) error {
	select {
	case <-p.done:
		if !p.terminated {
			return p.exited()
		}
	default:
	}
	p.terminate()
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("etcd did not stop within %s of SIGTERM and was killed; see %s", grace, p.logPath)
	}
	var ee *exec.ExitError
	if p.err == nil {
		return nil
	}
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil // etcd re-raises the signal after its shutdown handlers ran
		}
	}
	return fmt.Errorf("etcd stopped with %v; see %s", p.err, p.logPath)
}

// kill is for error paths.
func (p *etcdProc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitStatus polls the member's status until ok accepts it (nil), etcd exits, or ctx ends;
// the error then names what was awaited and the last answer.
func (p *etcdProc) waitStatus(ctx context.Context, cli *clientv3.Client, what string, ok func(*clientv3.StatusResponse) error) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, p.clientURL)
		cancel()
		if err == nil {
			err = ok(st)
		}
		if last = err; last == nil {
			return true, nil
		}
		if alarm := (*alarmError)(nil); errors.As(err, &alarm) {
			return false, fmt.Errorf("etcd on %s: %w; see %s", p.clientURL, err, p.logPath)
		}
		select {
		case <-p.done:
			return false, p.exited()
		default:
			return false, nil
		}
	})
	if err != nil && errors.Is(ctx.Err(), context.Canceled) { // a signal, not a timeout
		return fmt.Errorf("etcd on %s: stopped waiting for it to be %s: %w", p.clientURL, what, context.Cause(ctx))
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("etcd on %s: %s not reached in time (%v); see %s", p.clientURL, what, last, p.logPath)
	}
	return err
}

// waitHealthy waits until the member answers a status with a leader elected.
func (p *etcdProc) waitHealthy(ctx context.Context, cli *clientv3.Client) error {
	return p.waitStatus(ctx, cli, "healthy", healthyStatus)
}

// alarmError is a member that answers with an alarm raised (NOSPACE, CORRUPT): stored in its
// backend, no wait ends it.
type alarmError struct{ msg string }

func (e *alarmError) Error() string { return e.msg }

// healthyStatus is nil for a member with a leader and no alarm; an *alarmError for an alarm.
func healthyStatus(st *clientv3.StatusResponse) error {
	for _, e := range st.Errors {
		switch {
		case strings.Contains(e, "alarm:NOSPACE"):
			return &alarmError{fmt.Sprintf("it holds etcd's NOSPACE alarm (%s): its database reached its quota (--quota-backend-bytes) and it takes no writes until the alarm is disarmed: compact and defragment it (etcdctl compact, etcdctl defrag), then 'etcdctl alarm disarm', and run this again", strings.TrimSpace(e))}
		case strings.Contains(e, "alarm:CORRUPT"):
			return &alarmError{fmt.Sprintf("it holds etcd's CORRUPT alarm (%s): its data differs from its peers'; restore the member from a backup", strings.TrimSpace(e))}
		}
	}
	if st.Leader == 0 || len(st.Errors) > 0 {
		return fmt.Errorf("no leader yet (errors: %v)", st.Errors)
	}
	return nil
}

// waitStorageVersion waits until etcd 3.6+ reports the storage version of its minor (its
// version monitor writes it some seconds after the cluster version is settled).
func (p *etcdProc) waitStorageVersion(ctx context.Context, cli *clientv3.Client, want string) error {
	return p.waitStatus(ctx, cli, "storage version "+want, func(st *clientv3.StatusResponse) error {
		if st.StorageVersion != want {
			return fmt.Errorf("it reports storage version %q", st.StorageVersion)
		}
		return nil
	})
}

// healthCheck proves the cluster serves: a linearizable read always, and for v3-only data a
// write under HealthPrefix, then the prefix deleted (a key a killed run left is deleted too).
// v2 data is not written to at all.
func healthCheck(ctx context.Context, cli *clientv3.Client, write bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, HealthPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("health check read: %w", err)
	}
	if !write {
		return nil
	}
	key := HealthPrefix + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := cli.Put(ctx, key, "kubefence migrate health check; deleted at once"); err != nil {
		return fmt.Errorf("health check write: %w", err)
	}
	if _, err := cli.Delete(ctx, HealthPrefix, clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("health check delete of %s: %w", key, err)
	}
	return nil
}

// LogTail is the last n lines of the log at path a process kubefence started writes (or why
// it cannot be read), with the line etcd died saying (a panic or fatal line) kept when its stack
// followed it: what to show when the process exited at its start.
func LogTail(path string, n int) string { return logTail(path, n) }

func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) <= n {
		return strings.Join(lines, "\n")
	}
	tail := lines[len(lines)-n:]
	if slices.ContainsFunc(tail, diedSaying) {
		return strings.Join(tail, "\n")
	}
	// etcd says why it died in a panic or fatal line, then prints its stack: keep that line,
	// if this run wrote it (each run starts with a "### " line in the same log).
	for i := len(lines) - n - 1; i >= 0 && !strings.HasPrefix(lines[i], "### "); i-- {
		if diedSaying(lines[i]) {
			return lines[i] + "\n…\n" + strings.Join(tail, "\n")
		}
	}
	return strings.Join(tail, "\n")
}

// diedSaying says whether an etcd log line is the one it dies with.
func diedSaying(line string) bool {
	return strings.Contains(line, `"level":"panic"`) || strings.Contains(line, `"level":"fatal"`)
}
