package cutover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/migrator/replicate"
)

// Rebuilding green (mode replicate): when blue compacts history that replication still needs
// (ErrCompacted: green fell more than blue's compaction interval behind, e.g. while a large
// snapshot was restored), green cannot catch up by replication any more. Before the fence this
// costs nothing but time: green is stopped, the data dirs this cutover restored are removed,
// and the cutover starts again from a new snapshot (the copy step), at most maxRebuilds times.

// maxRebuilds bounds how often one cutover rebuilds green from a new snapshot.
const maxRebuilds = 2

// rebuildable says whether a failed step's error is answered by rebuilding green: blue
// compacted what replication needed, before the fence, with rebuilds left.
// Not with green apiservers their own hosts run (kubefence does not stop them): a new green has
// no etcd auth until its auth step, and they would reconnect and write their leases first.
func (r *runner) rebuildable(err error) bool {
	return r.p.Replicating() && errors.Is(err, replicate.ErrCompacted) && r.j.FencedAt.IsZero() && r.j.Rebuilds < maxRebuilds && len(r.p.greenAPIServersOnOtherHosts()) == 0
}

// noRebuild says why a compaction before the fence is not answered by a rebuild, when that is
// the green apiservers other hosts run ("" otherwise).
func (r *runner) noRebuild(err error) string {
	hosts := r.p.greenAPIServersOnOtherHosts()
	if !errors.Is(err, replicate.ErrCompacted) || len(hosts) == 0 {
		return ""
	}
	return fmt.Sprintf("not rebuilt from a new snapshot: green apiservers their own hosts run (%s) would write to a new green before its auth step; stop them there, then run the cutover again", strings.Join(hosts, ", "))
}

// greenAPIServersOnOtherHosts are the URLs of green.apiservers without a command.
func (p *Plan) greenAPIServersOnOtherHosts() []string {
	var urls []string
	for _, a := range p.Green.APIServers {
		if len(a.Command) == 0 {
			urls = append(urls, a.URL)
		}
	}
	return urls
}

// staticPodGone bounds the rebuild's wait for green's static pod apiserver to stop once its
// manifest is removed (the kubelet gives it its grace period); a variable for the tests.
var staticPodGone = 2 * time.Minute

// awaitStaticPodGone waits until green's apiserver URL takes no connection, after its static
// pod manifest was removed: a new green, without etcd auth until its auth step, must not be
// restored while that apiserver may still reconnect and write.
func awaitStaticPodGone(url string) error {
	addr := proc.HostPort(url)
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, staticPodGone, true, func(context.Context) (bool, error) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true, nil
		}
		c.Close()
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("green's apiserver %s still answers %s after its static pod manifest was removed: a new green could be written by it before its auth step; stop it (the kubelet, or crictl), then run the cutover again", url, staticPodGone)
	}
	return nil
}

// rebuildGreen stops replication and green, removes green's data dirs (only those this cutover
// restored: they hold its marker) and rewinds the journal to just after the preflight.
func (r *runner) rebuildGreen(cause error) error {
	if r.j.Rebuilding == "" { // journaled first: a --resume finishes what this begins
		r.j.Rebuilding, r.j.Rebuilds = cause.Error(), r.j.Rebuilds+1
		if err := r.j.save(r.p.StateDir); err != nil {
			return err
		}
	}
	if _, err := r.stopReplication(); err != nil && r.o.Log != nil {
		r.o.Log.Info("replication stopped", "err", err)
	}
	r.closeAuthClients() // the fence step connects again, to the green built next
	r.releaseGreenHold()
	staticPod := r.j.StaticPodPlaced != ""
	if _, err := r.stopGreen(); err != nil {
		return err
	}
	if staticPod {
		if err := awaitStaticPodGone(r.p.Green.APIServer.URL); err != nil {
			return err
		}
	}
	if _, err := r.removeRestored(); err != nil {
		return err
	}
	j := r.j
	j.Done = slices.DeleteFunc(j.Done, func(rec StepRecord) bool { return rec.Step != StepPreflight })
	j.Snapshot, j.SnapshotRevision, j.SnapshotBytes = "", 0, 0
	j.GreenPIDs, j.GreenArgv = map[string]int{}, nil
	j.StaticPodPlaced = ""
	j.Verified = nil
	j.Rebuilding = ""
	if err := j.save(r.p.StateDir); err != nil {
		return err
	}
	r.emit(Event{Type: EventNote, Detail: fmt.Sprintf("rebuilding green from a new snapshot (%d of at most %d): %v%s", j.Rebuilds, maxRebuilds, cause, r.p.externalLearnersAdvice())})
	return nil
}

// externalLearnersAdvice tells, after green was rebuilt, what the hosts of external learners
// must do: their member joined the green that is gone, and kubefence neither stops it nor
// empties its data dir; the new green adds it again with a start command of its own.
func (p *Plan) externalLearnersAdvice() string {
	var names []string
	for _, m := range p.Green.Etcd.Members {
		if m.External {
			names = append(names, m.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf("; on the host of each external learner (%s): stop its etcd and empty its data dir now, then start it again with the command this cutover prints when it adds it to the new green", strings.Join(names, ", "))
}

// removeRestored removes green's data dirs that this cutover restored (they hold its run's
// marker) and says which; a dir without the marker is left alone (never restored), one with
// another run's marker is an error.
func (r *runner) removeRestored() (removed []string, err error) {
	for _, m := range r.p.Green.Etcd.Members {
		b, err := os.ReadFile(filepath.Join(m.DataDir, restoreMarker))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return removed, err
		case string(b) != r.j.ID:
			return removed, fmt.Errorf("green data dir %s was not restored by cutover %s: leaving it alone", m.DataDir, r.j.ID)
		}
		if err := os.RemoveAll(m.DataDir); err != nil {
			return removed, fmt.Errorf("removing green data dir %s: %w", m.DataDir, err)
		}
		removed = append(removed, m.DataDir)
	}
	return removed, nil
}
