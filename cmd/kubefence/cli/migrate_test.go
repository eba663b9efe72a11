package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/v2v3"
)

// TestMigrateTTLClockNotInTheFuture: a --ttl-clock later than now drops every key expiring
// before it and gives the rest TTLs short by the difference (a local time written with "Z"
// east of UTC is such a clock): refused, saying what the clock must be. A clock within a
// minute of now (skew between machines) and one in the past pass this check.
func TestMigrateTTLClockNotInTheFuture(t *testing.T) {
	base := []string{"migrate", "v2-to-v3", "--name", "a", "--initial-cluster", "a=https://10.0.0.1:2380"}
	now := time.Now().UTC()
	for _, tc := range []struct {
		name    string
		clock   time.Time
		refused bool
	}{
		{"nine hours ahead", now.Add(9 * time.Hour), true},
		{"two minutes ahead", now.Add(2 * time.Minute), true},
		{"within the skew", now.Add(30 * time.Second), false},
		{"an hour ago", now.Add(-time.Hour), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(append(base, "--ttl-clock", tc.clock.Format(time.RFC3339))...)
			if code != ExitUsage {
				t.Fatalf("exit %d, want %d (usage): %s", code, ExitUsage, errOut)
			}
			refused := strings.Contains(errOut, "--ttl-clock") && strings.Contains(errOut, "in the future")
			if refused != tc.refused {
				t.Fatalf("--ttl-clock %s refused: %v, want %v: %s", tc.clock.Format(time.RFC3339), refused, tc.refused, errOut)
			}
			if refused {
				for _, want := range []string{"the time the source stopped", "not later than now", "+09:00"} {
					if !strings.Contains(errOut, want) {
						t.Errorf("the refusal does not say %q: %s", want, errOut)
					}
				}
			}
		})
	}
}

// TestMigrateReportComparesMembers: every member of a new cluster must be built from one source
// copy; the report gives what to compare across their runs (the source's commit index and the
// output's content digest), and the help says to build them all from one copy.
func TestMigrateReportComparesMembers(t *testing.T) {
	var out bytes.Buffer
	printMigrateReport(&out, &v2v3.Report{CommitIndex: 0x1234, ContentCRC: 0xdeadbeef})
	if !strings.Contains(out.String(), "content crc32c deadbeef") || !strings.Contains(out.String(), "commit index 4660") {
		t.Errorf("the report does not give the content digest and the source's commit index to compare:\n%s", out.String())
	}
	code, help, _ := runCLI("migrate", "v2-to-v3", "--help")
	if code != ExitOK || !strings.Contains(help, "from one source copy") {
		t.Errorf("the help does not say to build every member from one source copy (exit %d):\n%s", code, help)
	}
}
