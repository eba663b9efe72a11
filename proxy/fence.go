package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubefence/kubefence/policy"
	"github.com/kubefence/kubefence/proxy/admin"
)

// ErrNotFenced is returned by a backend change while writes are open (invariant switch-only-fenced, docs/invariants.md).
var ErrNotFenced = errors.New("the backend can be changed only while fenced: run 'kubefence fence on' first")

// ErrWritesInFlight refuses a backend change while writes admitted before the fence still run
// on the old backend (the barrier did not finish): it could acknowledge them after the switch,
// and the new backend would never have them.
var ErrWritesInFlight = errors.New("writes admitted before the fence are still running: wait until 'kubefence fence status' shows none, then switch")

// ErrNotSaved: the new state could not be saved, so nothing changed (the proxy's failure).
var ErrNotSaved = errors.New("state not changed (it could not be saved)")

// ErrConcurrentChange: another admin request changed the fence while this one waited.
var ErrConcurrentChange = errors.New("concurrent fence change")

// ErrBadRequest marks an admin request that is not well formed.
var ErrBadRequest = errors.New("bad request")

// ErrWrongBackend: a fence off expected another backend than the proxy's (it stays fenced).
var ErrWrongBackend = errors.New("the proxy is not on the backend this fence off expects")

// ErrUnconfirmed refuses 'fence off' while the backend is unconfirmed (see Server.initialState).
var ErrUnconfirmed = errors.New("the backend is unconfirmed (the state file was unusable at start-up): run 'kubefence backend set URL' first")

// ErrUnchecked refuses a 'fence off' that does not name the backend while the backend is
// --upstream only because the proxy started fenced with no state file (see Server.initialState).
var ErrUnchecked = errors.New("the backend is unchecked")

// gate is the fence state machine (open ↔ fenced) and the write barrier.
//
// A write is admitted under mu.RLock, after checking the state, and registered in inflight; a
// flip takes mu.Lock. So once a flip to fenced has returned from mu.Lock, no later write can be
// admitted, and the writes admitted before it are exactly those in inflight: the barrier waits
// for them to drain. The state is persisted before it is published (invariant persist-then-ack).
type gate struct {
	mu sync.RWMutex
	// word is the fence and its mode in one value (a fenceWord), read without mu on the request
	// path: one load says both, so no write sees the fence of one state and the mode of another.
	word  atomic.Uint32
	state State // guarded by mu
	store *stateStore
	now   func() time.Time
	// opened is closed while the fence is open and replaced by a new channel when it comes on
	// (guarded by mu): held writes wait on it.
	opened chan struct{}

	inflight inflightSet
}

// publish makes st the acknowledged state; mu must be held.
func (g *gate) publish(st State) {
	if g.opened == nil {
		g.opened = make(chan struct{})
		if !st.Fenced {
			close(g.opened)
		}
	} else if st.Fenced != g.state.Fenced {
		if st.Fenced {
			g.opened = make(chan struct{})
		} else {
			close(g.opened)
		}
	}
	g.state = st
	g.word.Store(uint32(wordOf(st)))
}

// fenceWord is the fence as the request path sees it.
type fenceWord uint32

const (
	fenceIsOpen fenceWord = iota
	fenceRefusing
	fenceHolding
)

func wordOf(st State) fenceWord {
	switch {
	case !st.Fenced:
		return fenceIsOpen
	case st.Mode == admin.ModeHold:
		return fenceHolding
	}
	return fenceRefusing
}

// fence returns the published fence and mode.
func (g *gate) fence() fenceWord { return fenceWord(g.word.Load()) }

// fenced reports whether the fence is on.
func (g *gate) fenced() bool { return g.fence() != fenceIsOpen }

// openCh returns a channel that is closed while the fence is open.
func (g *gate) openCh() <-chan struct{} {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.opened
}

// admitWrite registers a write that arrives while the fence is open and returns its id (end it
// with inflight.remove) and fenceIsOpen. While the fence is on it registers nothing and returns the
// fence that refused admission, whose mode decides between holding and refusing the write.
func (g *gate) admitWrite(w inflightWrite) (uint64, fenceWord) {
	if f := g.fence(); f != fenceIsOpen {
		return 0, f
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	if f := g.fence(); f != fenceIsOpen {
		return 0, f
	}
	return g.inflight.add(w), fenceIsOpen
}

// admitSession reports whether a session write (see sessionWrite) may pass: the fence is open.
// It registers nothing: the barrier does not wait for sessions.
func (g *gate) admitSession() bool {
	return !g.fenced()
}

// current returns the acknowledged state.
func (g *gate) current() State {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.state
}

// update applies change to a copy of the state, persists it, then publishes it. A failed save
// changes nothing.
func (g *gate) update(change func(*State) error) (State, error) {
	return g.updateThen(change, nil)
}

// updateThen is update, with commit (if any) run under the gate's lock once the new state is
// saved, before it is published: what must change with the persisted state, never without it.
func (g *gate) updateThen(change func(*State) error, commit func()) (State, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	next := g.state
	if err := change(&next); err != nil {
		return g.state, err
	}
	next.Generation = g.state.Generation + 1
	next.ChangedAt = g.now().UTC()
	if err := g.store.save(next); err != nil {
		return g.state, fmt.Errorf("%w: %w", ErrNotSaved, err)
	}
	if commit != nil {
		commit()
	}
	g.publish(next)
	return next, nil
}

// waitWrites waits until no admitted write is running, or until timeout.
func (g *gate) waitWrites(ctx context.Context, timeout time.Duration) admin.Barrier {
	start := g.now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		empty := g.inflight.emptyCh()
		if empty == nil {
			return admin.Barrier{Complete: true, Waited: admin.Duration(g.now().Sub(start))}
		}
		select {
		case <-empty:
		case <-ctx.Done():
			return admin.Barrier{Waited: admin.Duration(g.now().Sub(start)), Remaining: g.inflight.list(g.now())}
		}
	}
}

// inflightWrite is an admitted write. Its description for the barrier's report is built only
// when a report is asked for, not on every write: attrs belongs to the request, which outlives
// the registration and no longer changes.
type inflightWrite struct {
	attrs     *policy.Attributes
	userAgent string
	start     time.Time
}

// inflightSet holds the admitted writes that have not finished.
type inflightSet struct {
	mu    sync.Mutex
	next  uint64
	m     map[uint64]inflightWrite
	empty chan struct{} // closed when m becomes empty; nil while nobody waits
}

func (s *inflightSet) add(w inflightWrite) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[uint64]inflightWrite)
	}
	s.next++
	s.m[s.next] = w
	return s.next
}

// remove ends a registration; removing one twice is harmless.
func (s *inflightSet) remove(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
	if len(s.m) == 0 && s.empty != nil {
		close(s.empty)
		s.empty = nil
	}
}

// emptyCh returns nil when the set is empty, else a channel closed when it becomes empty.
func (s *inflightSet) emptyCh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) == 0 {
		return nil
	}
	if s.empty == nil {
		s.empty = make(chan struct{})
	}
	return s.empty
}

func (s *inflightSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

func (s *inflightSet) list(now time.Time) []admin.InflightWrite {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]admin.InflightWrite, 0, len(s.m))
	for _, w := range s.m {
		a := w.attrs
		out = append(out, admin.InflightWrite{Verb: a.Verb, Resource: resourceString(a), Namespace: a.Namespace, Name: a.Name, User: a.User, UserAgent: w.userAgent, Running: admin.Duration(now.Sub(w.start))})
	}
	slices.SortFunc(out, func(a, b admin.InflightWrite) int { return int(b.Running - a.Running) })
	return out
}
