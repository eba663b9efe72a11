package cutover

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/policy"
)

// TestShippedExamples parses every example in deploy/examples. The plans name files of a real
// cluster, so only "no such file" problems are expected of them here, plus, for the v2 example,
// the refusal of a migration mode that does not exist yet.
func TestShippedExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "examples")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	plans := 0
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.Contains(string(data), "kind: FencePolicy"):
			if _, err := policy.Parse(data); err != nil {
				t.Errorf("%s: %v", e.Name(), err)
			}
		case strings.Contains(string(data), "kind: CutoverPlan"):
			plans++
			_, err := ParsePlan(data)
			var unexpected []string
			for _, line := range strings.Split(errString(err), "\n") {
				switch {
				case line == "", strings.Contains(line, "no such file or directory"), strings.Contains(line, "is not a directory"):
				case strings.Contains(line, "is not an etcd member data dir"): // a path of the example's machine
				default:
					unexpected = append(unexpected, line)
				}
			}
			if len(unexpected) > 0 {
				t.Errorf("%s: %s", e.Name(), strings.Join(unexpected, "\n"))
			}
		default:
			t.Errorf("%s: neither a FencePolicy nor a CutoverPlan", e.Name())
		}
	}
	if plans < 2 {
		t.Errorf("found %d example plans", plans)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) {
		var b strings.Builder
		for _, e := range j.Unwrap() {
			b.WriteString(e.Error() + "\n")
		}
		return b.String()
	}
	return err.Error()
}
