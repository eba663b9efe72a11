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
// first one. A refusal still ends it at once. A rollback's gate-green (the same step, on green
// etcd) rides them out the same way: green's apiserver is gated, not left writing green etcd.
func TestGateRetried(t *testing.T) {
	for _, tc := range []struct {
		call     string
		err      error
		wantGate bool
	}{
		{"grant", rpctypes.ErrLeaderChanged, true},
		{"revoke", rpctypes.ErrLeaderChanged, true},
		{"get", rpctypes.ErrNoLeader, true},
		{"revoke", rpctypes.ErrGRPCNoLeader, true},
		{"grant", rpctypes.ErrPermissionDenied, false},
	} {
		for _, step := range []string{StepGateBlue, StepGateGreen} {
			t.Run(step+" "+tc.call+" "+tc.err.Error(), func(t *testing.T) {
				r, gated := gateWorld(t, step)
				defer r.closeAuthClients()
				cli, err := r.authClient(r.from)
				if err != nil {
					t.Fatal(err)
				}
				cli.Auth = &flakyAuth{Auth: cli.Auth, call: tc.call, err: tc.err}
				detail, err := gateStep{step}.run(t.Context(), r)
				if err != nil {
					t.Fatal(err)
				}
				if done := r.j.NoBake == "" && !strings.Contains(detail, "could not be gated"); done != tc.wantGate {
					t.Fatalf("%s: %q, noBake %q; want gated %v", step, detail, r.j.NoBake, tc.wantGate)
				}
				if !tc.wantGate {
					return
				}
				u, err := gated.UserGet(t.Context(), r.from.api.EtcdUser)
				if err != nil || strings.Join(u.Roles, ",") != readOnlyRole {
					t.Errorf("%s's apiserver user has roles %v, %v; want only %s", r.from.name, u, err, readOnlyRole)
				}
			})
		}
	}
}

// gateWorld is a runner past its switch whose gate step (gate-blue: a cutover's, gate-green: a
// rollback's) is to run, over two real etcds (bothSidesPlan), the apiserver's user of the side
// to gate holding read-write; it returns that side's etcd client too.
func gateWorld(t *testing.T, step string) (*runner, *clientv3.Client) {
	t.Helper()
	p, blue := bothSidesPlan(t, false)
	var calls []string
	if step == StepGateBlue {
		if _, err := blue.UserGrantRole(t.Context(), p.Blue.APIServer.EtcdUser, readWriteRole); err != nil {
			t.Fatal(err)
		}
		j := journalThrough(p, bakeSteps, StepSwitch, time.Now().UTC())
		st := &admin.Status{Backend: p.Green.APIServer.URL, Fenced: true, Generation: 3}
		return (&runner{o: Options{Plan: p}, p: p, j: j, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: bakeSteps}).forward(), blue
	}
	green, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Green.Etcd.Members[0].ClientURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { green.Close() })
	if _, err := green.UserGrantRole(t.Context(), p.Green.APIServer.EtcdUser, readWriteRole); err != nil {
		t.Fatal(err)
	}
	r, err := newRollbackRunner(Options{Plan: p}, &Journal{ID: "x", State: StateBaking, PlanHash: p.hash, Bake: &BakeRecord{Revision: 2}})
	if err != nil {
		t.Fatal(err)
	}
	r.j.Done = journalThrough(p, rollbackSteps, StepSwitch, time.Time{}).Done
	r.j.FencedAt = time.Now().UTC()
	r.adm = memProxy(&admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 3}, &calls)
	return r, green
}
