package cutover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/proxy/admin"
)

func (r *runner) snapshotPath() string { return filepath.Join(r.p.StateDir, "blue-snapshot.db") }

// describe says what a step will do; verbose gives the exact commands (--dry-run).
func (r *runner) describe(step string, verbose bool) string {
	p := r.p
	switch step {
	case StepPreflight:
		return fmt.Sprintf("check blue apiserver %s /readyz and etcd %s, proxy %s open on blue, green binaries and ports, disk space in %s",
			p.Blue.APIServer.URL, strings.Join(p.Blue.Etcd.Endpoints, ","), p.Proxy.AdminSocket, p.StateDir)
	case StepFence:
		return fmt.Sprintf("kubefence fence on (wait up to %s for in-flight writes)", p.Proxy.WaitTimeout.D())
	case StepCopy:
		s := fmt.Sprintf("check blue.etcd.endpoints are blue's members, take a linearizable read, wait for the raft indexes to converge and the most advanced member to apply what is committed, snapshot it into %s, check its sha256 and that its revision is at least the read's", r.snapshotPath())
		if r.v2Possible() {
			s += fmt.Sprintf("; copy %s's snapshot files, then its WAL, into %s", p.Blue.Etcd.DataDir, r.memberCopyPath())
			if p.Migration.Mode == "auto" {
				s += "; look for v2 user content there (v2-to-v3 if any, snapshot otherwise)"
			}
		}
		return s
	case StepMigrate:
		var dirs []string
		for _, m := range p.Green.Etcd.Members {
			dirs = append(dirs, m.DataDir)
		}
		if r.v2Possible() {
			return fmt.Sprintf("kubefence migrate v2-to-v3 from %s into %s (v3 keys kept, v2 keys renumbered above them, TTLs as leases; revision +%d, marked compacted), or for auto without v2 content a snapshot restore",
				r.memberCopyPath(), strings.Join(dirs, ", "), p.Migration.RevisionBump)
		}
		return fmt.Sprintf("restore the snapshot into %s (revision +%d, marked compacted)", strings.Join(dirs, ", "), p.Migration.RevisionBump)
	case StepGreenEtcd:
		var cmds []string
		for _, m := range p.Green.Etcd.Members {
			if verbose {
				cmds = append(cmds, strings.Join(etcdCommand(p, m), " "))
			} else {
				cmds = append(cmds, m.Name+" at "+m.ClientURL)
			}
		}
		return "start etcd " + p.Green.Etcd.Version + ": " + strings.Join(cmds, "; ")
	case StepGreenAPIServer:
		if sp := p.Green.APIServer.StaticPod; sp != nil {
			return fmt.Sprintf("write %s into %s, wait for %s/readyz", sp.Manifest, sp.ManifestDir, p.Green.APIServer.URL)
		}
		cmd := filepath.Base(p.Green.APIServer.Command[0])
		if verbose {
			cmd = strings.Join(p.Green.APIServer.Command, " ")
		}
		return fmt.Sprintf("start %s, wait for %s/readyz", cmd, p.Green.APIServer.URL)
	case StepVerify:
		return "compare every listable resource type on blue and green (UID and content)"
	case StepSwitch:
		return "kubefence backend set " + p.Green.APIServer.URL
	case StepUnfence:
		return "kubefence fence off"
	}
	return ""
}

// v2Possible says whether the copy looks at a blue member's v2 store.
func (r *runner) v2Possible() bool {
	return r.p.Migration.Mode != "snapshot" && r.p.Blue.Etcd.DataDir != ""
}

