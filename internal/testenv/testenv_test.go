package testenv

import (
	"fmt"
	"testing"
)

// recorder is a TB that records whether the test was skipped or failed.
type recorder struct{ skipped, failed string }

func (r *recorder) Helper()                        {}
func (r *recorder) Skipf(format string, a ...any)  { r.skipped = fmt.Sprintf(format, a...) }
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

func TestSkipOrFail(t *testing.T) {
	for _, tc := range []struct {
		ci   string
		fail bool
	}{
		{"", false}, {"false", false}, {"0", false}, {"FALSE", false},
		{"true", true}, {"1", true}, {"yes", true}, {"TRUE", true},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{}
			SkipOrFail(r, "no etcd on PATH")
			if got := r.failed != ""; got != tc.fail || (r.failed == "") == (r.skipped == "") {
				t.Fatalf("CI=%q: failed %q, skipped %q; want failed %v", tc.ci, r.failed, r.skipped, tc.fail)
			}
		})
	}
}
