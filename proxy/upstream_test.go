package proxy

import (
	"crypto/x509"
	"net/http"
	"testing"
)

// TestUpstreamHTTP2: requests reach a backend that offers HTTP/2 over HTTP/2, with and without
// a forwarded identity; an upgrade request goes over HTTP/1.1 (SPDY and WebSocket need it);
// with --upstream-http2=false everything goes over HTTP/1.1.
func TestUpstreamHTTP2(t *testing.T) {
	for _, tc := range []struct {
		name      string
		http2     bool
		wantProto int
	}{{"http2", true, 2}, {"http1-only", false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newIdentityFixture(t, func(o *Options, _ string) { o.UpstreamHTTP2 = tc.http2 })
			alice, _, _ := f.clientCA.issue(t, f.dir, "alice", "alice", nil, x509.ExtKeyUsageClientAuth)
			for _, c := range []*http.Client{f.client(nil), f.client(&alice)} {
				resp, err := c.Get(f.proxyURL + "/api/v1/namespaces/default/configmaps")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			req, _ := http.NewRequest(http.MethodGet, f.proxyURL+"/api/v1/namespaces/default/pods/p/exec?command=ls", nil)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "SPDY/3.1")
			resp, err := f.client(&alice).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			seen := f.backend.requests()
			if len(seen) != 3 {
				t.Fatalf("backend saw %d requests, want 3", len(seen))
			}
			for i, sr := range seen[:2] {
				if sr.protoMajor != tc.wantProto {
					t.Errorf("request %d reached the backend over HTTP/%d, want HTTP/%d", i, sr.protoMajor, tc.wantProto)
				}
			}
			if seen[2].protoMajor != 1 {
				t.Errorf("the upgrade reached the backend over HTTP/%d, want HTTP/1.1", seen[2].protoMajor)
			}
		})
	}
}
