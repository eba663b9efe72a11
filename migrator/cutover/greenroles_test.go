package cutover

import (
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestGreenAuthTakesBlueRolesAway: green is restored from blue's snapshot with blue's users;
// when blue's apiserver user holds a role of its own (auth on in blue), green's auth step takes
// it from that user on green (kubefence's until the switch; the role stays) and says which,
// instead of refusing with advice no run could follow (the next run restores it again). Blue's
// own auth step (a bake) still refuses: blue is the operator's.
func TestGreenAuthTakesBlueRolesAway(t *testing.T) {
	cli := startTestEtcd(t)
	ctx := t.Context()
	const apiserver = "kube-apiserver-etcd-client"
	for _, op := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", "pw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "apiserver-rw"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "apiserver-rw", "/registry/", clientv3.GetPrefixRangeEnd("/registry/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, apiserver, "pw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, apiserver, "apiserver-rw"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := op(); err != nil {
			t.Fatal(err)
		}
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: cli.Endpoints(), Username: "root", Password: "pw", DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()

	if err := setupAuth(ctx, root, "blue", "kubefence", apiserver, readWriteRole, nil); err == nil {
		t.Fatal("blue's auth step took the operator's role away from blue's apiserver user; want a refusal")
	}
	// What the green-auth step is told, it journals before the roles go (write-ahead): the
	// user still holds them when take runs.
	var revoked []string
	take := func(roles []string) error {
		u, err := root.UserGet(ctx, apiserver)
		if err != nil || !slices.Contains(u.Roles, "apiserver-rw") {
			t.Errorf("roles %q, %v when told: want them still held", u.Roles, err)
		}
		revoked = append(revoked, roles...)
		return nil
	}
	if err := setupAuth(ctx, root, "green", "kubefence", apiserver, readOnlyRole, take); err != nil {
		t.Fatalf("green's auth step: %v", err)
	}
	if !slices.Equal(revoked, []string{"apiserver-rw"}) {
		t.Errorf("told %q, want the role blue's user brought", revoked)
	}
	u, err := root.UserGet(ctx, apiserver)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(u.Roles, []string{readOnlyRole}) {
		t.Errorf("green apiserver user's roles %q, want only %s", u.Roles, readOnlyRole)
	}
	revoked = nil
	if err := setupAuth(ctx, root, "green", "kubefence", apiserver, readOnlyRole, take); err != nil || len(revoked) > 0 {
		t.Errorf("green's auth step again (a resume): told %q, %v; want nothing more", revoked, err)
	}
}

// TestRolesTakenAdvice: the report names the roles taken from green's apiserver user, and during
// a bake says to grant them back only after the finish (a rollback's gate refuses them).
func TestRolesTakenAdvice(t *testing.T) {
	p, _ := validPlan(t)
	r := &runner{p: p, j: &Journal{State: StateDone}}
	if got := r.rolesTakenAdvice(); got != "" {
		t.Errorf("no roles taken: %q, want nothing", got)
	}
	r.j.GreenRolesTaken = []string{"apiserver-rw"}
	if got := r.rolesTakenAdvice(); !strings.Contains(got, `["apiserver-rw"]`) || strings.Contains(got, "cutover finish") {
		t.Errorf("done: %q", got)
	}
	r.j.State = StateBaking
	if got := r.rolesTakenAdvice(); !strings.Contains(got, "after 'kubefence cutover finish'") {
		t.Errorf("baking: %q, want it to wait for the finish", got)
	}
}
