package proxy

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestFencedWriteLogBounded: the lines logged for a refused or held write carry client-chosen
// text (User-Agent, name, namespace) cut short: a client sending a 200 KiB User-Agent must not
// make each refusal write 200 KiB of log.
func TestFencedWriteLogBounded(t *testing.T) {
	cases := []struct {
		mode  string
		lines []string // log messages the write must produce
	}{
		{admin.ModeRefuse, []string{"refused write: fence is on"}},
		{admin.ModeHold, []string{"held write: fence is on", "refused write: fence is on"}},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			f := newIdentityFixture(t, func(o *Options, _ string) { o.HoldTimeout = 100 * time.Millisecond })
			if _, err := f.p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Mode: tc.mode, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			ns, name := strings.Repeat("n", 10<<10), strings.Repeat("c", 10<<10)
			req, _ := http.NewRequest("PUT", f.proxyURL+"/api/v1/namespaces/"+ns+"/configmaps/"+name, strings.NewReader(`{}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("User-Agent", strings.Repeat("u", 200<<10))
			resp, err := f.client(nil).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("fenced write = %d, want 429", resp.StatusCode)
			}
			logs := f.logs.String()
			for _, msg := range tc.lines {
				found := false
				for line := range strings.Lines(logs) {
					if !strings.Contains(line, msg) {
						continue
					}
					found = true
					if len(line) >= 4<<10 {
						t.Errorf("%q logged in %d bytes, want under 4 KiB: %.300s...", msg, len(line), line)
					}
				}
				if !found {
					t.Errorf("no %q logged", msg)
				}
			}
		})
	}
}

// TestClipField: short strings are kept whole; long ones are cut at a character's start, within
// maxLoggedField bytes, and say their length.
func TestClipField(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"short", "kubelet/v1.31.0", "kubelet/v1.31.0"},
		{"at the limit", strings.Repeat("a", maxLoggedField), strings.Repeat("a", maxLoggedField)},
		{"past the limit", strings.Repeat("a", maxLoggedField+1), strings.Repeat("a", maxLoggedField) + "...(257 bytes)"},
		{"a character across the limit", strings.Repeat("a", maxLoggedField-1) + "é", strings.Repeat("a", maxLoggedField-1) + "...(257 bytes)"},
		{"not UTF-8: cut at the limit, not to nothing", strings.Repeat("\x80", maxLoggedField+1), strings.Repeat("\x80", maxLoggedField) + "...(257 bytes)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := clipField(tc.in); got != tc.want {
				t.Errorf("clipField = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestLetThroughWriteLogged: a write a policy rule lets through while fenced is logged, as
// refused and held ones are: after a snapshot cutover warns that such writes were in flight on
// blue at the switch, the proxy's log is where the operator finds which objects they were.
func TestLetThroughWriteLogged(t *testing.T) {
	api := newFakeAPI(t, "blue")
	dir := t.TempDir()
	o := NewOptions()
	o.Listen, o.InsecureListen, o.Upstream = "127.0.0.1:0", true, api.URL
	o.AdminSocket, o.StateFile = filepath.Join(dir, "admin.sock"), filepath.Join(dir, "state.json")
	o.PolicyFile = leasePolicy(t)
	logs := &syncBuf{}
	p := startProxyWith(t, o, logs)
	fenceOn(t, p, time.Second)
	if resp, _, err := doErr("PUT", p.url+testLeaseURL, "Content-Type", "application/json"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a lease update the policy allows: %v %v, want 200", resp, err)
	}
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "let through") && strings.Contains(line, "resource=leases.coordination.k8s.io") &&
			strings.Contains(line, "name=kube-scheduler") && strings.Contains(line, "leader-election") {
			return
		}
	}
	t.Errorf("no line names the write let through and its rule; the log:\n%s", logs.String())
}
