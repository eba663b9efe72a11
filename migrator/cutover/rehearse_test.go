package cutover

import (
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestRehearsalPrediction: the predicted window adds up what the window does besides the drain
// — the writes in flight at the fence (blue's median latency), a journal save per step from the
// fence to the unfence and a state save per proxy change (fence, switch, unfence), the round
// trips — so that it is not a tenth of the window that follows (4 ms predicted against 94 ms
// in `make demo` before).
func TestRehearsalPrediction(t *testing.T) {
	if n := windowSteps(replicateSteps); n != 6 {
		t.Errorf("replicate: %d steps from the fence to the unfence, want 6 (fence, drain, switch, stop-replication, ungate-green, unfence)", n)
	}
	if n := windowSteps(bakeSteps); n != 7 {
		t.Errorf("bake: %d steps from the fence to the unfence, want 7 (fence, drain, switch, gate-blue, hand-over, ungate-green, unfence)", n)
	}
	cases := []struct {
		took []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{5 * time.Millisecond}, 5 * time.Millisecond},
		{[]time.Duration{40 * time.Millisecond, 2 * time.Millisecond, 9 * time.Millisecond, 600 * time.Millisecond, 7 * time.Millisecond}, 9 * time.Millisecond},
	}
	for _, tc := range cases {
		var ws []admin.ForwardedWrite
		for _, d := range tc.took {
			ws = append(ws, admin.ForwardedWrite{Took: admin.Duration(d)})
		}
		if got := medianTook(ws); got != tc.want {
			t.Errorf("median of %v: %s, want %s", tc.took, got, tc.want)
		}
	}
	m := Rehearsal{Barrier: 9 * time.Millisecond, Drain: 2 * time.Millisecond, Check: time.Millisecond, ProxyRoundTrip: time.Millisecond,
		EtcdRoundTrip: 4 * time.Millisecond, StateSave: 2 * time.Millisecond, WindowSteps: 6, WatchMove: 100 * time.Millisecond}
	m.predict()
	if want := (9 + 2 + 1 + 3 + 4 + 9*2 + 100) * time.Millisecond; m.PredictedWindow != want {
		t.Errorf("predicted %s, want %s", m.PredictedWindow, want)
	}
	m.WatchMoveError = "forbidden"
	if got := m.WatchMoveText(); got != "not timed, left out (forbidden)" {
		t.Errorf("watch move %q, want it said as left out, with why", got)
	}
}
