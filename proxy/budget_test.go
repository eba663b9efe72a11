package proxy

import (
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestWriteBodyBudgetVerifiedFloor: writes from clients whose certificate the proxy verified
// (kubelets, kube-controller-manager, kube-scheduler) must not be starved of
// --max-buffered-write-bytes by clients it did not verify (anonymous, bearer tokens), which
// reach it before any authentication. Unverified clients on four connections, each holding all
// but the last byte of a largest body, fill what they may of the budget; a node's lease renewal
// then still gets 200, while one more unverified write gets 429. Verified clients may fill the
// whole budget: they are trusted not to starve one another.
func TestWriteBodyBudgetVerifiedFloor(t *testing.T) {
	const maxBody = 1 << 20
	cases := []struct {
		name      string
		filler    string // who holds the stalled bodies: anonymous, token or certificate
		wantUsed  int64  // budget reserved once they are in
		wantNode  int    // a node's 400-byte lease renewal, over a certificate
		wantOther int    // an anonymous 100-byte write
	}{
		{"anonymous", "anonymous", 3 * maxBody, http.StatusOK, http.StatusTooManyRequests},
		{"bearer tokens", "token", 3 * maxBody, http.StatusOK, http.StatusTooManyRequests},
		{"certificates", "certificate", 4 * maxBody, http.StatusTooManyRequests, http.StatusTooManyRequests},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newIdentityFixture(t, func(o *Options, _ string) {
				o.MaxWriteBodyBytes, o.MaxBufferedWriteBytes = maxBody, 4*maxBody
			})
			node, _, _ := f.clientCA.issue(t, f.dir, "node", "system:node:n1", []string{"system:nodes"}, x509.ExtKeyUsageClientAuth)
			filler, _, _ := f.clientCA.issue(t, f.dir, "kcm", "system:kube-controller-manager", nil, x509.ExtKeyUsageClientAuth)
			for range 4 {
				c, header := f.h2Client(nil), http.Header{}
				switch tc.filler {
				case "token":
					header.Set("Authorization", "Bearer not-checked-by-the-proxy")
				case "certificate":
					c = f.h2Client(&filler)
				}
				openStalledStreamsWith(t, f, c, header, 1, maxBody, maxBody-1)
			}
			if got := f.p.bodyBudget.used.Load(); got != tc.wantUsed {
				t.Errorf("%s clients on 4 connections reserved %d bytes of %d, want %d", tc.filler, got, 4*maxBody, tc.wantUsed)
			}
			lease := f.proxyURL + "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"
			if got, b := putBody(t, f.h2Client(&node), "PUT", lease, 400); got != tc.wantNode {
				t.Errorf("a node's lease renewal = %d %s, want %d", got, b, tc.wantNode)
			}
			if got, b := putBody(t, f.h2Client(nil), "POST", f.proxyURL+"/api/v1/namespaces/default/configmaps", 100); got != tc.wantOther {
				t.Errorf("an anonymous write = %d %s, want %d", got, b, tc.wantOther)
			}
		})
	}
}

// putBody sends a write of size bytes with c and returns its status and body.
func putBody(t *testing.T, c *http.Client, method, url string, size int) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(strings.Repeat("x", size)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBodyBudgetShares: what writes from unverified clients may hold of the budget, and that a
// verified write may take the rest, but no more than the budget.
func TestBodyBudgetShares(t *testing.T) {
	cases := []struct {
		name                   string
		total, maxBody         int64
		verifies               bool
		wantUnverified         int64 // what unverified writes may hold
		wantVerifiedAfterwards int64 // what verified writes may then still take
	}{
		{"a quarter kept for verified clients", 400, 10, true, 300, 100},
		{"one largest body for unverified clients at least", 400, 350, true, 350, 50},
		{"the whole budget a largest body", 400, 400, true, 400, 0},
		{"no certificates verified: no share kept", 400, 10, false, 400, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBodyBudget(tc.total, tc.maxBody, tc.verifies)
			anon, node := reservation{budget: b}, reservation{budget: b, verified: true}
			if err := anon.take(tc.wantUnverified); err != nil {
				t.Fatalf("unverified writes could not take %d bytes: %v", tc.wantUnverified, err)
			}
			if err := anon.take(1); !errors.Is(err, errBodyBudget) {
				t.Fatalf("unverified writes took %d bytes, want %d at most (err %v)", tc.wantUnverified+1, tc.wantUnverified, err)
			}
			if err := node.take(tc.wantVerifiedAfterwards); err != nil {
				t.Fatalf("a verified write could not take the %d bytes left: %v", tc.wantVerifiedAfterwards, err)
			}
			if err := node.take(1); !errors.Is(err, errBodyBudget) {
				t.Fatalf("a verified write took more than the budget (err %v)", err)
			}
			anon.release()
			node.release()
			if b.used.Load() != 0 || b.unverified.Load() != 0 {
				t.Fatalf("after release: used %d, unverified %d, want 0", b.used.Load(), b.unverified.Load())
			}
		})
	}
}
