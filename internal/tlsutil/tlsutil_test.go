package tlsutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadCAPool(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A file larger than any CA bundle: sparse, so that nothing is written to disk.
	huge := filepath.Join(dir, "huge.pem")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(maxCABundleBytes + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	cases := []struct{ name, path, want string }{
		{"no certificate", empty, "holds no PEM certificate"},
		{"missing file", filepath.Join(dir, "missing.pem"), "read CA bundle"},
		{"too large", huge, "larger than"},
		{"a device", os.DevNull, "not a regular file"},
		{"a directory", dir, "not a regular file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := LoadCAPool(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadCAPool(%s) = %v, want an error saying %q", tc.path, err, tc.want)
			}
		})
	}
}
