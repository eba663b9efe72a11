package cutover

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestPreflightChecksTheAllowList: a proxy that would refuse 'backend set' to the green
// apiserver it is switched to (and, with a bake, to the blue one a rollback goes back to) stops
// the cutover at the preflight, naming the proxy and the flag to fix; at the switch, inside the
// window, it would abort the cutover. A proxy that does not report its allow-list is not judged.
func TestPreflightChecksTheAllowList(t *testing.T) {
	p, _ := validPlan(t)
	blue, green := sameURL(p.Blue.APIServer.URL), sameURL(p.Green.APIServer.URL)
	const own = "https://10.0.0.11:7443"
	cases := []struct {
		name       string
		switchable *admin.Switchable
		greenURL   string // the proxy's own green apiserver, if not the plan's
		bake       bool
		wantErr    string
	}{
		{"green allowed", &admin.Switchable{Upstream: blue, AllowedBackends: []string{green}}, "", false, ""},
		{"green not allowed", &admin.Switchable{Upstream: blue, AllowedBackends: []string{"https://192.0.2.1:*"}}, "", false, "would refuse to switch to " + green},
		{"nothing allowed", &admin.Switchable{Upstream: blue}, "", false, "--allowed-backends"},
		{"its own green allowed", &admin.Switchable{Upstream: blue, AllowedBackends: []string{"https://10.0.0.11:*"}}, own, false, ""},
		{"the plan's green but not its own", &admin.Switchable{Upstream: blue, AllowedBackends: []string{green}}, own, false, "would refuse to switch to " + own},
		{"bake, blue not --upstream nor allowed", &admin.Switchable{Upstream: "https://192.0.2.9:6443", AllowedBackends: []string{green}}, "", true, "would refuse to switch to " + blue},
		{"bake, blue is --upstream", &admin.Switchable{Upstream: blue, AllowedBackends: []string{green}}, "", true, ""},
		{"an older proxy", nil, "", false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			p.Bake.Enabled = tc.bake
			p.Green.APIServer.URL = green
			var calls []string
			st := &admin.Status{Backend: blue, APILevel: admin.APILevel, Switchable: tc.switchable}
			px := routeProxy(memProxy(st, &calls), p, ProxyRef{AdminSocket: "a", GreenURL: tc.greenURL})
			r := &runner{p: p, adm: &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "a", Client: px}}}, j: &Journal{}}
			err := r.checkProxiesAllowSwitch(t.Context())
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "proxy a")):
				t.Fatalf("error %v, want one naming proxy a and %q", err, tc.wantErr)
			}
		})
	}
}

// TestPreflightChecksTheSwitchBackCA: with green.apiserver.caFile set and blue's not, a switch
// back to blue (a partial switch undone, an abort after it, a rollback) sends no CA, which keeps
// the proxy's current one, green's: the preflight checks that it verifies blue's serving
// certificate, and refuses a cutover whose way back would fail inside the window otherwise. Not
// at parse time: a plan of a cutover already under way must still be read by abort, rollback,
// finish and --resume.
func TestPreflightChecksTheSwitchBackCA(t *testing.T) {
	blue := httptest.NewTLSServer(http.NotFoundHandler())
	defer blue.Close()
	dir := t.TempDir()
	bluesCA := writeFile(t, dir, "blue-ca.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: blue.Certificate().Raw})))
	other := newTestCA(t, dir, "green-ca").file
	for _, tc := range []struct {
		name, greenCA, blueCA string
		want                  string // "" for none
	}{
		{"green's CA verifies blue too", bluesCA, "", ""},
		{"green's CA does not verify blue", other, "", "blue.apiserver.caFile"},
		{"blue's CA given", other, bluesCA, ""},
		{"no CA given", "", "", ""},
		{"blue on plain http", other, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			p.Blue.APIServer.URL = blue.URL
			if tc.name == "blue on plain http" {
				p.Blue.APIServer.URL = strings.Replace(blue.URL, "https:", "http:", 1)
			}
			p.Green.APIServer.CAFile, p.Blue.APIServer.CAFile = tc.greenCA, tc.blueCA
			err := checkSwitchBackCA(t.Context(), p)
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkSwitchBackCA = %v, want %q", err, tc.want)
			}
		})
	}
}
