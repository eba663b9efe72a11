package replicate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"
)

// leaseMirror holds green's copies of blue's leases: same IDs, blue's granted TTLs, kept alive
// from here so green never expires one (an expiry would delete keys on green alone and bump its
// revision). Granting and revoking a lease that holds no keys does not change etcd's revision.
type leaseMirror struct {
	cfg Config
	ctx context.Context // Run's; the keepalives live as long as it
	// hold: HoldLeases' mirror, which keeps every lease it found while a replication beside it
	// revokes those the source dropped: a lease gone is their end, not a loss.
	hold bool

	mu   sync.Mutex
	kept map[clientv3.LeaseID]context.CancelFunc
	// goneAt: leases blue no longer has, with blue's revision when that was seen. Every put with
	// such a lease is below that revision, so once green has applied it the lease holds no key
	// on green either and can be revoked there.
	goneAt map[clientv3.LeaseID]int64
	wg     sync.WaitGroup
}

func newLeaseMirror(cfg Config) *leaseMirror {
	return &leaseMirror{cfg: cfg, kept: map[clientv3.LeaseID]context.CancelFunc{}, goneAt: map[clientv3.LeaseID]int64{}}
}

func (m *leaseMirror) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.kept)
}

// adoptDest keeps alive (within ctx) every lease green already has (restored from blue's
// snapshot), listed within listCtx.
func (m *leaseMirror) adoptDest(ctx, listCtx context.Context) error {
	m.ctx = ctx
	resp, err := m.cfg.Dest.Leases(listCtx)
	if err != nil {
		return fmt.Errorf("replicate: listing green's leases: %w", err)
	}
	for _, l := range resp.Leases {
		if err := m.keepAlive(l.ID); err != nil {
			return err
		}
	}
	m.cfg.Log.Info("keeping green's restored leases alive", "leases", len(resp.Leases))
	return nil
}

// ensure makes lease id exist on green before a put that names it, granted with blue's TTL and
// the same ID, and keeps it alive. green is green's revision, which the grant must not change.
func (m *leaseMirror) ensure(ctx context.Context, id clientv3.LeaseID, green int64) error {
	m.mu.Lock()
	_, ok := m.kept[id]
	m.mu.Unlock()
	if ok {
		return nil
	}
	// As a txn: each try within ApplyTimeout, 10 tries (a grant that timed out but was applied
	// answers ErrLeaseExist the next time, which is kept alive like any).
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, m.cfg.ApplyTimeout)
		err := m.grant(actx, id, green)
		cancel()
		if err == nil || errors.Is(err, ErrRevisionMismatch) || ctx.Err() != nil {
			return err
		}
		if attempt == 10 {
			return fmt.Errorf("%w (%d attempts)", err, attempt)
		}
		m.cfg.Log.Warn("granting a lease on green failed; trying again", "lease", fmt.Sprintf("%x", int64(id)), "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// grant is one try of ensure: blue's lease's TTL, then the grant on green with its ID.
func (m *leaseMirror) grant(ctx context.Context, id clientv3.LeaseID, green int64) error {
	ttl := m.cfg.MissingLeaseTTL
	src, err := m.cfg.Source.TimeToLive(ctx, id)
	switch {
	case err != nil:
		return fmt.Errorf("reading blue's lease %x: %w", int64(id), err)
	case src.TTL == -1: // gone on blue since the put; its deletes follow in the stream
		m.cfg.Log.Info("a replicated put names a lease blue no longer has; granting it on green", "lease", fmt.Sprintf("%x", int64(id)), "ttl", ttl)
	default:
		ttl = src.GrantedTTL
	}
	// Waiting for the connection, as clientv3's own calls (and the txns) do: without it each try
	// fails at once while green is down, and the tries run out in seconds.
	resp, err := pb.NewLeaseClient(m.cfg.Dest.ActiveConnection()).LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: int64(id), TTL: ttl}, grpc.WaitForReady(true))
	switch {
	case err != nil && errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseExist):
		// Green has it but did not when the replicator started: something else granted it
		// (green's gated apiserver may grant leases). Keep it alive all the same.
		m.cfg.Log.Warn("green already has a lease blue's stream names; keeping it alive", "lease", fmt.Sprintf("%x", int64(id)))
	case err != nil:
		return fmt.Errorf("granting lease %x (TTL %d s) on green: %w", int64(id), ttl, rpctypes.Error(err))
	case resp.Error != "":
		return fmt.Errorf("granting lease %x (TTL %d s) on green: %s", int64(id), ttl, resp.Error)
	case resp.Header.Revision != green:
		return fmt.Errorf("%w: granting lease %x moved green from revision %d to %d", ErrRevisionMismatch, int64(id), green, resp.Header.Revision)
	}
	return m.keepAlive(id)
}

// keepAlive keeps id alive on green until Run ends or the lease is revoked by collect.
func (m *leaseMirror) keepAlive(id clientv3.LeaseID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.kept[id]; ok {
		return nil
	}
	ctx, cancel := context.WithCancel(m.ctx)
	ch, err := m.cfg.Dest.KeepAlive(ctx, id)
	if err != nil {
		cancel()
		return fmt.Errorf("replicate: keeping lease %x alive on green: %w", int64(id), err)
	}
	m.kept[id] = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		m.renew(ctx, id, ch)
	}()
	return nil
}

