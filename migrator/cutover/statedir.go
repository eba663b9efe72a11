package cutover

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/kubefence/kubefence/internal/pathguard"
)

// stateDirExample is the state dir a refusal suggests (docs/plan.md's).
const stateDirExample = "/var/lib/kubefence/cutover"

// checkStateDir refuses a state dir that another user could change: one they own or may write
// to, or below a directory they own or may write to (pathguard.CheckTrustedDir), as the proxy
// holds its state file's directory; one not there yet, below such a directory (they could make
// it theirs). Every command that uses the state dir checks it before it takes the lock or reads
// the journal: kubefence, as root, acts on what it reads back from there (the journal names the
// static pod manifest an abort removes, the snapshot green is restored from, the green
// processes it stops), logs green's output there and locks it; whoever could change it could
// hold the lock, redirect the logs or plant a journal. The two doors every command goes through
// call it, LoadJournal and lockStateDir, so that none can forget it.
func checkStateDir(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return stateDirRefusal(pathguard.CheckTrustedAbove("stateDir", dir, stateDirExample))
	}
	return stateDirRefusal(pathguard.CheckTrustedDirLike("stateDir", dir, stateDirExample))
}

// makeStateDir is checkStateDir for a cutover's run, which makes the state dir (0700) when it
// is not there, and checks it again once made.
func makeStateDir(dir string) error {
	if err := checkStateDir(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	return checkStateDir(dir)
}

// untrustedStateDir is checkStateDir's refusal: a caller that goes on without a journal (none
// there, or one it cannot read) must not go on past it.
type untrustedStateDir struct{ err error }

func (e *untrustedStateDir) Error() string { return e.err.Error() }
func (e *untrustedStateDir) Unwrap() error { return e.err }

// isUntrustedStateDir says err is checkStateDir's refusal.
func isUntrustedStateDir(err error) bool {
	var u *untrustedStateDir
	return errors.As(err, &u)
}

// stateDirRefusal is pathguard's refusal of a state dir with why it matters and what else to do.
func stateDirRefusal(err error) error {
	if err == nil {
		return nil
	}
	return &untrustedStateDir{fmt.Errorf("%w; or, if it is yours, fix the directory named (chown it to root, the user kubefence runs as; chmod go-w), after checking what another user may have put in it; or give the plan another stateDir. kubefence acts on what it reads back from the state dir (the journal names files an abort removes, the snapshot green is restored from, the green processes it stops) and keeps its lock and green's logs there. Nothing was read or changed", err)}
}
