package datadir

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

// ManifestName is the manifest a copy or backup carries, in sha256sum's format, so
// `cd DIR && sha256sum -c kubefence-manifest.sha256` checks it without kubefence.
const ManifestName = "kubefence-manifest.sha256"

// ManifestEntry is one file: its path relative to the dir (slash-separated), sha256 and size.
type ManifestEntry struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Manifest lists a dir's regular files.
type Manifest []ManifestEntry

// Bytes is the total size.
func (m Manifest) Bytes() int64 {
	var n int64
	for _, e := range m {
		n += e.Size
	}
	return n
}

// Write writes the manifest (sorted by path) into dir/ManifestName, atomically.
func (m Manifest) Write(dir string) error {
	sort.Slice(m, func(i, j int) bool { return m[i].Path < m[j].Path })
	var b strings.Builder
	for _, e := range m {
		fmt.Fprintf(&b, "%s  %s\n", e.SHA256, e.Path)
	}
	return atomicfile.Write(filepath.Join(dir, ManifestName), []byte(b.String()), 0o600)
}

// ownFile reports whether rel (relative to a copy or backup) is one of kubefence's own files,
// which a manifest does not list and a copy or restore leaves out.
func ownFile(rel string) bool { return rel == ManifestName || rel == BackupInfoName }

// HashDir computes the manifest of every regular file under dir (kubefence's own files excepted).
func HashDir(ctx context.Context, dir string) (Manifest, error) {
	var m Manifest
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || ownFile(rel) {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, ctxReader{ctx, f})
		if err != nil {
			return err
		}
		m = append(m, ManifestEntry{Path: filepath.ToSlash(rel), SHA256: fmt.Sprintf("%x", h.Sum(nil)), Size: n})
		return nil
	})
	sort.Slice(m, func(i, j int) bool { return m[i].Path < m[j].Path })
	return m, err
}

// ReadManifest reads dir/ManifestName.
func ReadManifest(dir string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, fmt.Errorf("%s has no manifest (%w): it was not written by kubefence, or is incomplete", dir, err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, path, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 || path == "" {
			return nil, fmt.Errorf("%s: malformed line %q", filepath.Join(dir, ManifestName), sc.Text())
		}
		out[path] = sum
	}
	return out, sc.Err()
}

// VerifyManifest checks that dir holds exactly the files its manifest lists, with their
// sha256, and names every difference.
func VerifyManifest(ctx context.Context, dir string) (Manifest, error) {
	want, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	got, err := HashDir(ctx, dir)
	if err != nil {
		return nil, err
	}
	return got, Compare(want, got)
}

// Compare names every file that differs between a manifest and a dir's hashes.
func Compare(want map[string]string, got Manifest) error {
	var errs []error
	seen := map[string]bool{}
	for _, e := range got {
		seen[e.Path] = true
		switch sum, ok := want[e.Path]; {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: not in the manifest", e.Path))
		case sum != e.SHA256:
			errs = append(errs, fmt.Errorf("%s: sha256 %s, the manifest says %s", e.Path, e.SHA256, sum))
		}
	}
	for p := range want {
		if !seen[p] {
			errs = append(errs, fmt.Errorf("%s: missing", p))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("manifest check failed: %w", errors.Join(errs...))
	}
	return nil
}

// Map is the manifest as path → sha256.
func (m Manifest) Map() map[string]string {
	out := make(map[string]string, len(m))
	for _, e := range m {
		out[e.Path] = e.SHA256
	}
	return out
}
