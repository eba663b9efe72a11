package proxy

import (
	"context"
	"sync"
	"testing"
	"time"
)

// BenchmarkHoldRelease times the waiting room alone: 10,000 held writes admitted after the fence
// lifts, with nothing forwarded, so that the cost of releasing in arrival order is seen apart
// from the network.
func BenchmarkHoldRelease(b *testing.B) {
	const n = 10000
	for b.Loop() {
		b.StopTimer()
		g := &gate{now: time.Now}
		g.publish(State{Version: stateVersion, Fenced: true})
		q := &holdQueue{maxCount: n, maxBytes: 1 << 30}
		var wg sync.WaitGroup
		for range n {
			h, err := q.enter(100, false, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, out := g.awaitRelease(context.Background(), h, nil, nil, testWrite())
				h.leave()
				if out == holdReleased {
					g.inflight.remove(id)
				}
			}()
		}
		time.Sleep(100 * time.Millisecond)
		b.StartTimer()
		if _, err := g.update(func(st *State) error { st.Fenced = false; return nil }); err != nil {
			b.Fatal(err)
		}
		wg.Wait()
	}
}