func (r *runner) step(ctx context.Context, step string) (string, error) {
	switch step {
	case StepPreflight:
		return r.preflight(ctx)
	case StepFence:
		st, err := r.adm.Status(ctx)
		if err != nil {
			return "", err
		}
		reason := r.p.Proxy.Reason
		if reason == "" {
			reason = "kubefence cutover " + r.j.ID
		}
		resp, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: reason, WaitTimeout: admin.Duration(r.p.Proxy.WaitTimeout)})
		if err != nil {
			return "", err
		}
		if !resp.Barrier.Complete {
			return "", fmt.Errorf("%d write(s) admitted before the fence still running after %s", len(resp.Barrier.Remaining), r.p.Proxy.WaitTimeout.D())
		}
		if r.j.FencedAt.IsZero() {
			r.j.FencedAt = time.Now().UTC()
			r.j.RefusedAtFence = st.RefusedWrites
		}
		r.j.FenceGeneration = resp.Status.Generation
		return fmt.Sprintf("writes refused from now; in-flight writes finished in %s", time.Duration(resp.Barrier.Waited).Round(time.Microsecond)), nil
	case StepCopy:
		return r.copyBlue(ctx)
	case StepMigrate:
		if r.j.Mode == "v2-to-v3" {
			return r.migrateV2(ctx)
		}
		if err := r.restoreGreen(); err != nil {
			return "", err
		}
		return fmt.Sprintf("%d member data dir(s) built; green starts at revision %d", len(r.p.Green.Etcd.Members), r.j.SnapshotRevision+r.p.Migration.RevisionBump), nil
	case StepGreenEtcd:
		return r.startGreenEtcd(ctx)
	case StepGreenAPIServer:
		return r.startGreenAPIServer(ctx)
	case StepVerify:
		return r.verify(ctx)
	case StepSwitch:
		if err := r.checkFenceHeld(ctx); err != nil {
			return "", err
		}
		resp, err := r.adm.SetBackend(ctx, admin.BackendRequest{URL: r.p.Green.APIServer.URL, CAFile: r.p.Green.APIServer.CAFile})
		if err != nil {
			return "", err
		}
		return switchDetail(resp), nil
	case StepUnfence:
		resp, err := r.adm.Fence(ctx, admin.FenceRequest{Fenced: false})
		if err != nil {
			return "", err
		}
		r.j.UnfencedAt = time.Now().UTC()
		r.j.RefusedAtUnfence = resp.Status.RefusedWrites
		return fmt.Sprintf("writes open on green; write-unavailability window %s", r.j.UnfencedAt.Sub(r.j.FencedAt).Round(time.Millisecond)), nil
	}
	return "", fmt.Errorf("unknown step %q", step)
}

// copyBlue snapshots blue (every acknowledged write in it) and, for a v2 source, copies the
// member's files next to it.
func (r *runner) copyBlue(ctx context.Context) (string, error) {
	info, err := datadir.TakeSnapshot(ctx, r.p.Blue.Etcd.EtcdClientSpec, r.snapshotPath())
	if err != nil {
		return "", err
	}
	r.j.Snapshot, r.j.SnapshotRevision, r.j.SnapshotBytes = info.Path, info.Revision, info.Bytes
	msg := fmt.Sprintf("%.1f MB, %d keys at revision %d (a linearizable read after the fence saw %d) from %s", float64(info.Bytes)/1e6, info.Keys, info.Revision, info.ReadRevision, info.Endpoint)
	r.j.Mode = "snapshot"
	if r.v2Possible() {
		m, err := r.copyV2Member(info.Path, info.ClusterID)
		if err != nil {
			return "", err
		}
		msg += "; " + m
	}
	return msg, nil
}

// verify compares blue and green object by object (and green etcd's migrated v2 keys).
func (r *runner) verify(ctx context.Context) (string, error) {
	blue, err := restConfig(r.p.Blue.APIServer.Kubeconfig)
	if err != nil {
		return "", err
	}
	green, err := restConfig(r.p.Green.APIServer.Kubeconfig)
	if err != nil {
		return "", err
	}
	rep, err := verifyObjects(ctx, blue, green, r.j.SnapshotRevision)
	r.j.Verified = rep
	if err != nil {
		return "", err
	}
	msg := fmt.Sprintf("%d objects of %d resource types identical; %d differences explained (the apiservers' own objects, expired events)", rep.Objects, rep.ResourceTypes, len(rep.ChangedAfterCopy))
	if len(r.j.V2Prefixes) > 0 {
		m, err := r.checkV2Keys(ctx)
		if err != nil {
			return "", err
		}
		msg += "; " + m
	}
	return msg, nil
}

