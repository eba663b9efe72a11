package proxy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestAlertRulesNameRealMetrics: the alerting rules shipped in deploy/prometheus read metrics
// this proxy exports, under those names, and decisions it counts: a metric renamed here would
// otherwise leave an alert that never fires. (promtool checks their syntax and runs their tests:
// make alerts-check.)
func TestAlertRulesNameRealMetrics(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", "kubefence-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, newFakeAPI(t, "blue").URL)
	do(t, "GET", p.url+"/api/v1/namespaces/default/configmaps") // a labelled vector shows once it has a sample
	families, err := p.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}
	names := regexp.MustCompile(`kubefence_[a-z_]+`).FindAllString(string(rules), -1)
	if len(names) == 0 {
		t.Fatal("the rules name no kubefence metric")
	}
	for _, n := range names {
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] {
				base = b
			}
		}
		if !exported[base] {
			t.Errorf("the rules read %s, which the proxy does not export", n)
		}
	}
	decisions := []string{decisionForwarded, decisionRefused, decisionAbandoned, decisionRejected, decisionUnavailable, decisionUnauthenticated, decisionBackendFailed}
	for _, m := range regexp.MustCompile(`decision="([^"]*)"`).FindAllStringSubmatch(string(rules), -1) {
		if !slices.Contains(decisions, m[1]) {
			t.Errorf("the rules select decision %q, which kubefence_requests_total never has", m[1])
		}
	}
}
