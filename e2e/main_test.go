//go:build e2e

// Package e2e holds the end-to-end tests: real etcd, kube-apiserver, kubectl and kubefence
// processes started by the framework package. Run them with `make test` (or `make e2e`).
package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubefence/kubefence/e2e/framework"
)

// kubefenceBin is the binary under test, built once for the package.
var kubefenceBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kubefence-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kubefenceBin, err = framework.Kubefence(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Every kubectl the tests run (they inherit the environment) keeps its discovery cache here,
	// not in the shared $HOME/.kube/cache: no state from another run or another user's kubectl,
	// and nothing left behind. kubectl's --cache-dir defaults to $KUBECACHEDIR.
	if err := os.Setenv("KUBECACHEDIR", filepath.Join(dir, "kube-cache")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newEnv returns a framework.Env for the test. Its logs are kept, and their place printed, when
// the test fails; otherwise everything is removed. Every process is stopped at the end, and a
// process that outlives that fails the test.
// newEnvPKI is newEnv with a fresh PKI in the env's dir (serving certificates for extraIPs too).
func newEnvPKI(t *testing.T, extraIPs ...net.IP) (*framework.Env, *framework.PKI) {
	t.Helper()
	env := newEnv(t)
	pki, err := framework.NewPKI(env.Dir+"/pki", extraIPs...)
	if err != nil {
		t.Fatal(err)
	}
	return env, pki
}

func newEnv(t *testing.T) *framework.Env {
	t.Helper()
	env, err := framework.NewEnv("", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Close(); err != nil {
			t.Errorf("stopping processes: %v", err)
		}
		if left := env.Running(); len(left) > 0 {
			t.Errorf("processes left running: %v", left)
		}
		if t.Failed() {
			t.Logf("component logs kept in %s", env.LogDir)
			return
		}
		os.RemoveAll(env.Dir)
	})
	return env
}
