package cutover

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kubefence/kubefence/internal/flock"
)

// stateLock is the lock that lets one cutover command (run, resume or abort) at a time work in
// a state dir: an flock on stateDir/lock (internal/flock), which holds the holder's pid.
type stateLock struct{ l *flock.Lock }

func lockPath(stateDir string) string { return filepath.Join(stateDir, "lock") }

// lockStateDir takes the state dir's lock, once checkStateDir trusts it, or says which process
// holds it.
func lockStateDir(stateDir string) (*stateLock, error) {
	if err := checkStateDir(stateDir); err != nil {
		return nil, err
	}
	path := lockPath(stateDir)
	l, err := flock.Take(path)
	var held *flock.HeldError
	if errors.As(err, &held) && slices.Contains(strings.Fields(held.Holder), bakeRole) {
		return nil, fmt.Errorf("another kubefence cutover (pid %s) is baking in %s (it holds %s): it keeps blue following green until it is stopped, so it does not finish by itself. See 'kubefence cutover status --plan PLAN'; 'kubefence cutover rollback --plan PLAN' (back to blue) or 'kubefence cutover finish --plan PLAN' (end the bake) stop it", held.PID(), stateDir, path)
	}
	if errors.As(err, &held) {
		return nil, fmt.Errorf("another kubefence cutover (pid %s) is working in %s (it holds %s): wait for it to finish, or stop that process; only one cutover, resume or abort runs at a time", held.PID(), stateDir, path)
	}
	if err != nil {
		return nil, err
	}
	return &stateLock{l: l}, nil
}

// markBaking writes "PID bake" into the lock file: the holder keeps blue following green, and
// `cutover rollback` or `finish` may stop it (stopHolder signals no other holder).
func (l *stateLock) markBaking() {
	if l != nil {
		l.l.Note(bakeRole)
	}
}

// bakeRole marks a lock holder that bakes.
const bakeRole = "bake"

// unlock releases the lock.
func (l *stateLock) unlock() {
	if l != nil {
		l.l.Release()
	}
}
