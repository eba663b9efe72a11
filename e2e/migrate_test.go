//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/v2v3"
)

// v2KeyNotFound is the v2 API's errorCode for a missing key.
const v2KeyNotFound = 100

// writeV2Data drives etcd 3.4's v2 API through every kind of write the migrator must replay.
func writeV2Data(t *testing.T, c *framework.V2Client) {
	t.Helper()
	ctx := t.Context()
	do := func(method, key string, kv ...string) framework.V2Result {
		t.Helper()
		p := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Set(kv[i], kv[i+1])
		}
		r, err := c.Do(ctx, method, key, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i := range 120 {
		v := fmt.Sprintf(`{"kind":"ConfigMap","metadata":{"name":"cm-%d"},"data":{"pct":"100%%","utf8":"grüße ✓ \u00e9"}}`, i)
		do("PUT", fmt.Sprintf("/registry/configmaps/default/cm-%03d", i), "value", v)
	}
	for i := range 30 {
		do("PUT", fmt.Sprintf("/registry/configmaps/default/cm-%03d", i), "value", fmt.Sprintf("updated-%d", i))
	}
	for i := 100; i < 110; i++ {
		do("DELETE", fmt.Sprintf("/registry/configmaps/default/cm-%03d", i))
	}
	// Compare-and-swap and compare-and-delete, succeeding and failing.
	r := do("PUT", "/registry/cas/a", "value", "one")
	do("PUT", "/registry/cas/a", "value", "two", "prevValue", "one")
	do("PUT", "/registry/cas/a", "value", "never", "prevValue", "one") // fails
	do("PUT", "/registry/cas/b", "value", "b1")
	do("PUT", "/registry/cas/b", "value", "b2", "prevIndex", "1") // fails
	do("PUT", "/registry/cas/c", "value", "c1", "prevExist", "false")
	do("PUT", "/registry/cas/c", "value", "c2", "prevExist", "false") // fails: exists
	do("PUT", "/registry/cas/c", "value", "c3", "prevExist", "true")
	do("PUT", "/registry/cas/d", "value", "d1")
	do("DELETE", "/registry/cas/d", "prevValue", "wrong") // fails
	do("PUT", "/registry/cas/e", "value", "e1")
	do("DELETE", "/registry/cas/e", "prevValue", "e1")
	_ = r
	// Directories, recursive delete, in-order keys.
	do("PUT", "/registry/emptydir", "dir", "true")
	do("PUT", "/registry/tree/x/y", "value", "1")
	do("PUT", "/registry/tree/x/z", "value", "2")
	do("DELETE", "/registry/tree/x", "recursive", "true")
	do("PUT", "/registry/tree/kept", "value", "3")
	for i := range 5 {
		do("POST", "/registry/queue", "value", fmt.Sprintf("job-%d", i))
	}
	// TTL keys: events live an hour; one refreshed; one gone before the copy.
	for i := range 10 {
		do("PUT", fmt.Sprintf("/registry/events/default/ev-%d", i), "value", fmt.Sprintf("event %d", i), "ttl", "3600")
	}
	do("PUT", "/registry/events/default/ev-0", "ttl", "7200", "refresh", "true", "prevExist", "true")
	do("PUT", "/registry/events/default/short", "value", "gone soon", "ttl", "1")
	// Hidden keys.
	do("PUT", "/_hidden/secret", "value", "h1")
	do("PUT", "/registry/_internal/state", "value", "h2")
	// The leader's SYNC expires the 1 s key, within a second or two; the v2 store drops it only
	// then, so once a read misses it the expiry is in the log the migration replays.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := c.Do(ctx, "GET", "/registry/events/default/short", nil)
		return err == nil && r.ErrorCode == v2KeyNotFound, nil
	})
	if err != nil {
		t.Fatalf("the 1 s TTL key /registry/events/default/short did not expire within 30 s: %v", err)
	}
	// Writes after the last snapshot (--snapshot-count is small).
	for i := range 7 {
		do("PUT", fmt.Sprintf("/registry/late/k%d", i), "value", fmt.Sprintf("late %d", i))
	}
}

