package cutover

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/migrator/replicate"
)

// Roles mode replicate gives green etcd: its apiserver reads until the switch, then writes.
const (
	readOnlyRole  = "kubefence-readonly"
	readWriteRole = "kubefence-readwrite"
)

// wholeKeyspace is etcd's range for every key (etcdctl's `--prefix ""`).
const wholeKeyspace = "\x00"

// greenAuthStep turns etcd auth on in green (mode replicate): kubefence's client certificate
// is root, green apiserver's may only read. Auth changes are not revisions: green stays at
// the snapshot's revision, which the step checks.
type greenAuthStep struct{}

func (greenAuthStep) name() string                  { return StepGreenAuth }
func (greenAuthStep) timeout(p *Plan) time.Duration { return p.Timeouts.GreenEtcd.D() }
func (greenAuthStep) pastNoReturn() bool            { return false }

func (greenAuthStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("green etcd auth: users root and kubefence's client certificate CN with role root, user %s (green apiserver) with role %s (read on every key) and no other; auth enable; green's revision unchanged",
		r.p.Green.APIServer.EtcdUser, readOnlyRole)
}

func (greenAuthStep) run(ctx context.Context, r *runner) (string, error) {
	self, err := certCN(r.p.Green.Etcd.TLS.ClientCertFile)
	if err != nil {
		return "", fmt.Errorf("green.etcd.tls.clientCertFile: %w", err)
	}
	cli, err := newEtcdClient(r.p.greenConn())
	if err != nil {
		return "", err
	}
	defer cli.Close()
	if err := setupAuth(ctx, cli, "green", self, r.p.Green.APIServer.EtcdUser, readOnlyRole, r.journalRolesTaken); err != nil {
		return "", err
	}
	rev, err := replicate.Revision(ctx, cli)
	if err != nil {
		return "", err
	}
	if rev != r.j.SnapshotRevision {
		return "", greenMoved(ctx, cli, r.j.SnapshotRevision, rev)
	}
	detail := fmt.Sprintf("auth on: %q root, %q read only; green at the snapshot's revision %d", self, r.p.Green.APIServer.EtcdUser, rev)
	if len(r.j.GreenRolesTaken) > 0 {
		detail += fmt.Sprintf("; roles %q that %q brought from blue's snapshot taken from it on green (the roles stay)", r.j.GreenRolesTaken, r.p.Green.APIServer.EtcdUser)
	}
	return detail, nil
}

// holdsGreenLeases is a step between green's start and replication's (the auth steps): green's
// restored leases must stay alive while it runs, as the run that started green keeps them from
// then on (holdRestoredLeases). A --resume after that process stopped holds them again before
// the step runs, until replication takes them over; a lease green let run out meanwhile is a
// revision of green's own (greenMoved says so).
type holdsGreenLeases struct{ step }

func (s holdsGreenLeases) run(ctx context.Context, r *runner) (string, error) {
	if err := r.holdRestoredLeases(ctx); err != nil {
		return "", err
	}
	return s.step.run(ctx, r)
}

// greenMovedRead bounds reading green's changes past the snapshot (greenMoved).
const greenMovedRead = 10 * time.Second

// greenMoved is the green-auth step's refusal of a green at revision rev, past the snapshot's,
// saying what moved it, from green's history since: deletes of leased keys only are a lease
// green let run out by itself while nothing kept its leases alive (the process that started
// green stopped, for longer than the lease's TTL, before this --resume); anything else a write.
func greenMoved(ctx context.Context, cli *clientv3.Client, snapshot, rev int64) error {
	base := fmt.Sprintf("green etcd is at revision %d after auth was set up, not the snapshot's %d", rev, snapshot)
	ended, written, err := greenChanges(ctx, cli, snapshot+1, rev)
	switch {
	case err != nil:
		return fmt.Errorf("%s: something wrote to green, or a lease ran out there (its changes could not be read: %w)", base, err)
	case len(written) > 0:
		return fmt.Errorf("%s: something wrote to green (%s)", base, keysSaid(written))
	}
	return fmt.Errorf("%s: a lease green was restored with ran out there (%s deleted with it): nothing kept green's leases alive while no cutover process ran, for longer than its TTL (the process that started green stopped before this --resume); green is no longer blue's snapshot: the cutover goes back to blue; run the cutover again", base, keysSaid(ended))
}

