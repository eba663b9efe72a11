package cutover

import (
	"errors"
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

// TestNotCatchingUpCarriesTheStalledSide: a lag check that gave up with nothing applied (the
// replicate step's, the bake's, the rollback's wait) says which side stalled, and the abort's
// advice must read it as the drain's does: with blue's watch delivering nothing, green's data
// dirs are not the suspect.
func TestNotCatchingUpCarriesTheStalledSide(t *testing.T) {
	for _, tc := range []struct {
		name     string
		e        notCatchingUpError
		onSource bool
		found    bool
	}{
		{"blue's watch quiet", notCatchingUpError{src: "blue", dst: "green", now: replicate.Progress{Received: 5, Applied: 5}}, true, true},
		{"green applies nothing", notCatchingUpError{src: "blue", dst: "green", now: replicate.Progress{Received: 9, Applied: 5}}, false, true},
		{"green applies, too slowly", notCatchingUpError{src: "blue", dst: "green", applied: 40, written: 400, over: time.Minute}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stall *replicationStalled
			err := fmt.Errorf("replicate: %w", &tc.e)
			if found := errors.As(err, &stall); found != tc.found || found && stall.onSource != tc.onSource {
				t.Errorf("errors.As(%q) = %v (%+v), want %v, on the source %v", err, found, stall, tc.found, tc.onSource)
			}
		})
	}
}
