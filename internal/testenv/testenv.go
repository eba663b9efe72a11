// Package testenv holds the one rule the project's tests follow when something they need is
// not there: under CI a missing dependency is a broken build and fails the test; elsewhere the
// test is skipped, saying what it needs.
package testenv

import (
	"os"
	"strings"
)

// TB is the part of testing.TB that SkipOrFail uses.
type TB interface {
	Helper()
	Skipf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// InCI reports whether the tests run under CI: $CI set to anything but "", "false" or "0"
// (CI systems set CI=true, some CI=1).
func InCI() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv("CI"))) {
	case "", "false", "0":
		return false
	}
	return true
}

// SkipOrFail stops the test for want of what why names: it fails under CI (see InCI) and skips
// elsewhere.
func SkipOrFail(t TB, why string) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s (CI=%s: a missing dependency fails the run)", why, os.Getenv("CI"))
		return // for a TB whose Fatalf returns
	}
	t.Skipf("%s", why)
}