// greenChanges reads green's changes of revisions from..to: the keys deleted with their lease
// (ended) and the others (written).
func greenChanges(ctx context.Context, cli *clientv3.Client, from, to int64) (ended, written []string, err error) {
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), greenMovedRead)
	defer cancel()
	for resp := range cli.Watch(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV()) {
		if err := resp.Err(); err != nil {
			return nil, nil, err
		}
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision > to {
				return ended, written, nil
			}
			if ev.Type == clientv3.EventTypeDelete && ev.PrevKv != nil && ev.PrevKv.Lease != 0 {
				ended = append(ended, string(ev.Kv.Key))
			} else {
				written = append(written, string(ev.Kv.Key))
			}
		}
		if n := len(resp.Events); n > 0 && resp.Events[n-1].Kv.ModRevision >= to {
			return ended, written, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	return nil, nil, errors.New("the watch ended before green's changes arrived")
}

// keysSaid names keys in a message: the first three, and how many more.
func keysSaid(keys []string) string {
	if len(keys) <= 3 {
		return strings.Join(keys, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(keys[:3], ", "), len(keys)-3)
}

// setupAuth creates the read-only and read-write roles and the users (root and kubefence's
// self as root, apiserver with apiRole and only it) and enables auth; each call tolerates what
// an earlier run already did. A role of the apiserver user's not given by kubefence is refused
// (blue: the operator's) unless take is given (green, restored with blue's users: kubefence's
// until the switch): then take is told the roles first, and they are taken from the user.
func setupAuth(ctx context.Context, cli *clientv3.Client, where, self, apiserver, apiRole string, take func(roles []string) error) error {
	if self == apiserver {
		return fmt.Errorf("kubefence's etcd client certificate has CN %q, the same as the apiserver's etcd user: give kubefence a certificate of its own (kubeadm's healthcheck-client)", self)
	}
	noPassword := &clientv3.UserAddOptions{NoPassword: true}
	grant := func(role string, perm clientv3.PermissionType) func() error {
		return func() error {
			_, err := cli.RoleGrantPermission(ctx, role, wholeKeyspace, wholeKeyspace, perm)
			return err
		}
	}
	ops := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, readOnlyRole); return err },
		grant(readOnlyRole, clientv3.PermissionType(clientv3.PermRead)),
		func() error { _, err := cli.RoleAdd(ctx, readWriteRole); return err },
		grant(readWriteRole, clientv3.PermissionType(clientv3.PermReadWrite)),
		func() error { _, err := cli.UserAddWithOptions(ctx, "root", "", noPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.UserAddWithOptions(ctx, self, "", noPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, self, "root"); return err },
		func() error { _, err := cli.UserAddWithOptions(ctx, apiserver, "", noPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, apiserver, apiRole); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for _, op := range ops {
		if err := op(); err != nil && !alreadyDone(err) {
			return fmt.Errorf("etcd auth: %w", err)
		}
	}
	// A snapshot of an etcd with auth on carries its users: green restored from a blue that
	// was rolled back to holds the apiserver user with read-write already.
	other := readWriteRole
	if apiRole == readWriteRole {
		other = readOnlyRole
	}
	if _, err := cli.UserRevokeRole(ctx, apiserver, other); err != nil && !alreadyDone(err) {
		return fmt.Errorf("etcd auth: %w", err)
	}
	if take != nil {
		if err := revokeOthers(ctx, cli, apiserver, apiRole, take); err != nil {
			return fmt.Errorf("%s etcd auth: %w", where, err)
		}
	}
	return checkRoles(ctx, cli, side{name: where, api: APIServerRef{EtcdUser: apiserver}}, apiRole)
}

// revokeOthers takes from user every role but keep and kubefence's read-only one, after
// telling take which (write-ahead: a run killed between the two still knows them); the roles
// themselves stay.
func revokeOthers(ctx context.Context, cli clientv3.Auth, user, keep string, take func([]string) error) error {
	u, err := cli.UserGet(ctx, user)
	if err != nil {
		return err
	}
	others := slices.DeleteFunc(slices.Clone(u.Roles), func(role string) bool { return role == keep || role == readOnlyRole })
	if len(others) == 0 {
		return nil
	}
	if err := take(others); err != nil {
		return err
	}
	for _, role := range others {
		if _, err := cli.UserRevokeRole(ctx, user, role); err != nil && !alreadyDone(err) {
			return err
		}
	}
	return nil
}

// journalRolesTaken journals roles the green-auth step is about to take from green's apiserver
// user, before it does.
func (r *runner) journalRolesTaken(roles []string) error {
	for _, role := range roles {
		if !slices.Contains(r.j.GreenRolesTaken, role) {
			r.j.GreenRolesTaken = append(r.j.GreenRolesTaken, role)
		}
	}
	if err := r.saveJournal(); err != nil {
		return fmt.Errorf("journal the roles to take from %s: %w", r.p.Green.APIServer.EtcdUser, err)
	}
	return nil
}

// alreadyDone is an auth error a repeated call gets.
func alreadyDone(err error) bool {
	for _, e := range []error{rpctypes.ErrRoleAlreadyExist, rpctypes.ErrUserAlreadyExist, rpctypes.ErrRoleNotGranted} {
		if errors.Is(err, e) || err.Error() == e.Error() {
			return true
		}
	}
	return false
}

// certCN is the common name of the first certificate in a PEM file: etcd's user for it.
func certCN(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return "", fmt.Errorf("%s: no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return "", err
	}
	if c.Subject.CommonName == "" {
		return "", fmt.Errorf("%s: the certificate has no CN (etcd's user name)", path)
	}
	return c.Subject.CommonName, nil
}

// ungateStep lets r.to's apiserver write (green's in a cutover, blue's in a rollback): its etcd
// user gets read-write on every key, over a client dialed before the fence (authClient).
// Replication has stopped (a step before), so nothing else writes there. No role check
// follows: read-write on every key is all any role could give.
type ungateStep struct{ n string }

func (s ungateStep) name() string                { return s.n }
func (ungateStep) timeout(p *Plan) time.Duration { return p.Timeouts.Switch.D() }
func (ungateStep) pastNoReturn() bool            { return true }

func (ungateStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("grant %s etcd user %s role %s (read-write on every key)", r.to.name, r.to.api.EtcdUser, readWriteRole)
}

func (ungateStep) run(ctx context.Context, r *runner) (string, error) {
	cli, err := r.authClient(r.to)
	if err != nil {
		return "", err
	}
	if err := grantRole(ctx, cli, r.to.api.EtcdUser, readWriteRole); err != nil {
		return "", fmt.Errorf("%s etcd auth: %w; %s's apiserver may still only read: writes stay fenced until this step is done (--resume)", r.to.name, err, r.to.name)
	}
	return fmt.Sprintf("%s apiserver (%s) may write", r.to.name, r.to.api.EtcdUser), nil
}

// grantRole grants user role, again while etcd answers with an error that may pass
// (authRetried): granting a role the user holds changes nothing.
func grantRole(ctx context.Context, cli clientv3.Auth, user, role string) error {
	return authRetried(ctx, func(ctx context.Context) error {
		_, err := cli.UserGrantRole(ctx, user, role)
		return err
	})
}

// authRetried runs call, an etcd auth request that changes nothing when repeated, again while
// etcd answers with an error that may pass (a leader change, a timeout, too many requests, no
// leader: clientv3 retries none of its auth requests), until ctx ends. A refusal (permission
// denied, no such user or role) ends it at once.
func authRetried(ctx context.Context, call func(context.Context) error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Cap: time.Second, Steps: math.MaxInt32},
		func(ctx context.Context) (bool, error) {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			last = call(actx)
			switch rpctypes.Error(last) {
			case nil:
				return true, nil
			case rpctypes.ErrPermissionDenied, rpctypes.ErrUserNotFound, rpctypes.ErrRoleNotFound, rpctypes.ErrUserEmpty:
				return false, last
			}
			return false, nil
		})
	if err != nil && last != nil && !errors.Is(err, last) {
		return fmt.Errorf("%w (last: %w)", err, last)
	}
	return err
}

