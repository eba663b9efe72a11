package cutover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// stateLock is the lock that lets one cutover command (run, resume or abort) at a time work in
// a state dir. It is an flock on stateDir/lock, so the kernel releases it when the holder dies,
// even by kill -9; the file holds the holder's pid for the error message.
type stateLock struct{ f *os.File }

func lockPath(stateDir string) string { return filepath.Join(stateDir, "lock") }

// lockStateDir takes the state dir's lock or says which process holds it.
func lockStateDir(stateDir string) (*stateLock, error) {
	path := lockPath(stateDir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(holder))
			if pid == "" {
				pid = "unknown"
			}
			return nil, fmt.Errorf("another kubefence cutover (pid %s) is working in %s (it holds %s): wait for it to finish, or stop that process; only one cutover, resume or abort runs at a time", pid, stateDir, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &stateLock{f: f}, nil
}

// markBaking writes "PID bake" into the lock file: the holder keeps blue following green, and
// `cutover rollback` or `finish` may stop it (stopHolder signals no other holder).
func (l *stateLock) markBaking() {
	if l != nil && l.f != nil && l.f.Truncate(0) == nil {
		_, _ = l.f.WriteAt([]byte(strconv.Itoa(os.Getpid())+" "+bakeRole+"\n"), 0)
	}
}

// bakeRole marks a lock holder that bakes.
const bakeRole = "bake"

// unlock releases the lock (closing the file releases the flock).
func (l *stateLock) unlock() {
	if l != nil && l.f != nil {
		_ = l.f.Close()
	}
}
