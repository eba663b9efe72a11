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
