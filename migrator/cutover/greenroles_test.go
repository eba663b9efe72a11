package cutover

import (
	"slices"
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

	if _, err := setupAuth(ctx, root, "blue", "kubefence", apiserver, readWriteRole, false); err == nil {
		t.Fatal("blue's auth step took the operator's role away from blue's apiserver user; want a refusal")
	}
	revoked, err := setupAuth(ctx, root, "green", "kubefence", apiserver, readOnlyRole, true)
	if err != nil {
		t.Fatalf("green's auth step: %v", err)
	}
	if !slices.Equal(revoked, []string{"apiserver-rw"}) {
		t.Errorf("revoked %q, want the role blue's user brought", revoked)
	}
	u, err := root.UserGet(ctx, apiserver)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(u.Roles, []string{readOnlyRole}) {
		t.Errorf("green apiserver user's roles %q, want only %s", u.Roles, readOnlyRole)
	}
	if again, err := setupAuth(ctx, root, "green", "kubefence", apiserver, readOnlyRole, true); err != nil || len(again) > 0 {
		t.Errorf("green's auth step again (a resume): revoked %q, %v; want nothing more", again, err)
	}
}
