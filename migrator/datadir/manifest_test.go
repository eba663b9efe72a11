package datadir

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestManifestWriteVerify(t *testing.T) {
	files := map[string]string{
		"version.txt":        "3.5.9/etcd3\n",
		"member/snap/db":     strings.Repeat("backend", 1000),
		"member/wal/0.wal":   "first segment",
		"member/wal/1.wal":   "",
		"member/snap/a.snap": "snapshot",
	}
	dir := t.TempDir()
	writeTree(t, dir, files)

	m, err := HashDir(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	var wantBytes int64
	for _, c := range files {
		wantBytes += int64(len(c))
	}
	if len(m) != len(files) || m.Bytes() != wantBytes {
		t.Fatalf("HashDir: %d entries, %d bytes; want %d, %d", len(m), m.Bytes(), len(files), wantBytes)
	}
	for _, e := range m {
		c, ok := files[e.Path]
		if !ok {
			t.Fatalf("HashDir lists %q, which was not written", e.Path)
		}
		if want := fmt.Sprintf("%x", sha256.Sum256([]byte(c))); e.SHA256 != want || e.Size != int64(len(c)) {
			t.Errorf("%s: sha256 %s size %d, want %s %d", e.Path, e.SHA256, e.Size, want, len(c))
		}
	}
	if err := m.Write(dir); err != nil {
		t.Fatal(err)
	}

	// sha256sum's format: "<64 hex>  <path>", one per file, sorted by path.
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^([0-9a-f]{64})  (\S+)$`)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if !strings.HasSuffix(string(b), "\n") || len(lines) != len(files) {
		t.Fatalf("manifest:\n%s\nwant %d newline-terminated lines", b, len(files))
	}
	var paths []string
	for _, l := range lines {
		mm := line.FindStringSubmatch(l)
		if mm == nil {
			t.Fatalf("manifest line %q is not in sha256sum format", l)
		}
		if want := fmt.Sprintf("%x", sha256.Sum256([]byte(files[mm[2]]))); mm[1] != want {
			t.Errorf("manifest line %q: want sha256 %s", l, want)
		}
		paths = append(paths, mm[2])
	}
	if !slices.IsSorted(paths) {
		t.Errorf("manifest paths %v are not sorted", paths)
	}
	read, err := ReadManifest(dir)
	if err != nil || len(read) != len(files) {
		t.Fatalf("ReadManifest = %v, %v", read, err)
	}

	got, err := VerifyManifest(t.Context(), dir)
	if err != nil {
		t.Fatalf("VerifyManifest of an unchanged dir: %v", err)
	}
	if len(got) != len(files) {
		t.Errorf("VerifyManifest hashed %d files, want %d (the manifest itself not among them)", len(got), len(files))
	}

	// Modify one, add one, delete one: each is named.
	writeTree(t, dir, map[string]string{
		"member/wal/0.wal": "first segment, changed",
		"member/wal/2.wal": "new",
	})
	if err := os.Remove(filepath.Join(dir, "member", "snap", "a.snap")); err != nil {
		t.Fatal(err)
	}
	_, err = VerifyManifest(t.Context(), dir)
	assertErrContains(t, err,
		"manifest check failed",
		"member/wal/0.wal: sha256 "+fmt.Sprintf("%x", sha256.Sum256([]byte("first segment, changed"))),
		"member/wal/2.wal: not in the manifest",
		"member/snap/a.snap: missing",
	)
	for _, unchanged := range []string{"version.txt", "member/snap/db", "member/wal/1.wal"} {
		if strings.Contains(err.Error(), unchanged) {
			t.Errorf("error names %s, which did not change: %v", unchanged, err)
		}
	}
}

func TestReadManifestErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		manifest *string
		wantErr  []string
	}{
		{name: "none", manifest: nil, wantErr: []string{"has no manifest"}},
		{name: "short sum", manifest: ptr("abc  member/snap/db\n"), wantErr: []string{"malformed line", "abc  member/snap/db"}},
		{name: "one space", manifest: ptr(strings.Repeat("a", 64) + " member/snap/db\n"), wantErr: []string{"malformed line"}},
		{name: "no path", manifest: ptr(strings.Repeat("a", 64) + "  \n"), wantErr: []string{"malformed line"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.manifest != nil {
				writeTree(t, dir, map[string]string{ManifestName: *tc.manifest})
			}
			got, err := ReadManifest(dir)
			assertErrContains(t, err, tc.wantErr...)
			if got != nil {
				t.Errorf("got %v with the error", got)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