// readBackendKeys reads the live keys of a member's v3 backend: key -> its newest KeyValue,
// unless that revision is a deletion (a tombstone, marked by a 't' after the revision).
func readBackendKeys(t *testing.T, dataDir string) map[string]*mvccpb.KeyValue {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dataDir, "member", "snap", "db"), 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]*mvccpb.KeyValue{}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("key")).ForEach(func(k, v []byte) error {
			if len(v) == 0 {
				return nil
			}
			kv := &mvccpb.KeyValue{}
			if err := kv.Unmarshal(v); err != nil {
				return err
			}
			if len(k) == 18 && k[17] == 't' {
				delete(out, string(kv.Key))
			} else {
				out[string(kv.Key)] = kv
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
}

// TestMigrateV2ToV3 writes v2 data through real etcd 3.4, migrates a copy with kubefence and
// another with etcdctl migrate, and checks: identical key sets, revisions and values; ours has
// the TTL keys in leases and counts hidden keys; etcd 3.6 and 3.5 start on ours; etcd 3.6
// refuses the source and etcdctl migrate's output.
func TestMigrateV2ToV3(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcdctl", framework.Etcd34, "etcd", framework.Etcd35, "etcd", framework.Etcd36)
	ctx := t.Context()
	env := newEnv(t)
	blue, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "v2", Version: framework.Etcd34, EnableV2: true, ExtraArgs: []string{"--snapshot-count=150"}})
	if err != nil {
		t.Fatal(err)
	}
	writeV2Data(t, &framework.V2Client{Endpoint: blue.Endpoints()[0]})
	if err := blue.Stop(); err != nil {
		t.Fatal(err)
	}
	src := blue.Members[0].DataDir
	snaps, _ := filepath.Glob(filepath.Join(src, "member", "snap", "*.snap"))
	if len(snaps) == 0 {
		t.Fatal("the v2 member took no snapshot: the test would not cover snapshot + WAL tail")
	}
	ours, theirs, refused := filepath.Join(env.Dir, "ours-src"), filepath.Join(env.Dir, "theirs"), filepath.Join(env.Dir, "refused-src")
	copyDir(t, src, ours)
	copyDir(t, src, theirs)
	copyDir(t, src, refused)
	before := dirDigest(t, ours)

	ports, err := framework.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	out := filepath.Join(env.Dir, "migrated")
	cmd, explain := boundedKubefence(ctx, "migrate", "v2-to-v3", "--data-dir", ours, "--output-dir", out,
		"--name", "green-0", "--initial-cluster", "green-0="+peer, "--initial-advertise-peer-urls", peer, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := explain(cmd.Run()); err != nil {
		t.Fatalf("kubefence migrate v2-to-v3: %v\n%s", err, stderr.String())
	}
	var rep v2v3.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("report: snapshot index %d, commit %d, replay %+v, keys %+v, leases %d", rep.SnapshotIdx, rep.CommitIndex, rep.Replay, rep.Keys, rep.Leases)
	// --snapshot-count puts the bulk writes in the snapshot and the tricky ones in the WAL tail,
	// so the replay exercises the applier: failed compares, expiry syncs, in-order keys, dirs.
	if rep.SnapshotIdx == 0 || rep.Replay.Applied < 20 || rep.Replay.Refused < 4 || rep.Replay.Syncs == 0 {
		t.Errorf("want a snapshot and a WAL tail with applied, refused and sync entries: %+v", rep)
	}
	if rep.Keys.Hidden != 2 || rep.Keys.HiddenSkipped != 2 || rep.Keys.TTLKeys != 10 || rep.Leases < 1 || rep.Verified != rep.Keys.Keys {
		t.Errorf("report: %+v", rep)
	}
	if after := dirDigest(t, ours); after != before {
		t.Fatal("the source data dir changed")
	}

	// The reference: etcdctl migrate (etcd 3.4.23), in place on its own copy.
	etcdctl, _ := framework.Bin("etcdctl", framework.Etcd34)
	mig := exec.CommandContext(ctx, etcdctl, "migrate", "--data-dir", theirs)
	mig.Env = append(os.Environ(), "ETCDCTL_API=3")
	if b, err := mig.CombinedOutput(); err != nil {
		t.Fatalf("etcdctl migrate: %v\n%s", err, b)
	}
	want := readBackendKeys(t, theirs)
	got := readBackendKeys(t, out)
	compareWithEtcdctl(t, got, want)
	leased := 0
	for k, g := range got {
		if strings.HasPrefix(k, "/registry/events/") {
			if g.Lease == 0 {
				t.Errorf("TTL key %s has no lease", k)
			}
			leased++
		}
		if want[k] != nil && want[k].Lease != 0 {
			t.Errorf("etcdctl migrate gave %s a lease (the reference changed?)", k)
		}
	}
	if leased != 10 {
		t.Errorf("%d event keys migrated, want 10", leased)
	}

	// The same transformer program through both tools (etcdctl migrate's protocol).
	xform := filepath.Join(env.Dir, "transformer")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", xform, "./testdata/transformer").CombinedOutput(); err != nil {
		t.Fatalf("build the test transformer: %v\n%s", err, b)
	}
	oursX, outX := filepath.Join(env.Dir, "ours-x"), filepath.Join(env.Dir, "migrated-x")
	copyDir(t, src, oursX)
	if b, err := runKubefence(ctx, "migrate", "v2-to-v3", "--data-dir", oursX, "--output-dir", outX, "--transformer", xform,
		"--name", "green-0", "--initial-cluster", "green-0="+peer, "--initial-advertise-peer-urls", peer); err != nil {
		t.Fatalf("kubefence migrate --transformer: %v\n%s", err, b)
	}
	gotX := readBackendKeys(t, outX)
	// etcdctl migrate reads the transformer's output while a goroutine already runs cmd.Wait,
	// which closes the pipe when the program exits, and it ignores the read error: it can lose
	// keys without a word. Its best of a few runs is the reference; every key it did write
	// must be identical in ours.
	var wantX map[string]*mvccpb.KeyValue
	for try := 0; try < 5 && len(wantX) < len(gotX); try++ {
		theirsX := filepath.Join(env.Dir, fmt.Sprintf("theirs-x%d", try))
		copyDir(t, src, theirsX)
		mig = exec.CommandContext(ctx, etcdctl, "migrate", "--data-dir", theirsX, "--transformer", xform)
		mig.Env = append(os.Environ(), "ETCDCTL_API=3")
		if b, err := mig.CombinedOutput(); err != nil {
			t.Fatalf("etcdctl migrate --transformer: %v\n%s", err, b)
		}
		if w := readBackendKeys(t, theirsX); len(w) > len(wantX) {
			wantX = w
		}
		if len(wantX) < len(gotX) {
			t.Logf("etcdctl migrate --transformer wrote %d of %d keys (its pipe race)", len(wantX), len(gotX))
		}
	}
	if len(wantX) == 0 {
		t.Fatal("etcdctl migrate --transformer wrote no key in 5 runs: nothing to compare with")
	}
	subset := map[string]*mvccpb.KeyValue{}
	for k := range wantX {
		subset[k] = gotX[k]
	}
	compareWithEtcdctl(t, subset, wantX)
	if len(gotX) != len(got) || gotX["/t/registry/events/default/ev-1"] == nil || gotX["/t/registry/events/default/ev-1"].Lease == 0 {
		t.Errorf("transformed keys: %d (want %d), and the event keeps its lease", len(gotX), len(got))
	}

	// etcd 3.6 and 3.5 start on the output and serve every key; 3.6 refuses the v2 sources.
	for _, v := range []string{framework.Etcd36, framework.Etcd35} {
		dir := filepath.Join(env.Dir, "start-"+v)
		copyDir(t, out, dir)
		e, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "green-" + v, Version: v, DataDirs: []string{dir}})
		if err != nil {
			t.Fatalf("etcd %s on the migrated data: %v", v, err)
		}
		cli, err := e.Client()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Get(ctx, "/", clientv3.WithPrefix())
		if err != nil || int(resp.Count) != len(got) {
			t.Errorf("etcd %s serves %v keys (%v), want %d", v, resp, err, len(got))
		}
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(got["/registry/events/default/ev-1"].Lease), clientv3.WithAttachedKeys())
		if err != nil || ttl.TTL <= 0 || len(ttl.Keys) == 0 {
			t.Errorf("etcd %s: lease of an event: %+v %v", v, ttl, err)
		}
		cli.Close()
		if err := e.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{refused, theirs} {
		if msg := etcdRefuses(t, env, framework.Etcd36, dir); !strings.Contains(msg, "v2store") {
			t.Errorf("etcd 3.6 on %s: want a refusal naming v2store, got: %s", filepath.Base(dir), msg)
		}
	}
}

