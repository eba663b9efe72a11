package datadir_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/internal/testetcd"
	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// TestUpgradeOfA34MemberProbedForHealth: etcd 3.4 answers /health with a v2 quorum read that
// lands in its WAL (kubeadm probes it every 10 s). Such a member holds no v2 content, but etcd
// 3.6 panics replaying that read ("detected disallowed v2 WAL") unless a snapshot was taken past
// it, and an ordinary 3.5 run takes none. kubefence's upgrade to 3.6 runs 3.5 with
// --snapshot-count=1, says so, and 3.6 then starts. Real etcd 3.4, 3.5 and 3.6 binaries.
func TestUpgradeOfA34MemberProbedForHealth(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd35, "etcd", framework.Etcd36)
	dir := filepath.Join(t.TempDir(), "etcd")
	runEtcd(t, framework.BinPath("etcd", framework.Etcd34), dir, func(url string) {
		for range 3 {
			resp, err := http.Get(url + "/health")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
		}
	})
	found, err := v2v3.DetectV2(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if found.Content || !strings.Contains(found.Replay, "QGET") {
		t.Fatalf("DetectV2 on a 3.4 member probed for health: %+v, want no content and its QGETs named", found)
	}

	t.Run("etcd 3.6 refuses it after a plain 3.5 run", func(t *testing.T) {
		cp := filepath.Join(t.TempDir(), "etcd")
		if out, err := exec.Command("cp", "-a", dir, cp).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		runEtcd(t, framework.BinPath("etcd", framework.Etcd35), cp, func(string) {})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cmd, _ := testetcd.Command(ctx, t, framework.BinPath("etcd", framework.Etcd36), cp)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "detected disallowed v2 WAL") {
			t.Fatalf("etcd 3.6 after a plain 3.5 run: %v, want its panic on the v2 WAL; the end of its log:\n%s", err, tail(out))
		}
	})

	rep, err := datadir.Run(t.Context(), datadir.OpUpgrade, datadir.Options{
		DataDirs: []string{dir}, Target: datadir.Version{Major: 3, Minor: 6, Patch: 16},
		BinDir: framework.BinDir(), BackupDir: filepath.Join(t.TempDir(), "backups"),
	})
	if err != nil {
		t.Fatalf("upgrade to 3.6.16: %v", err)
	}
	if got := rep.After[dir]; got != "3.6.16/etcd3" {
		t.Errorf("version file after the upgrade: %q, want 3.6.16/etcd3", got)
	}
	var snapshotted bool
	for _, s := range rep.Steps {
		if s.Kind == datadir.StepRun && s.SnapshotCount == 1 {
			snapshotted = strings.Contains(s.Members[dir], "--snapshot-count=1") && strings.Contains(s.Members[dir], "3.6 refuses to replay")
			t.Logf("step %q: %s", s.Name, s.Members[dir])
		}
	}
	if !snapshotted {
		t.Errorf("no run step says it ran etcd with --snapshot-count=1 and why: %+v", rep.Steps)
	}
}

// runEtcd starts bin on dir (made if need be), waits until it has a leader, calls use with its
// client URL, and stops it with SIGTERM.
func runEtcd(t *testing.T, bin, dir string, use func(url string)) {
	t.Helper()
	cmd, url := testetcd.Command(t.Context(), t, bin, dir)
	log, err := os.Create(dir + ".log")
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := testetcd.Ready(t.Context(), url); err != nil {
		b, _ := os.ReadFile(dir + ".log")
		t.Fatalf("%s on %s: %v\n%s", bin, dir, err, tail(b))
	}
	use(url)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func tail(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-12):], "\n")
}