// gateStep keeps r.from's apiserver from writing (blue's after a cutover's switch, green's after
// a rollback's): its etcd user keeps read and loses read-write, which the step checks. Nothing
// but the replicator writes to that etcd from here (invariant blue-follows-exactly).
type gateStep struct{ n string }

func (s gateStep) name() string                { return s.n }
func (gateStep) timeout(p *Plan) time.Duration { return p.Timeouts.Switch.D() }
func (gateStep) pastNoReturn() bool            { return true }

func (gateStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("%s etcd user %s: role %s granted, %s revoked (its apiserver reads, writes nothing)", r.from.name, r.from.api.EtcdUser, readOnlyRole, readWriteRole)
}

// run gates within the window's budget (bakeContext): past the switch, writes fenced, the
// gate only keeps the side left behind from writing. If it cannot be done in time, a cutover
// goes on without a bake (NO WAY BACK) and a rollback without the gate, rather than keep
// writes fenced.
func (s gateStep) run(ctx context.Context, r *runner) (string, error) {
	wctx, cancel := r.bakeContext(ctx)
	defer cancel()
	detail, err := gate(wctx, r)
	switch {
	case err == nil:
		return detail, nil
	case s.n == StepGateBlue:
		return r.forgoBake(fmt.Errorf("blue's apiserver could not be gated: %w", err)), nil
	}
	r.j.NotGated = err.Error()
	return fmt.Sprintf("%s's apiserver could not be gated (%v): it may still write %s etcd, which nothing follows any more; going on rather than keep writes fenced", r.from.name, err, r.from.name), nil
}

