package cutover

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

// checkNoReplaceRenames tries, once, the rename that places blue's snapshot (and the copy of a
// v2 source's member files) in the state dir: one that replaces nothing
// (atomicfile.RenameNoReplace), which NFS and some FUSE filesystems refuse. Without the check
// the cutover would find out only when it places the snapshot: in mode snapshot after the fence,
// once all of blue's db has streamed. A temp file is renamed to another temp name, and both
// are removed.
func checkNoReplaceRenames(p *Plan) error {
	f, err := os.CreateTemp(p.StateDir, ".kubefence-rename-check-*")
	if err != nil {
		return fmt.Errorf("stateDir %s: %w", p.StateDir, err)
	}
	from, to := f.Name(), f.Name()+".renamed"
	f.Close()
	defer os.Remove(from)
	err = atomicfile.RenameNoReplace(from, to)
	var errno syscall.Errno
	switch {
	case errors.Is(err, atomicfile.ErrNoReplaceUnsupported) && errors.As(err, &errno):
		return fmt.Errorf("stateDir %s: %w (a test rename there: %v). Blue's snapshot is renamed into place there so: in mode snapshot after the fence, once all of blue's db has streamed", p.StateDir, atomicfile.ErrNoReplaceUnsupported, errno)
	case err != nil:
		return fmt.Errorf("stateDir %s: a test rename there: %w", p.StateDir, err)
	}
	return os.Remove(to)
}
