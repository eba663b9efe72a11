// Package framework starts real etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// kubectl and kubefence processes for the end-to-end tests and the demo: free loopback ports,
// data under temp dirs, a kubeadm-style PKI, logs kept when something fails. Binaries come from
// `make e2e-deps` (hack/e2e-deps.sh).
package framework

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kubefence/kubefence/internal/testenv"
)

// Pinned component versions; hack/e2e-deps.sh builds or installs exactly these.
const (
	Etcd34  = "3.4.23"
	Etcd35  = "3.5.35"
	Etcd36  = "3.6.16"
	Kube136 = "1.36.4"
)

// BinDir is where `make e2e-deps` puts the binaries.
func BinDir() string {
	if d := os.Getenv("KUBEFENCE_BIN_DIR"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "kubefence", "bin")
}

// ErrMissingBinary says a component is not installed; the message names the make target.
var ErrMissingBinary = errors.New("missing e2e binary")

// BinPath is where `make e2e-deps` puts component-version (e.g. "kubectl", "1.36.4"), whether
// it is there or not.
func BinPath(component, version string) string {
	return filepath.Join(BinDir(), component+"-"+version)
}

// Bin returns the path of component-version (e.g. "etcd", "3.4.23"), or an error that says how
// to install it.
func Bin(component, version string) (string, error) {
	p := BinPath(component, version)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: %s not found (run 'make e2e-deps' to install the pinned etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl)", ErrMissingBinary, p)
	}
	return p, nil
}

// ControlPlaneBins are the RequireBins pairs of the tests that run kube-controller-manager and
// kube-scheduler (StartControllerManager, StartScheduler) besides the apiserver.
var ControlPlaneBins = []string{"kube-controller-manager", Kube136, "kube-scheduler", Kube136}

// Skipper is the part of testing.TB that RequireBins uses.
type Skipper interface {
	Helper()
	Skipf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// RequireBins stops the test when a binary is missing: it fails under CI (testenv.InCI: $CI set
// to anything but "", "false" or "0"), where a missing dependency is a broken build, and skips
// with the make target to run elsewhere.
func RequireBins(t Skipper, pairs ...string) {
	t.Helper()
	var missing []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if _, err := Bin(pairs[i], pairs[i+1]); err != nil {
			missing = append(missing, pairs[i]+"-"+pairs[i+1])
		}
	}
	if len(missing) == 0 {
		return
	}
	testenv.SkipOrFail(t, fmt.Sprintf("e2e binaries missing from %s: %s; run 'make e2e-deps'", BinDir(), strings.Join(missing, ", ")))
}

// Kubefence returns the kubefence binary under test: $KUBEFENCE_BINARY, or one built from this
// module into dir.
func Kubefence(dir string) (string, error) {
	if p := os.Getenv("KUBEFENCE_BINARY"); p != "" {
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "kubefence")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/kubefence")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build kubefence: %v\n%s", err, b)
	}
	return out, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/kubefence/kubefence\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the kubefence module root from the working directory")
		}
		dir = parent
	}
}
