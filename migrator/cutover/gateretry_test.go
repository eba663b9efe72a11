package cutover

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/proxy/admin"
)

// flakyAuth is a real etcd's auth API whose named call answers err once first.
type flakyAuth struct {
	clientv3.Auth
	call string
	err  error
}

// once returns a.err the first time call is asked for.
func (a *flakyAuth) once(call string) error {
	if a.call != call {
		return nil
	}
	a.call = ""
	return a.err
}

func (a *flakyAuth) UserGrantRole(ctx context.Context, user, role string) (*clientv3.AuthUserGrantRoleResponse, error) {
	if err := a.once("grant"); err != nil {
		return nil, err
	}
	return a.Auth.UserGrantRole(ctx, user, role)
}

func (a *flakyAuth) UserRevokeRole(ctx context.Context, user, role string) (*clientv3.AuthUserRevokeRoleResponse, error) {
	if err := a.once("revoke"); err != nil {
		return nil, err
	}
	return a.Auth.UserRevokeRole(ctx, user, role)
}

func (a *flakyAuth) UserGet(ctx context.Context, user string) (*clientv3.AuthUserGetResponse, error) {
	if err := a.once("get"); err != nil {
		return nil, err
	}
	return a.Auth.UserGet(ctx, user)
}

// TestGateRetried: gate-blue, past the switch with writes fenced, rides out one leader change
// (or no leader) on blue etcd as the ungate does, within the time the bake's steps have: its
// requests change nothing when repeated. It gave the bake up for good (NO WAY BACK) at the
// first one. A refusal still ends it at once.
func TestGateRetried(t *testing.T) {
	for _, tc := range []struct {
		call    string
		err     error
		wantBak bool
	}{
		{"grant", rpctypes.ErrLeaderChanged, true},
		{"revoke", rpctypes.ErrLeaderChanged, true},
		{"get", rpctypes.ErrNoLeader, true},
		{"revoke", rpctypes.ErrGRPCNoLeader, true},
		{"grant", rpctypes.ErrPermissionDenied, false},
	} {
		t.Run(tc.call+" "+tc.err.Error(), func(t *testing.T) {
			p, blue := bothSidesPlan(t, false)
			if _, err := blue.UserGrantRole(t.Context(), p.Blue.APIServer.EtcdUser, readWriteRole); err != nil {
				t.Fatal(err)
			}
			j := journalThrough(p, bakeSteps, StepSwitch, time.Now().UTC())
			var calls []string
			st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
			r := (&runner{o: Options{Plan: p}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: bakeSteps}).forward()
			defer r.closeAuthClients()
			cli, err := r.authClient(r.from)
			if err != nil {
				t.Fatal(err)
			}
			cli.Auth = &flakyAuth{Auth: cli.Auth, call: tc.call, err: tc.err}
			detail, err := gateStep{StepGateBlue}.run(t.Context(), r)
			if err != nil {
				t.Fatal(err)
			}
			if kept := r.j.NoBake == ""; kept != tc.wantBak {
				t.Fatalf("gate-blue: %q, noBake %q; want the bake kept %v", detail, r.j.NoBake, tc.wantBak)
			}
			if !tc.wantBak {
				return
			}
			u, err := blue.UserGet(t.Context(), p.Blue.APIServer.EtcdUser)
			if err != nil || strings.Join(u.Roles, ",") != readOnlyRole {
				t.Errorf("blue's apiserver user has roles %v, %v; want only %s", u, err, readOnlyRole)
			}
		})
	}
}