// renew drains a keepalive channel (so the client never logs a full queue) and starts the
// keepalive again while green still has the lease: the client closes the channel when green
// says the lease is gone, and also when no renewal got through for a whole TTL (green
// unreachable, a leader change).
func (m *leaseMirror) renew(ctx context.Context, id clientv3.LeaseID, ch <-chan *clientv3.LeaseKeepAliveResponse) {
	lease := fmt.Sprintf("%x", int64(id))
	backoff := 100 * time.Millisecond
	for {
		for range ch {
			backoff = 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
		l, err := m.cfg.Dest.TimeToLive(ctx, id)
		if err == nil && l.TTL == -1 {
			// Green expired or revoked it by itself; if it held keys, green's revision moved
			// and the next apply says so. Under a hold, the replication revoked it.
			if m.hold {
				m.cfg.Log.Info("a lease the hold kept alive is gone: revoked by the replication beside the hold (it drops what the source dropped), or expired, which a revision mismatch then shows; no longer kept alive", "lease", lease)
			} else {
				m.cfg.Log.Error("green lost a lease the replicator kept alive", "lease", lease)
			}
			m.mu.Lock()
			delete(m.kept, id)
			m.mu.Unlock()
			return
		}
		if err == nil {
			ch, err = m.cfg.Dest.KeepAlive(ctx, id)
		}
		if err == nil {
			m.cfg.Log.Info("keepalive of a lease on green dropped by the client; started again", "lease", lease, "ttl", l.TTL)
		}
		if err != nil {
			m.cfg.Log.Warn("keeping a lease alive on green", "lease", lease, "err", err, "retry", backoff)
			closed := make(chan *clientv3.LeaseKeepAliveResponse)
			close(closed)
			ch = closed
		}
	}
}

// stopAll ends every keepalive and waits for them.
func (m *leaseMirror) stopAll() {
	m.mu.Lock()
	for _, cancel := range m.kept {
		cancel()
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// checkLoop revokes on green, every LeaseCheckInterval, the leases blue no longer has once green
// has applied every revision that could have used them, so that keepalives do not pile up (the
// apiservers grant a lease every few seconds).
func (m *leaseMirror) checkLoop(ctx context.Context, applied func() int64) {
	_ = wait.PollUntilContextCancel(ctx, m.cfg.LeaseCheckInterval, false, func(ctx context.Context) (bool, error) {
		if err := m.check(ctx, applied); err != nil && ctx.Err() == nil {
			m.cfg.Log.Warn("checking green's leases against blue", "err", err)
		}
		return false, nil // until ctx ends
	})
}

func (m *leaseMirror) check(ctx context.Context, applied func() int64) error {
	m.mu.Lock()
	ids := make([]clientv3.LeaseID, 0, len(m.kept))
	for id := range m.kept {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		m.mu.Lock()
		at, gone := m.goneAt[id]
		m.mu.Unlock()
		if !gone {
			src, err := m.cfg.Source.TimeToLive(ctx, id)
			if err != nil {
				return fmt.Errorf("reading blue's lease %x: %w", int64(id), err)
			}
			if src.TTL != -1 {
				continue
			}
			// A linearizable read after blue said the lease is gone: its revision covers the
			// revision that deleted the lease's keys (a lease reply's header is the answering
			// member's, which may lag).
			if at, err = Revision(ctx, m.cfg.Source); err != nil {
				return fmt.Errorf("reading blue's revision: %w", err)
			}
			m.mu.Lock()
			m.goneAt[id] = at
			m.mu.Unlock()
		}
		if applied() < at {
			continue
		}
		if err := m.collect(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// collect revokes id on green, which blue no longer has, if it holds no key there: revoking a
// lease without keys does not change the revision.
func (m *leaseMirror) collect(ctx context.Context, id clientv3.LeaseID) error {
	dst, err := m.cfg.Dest.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
	if err != nil {
		return fmt.Errorf("reading green's lease %x: %w", int64(id), err)
	}
	if len(dst.Keys) > 0 {
		// Blue deleted these keys when the lease went; green has applied past that, so
		// they should be gone. Revoking would delete them on green alone: leave it to the
		// cutover's verification.
		m.cfg.Log.Error("green's copy of a lease blue no longer has still holds keys; keeping it", "lease", fmt.Sprintf("%x", int64(id)), "keys", len(dst.Keys))
		return nil
	}
	m.mu.Lock()
	if cancel, ok := m.kept[id]; ok {
		cancel()
		delete(m.kept, id)
	}
	delete(m.goneAt, id)
	m.mu.Unlock()
	if dst.TTL == -1 {
		return nil
	}
	if _, err := m.cfg.Dest.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoking lease %x on green: %w", int64(id), err)
	}
	m.cfg.Log.Debug("revoked on green a lease blue no longer has", "lease", fmt.Sprintf("%x", int64(id)))
	return nil
}

// has says whether green keeps lease id alive for the replicator.
func (m *leaseMirror) has(id clientv3.LeaseID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.kept[id]
	return ok
}

// HoldLeases keeps every lease cli's cluster has now alive until release is called (or ctx
// ends), so that the cluster expires none of them by itself meanwhile: an expiry of a lease
// holding keys is a revision of that cluster's own. A replication that is about to start with
// cli's cluster as its destination (whose Run keeps the leases alive from then on) uses it to
// leave no gap. Leases granted after the call are not held.
//
// The leases are listed within listCtx (which may end before ctx): a cluster that does not
// answer fails the call then.
func HoldLeases(ctx, listCtx context.Context, cli *clientv3.Client, log *slog.Logger) (release func(), err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	m := newLeaseMirror(Config{Dest: cli, Log: log})
	m.hold = true
	if err := m.adoptDest(ctx, listCtx); err != nil {
		cancel()
		m.stopAll()
		return nil, err
	}
	return func() { cancel(); m.stopAll() }, nil
}
