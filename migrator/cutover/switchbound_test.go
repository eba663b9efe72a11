package cutover

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestSwitchTimeoutFitsTheDrain: a proxy answers a switch only after its drain (up to its
// --drain-timeout), and the cutover gives it that and some more; a timeouts.switch shorter
// than that cuts the switch off in the window, with the proxy switched and writes fenced until
// an operator resumes. The preflight refuses such a plan, naming both.
func TestSwitchTimeoutFitsTheDrain(t *testing.T) {
	for _, tc := range []struct {
		drain, sw time.Duration
		want      string
	}{
		{10 * time.Second, time.Minute, ""},
		{0, 10 * time.Second, ""}, // a proxy too old to say its drain: the step's time, as before
		{90 * time.Second, time.Minute, "--drain-timeout 1m30s"},
		{20 * time.Second, 30 * time.Second, "timeouts.switch (30s)"},
	} {
		p, _ := validPlan(t)
		p.Timeouts.Switch = Duration(tc.sw)
		err := checkSwitchFitsDrain(p, admin.Status{DrainTimeout: admin.Duration(tc.drain)})
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("drain %s, switch %s: %v; want %q", tc.drain, tc.sw, err, tc.want)
		}
	}
}

// TestSwitchBackWaitsForTheDrain: a proxy switched back (a partial switch undone) drains the
// watches it had just moved before it answers, as a switch does: it gets as long as its switch
// would, not a fixed minute that a long --drain-timeout outlasts, leaving it on the new backend
// while the others are back.
func TestSwitchBackWaitsForTheDrain(t *testing.T) {
	shortProxyAnswers(t, 100*time.Millisecond)
	defer func(d time.Duration) { switchBackTimeout = d }(switchBackTimeout)
	switchBackTimeout = 100 * time.Millisecond
	slow := funcProxy{setBackend: func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
		select {
		case <-time.After(400 * time.Millisecond): // its drain
			return admin.BackendResponse{}, nil
		case <-ctx.Done():
			return admin.BackendResponse{}, ctx.Err()
		}
	}}
	if _, err := switchBackOf(t.Context(), slow, admin.BackendRequest{URL: "https://blue:6443"}, time.Second); err != nil {
		t.Fatalf("switch back of a proxy draining for 400ms with --drain-timeout 1s: %v", err)
	}
}
