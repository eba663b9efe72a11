package proxy

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"
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
			err := anon.take(1)
			if !errors.Is(err, errBodyBudget) {
				t.Fatalf("unverified writes took %d bytes, want %d at most (err %v)", tc.wantUnverified+1, tc.wantUnverified, err)
			}
			if !tc.verifies && errors.Is(err, errUnverifiedBudget) {
				t.Errorf("a proxy that verifies no certificate refused for the unverified clients' share: %v", err)
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

// TestWriteBodyReservedAsReceived: a body holds of the budget what it has received and at most
// a bounded chunk more (64 KiB), or its announced length, whichever is less: a client that sends
// 1 MiB of a body announced as 3 MiB must not hold 2 MiB until --write-body-timeout.
func TestWriteBodyReservedAsReceived(t *testing.T) {
	const chunk = 64 << 10
	cases := []struct {
		name   string
		length int64 // announced; -1: unknown (chunked)
		send   int
	}{
		{"1 MiB of 3 MiB", 3 << 20, 1 << 20},
		{"1 MiB and a byte of 3 MiB", 3 << 20, 1<<20 + 1},
		{"2 MiB of 3 MiB", 3 << 20, 2 << 20},
		{"100 KiB of 3 MiB", 3 << 20, 100 << 10},
		{"1 MiB of an unknown length", -1, 1 << 20},
		{"all but the last byte of 100 KiB", 100 << 10, 100<<10 - 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			budget := newBodyBudget(16<<20, 4<<20, false)
			var held int64
			cut := iotest.ErrReader(io.ErrUnexpectedEOF)
			src := io.MultiReader(bytes.NewReader(make([]byte, tc.send)), readerFunc(func(p []byte) (int, error) {
				held = budget.used.Load() // when the client has sent all it will
				return cut.Read(p)
			}))
			r := httptest.NewRequest(http.MethodPost, "/api/v1/namespaces/d/configmaps", src)
			r.ContentLength = tc.length
			if _, _, err := readWriteBody(httptest.NewRecorder(), r, bodyLimits{max: 4 << 20, timeout: time.Second, budget: budget}, false); err == nil {
				t.Fatal("a body cut short was read without an error")
			}
			limit := int64(tc.send + chunk)
			if tc.length > 0 {
				limit = min(limit, tc.length)
			}
			if held > limit {
				t.Errorf("after %d bytes received the body held %d bytes of the budget, want at most %d", tc.send, held, limit)
			}
			if n := budget.used.Load(); n != 0 {
				t.Errorf("%d bytes still reserved after the body failed", n)
			}
		})
	}
}

// TestWriteBodyRead: bodies are read whole, whatever their size against the buffer's steps, with
// or without an announced length; one byte past --max-write-body-bytes is 413.
func TestWriteBodyRead(t *testing.T) {
	const maxBody = 300_000
	for _, size := range []int{1, 511, 512, 513, 1536, 64 << 10, 64<<10 + 1, 200_000, maxBody, maxBody + 1} {
		for _, known := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d/known=%v", size, known), func(t *testing.T) {
				want := make([]byte, size)
				for i := range want {
					want[i] = byte(i * 7)
				}
				budget := newBodyBudget(1<<20, maxBody, false)
				r := httptest.NewRequest(http.MethodPost, "/api/v1/namespaces/d/configmaps", iotest.HalfReader(bytes.NewReader(want)))
				r.ContentLength = -1
				if known {
					r.ContentLength = int64(size)
				}
				got, res, err := readWriteBody(httptest.NewRecorder(), r, bodyLimits{max: maxBody, timeout: time.Second, budget: budget}, false)
				if size > maxBody {
					if !errors.Is(err, errBodyTooLarge) {
						t.Fatalf("a %d-byte body past the %d limit: err %v, want errBodyTooLarge", size, maxBody, err)
					}
					return
				}
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("read %d of %d bytes (equal %v), err %v", len(got), size, bytes.Equal(got, want), err)
				}
				if held := budget.used.Load(); held < int64(size) || held > int64(size)+64<<10 {
					t.Errorf("a %d-byte body read holds %d bytes of the budget", size, held)
				}
				res.release()
				if n := budget.used.Load(); n != 0 {
					t.Errorf("%d bytes still reserved after release", n)
				}
			})
		}
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