func (r *runner) preflight(ctx context.Context) (string, error) {
	p := r.p
	var errs []error
	if err := readyz(ctx, p.Blue.APIServer.Kubeconfig); err != nil {
		errs = append(errs, fmt.Errorf("blue apiserver: %w", err))
	}
	blueDB, err := r.checkBlueEtcd(ctx)
	errs = append(errs, err, r.checkProxyOnBlue(ctx), checkGreenKubeconfig(ctx, p))
	if err := datadir.CheckBinaryVersion(ctx, p.Green.Etcd.Binary, p.Green.Etcd.Version); err != nil {
		errs = append(errs, fmt.Errorf("green.etcd.binary is not etcd %s: %w", p.Green.Etcd.Version, err))
	}
	for _, m := range p.Green.Etcd.Members {
		for _, u := range []string{m.ClientURL, m.PeerURL} {
			if err := portFree(u); err != nil {
				errs = append(errs, fmt.Errorf("green etcd %s: %w", m.Name, err))
			}
		}
		if entries, err := readDirIfExists(m.DataDir); err != nil || len(entries) > 0 {
			errs = append(errs, fmt.Errorf("green etcd %s: data dir %s must be absent or empty", m.Name, m.DataDir))
		}
		errs = append(errs, enoughSpace(filepath.Dir(m.DataDir), 2*blueDB))
	}
	if err := portFree(p.Green.APIServer.URL); err != nil {
		errs = append(errs, fmt.Errorf("green apiserver: %w", err))
	}
	if sp := p.Green.APIServer.StaticPod; sp != nil {
		errs = append(errs, manifestAbsent(sp))
	}
	errs = append(errs, enoughSpace(p.StateDir, 2*blueDB))
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	return fmt.Sprintf("blue ready, etcd db %.1f MB; proxy open on blue; green etcd %s, ports free, space enough", float64(blueDB)/1e6, p.Green.Etcd.Version), nil
}

// checkBlueEtcd checks every blue endpoint answers and they are exactly blue's members, and
// returns the largest db size.
func (r *runner) checkBlueEtcd(ctx context.Context) (int64, error) {
	cli, err := datadir.NewClient(r.p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		return 0, fmt.Errorf("blue etcd: %w", err)
	}
	defer cli.Close()
	sts, err := datadir.ClusterStatus(ctx, cli, r.p.Blue.Etcd.Endpoints)
	if err != nil {
		return 0, fmt.Errorf("blue etcd: %w", err)
	}
	var blueDB int64
	for _, s := range sts {
		blueDB = max(blueDB, s.DBSize)
	}
	if _, err := datadir.CheckMembers(ctx, r.p.Blue.Etcd.EtcdClientSpec); err != nil {
		return blueDB, fmt.Errorf("blue.etcd.endpoints: %w", err)
	}
	return blueDB, nil
}

// checkProxyOnBlue checks the proxy answers, open, with blue as its backend.
func (r *runner) checkProxyOnBlue(ctx context.Context) error {
	st, err := r.adm.Status(ctx)
	switch {
	case err != nil:
		return err
	case st.Fenced:
		return fmt.Errorf("the proxy is already fenced (%s): a cutover starts from an open proxy", st.Reason)
	case st.Backend != strings.TrimSuffix(r.p.Blue.APIServer.URL, "/"):
		return fmt.Errorf("the proxy's backend is %s, not blue's %s", st.Backend, r.p.Blue.APIServer.URL)
	}
	r.j.BlueBackend = st.Backend
	return nil
}

