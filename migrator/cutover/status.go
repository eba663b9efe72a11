package cutover

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// StatusReport is `kubefence cutover status`: where the cutover in a state dir stands.
type StatusReport struct {
	ID      string       `json:"id"`
	State   string       `json:"state"`
	Started time.Time    `json:"started"`
	Steps   []StepRecord `json:"steps"`
	// Bake is where blue stands against green while baking or rolling back.
	Bake *BakeStatus `json:"bake,omitempty"`
	// Rollback is the state of the rollback's journal, once one started.
	Rollback string `json:"rollback,omitempty"`
	// Rehearsal: the journal is a rehearsal's (never resumed as a cutover).
	Rehearsal bool `json:"rehearsal,omitempty"`
	// WindowOpenSince is when the cutover's fence went on, while it has not been lifted: every
	// proxy holds or refuses writes. FenceStartedAt is when it was being turned on when the run
	// stopped (the fence step not done): the proxies may or may not hold it.
	WindowOpenSince time.Time `json:"windowOpenSince,omitzero"`
	FenceStartedAt  time.Time `json:"fenceStartedAt,omitzero"`
	// Aborting is the reason of an abort that started and did not finish (the run stopped
	// partway through it): 'kubefence cutover abort' finishes it.
	Aborting string `json:"aborting,omitempty"`
	// StillFenced, with WindowOpenSince, are the proxies such an abort could not unfence: only
	// they hold or refuse writes; it reopened the others (on blue, or on green in a rollback's).
	// While baking, they are those a rollback's abort, which ended all the same, could not
	// unfence, as it left them.
	StillFenced []string `json:"stillFenced,omitempty"`
	// Runner is the pid of the process running the cutover (or keeping blue in step), 0 when
	// none does.
	Runner int `json:"runner"`
	// FinishByHand, once the switch is journaled and writes not reopened, is what to do if
	// 'kubefence cutover --resume' cannot run.
	FinishByHand string `json:"finishByHand,omitempty"`
}

// BakeStatus is blue against green during a bake.
type BakeStatus struct {
	BakeRecord `json:",inline"`
	// Follower is the pid of the process keeping blue in step with green, 0 when none runs.
	Follower      int   `json:"follower"`
	GreenRevision int64 `json:"greenRevision,omitempty"`
	BlueRevision  int64 `json:"blueRevision,omitempty"`
	// LagRevisions is how many of green's revisions blue has yet to apply, while it follows.
	LagRevisions int64 `json:"lagRevisions"`
	// FollowingStopped: the rollback has stopped blue following green (its stop-replication
	// step); blue leads from there, and there is no lag.
	FollowingStopped bool   `json:"followingStopped,omitempty"`
	Error            string `json:"error,omitempty"`
}

// statusTimeout bounds reading the two revisions.
const statusTimeout = 5 * time.Second

