package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/internal/pathguard"
)

// stateVersion is the version of the state file format.
const stateVersion = 1

// State is what the proxy persists: enough to come back after a crash exactly as it was
// acknowledged.
type State struct {
	Version int  `json:"version"`
	Fenced  bool `json:"fenced"`
	// Reason is the operator's text for the current fence.
	Reason string `json:"reason,omitempty"`
	// Mode is admin.ModeRefuse or admin.ModeHold while fenced; empty means refuse.
	Mode string `json:"mode,omitempty"`
	// Backend is the apiserver URL requests go to; BackendCAFile verifies its serving certificate.
	Backend       string `json:"backend"`
	BackendCAFile string `json:"backendCAFile,omitempty"`
	// Unconfirmed: the backend is a guess (--upstream) because the state file could not be used
	// at a start-up; the proxy serves nothing and refuses fence off until a backend set names
	// the backend. Saved with every change, so a fence on meanwhile does not confirm the guess.
	Unconfirmed bool `json:"unconfirmed,omitempty"`
	// Unchecked: the backend is --upstream only because there was no state file at a
	// --start-fenced start (after a cutover, a lost state file leaves --upstream on the old
	// side). Reads flow; a fence off must name the backend, or a backend set name one. Saved
	// with every change, like Unconfirmed.
	Unchecked bool `json:"unchecked,omitempty"`
	// Generation counts acknowledged changes; it only grows.
	Generation uint64    `json:"generation"`
	ChangedAt  time.Time `json:"changedAt"`
}

// stateStore writes the state file atomically: temp file, fsync, rename, fsync of the directory.
// A nil store (no --state-file) persists nothing.
type stateStore struct {
	path string
}

// errNoState means there is no state file yet: the proxy starts open on --upstream.
var errNoState = errors.New("no state file")

func (s *stateStore) load() (State, error) {
	var st State
	if s == nil {
		return st, errNoState
	}
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, errNoState
	}
	if err != nil {
		return st, fmt.Errorf("read state file %s: %w", s.path, err)
	}
	// A field this version does not know may be one a later version added to keep the proxy
	// safe (as unconfirmed and unchecked were added): not ignored, the file is unusable here.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return st, fmt.Errorf("state file %s is corrupt, or from a newer kubefence: %w", s.path, err)
	}
	// Only white space may follow (More is false before a stray '}' or ']').
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return st, fmt.Errorf("state file %s is corrupt: more than one JSON value", s.path)
	}
	if st.Version != stateVersion {
		return st, fmt.Errorf("state file %s has version %d, this kubefence reads version %d", s.path, st.Version, stateVersion)
	}
	if st.Backend == "" {
		return st, fmt.Errorf("state file %s names no backend", s.path)
	}
	return st, nil
}

// checkWritable fails unless the state file's directory exists and a file can be created in it:
// found at start-up, not at the first 'fence on', whose acknowledgement needs the save. Nor may
// another user be able to change what is in it (own it, write to it, or to a directory above):
// the proxy reads the file back at its next start and acts on it (open or fenced, which
// backend), so whoever could put a file of theirs there could open writes mid-cutover.
func (s *stateStore) checkWritable() error {
	if s == nil {
		return nil
	}
	dir := filepath.Dir(s.path)
	f, err := os.CreateTemp(dir, ".kubefence-write-check-*")
	if err != nil {
		return fmt.Errorf("--state-file %s: its directory must exist and be writable: %w", s.path, err)
	}
	name := f.Name()
	f.Close()
	if err := os.Remove(name); err != nil {
		return err
	}
	return pathguard.CheckTrustedDirLike("--state-file's directory", dir, "/var/lib/kubefence")
}

func (s *stateStore) save(st State) error {
	if s == nil {
		return nil
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path, append(data, '\n'), 0o600)
}
