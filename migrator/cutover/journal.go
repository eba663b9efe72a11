package cutover

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/migrator/replicate"
)

// Journal states.
const (
	StateRunning = "running"
	StateDone    = "done"
	StateAborted = "aborted"
	// StateBaking (bake.enabled): green serves and blue follows green, until `cutover
	// finish` (done) or `cutover rollback` (rolling-back, then rolled-back).
	StateBaking      = "baking"
	StateRollingBack = "rolling-back"
	StateRolledBack  = "rolled-back"
)

// knownStates are the journal states this kubefence writes; a journal in another was written by
// a newer one.
var knownStates = map[string]bool{StateRunning: true, StateDone: true, StateAborted: true, StateBaking: true,
	StateRollingBack: true, StateRolledBack: true, StateRehearsed: true}

// aborting reports an abort that started and did not finish: the run stopped partway through
// it, green maybe stopped. Only 'cutover abort' goes on from there.
func (j *Journal) aborting() bool { return j.State == StateRunning && j.AbortReason != "" }

// wayOn is the advice for a running cutover no process runs: past the switch abort refuses
// it, so only --resume finishes it.
func (j *Journal) wayOn() string {
	if j.Rehearse {
		return "a rehearsal is not resumed: 'kubefence cutover abort --plan PLAN' stops what it started"
	}
	if j.done(StepSwitch) {
		return "it has switched to green, and there is no abort from there: run 'kubefence cutover --resume --plan PLAN' to finish it"
	}
	return "run again with --resume to continue, or 'kubefence cutover abort' to go back to blue"
}

