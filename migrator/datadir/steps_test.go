package datadir

import (
	"path/filepath"
	"slices"
	"testing"
)

func TestRecoverSwap(t *testing.T) {
	oldData := map[string]string{"member/snap/db": "old backend", "version.txt": "3.6.16/etcd3\n"}
	newData := map[string]string{"member/snap/db": "new backend", "version.txt": "3.5.21/etcd3\n"}
	withMarker := func(files map[string]string) map[string]string {
		out := map[string]string{readyMarker: "ready\n"}
		for k, v := range files {
			out[k] = v
		}
		return out
	}
	// Each state names what exists before recovery; want is <dir>'s content after it (nil: no
	// dir), and wantNames the whole parent dir. The ready marker stays in a swapped-in dir: the
	// step removes it once every member is swapped (TestRebuildResumesFromJournaledSource).
	for _, tc := range []struct {
		name          string
		dir, new, old map[string]string // nil: absent
		want          map[string]string
		wantNames     []string
	}{
		{
			name: "crash between the two renames: new is ready",
			new:  withMarker(newData), old: oldData,
			want: withMarker(newData), wantNames: []string{"data"},
		},
		{
			name: "crash between the two renames, no old left",
			new:  withMarker(newData),
			want: withMarker(newData), wantNames: []string{"data"},
		},
		{
			name: "dir moved away, new not ready: old comes back",
			old:  oldData,
			want: oldData, wantNames: []string{"data"},
		},
		{
			name: "dir moved away, new half built: old comes back, new removed",
			new:  newData, old: oldData,
			want: oldData, wantNames: []string{"data"},
		},
		{
			name: "swapped, old not yet removed",
			dir:  withMarker(newData), old: oldData,
			want: withMarker(newData), wantNames: []string{"data"},
		},
		{
			name: "crash while building new",
			dir:  oldData, new: newData,
			want: oldData, wantNames: []string{"data"},
		},
		{
			name: "ready new next to the dir is left for the repeated step",
			dir:  oldData, new: withMarker(newData),
			want: oldData, wantNames: []string{"data", "data.kubefence-new"},
		},
		{
			name: "nothing to recover",
			dir:  oldData,
			want: oldData, wantNames: []string{"data"},
		},
		{
			name: "no data dir and nothing of ours",
			want: nil, wantNames: nil,
		},
		{
			name: "no data dir, new not ready: left alone",
			new:  newData,
			want: nil, wantNames: []string{"data.kubefence-new"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "data")
			for p, files := range map[string]map[string]string{dir: tc.dir, newPath(dir): tc.new, oldPath(dir): tc.old} {
				if files != nil {
					writeTree(t, p, files)
				}
			}
			if err := recoverSwap(dir); err != nil {
				t.Fatalf("recoverSwap: %v", err)
			}
			if got := dirNames(t, parent); !slices.Equal(got, tc.wantNames) {
				t.Fatalf("after recovery the parent holds %v, want %v", got, tc.wantNames)
			}
			if tc.want != nil {
				assertTree(t, dir, tc.want)
			}
			// Recovery is idempotent: a second run (a crash during the first) changes nothing.
			if err := recoverSwap(dir); err != nil {
				t.Fatalf("second recoverSwap: %v", err)
			}
			if got := dirNames(t, parent); !slices.Equal(got, tc.wantNames) {
				t.Fatalf("after a second recovery the parent holds %v, want %v", got, tc.wantNames)
			}
			if tc.want != nil {
				assertTree(t, dir, tc.want)
			}
		})
	}
}

func TestRecoverSwapTrailingSlash(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "data")
	writeTree(t, newPath(dir), map[string]string{readyMarker: "ready\n", "member/snap/db": "new"})
	writeTree(t, oldPath(dir), map[string]string{"member/snap/db": "old"})
	if err := recoverSwap(dir + "/"); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dir, map[string]string{readyMarker: "ready\n", "member/snap/db": "new"})
	if got := dirNames(t, parent); !slices.Equal(got, []string{"data"}) {
		t.Fatalf("parent holds %v", got)
	}
}
