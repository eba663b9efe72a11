package cutover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// TestLagTrend: the catch-up gives up once green's lag has grown through the patience (blue
// writes faster than green applies), and only then.
func TestLagTrend(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type point struct {
		after           time.Duration
		applied, source int64
		received        int64 // what blue's watch delivered; 0: as much as blue wrote (source)
	}
	tests := []struct {
		name   string
		points []point
		want   string // a part of the error, "" for none
	}{
		{"green falls behind", []point{{0, 1000, 10000, 0}, {30 * time.Second, 3700, 15160, 0}, {60 * time.Second, 6400, 20320, 0}},
			"green applied 5400 revisions (90/s) while blue wrote 10320 (172/s); the lag went from 9000 to 13920 revisions"},
		{"green applies nothing", []point{{0, 1000, 2000, 0}, {30 * time.Second, 1000, 8000, 0}, {60 * time.Second, 1000, 14000, 0}},
			"green applied no revision while blue wrote 12000; the lag went from 1000 to 13000 revisions; green applied none of the revisions 1001-14000 received from blue's watch: check green etcd"},
		// Nothing delivered from blue: green has nothing to apply, and its etcd is not the cause.
		{"blue's watch delivers nothing", []point{{0, 1000, 2000, 1000}, {30 * time.Second, 1000, 8000, 1000}, {60 * time.Second, 1000, 14000, 1000}},
			"green applied no revision while blue wrote 12000; the lag went from 1000 to 13000 revisions; nothing from blue's watch past revision 1000"},
		{"green gains", []point{{0, 1000, 10000, 0}, {30 * time.Second, 7000, 15000, 0}, {60 * time.Second, 13000, 20000, 0}}, ""},
		{"rates equal, a steady lag", []point{{0, 1000, 6000, 0}, {30 * time.Second, 4000, 9000, 0}, {60 * time.Second, 7000, 12000, 0}}, ""},
		{"a lag wobbling while green keeps pace", []point{{0, 1000, 1150, 0}, {30 * time.Second, 7000, 7100, 0},
			{60 * time.Second, 13000, 13250, 0}}, ""},
		{"a burst near the end", []point{{0, 1000, 1050, 0}, {30 * time.Second, 7000, 7050, 0}, {60 * time.Second, 13000, 16000, 0}}, ""},
		{"not watched long enough", []point{{0, 1000, 10000, 0}, {30 * time.Second, 1000, 15000, 0}, {59 * time.Second, 1000, 20000, 0}}, ""},
		{"small lag left to the wait", []point{{0, 1000, 1010, 0}, {30 * time.Second, 1000, 1050, 0}, {60 * time.Second, 1000, 1090, 0}}, ""},
		{"the reference moves on", []point{{0, 0, 50000, 0}, {30 * time.Second, 40000, 60000, 0}, {61 * time.Second, 60000, 70000, 0},
			{91 * time.Second, 62000, 82000, 0}, {121 * time.Second, 64000, 94000, 0}}, "the lag went from 10000 to 30000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := lagTrend{patience: time.Minute, src: "blue", dst: "green"}
			var err error
			for _, p := range tt.points {
				err = tr.add(t0.Add(p.after), replicate.Progress{Applied: p.applied, Source: p.source, Received: cmp.Or(p.received, p.source)})
				if err != nil {
					break
				}
			}
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("gave up: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one with %q", err, tt.want)
			case err != nil && !strings.Contains(err.Error(), "timeouts.replicate"):
				t.Errorf("the error does not say what to do: %v", err)
			}
		})
	}
}

// TestWatchCatchUpCancels: a green falling behind cancels the catch-up's context with the
// reason, well before the step's timeout; one keeping up does not.
func TestWatchCatchUpCancels(t *testing.T) {
	for _, keepsUp := range []bool{false, true} {
		var n atomic.Int64
		progress := func() replicate.Progress {
			i := n.Add(1)
			if keepsUp {
				return replicate.Progress{Applied: 1000 * i, Source: 1000*i + 50} // a few revisions behind
			}
			return replicate.Progress{Applied: 100 * i, Source: 1000 * i}
		}
		ctx, cancel := context.WithCancelCause(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			watchCatchUp(ctx, cancel, progress, 5*time.Millisecond, 50*time.Millisecond, "blue", "green")
		}()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		cancel(nil)
		<-done
		var nc *notCatchingUpError
		if got := errors.As(context.Cause(ctx), &nc); got == keepsUp {
			t.Errorf("keeps up %v: cause %v", keepsUp, context.Cause(ctx))
		}
	}
}