// Journal records a cutover's progress in the state dir. It is written atomically after every
// finished step, before the next one starts.
type Journal struct {
	Version  int       `json:"version"`
	ID       string    `json:"id"`
	PlanHash string    `json:"planHash"`
	State    string    `json:"state"`
	Started  time.Time `json:"started"`
	// Done lists finished steps with their duration and results.
	Done []StepRecord `json:"done"`
	// Rehearse marks a rehearsal's journal (--rehearse): it is never resumed as a cutover.
	Rehearse bool `json:"rehearse,omitempty"`

	FencedAt   time.Time `json:"fencedAt,omitzero"`
	UnfencedAt time.Time `json:"unfencedAt,omitzero"`
	// Unfenced is how long writes were fenced (the fence sent to the unfence), measured on the
	// monotonic clock of the process that did both; 0 when not (a resume between them): then
	// the wall times above give it (writeUnavailability).
	Unfenced time.Duration `json:"unfenced,omitzero"`
	// UnfencedUnknown: a resume found the proxies already open on the target, their unfence not
	// journaled (the run that sent it could not write its journal), and they did not say when
	// they opened: the window is not known here (writeUnavailability 0; that run's report gave it).
	UnfencedUnknown bool `json:"unfencedUnknown,omitempty"`
	// FenceGeneration is the proxy's state generation right after the cutover's fence on. It
	// grows with every change of the proxy's state, so a different one before the switch means
	// someone changed the fence (fence off and on by hand) and writes may have reached blue.
	FenceGeneration uint64 `json:"fenceGeneration,omitempty"`
	// UnfenceGeneration is the proxies' state generation (summed) the unfence's fence off
	// answered with, journaled with UnfencedAt: a resumed unfence, which sends it again, judges
	// changes by hand during the window by it.
	UnfenceGeneration uint64 `json:"unfenceGeneration,omitempty"`
	// FenceBarrier is how long the fence waited for the writes admitted before it to be answered
	// (the slowest of them across the proxies): part of the window that is blue's own write
	// latency, not kubefence's steps.
	FenceBarrier time.Duration `json:"fenceBarrierNanos,omitempty"`
	// StaticPodPlaced is the manifest the cutover wrote into the kubelet's directory (abort
	// removes it, and only it).
	StaticPodPlaced string `json:"staticPodPlaced,omitempty"`
	// BlueBackend is the proxy's backend the preflight found (blue's): a record for the
	// operator; nothing reads it back.
	BlueBackend string `json:"blueBackend,omitempty"`
	// Snapshot is the copy of blue: its path, revision and size.
	Snapshot         string `json:"snapshot,omitempty"`
	SnapshotRevision int64  `json:"snapshotRevision,omitempty"`
	SnapshotBytes    int64  `json:"snapshotBytes,omitempty"`
	// DrainRevision and SwitchRevision (mode replicate) are green's revision, one blue had too
	// (blue may have gone on: replication carries that over), after the drain, and when the
	// proxy was switched.
	DrainRevision  int64 `json:"drainRevision,omitempty"`
	SwitchRevision int64 `json:"switchRevision,omitempty"`
	// Mode is the migration the copy chose (auto resolves to snapshot or v2-to-v3).
	Mode string `json:"mode,omitempty"`
	// V2Prefixes counts the keys the v2 migration wrote per prefix (green etcd is checked for them).
	V2Prefixes map[string]int `json:"v2Prefixes,omitempty"`
	// V2Leased counts, of those, the keys with a TTL (a lease on green, which may run out before
	// the count).
	V2Leased map[string]int `json:"v2Leased,omitempty"`
	// GreenPIDs are the processes kubefence started (etcd members, apiserver), by name; 0 for
	// one it was starting when it last saved the journal.
	GreenPIDs map[string]int `json:"greenPIDs,omitempty"`
	// GreenArgv are the command lines the green processes of GreenPIDs were started with, by
	// name, journaled with the pid (before the start): a process is known by its own, not by
	// the one this kubefence would build today, which a newer kubefence, resuming or aborting
	// after an upgrade, may build differently. A journal of a kubefence before it has none:
	// the command line is built again then.
	GreenArgv map[string][]string `json:"greenArgv,omitempty"`
	// PIDsWriteAhead: this journal names each green process before it is started (GreenPIDs 0),
	// so a process it does not name is not this cutover's. A journal of a kubefence before it
	// named them only once started: a process with green's command line is adopted then.
	PIDsWriteAhead bool `json:"pidsWriteAhead,omitempty"`
	// RefusedAtFence and RefusedAtUnfence are the proxy's count of refused writes at the fence
	// and at the unfence; the report's RefusedWrites is their difference.
	RefusedAtFence   uint64        `json:"refusedAtFence,omitempty"`
	RefusedAtUnfence uint64        `json:"refusedAtUnfence,omitempty"`
	Verified         *VerifyReport `json:"verified,omitempty"`
	// StillFenced are the proxies (by name, the plan's one proxy by its admin socket) whose
	// unfence an abort going back did not get acknowledged: they stay fenced while the others
	// are open, until an abort run again reaches them (cleared when every one is open).
	StillFenced []string `json:"stillFenced,omitempty"`
	// AbortReason is why the cutover was aborted. An abort saves it before it changes anything,
	// so with the state still running it marks an abort under way (aborting).
	AbortReason string `json:"abortReason,omitempty"`
	// GreenRolesTaken are the roles green's apiserver user held in blue's snapshot (auth on in
	// blue) that the green-auth step took from it: it reads only until the switch, then has
	// read-write on every key. The report names them.
	GreenRolesTaken []string `json:"greenRolesTaken,omitempty"`
	// ReplicationAtFence and ReplicationAtStop (mode replicate) are where replication stood just
	// before the fence (the lag the window had to drain) and when it was stopped after the switch.
	ReplicationAtFence *replicate.Progress `json:"replicationAtFence,omitempty"`
	ReplicationAtStop  *replicate.Progress `json:"replicationAtStop,omitempty"`
	// Rehearsal is what a rehearsal measured (rehearse.go).
	Rehearsal *Rehearsal `json:"rehearsal,omitempty"`
	// Rebuilds counts how often green was rebuilt from a new snapshot because blue compacted
	// what replication still needed (rebuild.go).
	Rebuilds int `json:"rebuilds,omitempty"`
	// Rebuilding is why a rebuild of green began, until it rewound the journal: a run that
	// stopped in between (green stopped, data dirs half removed) has --resume finish it.
	Rebuilding string `json:"rebuilding,omitempty"`
	// Bake (bake.enabled) is the way back after the switch (bake.go).
	Bake *BakeRecord `json:"bake,omitempty"`
	// NoBake (bake.enabled) says why the cutover went on without a way back: a bake step past
	// the switch could not be done within timeouts.window, and writes stay fenced for no bake.
	NoBake string `json:"noBake,omitempty"`
	// NotGated (a rollback's journal) says why gate-green did not gate green's apiserver within
	// the window's budget: it may still write green etcd, and the report says so.
	NotGated string `json:"notGated,omitempty"`
	// BlueAuthEnabled: the cutover turned blue etcd's auth on (blue-etcd-auth); an abort turns
	// it off again.
	BlueAuthEnabled bool `json:"blueAuthEnabled,omitempty"`
}