// compareWithEtcdctl checks two migrations' keys are the same, with the same revisions.
func compareWithEtcdctl(t *testing.T, got, want map[string]*mvccpb.KeyValue) {
	t.Helper()
	var diffs []string
	for k, w := range want {
		g := got[k]
		switch {
		case g == nil:
			diffs = append(diffs, "missing "+k)
		case !bytes.Equal(g.Value, w.Value) || g.CreateRevision != w.CreateRevision || g.ModRevision != w.ModRevision:
			diffs = append(diffs, fmt.Sprintf("%s: ours %d/%d %q, etcdctl %d/%d %q", k, g.CreateRevision, g.ModRevision, g.Value, w.CreateRevision, w.ModRevision, w.Value))
		}
	}
	for k := range got {
		if want[k] == nil {
			diffs = append(diffs, "extra "+k)
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Errorf("kubefence and etcdctl migrate differ (%d keys ours, %d theirs):\n%s", len(got), len(want), strings.Join(diffs, "\n"))
	}
}

// etcdRefuses starts etcd of version on dir, expects it to exit, and returns its log.
func etcdRefuses(t *testing.T, env *framework.Env, version, dir string) string {
	t.Helper()
	bin, _ := framework.Bin("etcd", version)
	ports, _ := framework.FreePorts(2)
	c, p := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--data-dir", dir, "--name", "v2-0", "--listen-client-urls", c, "--advertise-client-urls", c,
		"--listen-peer-urls", p, "--initial-advertise-peer-urls", p, "--initial-cluster", "v2-0="+p).CombinedOutput()
	if ctx.Err() != nil {
		return "still running after 20s: " + string(out)
	}
	_ = err
	return string(out)
}