// Status reads the state dir's journal (without its lock: it changes nothing) and, during a
// bake, both clusters' revisions.
func Status(ctx context.Context, p *Plan) (*StatusReport, error) {
	// It changes nothing, but what it shows is what the journal says, and an operator acts on it:
	// LoadJournal reads it only from a trusted state dir.
	j, err := LoadJournal(p.StateDir)
	if errors.Is(err, errNoJournal) {
		return nil, fmt.Errorf("no cutover in %s", p.StateDir)
	}
	if err != nil {
		return nil, err
	}
	st := &StatusReport{ID: j.ID, State: j.State, Started: j.Started, Steps: j.Done, Rehearsal: j.Rehearse, Runner: follower(p.StateDir)}
	if j.aborting() {
		st.Aborting = j.AbortReason
		st.StillFenced = stillFenced(j)
	}
	if j.State == StateRunning && j.done(StepSwitch) && !j.done(StepUnfence) {
		st.FinishByHand = finishByHand(p, j)
	}
	st.WindowOpenSince, st.FenceStartedAt = fenceTimes(j)
	stopped := false
	// The rollback dir's journal may be an earlier cutover's (rolled back, then a new cutover):
	// only the one this cutover's journal names is its rollback.
	if rj, err := LoadJournal(filepath.Join(p.StateDir, "rollback")); err == nil && j.Bake != nil && rj.ID == j.Bake.Rollback {
		st.Rollback = fmt.Sprintf("%s (%s, last step %s)", rj.ID, rj.State, lastStep(rj))
		if j.State == StateRollingBack {
			// The rollback fences through its own journal.
			st.WindowOpenSince, st.FenceStartedAt = fenceTimes(rj)
			st.StillFenced = stillFenced(rj)
		}
		if still := leftFencedByRollback(j, rj); still != nil {
			st.StillFenced = still
		}
		stopped = j.State == StateRollingBack && rj.done(StepStopReplication)
		if j.State == StateRollingBack && rj.done(StepSwitch) && !rj.done(StepUnfence) {
			st.FinishByHand = finishRollbackByHand(p, rj)
		}
	}
	if j.Bake == nil {
		return st, nil
	}
	b := &BakeStatus{BakeRecord: *j.Bake, FollowingStopped: stopped}
	st.Bake = b
	if j.State == StateBaking || j.State == StateRollingBack {
		b.Follower = st.Runner
		ctx, cancel := context.WithTimeout(ctx, statusTimeout)
		defer cancel()
		if err := b.readRevisions(ctx, p); err != nil {
			b.Error = err.Error()
		}
	}
	return st, nil
}

// fenceTimes is a running journal's open window (its fence step done, its fence not lifted
// since) or, the fence step not done, when its fence was being turned on.
func fenceTimes(j *Journal) (windowOpenSince, fenceStartedAt time.Time) {
	if j.State != StateRunning || j.FencedAt.IsZero() || !j.UnfencedAt.IsZero() {
		return time.Time{}, time.Time{}
	}
	if j.done(StepFence) {
		return j.FencedAt, time.Time{}
	}
	return time.Time{}, j.FencedAt
}

// stillFenced are the proxies j's abort could not unfence while its fence is journaled as not
// lifted (nil otherwise).
func stillFenced(j *Journal) []string {
	if j.State != StateRunning || j.FencedAt.IsZero() || !j.UnfencedAt.IsZero() {
		return nil
	}
	return j.StillFenced
}

// leftFencedByRollback are the proxies the abort of j's rollback (rj, the one j names) left
// fenced: a rollback's abort ends even when a proxy did not acknowledge its unfence
// (abortRollback). As it left them: a fence lifted by hand since is not seen here.
func leftFencedByRollback(j, rj *Journal) []string {
	if j.State != StateBaking || j.Bake == nil || rj.ID != j.Bake.Rollback || rj.State != StateAborted || !rj.UnfencedAt.IsZero() {
		return nil
	}
	return rj.StillFenced
}

// readRevisions reads blue's and then green's revision: blue follows, so read in this order
// the lag is never below zero.
func (b *BakeStatus) readRevisions(ctx context.Context, p *Plan) error {
	for _, s := range []struct {
		sd  side
		rev *int64
	}{{p.blueSide(), &b.BlueRevision}, {p.greenSide(), &b.GreenRevision}} { // the follower first
		cli, err := newEtcdClient(s.sd.etcd)
		if err != nil {
			return err
		}
		*s.rev, err = replicate.Revision(ctx, cli)
		cli.Close()
		if err != nil {
			return fmt.Errorf("%s etcd: %w", s.sd.name, err)
		}
	}
	if !b.FollowingStopped {
		b.LagRevisions = b.GreenRevision - b.BlueRevision
	}
	return nil
}

// follower is the pid of the process holding the state dir's lock, 0 when none does. It does
// not take the lock (a cutover starting meanwhile would be refused, naming status's pid).
func follower(stateDir string) int {
	if pid := holderPID(stateDir); pid > 0 && holdsLock(stateDir, pid) {
		return pid
	}
	return 0
}