// BakeRecord is a journal's account of the bake.
type BakeRecord struct {
	// Revision is where blue started following green: both were at it, green's apiserver not
	// yet writing.
	Revision int64     `json:"revision"`
	Started  time.Time `json:"started"`
	// Ended is when `cutover finish` ended the bake or a rollback completed.
	Ended time.Time `json:"ended,omitzero"`
	// LastStop is where blue stood when the last process that kept it in step stopped.
	LastStop *replicate.Progress `json:"lastStop,omitempty"`
	// Rollback is the id of the rollback's journal (stateDir/rollback/journal.json), once one
	// started.
	Rollback string `json:"rollback,omitempty"`
}

// StepRecord is one finished step.
type StepRecord struct {
	Step     string        `json:"step"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"durationNanos"`
	Detail   string        `json:"detail,omitempty"`
}

func (j *Journal) done(step string) bool {
	_, ok := j.record(step)
	return ok
}

// record is the finished step's record, if it finished.
func (j *Journal) record(step string) (StepRecord, bool) {
	for _, r := range j.Done {
		if r.Step == step {
			return r, true
		}
	}
	return StepRecord{}, false
}

func journalPath(stateDir string) string { return filepath.Join(stateDir, "journal.json") }

// errNoJournal means no cutover has started in this state dir.
var errNoJournal = errors.New("no journal")

// LoadJournal reads the journal of stateDir, once checkStateDir trusts it. One a newer
// kubefence wrote (a version or state this one does not know) is refused, for every command:
// acting on it would mean guessing what its steps did.
func LoadJournal(stateDir string) (*Journal, error) {
	if err := checkStateDir(stateDir); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(journalPath(stateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoJournal
	}
	if err != nil {
		return nil, err
	}
	var j Journal
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("journal %s is corrupt: %w (inspect it; move it away only if no cutover is in progress)", journalPath(stateDir), err)
	}
	if j.Version > 1 || !knownStates[j.State] {
		return nil, fmt.Errorf("cutover %s's journal (version %d, state %q) was written by a newer kubefence: use that one", j.ID, j.Version, j.State)
	}
	return &j, nil
}

// save writes the journal atomically (temp, fsync, rename, fsync dir).
func (j *Journal) save(stateDir string) error { return j.saveTo(journalPath(stateDir)) }

// saveTo writes the journal atomically to path.
func (j *Journal) saveTo(path string) error {
	data, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(data, '\n'), 0o600)
}

// writeUnavailability is how long writes were fenced: as the process that fenced and unfenced
// measured it on its monotonic clock, else from the journaled wall times (a clock stepped in
// between skews only those).
func (j *Journal) writeUnavailability() time.Duration {
	if j.UnfencedUnknown {
		return 0
	}
	if j.Unfenced > 0 {
		return j.Unfenced
	}
	return j.UnfencedAt.Sub(j.FencedAt)
}
