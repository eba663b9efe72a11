package replicate

import (
	"testing"
	"time"
)

// TestProgressLag: the lag in seconds runs from when the oldest unapplied revision was first
// seen, not from when replication first fell behind; the rate counts applied revisions.
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
	// samples at +4 s (2 revisions counted), +5 s, +6 s, +7 s (5): 3 revisions in 3 s
	if p.RevisionsPerSecond != 1 {
		t.Fatalf("rate %.2f revisions/s, want 1", p.RevisionsPerSecond)
	}
}
