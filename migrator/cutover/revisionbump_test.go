package cutover

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestSwitchRefusesABumpBlueOutgrew: green starts at the snapshot's revision S plus
// migration.revisionBump, marked compacted, so that every resourceVersion a client read from
// blue is at or below it (a watch from there relists). Blue moves on while fenced (its
// apiservers' own leases, writes a policy rule lets through): past S+bump, clients hold
// resourceVersions green gives its own history, and the switch is refused, saying to raise the
// bump; within it, the switch goes on.
func TestSwitchRefusesABumpBlueOutgrew(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bump   int64
		writes int // blue's revisions after the snapshot
		want   string
	}{
		{"within the bump", 10, 5, ""},
		{"up to the bump", 5, 5, ""},
		{"past the bump", 3, 5, "raise migration.revisionBump"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blue := startTestEtcd(t)
			p, _ := validPlan(t)
			p.Migration.Mode, p.Migration.RevisionBump = "snapshot", tc.bump
			p.Blue.Etcd.Endpoints = blue.Endpoints()
			snap, err := blue.Put(t.Context(), "/registry/k", "v")
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.writes {
				if _, err := blue.Put(t.Context(), fmt.Sprintf("/registry/leases/%d", i), "v"); err != nil {
					t.Fatal(err)
				}
			}
			st := &admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 2}
			var calls []string
			r := (&runner{p: p, adm: memProxy(st, &calls), j: &Journal{ID: "x", State: StateRunning, FenceGeneration: 2, SnapshotRevision: snap.Header.Revision}}).forward()
			_, err = switchStep{}.run(t.Context(), r)
			switched := slices.Contains(calls, "backend "+p.Green.APIServer.URL)
			if tc.want == "" {
				if err != nil || !switched {
					t.Fatalf("switch: %v, calls %v; want it switched", err, calls)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || switched {
				t.Fatalf("switch: %v, calls %v; want it refused (%q) and nothing switched", err, calls, tc.want)
			}
			want := fmt.Sprintf("revision %d", snap.Header.Revision+int64(tc.writes))
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: does not say blue's %s", err, want)
			}
		})
	}
}