// dirDigest summarises a directory tree (names, sizes, modification times, content hashes).
func dirDigest(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", "cd '"+dir+"' && find . -type f -exec sha256sum {} + | sort && find . -printf '%p %s %T@\\n' | sort").CombinedOutput()
	if err != nil {
		t.Fatalf("digest: %v %s", err, out)
	}
	return string(out)
}

// TestMigrateMixedV2V3: a member holding both v2 and v3 keys (overlapping revision numbers):
// every key of both stores comes out with its value, v3 keys with their own revisions and v2
// keys renumbered above them; a key in both stores is an error until --on-conflict says which
// wins.
func TestMigrateMixedV2V3(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd36)
	ctx := t.Context()
	env := newEnv(t)
	e, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "mixed", Version: framework.Etcd34, EnableV2: true})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	v2 := &framework.V2Client{Endpoint: e.Endpoints()[0]}
	v3want := map[string]string{}
	for i := range 30 {
		k, v := fmt.Sprintf("/registry/v3/k%02d", i), fmt.Sprintf("v3-%d", i)
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		v3want[k] = v
		if _, err := v2.Do(ctx, "PUT", fmt.Sprintf("/registry/v2/k%02d", i), url.Values{"value": {fmt.Sprintf("v2-%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	// One key in both stores.
	if _, err := cli.Put(ctx, "/registry/both", "from v3"); err != nil {
		t.Fatal(err)
	}
	if _, err := v2.Do(ctx, "PUT", "/registry/both", url.Values{"value": {"from v2"}}); err != nil {
		t.Fatal(err)
	}
	v3want["/registry/both"] = "from v3"
	cli.Close()
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	src := e.Members[0].DataDir
	migrate := func(out string, extra ...string) (string, error) {
		ports, _ := framework.FreePorts(1)
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		args := append([]string{"migrate", "v2-to-v3", "--data-dir", src, "--output-dir", out, "--name", "m",
			"--initial-cluster", "m=" + peer, "--initial-advertise-peer-urls", peer}, extra...)
		return runKubefence(ctx, args...)
	}
	if out, err := migrate(filepath.Join(env.Dir, "refused")); err == nil || !strings.Contains(out, "/registry/both") || !strings.Contains(out, "--on-conflict") {
		t.Fatalf("a key in both stores must be refused by name: %v\n%s", err, out)
	}
	out := filepath.Join(env.Dir, "merged")
	if b, err := migrate(out, "--on-conflict", "v3"); err != nil {
		t.Fatalf("migrate --on-conflict v3: %v\n%s", err, b)
	}
	got := readBackendKeys(t, out)
	var maxV3 int64
	for k, v := range v3want {
		g := got[k]
		if g == nil || string(g.Value) != v {
			t.Errorf("v3 key %s: %v, want %q", k, g, v)
			continue
		}
		maxV3 = max(maxV3, g.ModRevision)
	}
	prev := int64(0)
	for i := range 30 {
		k := fmt.Sprintf("/registry/v2/k%02d", i)
		g := got[k]
		if g == nil || string(g.Value) != fmt.Sprintf("v2-%d", i) {
			t.Errorf("v2 key %s: %v", k, g)
			continue
		}
		if g.ModRevision <= maxV3 || g.ModRevision <= prev {
			t.Errorf("v2 key %s at revision %d: want above the v3 store's %d and in order", k, g.ModRevision, maxV3)
		}
		prev = g.ModRevision
	}
	// etcd 3.6 serves the merged store.
	g, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "merged", Version: framework.Etcd36, DataDirs: []string{out}})
	if err != nil {
		t.Fatalf("etcd 3.6 on the merged data: %v", err)
	}
	gcli, err := g.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer gcli.Close()
	resp, err := gcli.Get(ctx, "/registry/", clientv3.WithPrefix())
	if err != nil || resp.Count != 61 {
		t.Fatalf("etcd 3.6 serves %v keys (%v), want 61", resp, err)
	}
}

// TestMigrateKubernetesData: a real kube-apiserver's objects (stored as JSON) are written into a
// v2 store under /registry, migrated, and a kube-apiserver 1.36 on etcd 3.6 with the result
// serves every object as the original apiserver did (UID and content; resourceVersions are the
// v2 indexes now, so they are left out of the comparison).
func TestMigrateKubernetesData(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd36, "kube-apiserver", framework.Kube136)
	ctx := t.Context()
	env := newEnv(t)
	pki, err := framework.NewPKI(filepath.Join(env.Dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	orig, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "orig", Version: framework.Etcd34})
	if err != nil {
		t.Fatal(err)
	}
	a, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "orig-apiserver", EtcdEndpoints: orig.Endpoints(), PKI: pki, StorageMediaType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"create", "namespace", "shop"},
		{"-n", "shop", "create", "configmap", "conf", "--from-literal=k=v", "--from-literal=pct=100%"},
		{"-n", "shop", "create", "secret", "generic", "pw", "--from-literal=password=s3cr3t"},
		{"-n", "shop", "create", "deployment", "web", "--image=registry.k8s.io/pause:3.10", "--replicas=2"},
		{"-n", "shop", "create", "serviceaccount", "robot"},
		{"-n", "shop", "create", "role", "reader", "--verb=get", "--resource=configmaps"},
		{"-n", "shop", "create", "service", "clusterip", "web", "--tcp=80:8080"},
	} {
		mustKubectl(t, a.Kubeconfig, args...)
	}
	// Copy every /registry key into a v2 store, as a v2-era apiserver would have stored them.
	ocli, err := orig.Client()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ocli.Get(ctx, "/registry/", clientv3.WithPrefix())
	ocli.Close()
	if err != nil {
		t.Fatal(err)
	}
	v2etcd, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "v2k8s", Version: framework.Etcd34, EnableV2: true})
	if err != nil {
		t.Fatal(err)
	}
	v2 := &framework.V2Client{Endpoint: v2etcd.Endpoints()[0]}
	for _, kv := range resp.Kvs {
		if !json.Valid(kv.Value) {
			t.Fatalf("%s is not stored as JSON", kv.Key)
		}
		if r, err := v2.Do(ctx, "PUT", string(kv.Key), url.Values{"value": {string(kv.Value)}}); err != nil || r.ErrorCode != 0 {
			t.Fatalf("v2 put %s: %v %+v", kv.Key, err, r)
		}
	}
	if err := v2etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	ports, _ := framework.FreePorts(1)
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	out := filepath.Join(env.Dir, "k8s-migrated")
	if b, err := runKubefence(ctx, "migrate", "v2-to-v3", "--data-dir", v2etcd.Members[0].DataDir, "--output-dir", out,
		"--name", "m", "--initial-cluster", "m="+peer, "--initial-advertise-peer-urls", peer); err != nil {
		t.Fatalf("migrate: %v\n%s", err, b)
	}
	green, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "k8s-green", Version: framework.Etcd36, DataDirs: []string{out}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "green-apiserver", EtcdEndpoints: green.Endpoints(), PKI: pki, StorageMediaType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	compared := 0
	for _, res := range []string{"namespaces", "configmaps", "secrets", "deployments.apps", "serviceaccounts", "roles.rbac.authorization.k8s.io", "services", "clusterroles.rbac.authorization.k8s.io", "priorityclasses.scheduling.k8s.io"} {
		want := listObjects(t, a.Kubeconfig, res)
		got := listObjects(t, b.Kubeconfig, res)
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s %s differs after the migration:\n orig  %s\n green %s", res, k, w, got[k])
			}
			compared++
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("%s %s exists only on green", res, k)
			}
		}
	}
	t.Logf("%d objects identical on the migrated cluster", compared)
}

