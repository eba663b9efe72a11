//go:build e2e

package e2e

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/migrator/datadir"
)

// TestCutoverV2Source moves a cluster whose etcd 3.4 holds v2 data (a flannel-style network
// config, TTL keys, a hidden key) next to Kubernetes' v3 data to etcd 3.6, which refuses v2
// content: mode auto finds the v2 keys in the running member's files, green serves every
// Kubernetes object and the v2 keys as v3 keys (TTL keys with leases), a writer through the
// proxy sees no error and loses nothing, and blue keeps its data.
func TestCutoverV2Source(t *testing.T) {
	f, v2, netConfig := newV2CutoverFixture(t)
	ctx := t.Context()
	cs := f.proxyClient(t, 200)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "load"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := startWriter(t, cs, "load")
	time.Sleep(time.Second)
	out, err := f.cutoverCmd(ctx)
	acked, errs := w.finish()
	t.Logf("kubefence cutover:\n%s", out)
	if err != nil {
		t.Fatalf("cutover: %v", err)
	}
	for _, want := range []string{"v2 keys in snapshot", "v2-to-v3", "81 v2 keys migrated (80 with a lease, 1 hidden left out)", "green etcd serves the 81 migrated v2 keys"} {
		if !strings.Contains(out, want) {
			t.Errorf("cutover output lacks %q", want)
		}
	}
	if len(errs) > 0 {
		t.Errorf("the writer saw %d errors, first: %v", len(errs), errs[0])
	}
	// Every acknowledged write is on green, through the proxy (now on green).
	for _, name := range acked {
		if _, err := cs.CoreV1().ConfigMaps("load").Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("acknowledged %s not on green: %v", name, err)
		}
	}
	checkV2OnGreen(t, f, v2, netConfig)
}

// TestCutoverV2Resume kills the cutover of a v2 source as the steps that copy and migrate
// start, and resumes it.
func TestCutoverV2Resume(t *testing.T) {
	for _, step := range []string{cutover.StepCopy, cutover.StepMigrate, cutover.StepGreenEtcd} {
		t.Run(step, func(t *testing.T) {
			f, v2, netConfig := newV2CutoverFixture(t)
			killAtStep(t, f, step)
			out, err := f.cutoverCmd(t.Context(), "--resume")
			t.Logf("resume:\n%s", out)
			if err != nil {
				t.Fatalf("resume after kill -9 at %s: %v", step, err)
			}
			checkV2OnGreen(t, f, v2, netConfig)
		})
	}
}

// newV2CutoverFixture is a cutover fixture whose blue etcd 3.4 also holds v2 keys: a
// flannel-style network config, 80 subnet leases with a TTL (past --snapshot-count, so there
// is a v2 snapshot and a WAL tail) and a hidden key; the plan is mode auto on blue's member.
func newV2CutoverFixture(t *testing.T) (*cutoverFixture, *framework.V2Client, string) {
	t.Helper()
	f := newCutoverFixtureWith(t, framework.EtcdConfig{Version: framework.Etcd34, EnableV2: true, ExtraArgs: []string{"--snapshot-count=50"}})
	ctx := t.Context()
	v2 := &framework.V2Client{Endpoint: f.blue.etcd.Endpoints()[0]}
	put := func(key, value string, params url.Values) {
		t.Helper()
		if params == nil {
			params = url.Values{}
		}
		params.Set("value", value)
		if _, err := v2.Do(ctx, "PUT", key, params); err != nil {
			t.Fatalf("v2 PUT %s: %v", key, err)
		}
	}
	netConfig := `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`
	put("/coreos.com/network/config", netConfig, nil)
	for i := range 80 { // past --snapshot-count: a v2 snapshot plus a WAL tail
		put(fmt.Sprintf("/coreos.com/network/subnets/10.244.%d.0-24", i), fmt.Sprintf(`{"PublicIP":"192.168.0.%d"}`, i), url.Values{"ttl": {"3600"}})
	}
	put("/coreos.com/_internal/lock", "x", nil)
	f.green.Plan.Migration.Mode = "auto"
	f.green.Plan.Blue.Etcd.DataDir = f.blue.etcd.Members[0].DataDir
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	return f, v2, netConfig
}

// checkV2OnGreen checks the cutover ended on green, open, with the v2 keys as v3 keys (TTL
// keys with leases) on green etcd 3.6, and blue's v2 data untouched.
func checkV2OnGreen(t *testing.T, f *cutoverFixture, v2 *framework.V2Client, netConfig string) {
	t.Helper()
	ctx := t.Context()
	j, err := cutover.LoadJournal(f.green.Plan.StateDir)
	if err != nil || j.Mode != "v2-to-v3" {
		t.Fatalf("journal: mode %q, %v", j.Mode, err)
	}

	st, err := f.px.Admin.Status(ctx)
	if err != nil || st.Fenced || st.Backend != f.green.GreenURL {
		t.Fatalf("proxy after the cutover: %+v %v", st, err)
	}

	// Green etcd (3.6) serves the v2 keys as v3 keys; TTL keys hold leases.
	cli, err := datadir.NewClient(f.green.EtcdConn())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/coreos.com/network/config")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != netConfig {
		t.Fatalf("green etcd /coreos.com/network/config: %v %v", resp, err)
	}
	subnets, err := cli.Get(ctx, "/coreos.com/network/subnets/", clientv3.WithPrefix())
	if err != nil || len(subnets.Kvs) != 80 {
		t.Fatalf("green etcd subnets: %d, %v", len(subnets.Kvs), err)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(subnets.Kvs[0].Lease))
	if err != nil || ttl.TTL < 3000 || ttl.TTL > 3600 {
		t.Errorf("lease of a subnet: %+v %v", ttl, err)
	}
	// Blue is untouched: its v2 keys are still there.
	if r, err := v2.Do(ctx, "GET", "/coreos.com/network/config", nil); err != nil || r.Node.Value != netConfig {
		t.Errorf("blue lost its v2 data: %+v %v", r, err)
	}
}

// TestCutoverV2ForeignMember: blue.etcd.dataDir is the member of another etcd cluster on this
// host: its v2 store is not blue's, so the copy refuses it (naming both clusters) and the
// cutover aborts back to blue.
func TestCutoverV2ForeignMember(t *testing.T) {
	f := newCutoverFixtureWith(t, framework.EtcdConfig{Version: framework.Etcd34, EnableV2: true})
	other, err := f.env.StartEtcd(t.Context(), framework.EtcdConfig{Name: "other-etcd", Version: framework.Etcd34, EnableV2: true})
	if err != nil {
		t.Fatal(err)
	}
	f.green.Plan.Migration.Mode = "auto"
	f.green.Plan.Blue.Etcd.DataDir = other.Members[0].DataDir
	if err := f.green.Save(); err != nil {
		t.Fatal(err)
	}
	out, err := f.cutoverCmd(t.Context())
	t.Logf("kubefence cutover:\n%s", out)
	for _, want := range []string{"ABORT at copy", "blue.etcd.dataDir " + other.Members[0].DataDir + " is member", "not of blue's cluster"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("cutover (err %v) does not say %q", err, want)
		}
	}
	f.checkAborted(t)
}
