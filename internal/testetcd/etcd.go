// Package testetcd starts a real etcd for the tests that need one.
package testetcd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/internal/testenv"
)

// Etcd is a running etcd.
type Etcd struct {
	URL     string // client URL
	Version string // "3.4.23"
	DataDir string
}

// Start starts Debian's etcd 3.4 (the pinned one `make e2e-deps` checks) as a one-member cluster on
// free loopback ports, data in a t.TempDir, stopped at the test's end, and returns it once
// Ready.
func Start(t *testing.T) Etcd {
	t.Helper()
	// Debian's, which 'make e2e-deps' installs and checks is the pinned 3.4 (Etcd34 in
	// e2e/framework/bins.go), not whatever etcd is first on PATH.
	const bin = "/usr/bin/etcd"
	if _, err := os.Stat(bin); err != nil {
		testenv.SkipOrFail(t, "no "+bin+": run 'make e2e-deps' (Debian etcd-server 3.4)")
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	version, _, _ := strings.Cut(strings.TrimPrefix(string(out), "etcd Version: "), "\n")
	dataDir := filepath.Join(t.TempDir(), "m1")
	cmd, url := Command(t.Context(), t, bin, dataDir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := Ready(t.Context(), url); err != nil {
		t.Fatalf("etcd %s: %v", version, err)
	}
	return Etcd{URL: url, Version: version, DataDir: dataDir}
}

// Command is bin on data dir dir as a one-member cluster named m1, on free loopback ports, and
// its client URL.
func Command(ctx context.Context, t *testing.T, bin, dir string) (*exec.Cmd, string) {
	t.Helper()
	var urls [2]string
	for i := range urls {
		port, err := proc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		urls[i] = "http://127.0.0.1:" + strconv.Itoa(port)
	}
	return exec.CommandContext(ctx, bin, "--name", "m1", "--data-dir", dir,
		"--listen-client-urls", urls[0], "--advertise-client-urls", urls[0],
		"--listen-peer-urls", urls[1], "--initial-advertise-peer-urls", urls[1], "--initial-cluster", "m1="+urls[1]), urls[0]
}

// Ready waits until the etcd at url has a leader (30 s at most), then puts one key,
// /registry/k, so a snapshot's revision is the store's (etcdutl's status reads it from the
// newest key: 0 for an empty store).
func Ready(ctx context.Context, url string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := cli.Status(sctx, url)
		return err == nil && st.Leader != 0, nil
	})
	if err != nil {
		return fmt.Errorf("%s did not become healthy: %w", url, err)
	}
	_, err = cli.Put(ctx, "/registry/k", "v")
	return err
}
