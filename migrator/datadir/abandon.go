package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

// abandonJournals marks abandoned every unfinished upgrade or downgrade journaled in dirs (the
// backup dirs a run of dataDir may have used) that works on dataDir: restore-backup just put
// other data there, and a resume would go on from the step the journal reached, on data that
// never went through the steps before it. Each is renamed to <journal>.abandoned-<UTC time>,
// with why, and kept for the record; the next run plans afresh. It returns the new names.
func abandonJournals(dataDir string, dirs []string, why string, now time.Time) ([]string, error) {
	var kept []string
	var errs []error
	seen := map[string]bool{}
	for _, dir := range dirs {
		names, _ := filepath.Glob(filepath.Join(dir, "journal-*.json"))
		for _, path := range names {
			if seen[path] {
				continue
			}
			seen[path] = true
			to, err := abandonJournal(path, dataDir, why, now)
			if err != nil {
				errs = append(errs, err)
			} else if to != "" {
				kept = append(kept, to)
			}
		}
	}
	return kept, errors.Join(errs...)
}

// abandonJournal is abandonJournals for the journal at path; "" when it is not an unfinished
// run of dataDir.
func abandonJournal(path, dataDir, why string, now time.Time) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var rep Report
	if json.Unmarshal(b, &rep) != nil || rep.Done || !slices.Contains(rep.DataDirs, dataDir) {
		return "", nil // a damaged journal is refused by the next run with its own advice
	}
	to := fmt.Sprintf("%s.abandoned-%s", path, now.UTC().Format("20060102T150405Z"))
	if err := atomicfile.RenameNoReplace(path, to); err != nil {
		return "", fmt.Errorf("abandon the unfinished %s journaled in %s: %w; move it away by hand, or the next %[1]s resumes it on the restored data", rep.Operation, path, err)
	}
	rep.Abandoned = why
	if b, err = json.MarshalIndent(rep, "", "  "); err == nil {
		err = atomicfile.Write(to, b, 0o600)
	}
	if err != nil {
		return to, fmt.Errorf("note why %s was abandoned: %w", to, err)
	}
	return to, nil
}

// checkResumedVersions refuses to resume a run on a data dir whose version is not what the
// journal's last done step left (or what the started step after it makes): the dir was
// replaced since, say by a backup put back by hand, and the next step was not planned for it.
func checkResumedVersions(rep *Report) error {
	done, next := -1, -1
	for i, s := range rep.Steps {
		if s.Done {
			done = i
		} else if next < 0 {
			next = i
		}
	}
	if done < 0 {
		return nil // nothing done: nothing changed the data dirs yet
	}
	var errs []error
	for _, d := range rep.DataDirs {
		want, ok := leftBy(rep, done, d)
		if !ok {
			continue
		}
		det, err := Detect(d, "")
		var stale *StaleVersionFileError
		if errors.As(err, &stale) && startedReaches(rep, next, stale.Backend) {
			continue // the started step ran etcd that far, and was killed before it wrote the file
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if det.Version.SameMinor(want) {
			continue
		}
		if startedReaches(rep, next, det.Version) {
			continue // the started step got that far
		}
		errs = append(errs, fmt.Errorf("%s holds %s data (%s), but its last done step %q left it at %s", d, det.VersionText(), det.Source, rep.Steps[done].Name, want.MinorString()))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w\nthe data dirs changed since the unfinished %s journaled in %s (a backup put back by hand?), and its next step was planned for the data it left: abandon that run (mv %[3]s %[3]s.abandoned) and run the command again, which plans afresh from the data as it is",
			err, rep.Operation, rep.Journal)
	}
	return nil
}

// leftBy is the version step i of rep left data dir d at.
func leftBy(rep *Report, i int, d string) (Version, bool) {
	s := rep.Steps[i]
	if s.Kind != StepBackup {
		v, err := ParseVersion(s.Version)
		return v, err == nil
	}
	for _, b := range rep.Before {
		if b.DataDir == d {
			return b.Version, true
		}
	}
	return Version{}, false
}

// startedReaches reports whether step next of rep was started and brings the data to v's minor.
func startedReaches(rep *Report, next int, v Version) bool {
	if next < 0 || !rep.Steps[next].Started || rep.Steps[next].Kind == StepBackup {
		return false
	}
	sv, err := ParseVersion(rep.Steps[next].Version)
	return err == nil && sv.SameMinor(v)
}
