package cutover

import (
	"strings"
	"testing"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestOlderProxyRefusedBeforeTheFence: a proxy that speaks an older admin API than this
// kubefence (it would answer 400 to a field the window's unfence sends, and leave writes fenced)
// is refused by the preflight and by the fence step, before anything is fenced; the group names
// the proxy and its version.
func TestOlderProxyRefusedBeforeTheFence(t *testing.T) {
	p, _ := validPlan(t)
	blue := strings.TrimSuffix(p.Blue.APIServer.URL, "/")
	cases := []struct {
		name    string
		levels  map[string]int
		wantErr string
	}{
		{"current", map[string]int{"a": admin.APILevel}, ""},
		{"one older", map[string]int{"a": admin.APILevel, "b": 0}, "b (kubefence v-b) speaks admin API level 0"},
		{"newer", map[string]int{"a": admin.APILevel + 1}, ""},
		// Level 1 knows fence off's expectBackend but not backend set's expectGeneration: it
		// would refuse the switch inside the window.
		{"level 1", map[string]int{"a": admin.APILevel, "b": 1}, "b (kubefence v-b) speaks admin API level 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := &proxyGroup{}
			var calls []string
			for _, name := range []string{"a", "b"} {
				lvl, ok := tc.levels[name]
				if !ok {
					continue
				}
				st := &admin.Status{Backend: blue, APILevel: lvl, Version: "v-" + name}
				g.proxies = append(g.proxies, admin.Target[proxyAdmin]{Name: name, Client: memProxy(st, &calls)})
			}
			r := &runner{p: p, adm: g, j: &Journal{}, journalDir: t.TempDir()}
			errs := map[string]error{"preflight": r.checkProxyOnBlue(t.Context())}
			_, errs["fence"] = fenceStep{}.run(t.Context(), r)
			for what, err := range errs {
				if tc.wantErr == "" && err != nil {
					t.Errorf("%s: %v", what, err)
				}
				if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "Upgrade the proxies")) {
					t.Errorf("%s: error %v, want %q and what to do", what, err, tc.wantErr)
				}
			}
			if tc.wantErr != "" && len(calls) > 0 {
				t.Errorf("the proxies were asked %v; an older proxy must stop the cutover before any change", calls)
			}
		})
	}
}
