package cutover

import (
	"errors"
	"fmt"
	"os"

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
	if err := atomicfile.RenameNoReplace(from, to); err != nil {
		msg := fmt.Errorf("stateDir %s: a test rename there: %w", p.StateDir, err)
		if errors.Is(err, atomicfile.ErrNoReplaceUnsupported) {
			msg = fmt.Errorf("%w. Blue's snapshot is renamed into place there so: in mode snapshot after the fence, once all of blue's db has streamed", msg)
		}
		return msg
	}
	return os.Remove(to)
}
