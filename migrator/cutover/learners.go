package cutover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/internal/atomicfile"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// Green members on several hosts: the members without learner: true are restored from the
// snapshot on this host and start as green's cluster; each learner is then added to it
// (member add --learner), started empty — by kubefence, or by its own host for an external one,
// with the command the cutover prints — gets the data by raft, and is promoted once it has caught
// up. No copy per host; membership changes are no revisions, so green stays at the snapshot's
// revision. One learner at a time (etcd's default --max-learners is 1), in the plan's order.

// seeds are the members restored from the snapshot.
func (p *Plan) seeds() []GreenMember {
	return slices.DeleteFunc(slices.Clone(p.Green.Etcd.Members), func(m GreenMember) bool { return m.Learner })
}

// initialClusterFor is the --initial-cluster a member starts with: the seeds; for a learner,
// the seeds and the learners before it (promoted by then) and itself.
func (p *Plan) initialClusterFor(m GreenMember) string {
	var peers []datadir.Peer
	for _, o := range p.Green.Etcd.Members {
		if !o.Learner || m.Learner {
			peers = append(peers, datadir.Peer{Name: o.Name, PeerURLs: []string{o.PeerURL}})
		}
		if m.Learner && o.Name == m.Name {
			break
		}
	}
	return datadir.InitialCluster(peers)
}

// seedConn is how kubefence reaches green before its learners joined: the seeds' client URLs.
func (p *Plan) seedConn() datadir.ConnSpec {
	spec := p.greenConn()
	spec.Endpoints = nil
	for _, m := range p.seeds() {
		spec.Endpoints = append(spec.Endpoints, m.ClientURL)
	}
	return spec
}

// restartLearners starts again (or adopts) this host's learners that a run before this one
// started (their pids journaled), for a resume after green's processes died: a promoted learner
// votes, and the restored members alone may have no quorum without it. It returns them, to
// watch while green comes up.
func (r *runner) restartLearners(ctx context.Context) ([]greenProcess, error) {
	var gps []greenProcess
	for _, m := range r.p.Green.Etcd.Members {
		if _, started := r.j.GreenPIDs[m.Name]; !m.Learner || m.External || !started {
			continue
		}
		gp := greenEtcdProcess(r.p, m)
		if err := r.startGreenProcess(ctx, gp, m.ClientURL, m.PeerURL); err != nil {
			return nil, err
		}
		gps = append(gps, gp)
	}
	return gps, nil
}

// learnerPoll is how often a learner's promotion is tried while it catches up.
const learnerPoll = 200 * time.Millisecond

// joinLearners adds, starts and promotes every learner of the plan, one after the other; a
// learner a run before this one already added or promoted is taken up where it stands.
func (r *runner) joinLearners(ctx context.Context) ([]string, error) {
	var done []string
	for _, m := range r.p.Green.Etcd.Members {
		if !m.Learner {
			continue
		}
		if err := r.joinLearner(ctx, m); err != nil {
			return done, fmt.Errorf("green etcd %s: %w", m.Name, err)
		}
		done = append(done, m.Name)
	}
	return done, nil
}

func (r *runner) joinLearner(ctx context.Context, m GreenMember) error {
	cli, err := datadir.NewClient(r.p.seedConn())
	if err != nil {
		return err
	}
	defer cli.Close()
	var id uint64
	var promoted bool
	// etcd refuses a membership change until every voting member has been connected for a
	// while (--strict-reconfig-check): a learner promoted a moment ago is one.
	err = r.pollGreen(ctx, learnerPoll, "adding learner "+m.Name, func(ctx context.Context) (err error) {
		id, promoted, err = addLearner(ctx, cli, m)
		return err
	})
	if err != nil || promoted {
		return err
	}
	gp := greenEtcdProcess(r.p, m)
	var watch []greenProcess
	if m.External {
		r.emit(Event{Type: EventNote, Step: StepGreenEtcd, Detail: fmt.Sprintf("added %s as a learner; start it on its host (empty data dir) with: %s", m.Name, strings.Join(gp.argv, " "))})
	} else {
		if err := markLearnerDir(m.DataDir, r.j.ID); err != nil {
			return err
		}
		if err := r.startGreenProcess(ctx, gp, m.ClientURL, m.PeerURL); err != nil {
			return err
		}
		watch = append(watch, gp)
	}
	return r.pollGreen(ctx, learnerPoll, "learner "+m.Name+" caught up and promoted", func(ctx context.Context) error {
		return promote(ctx, cli, id)
	}, watch...)
}

// promote promotes learner id. A promote that failed may have committed with its answer lost
// (a timeout, a leader change): the member list then has id voting, and etcd would refuse every
// promote after ("can only promote a learner member") until the step timed out into an abort.
func promote(ctx context.Context, c clientv3.Cluster, id uint64) error {
	_, err := c.MemberPromote(ctx, id)
	if err == nil {
		return nil
	}
	if list, lerr := c.MemberList(ctx); lerr == nil {
		for _, m := range list.Members {
			if m.ID == id && !m.IsLearner {
				return nil
			}
		}
	}
	return err
}

// addLearner adds m as a learner unless green has it already; it returns m's member ID and
// whether it is a voting member already (promoted before a crash).
func addLearner(ctx context.Context, cli *clientv3.Client, m GreenMember) (uint64, bool, error) {
	list, err := cli.MemberList(ctx)
	if err != nil {
		return 0, false, err
	}
	for _, mem := range list.Members {
		if slices.Contains(mem.PeerURLs, m.PeerURL) {
			return mem.ID, !mem.IsLearner, nil
		}
	}
	resp, err := cli.MemberAddAsLearner(ctx, []string{m.PeerURL})
	if err != nil {
		if errors.Is(rpctypes.Error(err), rpctypes.ErrTooManyLearners) {
			return 0, false, fmt.Errorf("green has another learner not yet promoted (etcd allows one): %w", err)
		}
		return 0, false, err
	}
	return resp.Member.ID, false, nil
}

// markLearnerDir creates a local learner's data dir with this run's marker, so that cleanup and
// a rebuild remove it like the restored ones (etcd starts a member in a dir without member/).
func markLearnerDir(dir, runID string) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		if b, err := os.ReadFile(filepath.Join(dir, restoreMarker)); err == nil && string(b) == runID {
			return nil
		}
		return fmt.Errorf("data dir %s is not empty: a learner starts empty (move it away if it is not needed)", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, restoreMarker), []byte(runID), 0o600)
}
