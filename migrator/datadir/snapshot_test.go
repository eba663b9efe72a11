package datadir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/internal/testetcd"
)

// startSystemEtcd starts the etcd on PATH as a one-member cluster (testetcd.Start) and
// returns its client URL and version.
func startSystemEtcd(t *testing.T) (string, Version) {
	t.Helper()
	e := testetcd.Start(t)
	url, version := e.URL, e.Version
	v, err := ParseVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	return url, v
}

// TestSnapshotOfAV2ClusterWarns: the maintenance snapshot holds the v3 backend only, so a
// snapshot of a member on etcd 3.5 or older misses every v2 key it may hold. The copy says so
// in its report, naming the member and the copy that keeps v2 content.
func TestSnapshotOfAV2ClusterWarns(t *testing.T) {
	url, v := startSystemEtcd(t)
	if v.Minor > 5 {
		t.Fatalf("the test etcd is %s; the warning is for 3.5 and older, and the pinned test etcd is 3.4", v)
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

// TestSnapshotNeverReplaces: the CLI checks --snapshot is absent before a stream that can take
// minutes; a file created at that path meanwhile is someone else's and stays as it was: the
// snapshot fails with os.ErrExist instead of replacing it. Its own temp file (the name plus
// ".part", which a killed run may have left) is replaced, then removed.
func TestSnapshotNeverReplaces(t *testing.T) {
	url, _ := startSystemEtcd(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dst := filepath.Join(t.TempDir(), "snap.db")
	for _, f := range []string{dst, dst + ".part"} {
		if err := os.WriteFile(f, []byte("theirs"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := TakeSnapshot(ctx, ConnSpec{Endpoints: []string{url}}, dst)
	if !errors.Is(err, os.ErrExist) {
		t.Fatalf("snapshot onto an existing file: err %v, want os.ErrExist", err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "theirs" {
		t.Errorf("%s now holds %d bytes (err %v): it was replaced", dst, len(b), err)
	}
	if m, _ := filepath.Glob(dst + ".part*"); len(m) != 0 {
		t.Errorf("files left beside the snapshot: %v", m)
	}
	// A link at the temp file's name is replaced, never written through.
	outside, dst2 := filepath.Join(t.TempDir(), "outside"), filepath.Join(filepath.Dir(dst), "snap2.db")
	if err := os.WriteFile(outside, []byte("theirs"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, dst2+".part"); err != nil {
		t.Fatal(err)
	}
	if _, err := TakeSnapshot(ctx, ConnSpec{Endpoints: []string{url}}, dst2); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "theirs" {
		t.Errorf("the file a link at %s.part led to now holds %d bytes (err %v)", dst2, len(b), err)
	}
	if fi, err := os.Lstat(dst2); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the snapshot %s: %v, %v; want a regular file", dst2, fi, err)
	}
}

// TestLiveCopyAfterAKilledOne: a live copy killed while it copied the WAL leaves the backend it
// streamed beside its temp dir; the next copy to the same output replaces it (its own), not
// fails saying the file appeared while it streamed.
func TestLiveCopyAfterAKilledOne(t *testing.T) {
	e := testetcd.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dst := filepath.Join(t.TempDir(), "copy")
	if err := os.WriteFile(partPath(dst)+".backend", []byte("the killed copy's backend"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CopyLive(ctx, e.DataDir, "", dst, ConnSpec{Endpoints: []string{e.URL}}, e.URL); err != nil {
		t.Fatalf("live copy after a killed one: %v", err)
	}
	if m, _ := filepath.Glob(partPath(dst) + "*"); len(m) != 0 {
		t.Errorf("left beside the copy: %v", m)
	}
}
