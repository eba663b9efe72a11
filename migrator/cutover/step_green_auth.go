package cutover

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	return fmt.Sprintf("green etcd auth: users root and kubefence's client certificate CN with role root, user %s (green apiserver) with role %s (read on every key); auth enable; green's revision unchanged",
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
	if err := setupGreenAuth(ctx, cli, self, r.p.Green.APIServer.EtcdUser); err != nil {
		return "", err
	}
	rev, err := currentRevision(ctx, cli)
	if err != nil {
		return "", err
	}
	if rev != r.j.SnapshotRevision {
		return "", fmt.Errorf("green etcd is at revision %d after auth was set up, not the snapshot's %d: something wrote to green", rev, r.j.SnapshotRevision)
	}
	return fmt.Sprintf("auth on: %q root, %q read only; green at the snapshot's revision %d", self, r.p.Green.APIServer.EtcdUser, rev), nil
}

// setupGreenAuth creates the users and roles and enables auth; each call tolerates what an
// earlier run already did.
func setupGreenAuth(ctx context.Context, cli *clientv3.Client, self, apiserver string) error {
	if self == apiserver {
		return fmt.Errorf("kubefence's client certificate for green has CN %q, the same as green apiserver's etcd user: give kubefence a certificate of its own (kubeadm's healthcheck-client)", self)
	}
	noPassword := &clientv3.UserAddOptions{NoPassword: true}
	ops := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, readOnlyRole); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, readOnlyRole, wholeKeyspace, wholeKeyspace, clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error { _, err := cli.UserAddWithOptions(ctx, "root", "", noPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.UserAddWithOptions(ctx, self, "", noPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, self, "root"); return err },
		func() error { _, err := cli.UserAddWithOptions(ctx, apiserver, "", noPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, apiserver, readOnlyRole); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for _, op := range ops {
		if err := op(); err != nil && !alreadyDone(err) {
			return fmt.Errorf("green etcd auth: %w", err)
		}
	}
	return nil
}

// alreadyDone is an auth error a repeated call gets.
func alreadyDone(err error) bool {
	for _, e := range []error{rpctypes.ErrRoleAlreadyExist, rpctypes.ErrUserAlreadyExist} {
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

// ungateGreenStep lets green's apiserver write: its etcd user gets read-write on every key.
// Replication has stopped (the step before), so nothing else writes to green.
type ungateGreenStep struct{}

func (ungateGreenStep) name() string                  { return StepUngateGreen }
func (ungateGreenStep) timeout(p *Plan) time.Duration { return p.Timeouts.Switch.D() }
func (ungateGreenStep) pastNoReturn() bool            { return true }

func (ungateGreenStep) describe(r *runner, _ bool) string {
	return fmt.Sprintf("grant green etcd user %s role %s (read-write on every key)", r.p.Green.APIServer.EtcdUser, readWriteRole)
}

func (ungateGreenStep) run(ctx context.Context, r *runner) (string, error) {
	cli, err := newEtcdClient(r.p.greenConn())
	if err != nil {
		return "", err
	}
	defer cli.Close()
	user := r.p.Green.APIServer.EtcdUser
	ops := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, readWriteRole); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, readWriteRole, wholeKeyspace, wholeKeyspace, clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserGrantRole(ctx, user, readWriteRole); return err },
	}
	for _, op := range ops {
		if err := op(); err != nil && !alreadyDone(err) {
			return "", fmt.Errorf("green etcd auth: %w", err)
		}
	}
	return fmt.Sprintf("green apiserver (%s) may write", user), nil
}
