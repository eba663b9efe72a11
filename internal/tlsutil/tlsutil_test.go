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
	if _, err := LoadCAPool(empty); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("no certificate: %v", err)
	}
	if _, err := LoadCAPool(filepath.Join(dir, "missing.pem")); err == nil || !strings.Contains(err.Error(), "read CA bundle") {
		t.Errorf("missing file: %v", err)
	}
}
