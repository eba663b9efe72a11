package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/e2e/framework"
)

// TestGenerate runs the generation on real etcd 3.4: a small store ends up in the cache, and a
// generation stopped by the RSS limit leaves nothing there and says why.
func TestGenerate(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34)
	for _, tc := range []struct {
		name    string
		maxRSS  int64
		wantErr string
	}{
		{"fits", 4 << 30, ""},
		{"over the RSS limit", 1 << 20, "over the 0.00 GiB limit (--max-etcd-rss)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cache", "v2-200.etcd")
			cfg := &genConfig{keys: 200, maxRSS: tc.maxRSS, memLimit: 1 << 30, out: io.Discard}
			err := generate(t.Context(), dir, cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "nothing was kept") {
					t.Fatalf("err = %v, want one saying %q and that nothing was kept", err, tc.wantErr)
				}
				left, _ := os.ReadDir(filepath.Dir(dir))
				if len(left) > 0 {
					t.Fatalf("a failed generation left %v in the cache", left)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			snaps, _ := filepath.Glob(filepath.Join(dir, "member", "snap", "*.snap"))
			wals, _ := filepath.Glob(filepath.Join(dir, "member", "wal", "*.wal"))
			if len(snaps) != 1 || len(wals) == 0 || cfg.peak.Load() == 0 {
				t.Fatalf("snapshots %v, WAL files %v, etcd peak RSS %d: want one snapshot, a WAL and a measured RSS", snaps, wals, cfg.peak.Load())
			}
		})
	}
}

// TestSnapshotsIn: etcd 3.4 with --snapshot-count=1 can save a second snapshot (index 4 after
// index 2) milliseconds after the first; the newest is the one it boots from.
func TestSnapshotsIn(t *testing.T) {
	for _, tc := range []struct {
		name       string
		files      []string
		newest     string
		olderCount int
	}{
		{"none", []string{"db"}, "", 0},
		{"one", []string{"db", "0000000000000002-0000000000000003.snap"}, "0000000000000002-0000000000000003.snap", 0},
		{"a later one", []string{"0000000000000002-0000000000000004.snap", "0000000000000002-0000000000000002.snap", "0000000000000003-0000000000000010.snap"}, "0000000000000003-0000000000000010.snap", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			newest, older, err := snapshotsIn(dir)
			if tc.newest == "" {
				if err == nil {
					t.Fatalf("no snapshot: got %q, want an error", newest)
				}
				return
			}
			if err != nil || filepath.Base(newest) != tc.newest || len(older) != tc.olderCount {
				t.Fatalf("snapshotsIn = %q, %v, %v; want %q and %d older", newest, older, err, tc.newest, tc.olderCount)
			}
		})
	}
}