// checkGreenKubeconfig refuses a green kubeconfig that reaches something other than green:
// verify reads green through it, and pointed at blue (or at the proxy, still on blue) it would
// compare blue with blue and pass whatever green holds. Its server must not be blue's URL nor
// the server of blue's kubeconfig, and, green not being started yet, nothing may answer there.
func checkGreenKubeconfig(ctx context.Context, p *Plan) error {
	green, err := restConfig(p.Green.APIServer.Kubeconfig)
	if err != nil {
		return fmt.Errorf("green.apiserver.kubeconfig: %w", err)
	}
	server := hostPort(green.Host)
	fix := fmt.Sprintf("point green.apiserver.kubeconfig %s at green's apiserver (%s)", p.Green.APIServer.Kubeconfig, p.Green.APIServer.URL)
	if server == hostPort(p.Blue.APIServer.URL) {
		return fmt.Errorf("green.apiserver.kubeconfig's server %s is blue's apiserver: verify would compare blue with blue; %s", green.Host, fix)
	}
	if blue, err := restConfig(p.Blue.APIServer.Kubeconfig); err == nil && hostPort(blue.Host) == server {
		return fmt.Errorf("green.apiserver.kubeconfig's server %s is the server of blue.apiserver.kubeconfig: verify would compare blue with blue; %s", green.Host, fix)
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	if c, err := d.DialContext(ctx, "tcp", server); err == nil {
		c.Close()
		return fmt.Errorf("green.apiserver.kubeconfig's server %s already answers before green is started: it reaches blue, the proxy or another apiserver, and verify would not be reading green; %s", green.Host, fix)
	}
	return nil
}

func (r *runner) startGreenEtcd(ctx context.Context) (string, error) {
	p := r.p
	var eps []string
	for _, m := range p.Green.Etcd.Members {
		eps = append(eps, m.ClientURL)
		argv := etcdCommand(p, m)
		if r.greenPID(m.Name, argv) > 0 {
			continue // started before a crash; still running
		}
		for _, u := range []string{m.ClientURL, m.PeerURL} {
			if err := portFree(u); err != nil {
				return "", fmt.Errorf("green etcd %s: %w", m.Name, err)
			}
		}
		pid, err := daemon(p.StateDir, m.Name, argv)
		if err != nil {
			return "", err
		}
		r.j.GreenPIDs[m.Name] = pid
		if err := r.j.save(p.StateDir); err != nil {
			return "", err
		}
	}
	// Connect once every member accepts connections: a gRPC client that dials too early backs
	// off for a second before trying again.
	for _, m := range p.Green.Etcd.Members {
		for {
			c, err := net.DialTimeout("tcp", hostPort(m.ClientURL), time.Second)
			if err == nil {
				c.Close()
				break
			}
			if !alive(r.j.GreenPIDs[m.Name], etcdCommand(p, m)) {
				return "", fmt.Errorf("green etcd %s exited; see %s", m.Name, filepath.Join(p.StateDir, "logs", m.Name+".log"))
			}
			select {
			case <-ctx.Done():
				return "", fmt.Errorf("green etcd %s does not accept connections: %w", m.Name, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	spec := EtcdClientSpec{Endpoints: eps}
	cli, err := datadir.NewClient(spec)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	for {
		sts, err := datadir.ClusterStatus(ctx, cli, eps)
		if err == nil {
			rev := sts[0].Revision
			if want := r.j.SnapshotRevision + p.Migration.RevisionBump; rev < want {
				return "", fmt.Errorf("green etcd serves revision %d, below the bumped %d", rev, want)
			}
			return fmt.Sprintf("%d member(s) healthy, etcd %s, revision %d", len(sts), sts[0].Version, rev), nil
		}
		for _, m := range p.Green.Etcd.Members {
			if !alive(r.j.GreenPIDs[m.Name], etcdCommand(p, m)) {
				return "", fmt.Errorf("green etcd %s exited; see %s", m.Name, filepath.Join(p.StateDir, "logs", m.Name+".log"))
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("green etcd not healthy: %w (last: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (r *runner) startGreenAPIServer(ctx context.Context) (string, error) {
	a := r.p.Green.APIServer
	if a.StaticPod != nil {
		if err := r.placeGreenManifest(); err != nil {
			return "", err
		}
	} else if r.greenPID("apiserver", a.Command) == 0 {
		if err := portFree(a.URL); err != nil {
			return "", fmt.Errorf("green apiserver: %w", err)
		}
		pid, err := daemon(r.p.StateDir, "green-apiserver", a.Command)
		if err != nil {
			return "", err
		}
		r.j.GreenPIDs["apiserver"] = pid
		if err := r.j.save(r.p.StateDir); err != nil {
			return "", err
		}
	}
	start := time.Now()
	for {
		err := readyz(ctx, a.Kubeconfig)
		if err == nil {
			return fmt.Sprintf("%s ready after %s", a.URL, time.Since(start).Round(10*time.Millisecond)), nil
		}
		if a.StaticPod == nil && !alive(r.j.GreenPIDs["apiserver"], a.Command) {
			return "", fmt.Errorf("green apiserver exited; see %s", filepath.Join(r.p.StateDir, "logs", "green-apiserver.log"))
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("green apiserver %s not ready: %w (last: %v)", a.URL, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func enoughSpace(dir string, need int64) error {
	for d := dir; ; d = filepath.Dir(d) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(d, &st); err == nil {
			if free := int64(st.Bavail) * st.Bsize; free < need {
				return fmt.Errorf("%s: %.1f MB free, need %.1f MB", dir, float64(free)/1e6, float64(need)/1e6)
			}
			return nil
		}
		if d == filepath.Dir(d) {
			return fmt.Errorf("%s: cannot tell free space", dir)
		}
	}
}

// checkFenceHeld refuses the switch unless the proxy is still in the state the cutover's fence
// on left it in: fenced, on blue, at the generation journaled then. Any change in between (fence
// off and on by hand, a backend set) means writes may have reached blue after the copy.
func (r *runner) checkFenceHeld(ctx context.Context) error {
	st, err := r.adm.Status(ctx)
	if err != nil {
		return err
	}
	green := strings.TrimSuffix(r.p.Green.APIServer.URL, "/")
	switch {
	case st.Backend == green && st.Fenced && st.Generation == r.j.FenceGeneration+1:
		return nil // switched before a crash, not yet journaled
	case !st.Fenced:
		return fmt.Errorf("the proxy is not fenced (generation %d, changed %s): writes may have reached blue after the copy; not switching. Abort ('kubefence cutover abort') and run the cutover again", st.Generation, st.ChangedAt.Format(time.RFC3339))
	case st.Generation != r.j.FenceGeneration:
		return fmt.Errorf("the proxy's state changed since the cutover fenced it (generation %d then, %d now, last change %s, reason %q): someone ran fence off/on or backend set by hand, and writes may have reached blue after the copy; not switching. Abort ('kubefence cutover abort') and run the cutover again", r.j.FenceGeneration, st.Generation, st.ChangedAt.Format(time.RFC3339), st.Reason)
	}
	return nil
}

// placeGreenManifest writes the green apiserver's manifest into the kubelet's directory. A file
// of that name the cutover did not place is refused (it is a pod the kubelet runs), and the
// placement is journaled first, so that abort removes only what the cutover placed.
func (r *runner) placeGreenManifest() error {
	sp := r.p.Green.APIServer.StaticPod
	path := staticPodPath(sp)
	if r.j.StaticPodPlaced != path {
		if err := manifestAbsent(sp); err != nil {
			return err
		}
		r.j.StaticPodPlaced = path
		if err := r.j.save(r.p.StateDir); err != nil {
			return err
		}
	}
	return placeStaticPod(sp)
}

// manifestAbsent refuses a green manifest whose file name is already in the kubelet's directory.
func manifestAbsent(sp *StaticPod) error {
	path := staticPodPath(sp)
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("green.apiserver.staticPod: %s already exists in the kubelet's manifest dir: the cutover would replace a pod the kubelet runs; give green's manifest a file name of its own", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("green.apiserver.staticPod: %w", err)
	}
	return nil
}
