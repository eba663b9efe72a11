package cutover

import (
	"testing"

	"github.com/kubefence/kubefence/migrator/v2v3"
)

// TestCopyModeTakesOnlyV2Content: mode auto migrates v2 to v3 only for a member with v2
// content. etcd 3.4's /health reads in blue's WAL tail, which 3.6 refuses to replay, leave it a
// snapshot copy: green never replays that WAL. (copyV2Member needs a running blue; which WAL
// tails DetectV2 finds content in is v2v3's TestDetectV2AsEtcd36Does.)
func TestCopyModeTakesOnlyV2Content(t *testing.T) {
	qgets := v2v3.V2Findings{Why: "no v2 content (3 v3 keys)", Replay: "2 v2 requests without v2 content in the WAL after index 256 that etcd 3.6 refuses to replay (the first: QGET with no path (etcd 3.4's /health))"}
	for _, tc := range []struct {
		name, planned string
		found         v2v3.V2Findings
		want          string
	}{
		{"auto, /health reads in the WAL", "auto", qgets, "snapshot"},
		{"auto, nothing", "auto", v2v3.V2Findings{Why: "no v2 content (3 v3 keys)"}, "snapshot"},
		{"auto, v2 content", "auto", v2v3.V2Findings{Content: true, Why: "v2 keys in snapshot x.snap"}, "v2-to-v3"},
		{"v2-to-v3 asked for", "v2-to-v3", qgets, "v2-to-v3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := copyMode(tc.planned, tc.found); got != tc.want {
				t.Errorf("copyMode(%q, %+v) = %q, want %q", tc.planned, tc.found, got, tc.want)
			}
		})
	}
}
