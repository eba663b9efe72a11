// Package flock takes exclusive locks that the kernel releases when their holder dies, even by
// kill -9: an flock on a file that holds the holder's pid, for the error a second taker gets.
package flock

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/kubefence/kubefence/internal/pathguard"
)

// Lock is a held lock.
type Lock struct {
	f    *os.File
	path string
}

// HeldError says that another process holds the lock.
type HeldError struct {
	Path string
	// Holder is what the holder wrote into the file: its pid, then what it does, if anything.
	Holder string
}

func (e *HeldError) Error() string { return fmt.Sprintf("%s is held by pid %s", e.Path, e.PID()) }

// PID is the holder's pid as it wrote it ("unknown" if it wrote none).
func (e *HeldError) PID() string {
	if f := strings.Fields(e.Holder); len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// Who is the holder as a user reads it: "pid N", then what it does if it wrote that.
func (e *HeldError) Who() string {
	who := "pid " + e.PID()
	if _, what, ok := strings.Cut(e.Holder, " "); ok {
		who += ", " + what
	}
	return who
}

// Take takes the lock on path (created 0600 if missing; never a link: pathguard.OpenOwn) without waiting: a *HeldError if
// another process holds it. A lock file its holder removed (ReleaseRemove) between this open
// and this flock is no lock: then it opens path again.
func Take(path string) (*Lock, error) {
	for attempt := 1; ; attempt++ {
		f, err := pathguard.OpenOwn(path, os.O_RDWR)
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			holder, _ := io.ReadAll(io.LimitReader(f, 4096)) // the file locked, not what path leads to now
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, &HeldError{Path: path, Holder: strings.TrimSpace(string(holder))}
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		held, herr := f.Stat()
		now, nerr := os.Stat(path)
		if herr == nil && nerr == nil && os.SameFile(held, now) {
			l := &Lock{f: f, path: path}
			l.Note("")
			return l, nil
		}
		f.Close()
		if attempt == 10 { // removed under us each time: something else is at work there
			return nil, fmt.Errorf("lock %s: the file was removed or replaced while it was being locked, %d times", path, attempt)
		}
	}
}

// ReleaseRemove removes the lock file, then releases the lock: for a holder that leaves
// nothing behind (Take on the removed file opens a new one).
func (l *Lock) ReleaseRemove() {
	if l != nil && l.f != nil {
		_ = os.Remove(l.path)
	}
	l.Release()
}

// Note rewrites the file as "PID note" (just "PID" for ""), for the next taker's error.
func (l *Lock) Note(note string) {
	if l == nil || l.f == nil || l.f.Truncate(0) != nil {
		return
	}
	_, _ = l.f.WriteAt([]byte(strings.TrimSpace(strconv.Itoa(os.Getpid())+" "+note)+"\n"), 0)
}

// Release releases the lock (closing the file releases the flock).
func (l *Lock) Release() {
	if l != nil && l.f != nil {
		_ = l.f.Close()
	}
}
