package cutover

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// TestDrainOutOfTimeWhileApplyingBlamesTheLag: a drain that runs out of the window while green
// applies steadily (a lag larger than the window drains) is not "green applied none of the
// revisions": the note said so whenever green was behind what blue's watch delivered, sending
// the operator to green's disk when the cause is the lag at the fence.
func TestDrainOutOfTimeWhileApplyingBlamesTheLag(t *testing.T) {
	w := newLiveWorld(t, replicateSteps, replicate.Config{OnApplied: func(replicate.Progress) { time.Sleep(50 * time.Millisecond) }})
	for i := range 30 {
		put(t, w.blue, fmt.Sprintf("k%d", i), "v")
	}
	w.r.p.Timeouts.Window = Duration(300 * time.Millisecond)
	w.r.fencedMono = time.Now()
	w.r.j.FencedAt = w.r.fencedMono.UTC()
	before := w.r.repl.rep.Progress().Applied
	_, err := drainStep{}.run(t.Context(), w.r)
	if err == nil {
		t.Fatal("green drained 30 revisions of 50 ms each within a 300 ms window")
	}
	if after := w.r.repl.rep.Progress().Applied; after <= before {
		t.Fatalf("green applied nothing during the drain (%d -> %d): the world did not apply slowly", before, after)
	}
	if strings.Contains(err.Error(), "applied none") {
		t.Errorf("drain error %q: says green applied none while it applied steadily", err)
	}
	if !strings.Contains(err.Error(), "lag") {
		t.Errorf("drain error %q: want it to say the lag was more than the window drained", err)
	}
}
