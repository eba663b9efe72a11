package datadir

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/internal/testenv"
)

// startSystemEtcd starts the etcd on PATH (Debian's etcd-server is 3.4) as a one-member
// cluster on free loopback ports and returns its client URL and version, once it answers.
func startSystemEtcd(t *testing.T) (string, Version) {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		testenv.SkipOrFail(t, "no etcd on PATH: run 'make e2e-deps' (Debian etcd-server)")
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(strings.TrimPrefix(string(out), "etcd Version: "), "\n")
	v, err := ParseVersion(line)
	if err != nil {
		t.Fatal(err)
	}
	var urls [2]string
	for i := range urls {
		port, err := proc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		urls[i] = "http://127.0.0.1:" + strconv.Itoa(port)
	}
	cmd := exec.Command(bin, "--name", "m1", "--data-dir", t.TempDir(),
		"--listen-client-urls", urls[0], "--advertise-client-urls", urls[0],
		"--listen-peer-urls", urls[1], "--initial-advertise-peer-urls", urls[1], "--initial-cluster", "m1="+urls[1])
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	cli, err := NewClient(ConnSpec{}, urls[0])
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := cli.Status(sctx, urls[0])
		return err == nil && st.Leader != 0, nil
	})
	if err != nil {
		t.Fatalf("etcd %s on %s did not become healthy: %v", v, urls[0], err)
	}
	// A key, so the snapshot's revision is the store's (etcdutl's status reads it from the
	// newest key: 0 for an empty store).
	if _, err := cli.Put(t.Context(), "/registry/k", "v"); err != nil {
		t.Fatal(err)
	}
	return urls[0], v
}

// TestSnapshotOfAV2ClusterWarns: the maintenance snapshot holds the v3 backend only, so a
// snapshot of a member on etcd 3.5 or older misses every v2 key it may hold. The copy says so
// in its report, naming the member and the copy that keeps v2 content.
func TestSnapshotOfAV2ClusterWarns(t *testing.T) {
	url, v := startSystemEtcd(t)
	if v.Minor > 5 {
		t.Skipf("etcd on PATH is %s; the warning is for 3.5 and older", v)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	info, err := TakeSnapshot(ctx, ConnSpec{Endpoints: []string{url}}, filepath.Join(t.TempDir(), "snap.db"))
	if err != nil {
		t.Fatal(err)
	}
	w := strings.Join(info.Warnings, "\n")
	for _, want := range []string{url, v.String(), "v2", "copy --data-dir", "--live"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings %q do not name %q", info.Warnings, want)
		}
	}
}

// TestSnapshotWarnings: only members on 3.5 or older can hold v2 content.
func TestSnapshotWarnings(t *testing.T) {
	for _, tc := range []struct {
		versions []string
		want     int
	}{
		{[]string{"3.6.16", "3.6.16"}, 0},
		{[]string{"3.5.35"}, 1},
		{[]string{"3.6.16", "3.5.35", "3.4.23"}, 1}, // one warning, naming each
	} {
		var ms []MemberStatus
		for i, v := range tc.versions {
			ms = append(ms, MemberStatus{Endpoint: "http://m" + strconv.Itoa(i), Version: v})
		}
		got := v2Warnings(ms)
		if len(got) != tc.want {
			t.Errorf("%v: warnings %q, want %d", tc.versions, got, tc.want)
		}
		for i, v := range tc.versions {
			named := len(got) > 0 && strings.Contains(got[0], "http://m"+strconv.Itoa(i)+" (etcd "+v+")")
			if named != !strings.HasPrefix(v, "3.6") {
				t.Errorf("%v: warnings %q; member %d (etcd %s) named: %t", tc.versions, got, i, v, named)
			}
		}
	}
}
