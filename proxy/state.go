package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
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
	// Backend is the apiserver URL requests go to; BackendCAFile verifies its serving certificate.
	Backend       string `json:"backend"`
	BackendCAFile string `json:"backendCAFile,omitempty"`
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
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("state file %s is corrupt: %w", s.path, err)
	}
	if st.Version != stateVersion {
		return st, fmt.Errorf("state file %s has version %d, this kubefence reads version %d", s.path, st.Version, stateVersion)
	}
	if st.Backend == "" {
		return st, fmt.Errorf("state file %s names no backend", s.path)
	}
	return st, nil
}

func (s *stateStore) save(st State) error {
	if s == nil {
		return nil
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(s.path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write state file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename this finds nothing
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write state file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fsync state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("rename state file into place: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync state dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync state dir: %w", err)
	}
	return nil
}