// gate takes writing away from r.from's apiserver (gateStep).
func gate(ctx context.Context, r *runner) (string, error) {
	sd := r.from
	cli, err := r.authClient(sd)
	if err != nil {
		return "", err
	}
	user := sd.api.EtcdUser
	if err := grantRole(ctx, cli, user, readOnlyRole); err != nil {
		return "", fmt.Errorf("%s etcd auth: %w", sd.name, err)
	}
	err = authRetried(ctx, func(ctx context.Context) error {
		_, err := cli.UserRevokeRole(ctx, user, readWriteRole)
		if err != nil && alreadyDone(err) {
			return nil // revoked by a try whose answer was lost, or never held
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("%s etcd auth: %w", sd.name, err)
	}
	if err := checkRoles(ctx, cli, sd, readOnlyRole); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s apiserver (%s) may only read %s etcd", sd.name, user, sd.name), nil
}

// checkRoles refuses a user with roles other than want and the read-only role (its read
// retried as authRetried does).
func checkRoles(ctx context.Context, cli *clientv3.Client, sd side, want string) error {
	roles, err := userRoles(ctx, cli, sd.api.EtcdUser)
	if err != nil {
		return fmt.Errorf("%s etcd auth: %w", sd.name, err)
	}
	for _, role := range roles {
		if role != want && role != readOnlyRole {
			return fmt.Errorf("%s etcd user %s also has role %q, not given by kubefence: it could write past the gate; revoke it (etcdctl user revoke-role) and run again", sd.name, sd.api.EtcdUser, role)
		}
	}
	return nil
}

// userRoles are the roles etcd's user holds, read again while etcd answers with an error that may
// pass (authRetried).
func userRoles(ctx context.Context, cli *clientv3.Client, user string) ([]string, error) {
	var roles []string
	err := authRetried(ctx, func(ctx context.Context) error {
		u, err := cli.UserGet(ctx, user)
		if err == nil {
			roles = u.Roles
		}
		return err
	})
	return roles, err
}

// authClient is the client of sd's etcd that the window's gate and ungate steps use: dialed
// before the fence (warmAuthClients), or here when a resumed run starts after it. Run and
// Rollback close it when they end.
func (r *runner) authClient(sd side) (*clientv3.Client, error) {
	if cli := r.authClients[sd.name]; cli != nil {
		return cli, nil
	}
	cli, err := newEtcdClient(sd.etcd)
	if err != nil {
		return nil, fmt.Errorf("%s etcd: %w", sd.name, err)
	}
	if r.authClients == nil {
		r.authClients = map[string]*clientv3.Client{}
	}
	r.authClients[sd.name] = cli
	return cli, nil
}

// warmAuthClients connects, before the fence, to the etcd of each side a gate or ungate step
// still to run changes, and reads its revision there: the TLS handshake (milliseconds) is done
// outside the window, and an etcd that cannot be reached fails the step before anything is
// fenced rather than past the point of no return.
func (r *runner) warmAuthClients(ctx context.Context) error {
	for _, s := range r.steps {
		var sd side
		switch s.(type) {
		case ungateStep:
			sd = r.to
		case gateStep:
			sd = r.from
		default:
			continue
		}
		if r.j.done(s.name()) {
			continue
		}
		cli, err := r.authClient(sd)
		if err == nil {
			_, err = r.readRevision(ctx, cli)
		}
		if err != nil {
			return fmt.Errorf("connecting to %s etcd for the %s step, before the fence: %w; nothing is fenced", sd.name, s.name(), err)
		}
	}
	return nil
}

// closeAuthClients closes the clients authClient opened.
func (r *runner) closeAuthClients() {
	for _, cli := range r.authClients {
		cli.Close()
	}
	r.authClients = nil
}

// rolesTakenAdvice is what the report says of the roles the green-auth step took from green's
// apiserver user ("" when none).
func (r *runner) rolesTakenAdvice() string {
	if len(r.j.GreenRolesTaken) == 0 {
		return ""
	}
	when := "grant them again (etcdctl user grant-role) if anything else relies on them"
	if r.j.State == StateBaking {
		// A rollback gates green's apiserver again, and refuses a role it did not give.
		when = "grant them again (etcdctl user grant-role) after 'kubefence cutover finish' if anything else relies on them, not during the bake: a rollback's gate refuses a role it did not give"
	}
	return fmt.Sprintf(" Green's etcd user %s has kubefence's role %s (read-write on every key); the roles it had in blue, %q, were taken from it on green: %s.", r.p.Green.APIServer.EtcdUser, readWriteRole, r.j.GreenRolesTaken, when)
}