// listObjects lists a resource type with kubectl as JSON and returns each object, without its
// resourceVersion, by namespace/name.
func listObjects(t *testing.T, kubeconfig, resource string) map[string]string {
	t.Helper()
	out := mustKubectl(t, kubeconfig, "get", resource, "-A", "-o", "json")
	var l struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, o := range l.Items {
		md := o["metadata"].(map[string]any)
		delete(md, "resourceVersion")
		b, _ := json.Marshal(o)
		ns, _ := md["namespace"].(string)
		m[ns+"/"+md["name"].(string)] = string(b)
	}
	return m
}

// TestMigrateV2ToV3KeepsEtcdIndices: a member that has taken no snapshot yet replays its whole
// WAL, whose first entry is its own add; a learner added and removed later moves the v2 index
// by 1 and by 2. Every key must come out at the create and modified index etcd 3.4's v2 API
// answered with.
func TestMigrateV2ToV3KeepsEtcdIndices(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcdctl", framework.Etcd34)
	ctx := t.Context()
	env := newEnv(t)
	blue, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "v2", Version: framework.Etcd34, EnableV2: true})
	if err != nil {
		t.Fatal(err)
	}
	c := &framework.V2Client{Endpoint: blue.Endpoints()[0]}
	want := map[string][2]uint64{}
	put := func(key string) {
		r, err := c.Do(ctx, "PUT", key, url.Values{"value": {"v"}})
		if err != nil || r.ErrorCode != 0 {
			t.Fatalf("v2 PUT %s: %+v %v", key, r, err)
		}
		want[key] = [2]uint64{r.Node.CreatedIndex, r.Node.ModifiedIndex}
	}
	etcdctl, _ := framework.Bin("etcdctl", framework.Etcd34)
	member := func(args ...string) string {
		cmd := exec.CommandContext(ctx, etcdctl, append([]string{"--endpoints", blue.Endpoints()[0], "member"}, args...)...)
		cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("etcdctl member %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	put("/a")
	put("/b")
	added := member("add", "learner-0", "--learner", "--peer-urls", "http://127.0.0.1:1")
	put("/c")
	id := regexp.MustCompile(`Member\s+([0-9a-f]+) added`).FindStringSubmatch(added)
	if id == nil {
		t.Fatalf("no member ID in %q", added)
	}
	member("remove", id[1])
	put("/d")
	put("/a")
	if err := blue.Stop(); err != nil {
		t.Fatal(err)
	}
	src := blue.Members[0].DataDir
	if snaps, _ := filepath.Glob(filepath.Join(src, "member", "snap", "*.snap")); len(snaps) > 0 {
		t.Fatalf("the member took a snapshot %v: the test wants its whole WAL replayed", snaps)
	}
	ports, err := framework.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	out := filepath.Join(env.Dir, "migrated")
	if b, err := runKubefence(ctx, "migrate", "v2-to-v3", "--data-dir", src, "--output-dir", out,
		"--name", "green-0", "--initial-cluster", "green-0="+peer, "--initial-advertise-peer-urls", peer); err != nil {
		t.Fatalf("kubefence migrate v2-to-v3: %v\n%s", err, b)
	}
	got := readBackendKeys(t, out)
	for k, w := range want {
		if g := got[k]; g == nil || uint64(g.CreateRevision) != w[0] || uint64(g.ModRevision) != w[1] {
			t.Errorf("%s: migrated %+v, want create/mod revision %d/%d (etcd's v2 indices)", k, g, w[0], w[1])
		}
	}
}
