package cutover

import (
	"strings"
	"testing"
)

// TestV2KeysWithATTLMayHaveRunOut: the v2 migration's keys with a TTL are leases on green,
// which green's lessor expires from its start: by the verify step a subnet lease of 30 s may be
// gone, as it would have been on blue. The count checks that every key without one is there,
// and no more than the keys with one may be missing.
func TestV2KeysWithATTLMayHaveRunOut(t *testing.T) {
	cli := startTestEtcd(t)
	for _, k := range []string{"/coreos.com/network/config", "/registry/x/a"} {
		if _, err := cli.Put(t.Context(), k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	p, _ := validPlan(t)
	p.Green.Etcd.TLS = nil
	p.Green.Etcd.Members = []GreenMember{{Name: "g", ClientURL: cli.Endpoints()[0]}}
	wrote := map[string]int{"/coreos.com": 3, "/registry/x": 1} // two subnet leases expired since
	for _, tc := range []struct {
		name   string
		leased map[string]int
		want   string
	}{
		{"two of them had a TTL", map[string]int{"/coreos.com": 2}, ""},
		{"one of them had a TTL", map[string]int{"/coreos.com": 1}, "green etcd holds 1 keys under /coreos.com, the v2 migration wrote 3 (1 of them with a TTL"},
		{"a journal from before the TTL count", nil, "green etcd holds 1 keys under /coreos.com, the v2 migration wrote 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &runner{p: p, j: &Journal{V2Prefixes: wrote, V2Leased: tc.leased}}
			_, err := r.checkV2Keys(t.Context())
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkV2Keys = %v, want %q", err, tc.want)
			}
		})
	}
}