// TestCatchUpRates: the replicate step says how fast green caught up against blue's writes,
// the headroom a rehearsal is run to learn; it says nothing when the catch-up was too short to
// time or green was never behind.
func TestCatchUpRates(t *testing.T) {
	tests := []struct {
		name           string
		from, blueFrom int64 // green's and blue's revisions when the catch-up began
		rev            int64 // the revision both reached
		took           time.Duration
		want           string
	}{
		{"green well ahead of blue's rate", 1000, 13000, 14000, 20 * time.Second,
			"; from 12000 revisions behind, green applied 13000 (650/s) while blue wrote 1000 (50/s): green applies at least 13.0x blue's write rate"},
		{"blue quiet", 1000, 3000, 3000, 4 * time.Second, "; from 2000 revisions behind, green applied 2000 (500/s) while blue wrote nothing"},
		{"too short to time", 1000, 1010, 1020, 300 * time.Millisecond, ""},
		{"never behind", 1000, 1000, 1200, 5 * time.Second, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := catchUpRates(tt.from, tt.blueFrom, tt.rev, tt.took, "blue", "green"); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestCatchUpRounds: catching up before the fence goes on while the rounds get shorter (green
// gaining on blue), ends when one is short enough to call green caught up, and gives up after
// two rounds in a row no shorter than the shortest so far (green only keeping pace).
func TestCatchUpRounds(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name   string
		rounds []time.Duration
		// want is the round the wait ends after (index) and whether green was caught up then.
		want     int
		caughtUp bool
	}{
		{"caught up at once", []time.Duration{ms(10)}, 0, true},
		{"gaining: 1,600 revisions behind, applying 1.5x blue's rate", []time.Duration{ms(5300), ms(3600), ms(2400), ms(1600), ms(1050), ms(700), ms(470), ms(310), ms(210), ms(140), ms(90), ms(60), ms(40)}, 12, true},
		{"keeping pace", []time.Duration{ms(900), ms(950), ms(1000)}, 2, false},
		{"falling behind", []time.Duration{ms(500), ms(600), ms(700)}, 2, false},
		{"one slower round in a gain", []time.Duration{ms(800), ms(900), ms(400), ms(30)}, 3, true},
		{"wobbling at one pace", []time.Duration{ms(800), ms(900), ms(850)}, 2, false},
		{"a stall, then gaining again", []time.Duration{ms(800), ms(900), ms(700), ms(750), ms(300), ms(20)}, 5, true},
		// A burst of writes after green had caught up: the rounds grow, then shrink again;
		// green gains, however long the rounds still are next to the first.
		{"a burst after catching up", []time.Duration{ms(60), ms(10000), ms(8000), ms(5000), ms(2000), ms(600), ms(40)}, 6, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c catchUpRounds
			for i, took := range tt.rounds {
				if !c.next(took) {
					if i != tt.want || c.caughtUp != tt.caughtUp {
						t.Fatalf("ended after round %d (caught up %v), want round %d (caught up %v)", i, c.caughtUp, tt.want, tt.caughtUp)
					}
					if want := fmt.Sprintf("%d round(s), the last %s", i+1, tt.rounds[i]); !strings.Contains(c.String(), want) {
						t.Errorf("detail %q, want it to name %q", c.String(), want)
					}
					return
				}
			}
			t.Fatalf("still going after %d rounds, want the end at round %d", len(tt.rounds), tt.want)
		})
	}
}

// TestCatchUpRoundsString: the fence step's detail says how the catch-up ended, including when
// its time ran out before or after a round.
func TestCatchUpRoundsString(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name   string
		rounds []time.Duration
		want   string
	}{
		{"no round ended", nil, "did not catch up with blue in the time allowed (no round ended)"},
		{"caught up", []time.Duration{ms(900), ms(40)}, "caught up with blue in 2 round(s), the last 40ms"},
		{"no gain", []time.Duration{ms(500), ms(600), ms(700)}, "did not gain on blue in its last 2 of 3 round(s), the last 700ms"},
		{"time ran out while gaining", []time.Duration{ms(900), ms(800)}, "did not catch up with blue in the time allowed: 2 round(s), the last 800ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := catchUpRounds{to: "green", from: "blue"}
			for _, took := range tt.rounds {
				c.next(took)
			}
			if got := c.String(); got != "green "+tt.want {
				t.Errorf("%q, want %q", got, "green "+tt.want)
			}
			// A rollback's catch-up, the other way round, says so.
			back := catchUpRounds{to: "blue", from: "green"}
			for _, took := range tt.rounds {
				back.next(took)
			}
			if got, want := back.String(), "blue "+strings.ReplaceAll(tt.want, "blue", "green"); got != want {
				t.Errorf("rollback: %q, want %q", got, want)
			}
		})
	}
}
