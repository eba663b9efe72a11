package cutover

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefence/kubefence/proxy/admin"
)

// endpointsWorld is blue's apiserver serving the kubernetes Service's EndpointSlice with the
// given endpoints at :6443, and one proxy (on this host, through its socket) listening on listen.
func endpointsWorld(t *testing.T, listen string, endpoints ...string) *runner {
	t.Helper()
	port := int32(6443)
	sl := discoveryv1.EndpointSliceList{Items: []discoveryv1.EndpointSlice{{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"},
		Endpoints:  []discoveryv1.Endpoint{{Addresses: endpoints}},
		Ports:      []discoveryv1.EndpointPort{{Port: &port}},
	}}}
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(sl)
	}))
	t.Cleanup(api.Close)
	p, dir := validPlan(t)
	p.Blue.APIServer.Kubeconfig = writeKubeconfig(t, dir, "blue.conf", api.URL)
	px := funcProxy{status: func(context.Context) (admin.Status, error) {
		return speaking(admin.Status{Listen: listen}), nil
	}}
	g := &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "/run/kubefence/admin.sock", Client: px}}}
	return &runner{p: p, adm: g}
}

// TestServiceEndpointIsBlue: a proxy on a load-balancer host listening on every address
// (--listen=0.0.0.0:6443, deploy/systemd/proxy.env.example) does not make blue's own apiserver
// at the same port a proxy: the kubernetes Service's endpoint that is blue.apiserver.url is
// in-cluster clients going around the proxies, and the preflight names it.
func TestServiceEndpointIsBlue(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:6443", "[::]:6443", ":6443"} {
		r := endpointsWorld(t, listen, "10.0.0.1")
		r.p.Blue.APIServer.URL = "https://10.0.0.1:6443"
		problems, _ := r.checkServiceEndpoints(t.Context())
		if len(problems) != 1 || !strings.Contains(problems[0], "10.0.0.1:6443") || !strings.Contains(problems[0], "blue.apiserver.url") {
			t.Errorf("proxy on %s, endpoint blue's apiserver: problems %q, want the endpoint named as blue.apiserver.url", listen, problems)
		}
	}
}

// TestEndpointJudge: an endpoint is a proxy if a proxy listens on its address, or on every
// address at its port on a host the endpoint is known to be; never if the plan names it as an
// apiserver; undecided (a warning naming it) when only a wildcard listen on an unknown host
// could make it one.
func TestEndpointJudge(t *testing.T) {
	lb := proxyListen{proxy: "https://10.0.0.5:9446", listen: "0.0.0.0:6443", hostIPs: []string{"10.0.0.5"}}
	apiservers := map[string]string{"10.0.0.10:6443": "blue.apiserver.url", "10.0.0.11:6443": "proxies[1].blueURL"}
	cases := []struct {
		name    string
		addr    string
		listens []proxyListen
		want    endpointVerdict
		says    string
	}{
		{"exact listen", "10.0.0.20:6443", []proxyListen{{proxy: "a", listen: "10.0.0.20:6443"}}, endpointProxy, ""},
		{"blue behind a wildcard", "10.0.0.10:6443", []proxyListen{lb}, endpointNotProxy, "is blue.apiserver.url, an apiserver"},
		{"a proxy's blueURL behind a wildcard", "10.0.0.11:6443", []proxyListen{{proxy: "b", listen: "[::]:6443"}}, endpointNotProxy, "proxies[1].blueURL"},
		{"wildcard on the endpoint's host", "10.0.0.5:6443", []proxyListen{lb}, endpointProxy, ""},
		{"wildcard on another host", "10.0.0.30:6443", []proxyListen{lb}, endpointUndecided, "cannot tell whether the kubernetes Service's endpoint 10.0.0.30:6443 is a proxy"},
		{"wildcard without a host", "10.0.0.30:6443", []proxyListen{{proxy: "/run/kubefence/admin.sock", listen: ":6443"}}, endpointUndecided, "--listen=10.0.0.30:6443"},
		{"loopback listen", "10.0.0.20:6443", []proxyListen{{proxy: "a", listen: "127.0.0.1:6443"}}, endpointNotProxy, "is not a proxy (127.0.0.1:6443)"},
		{"other port", "10.0.0.5:6444", []proxyListen{lb}, endpointNotProxy, "is not a proxy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, why := endpointJudge{listens: tc.listens, apiservers: apiservers}.judge(tc.addr)
			if got != tc.want || !strings.Contains(why, tc.says) {
				t.Errorf("%s: verdict %d %q, want %d with %q", tc.addr, got, why, tc.want, tc.says)
			}
		})
	}
}

// TestServiceEndpointUndecided: an endpoint only a wildcard listen on an unknown host could
// make a proxy does not fail the preflight, and is named in a note.
func TestServiceEndpointUndecided(t *testing.T) {
	r := endpointsWorld(t, "0.0.0.0:6443", "192.0.2.77")
	problems, notes := r.checkServiceEndpoints(t.Context())
	if len(problems) != 0 || len(notes) != 1 || !strings.Contains(notes[0], "192.0.2.77:6443") {
		t.Errorf("problems %q, notes %q: want one note naming 192.0.2.77:6443", problems, notes)
	}
}
