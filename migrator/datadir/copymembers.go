package datadir

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/kubefence/kubefence/internal/pathguard"
)

// MemberCopies is a copy of one or more members' data dirs in one go (kubefence migrate copy
// --data-dir ...): each member stopped (CopyStopped) or, with Live, running (CopyLive).
type MemberCopies struct {
	// DataDirs are the members' data dirs.
	DataDirs []string
	// WALDir is the member's WAL dir when it is separate; only with a single data dir.
	WALDir string
	// OutputDir is the copy with one data dir; with several, each member's copy is
	// OutputDir/<base name of its data dir>.
	OutputDir string
	// Live copies running members, each through its client URL in Endpoints (one per data dir,
	// in order) reached with Conn's TLS settings.
	Live      bool
	Endpoints []string
	Conn      ConnSpec
}

// Output is where data dir d's copy goes.
func (m MemberCopies) Output(d string) string {
	if len(m.DataDirs) > 1 {
		return filepath.Join(m.OutputDir, filepath.Base(filepath.Clean(d)))
	}
	return m.OutputDir
}

// Check refuses, before anything is copied, a set of copies that cannot be taken as asked: a
// separate WAL dir with several members, a live copy without one endpoint per member, two
// members whose data dirs have the same name (their copies would go to one place), or a
// member's copy that overlaps any member's data dir or the WAL dir (not only its own: with
// several members, one member's copy must not land in another). The overlap is a
// pathguard error, so callers can add how to choose instead.
func (m MemberCopies) Check() error {
	if m.WALDir != "" && len(m.DataDirs) > 1 {
		return errors.New("a separate WAL dir goes with a single data dir")
	}
	if m.Live && len(m.Endpoints) != len(m.DataDirs) {
		return fmt.Errorf("a live copy needs one endpoint per data dir: %d endpoint(s) for %d data dir(s)", len(m.Endpoints), len(m.DataDirs))
	}
	if len(m.DataDirs) > 1 {
		seen := map[string]string{}
		for _, d := range m.DataDirs {
			out := m.Output(d)
			if other, ok := seen[out]; ok {
				return fmt.Errorf("%s and %s have the same name, and each member's copy goes to --output-dir/<its data dir's name>, %s: copy them one at a time, each with an --output-dir of its own", other, d, out)
			}
			seen[out] = d
		}
	}
	for _, d := range m.DataDirs {
		for _, src := range append([]string{m.WALDir}, m.DataDirs...) {
			if src == "" {
				continue
			}
			if err := pathguard.CheckApart("the copy", m.Output(d), "the source", src); err != nil {
				return err
			}
		}
	}
	return nil
}

// CopyMembers checks the copies (Check) and takes them one member after the other. A member
// that fails does not stop the others: the reports of the copies taken come back with every
// failure, each prefixed with its data dir, joined.
func CopyMembers(ctx context.Context, m MemberCopies) ([]CopyReport, error) {
	if err := m.Check(); err != nil {
		return nil, err
	}
	var reps []CopyReport
	var errs []error
	for i, d := range m.DataDirs {
		var rep CopyReport
		var err error
		if m.Live {
			rep, err = CopyLive(ctx, d, m.WALDir, m.Output(d), m.Conn, m.Endpoints[i])
		} else {
			rep, err = CopyStopped(ctx, d, m.WALDir, m.Output(d))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d, err))
			continue
		}
		reps = append(reps, rep)
	}
	return reps, errors.Join(errs...)
}
