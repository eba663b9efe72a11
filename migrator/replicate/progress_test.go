package replicate

import (
	"testing"
	"time"
)

// TestProgressLag: the lag in seconds runs from when the oldest unapplied revision was first
// seen, not from when replication first fell behind; the rate counts applied revisions up to
// now, so a stall shows it falling to 0 rather than the last rate kept.
func TestProgressLag(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tr := tracker{applied: 10, source: 10}
	check := func(now time.Time, lagRevs int64, lagSecs float64) {
		t.Helper()
		p := tr.snapshot(now)
		if p.LagRevisions != lagRevs || p.LagSeconds != lagSecs {
			t.Fatalf("at +%s: lag %d revisions %.1f s, want %d / %.1f", now.Sub(t0), p.LagRevisions, p.LagSeconds, lagRevs, lagSecs)
		}
	}
	check(at(0), 0, 0)
	tr.sawSource(12, at(1*time.Second)) // 11, 12 seen at +1 s
	tr.sawSource(15, at(3*time.Second)) // 13..15 seen at +3 s
	check(at(4*time.Second), 5, 3)
	tr.didApply(11, at(4*time.Second))
	tr.didApply(12, at(4*time.Second))
	check(at(5*time.Second), 3, 2) // 13 is the oldest unapplied, seen at +3 s
	for rev := int64(13); rev <= 15; rev++ {
		tr.didApply(rev, at(time.Duration(rev-8)*time.Second)) // 13 at +5 s … 15 at +7 s
	}
	check(at(8*time.Second), 0, 0)
	p := tr.snapshot(at(8 * time.Second))
	if p.Revisions != 5 || p.Applied != 15 {
		t.Fatalf("%+v: want 5 revisions applied, at 15", p)
	}
	// samples at +4 s (2 revisions counted), +5 s, +6 s, +7 s (5), then nothing applied
	for _, c := range []struct {
		now  time.Duration
		rate float64
	}{
		{7 * time.Second, 1},      // 3 revisions in 3 s
		{8 * time.Second, 0.75},   // 3 in 4 s: stalled for a second
		{12 * time.Second, 0.375}, // 3 in 8 s
		{20 * time.Second, 0},     // nothing in the last 10 s
	} {
		if got := tr.snapshot(at(c.now)).RevisionsPerSecond; got != c.rate {
			t.Errorf("at +%s: rate %.3f revisions/s, want %.3f", c.now, got, c.rate)
		}
	}
}
