package cutover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/kubefence/kubefence/proxy/admin"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func validPlan(t *testing.T) (*Plan, string) {
	t.Helper()
	dir := t.TempDir()
	kc := writeFile(t, dir, "kubeconfig", "apiVersion: v1\nkind: Config\n")
	etcd := writeFile(t, dir, "etcd", "#!/bin/sh\n")
	api := writeFile(t, dir, "kube-apiserver", "#!/bin/sh\n")
	p := &Plan{
		APIVersion: PlanAPIVersion, Kind: PlanKind, StateDir: filepath.Join(dir, "state"),
		Blue: BlueSpec{APIServer: APIServerRef{URL: "https://10.0.0.1:6443", Kubeconfig: kc}, Etcd: BlueEtcd{EtcdClientSpec: EtcdClientSpec{Endpoints: []string{"https://10.0.0.1:2379"}}}},
		Green: GreenSpec{
			Etcd:      GreenEtcd{Binary: etcd, Version: "3.6.16", Members: []GreenMember{{Name: "g0", DataDir: filepath.Join(dir, "g0"), ClientURL: "http://127.0.0.1:2479", PeerURL: "http://127.0.0.1:2480"}}, Insecure: true},
			APIServer: GreenAPIServer{APIServerRef: APIServerRef{URL: "https://10.0.0.2:6443", Kubeconfig: kc}, Command: []string{api, "--etcd-servers=http://127.0.0.1:2479", "--endpoint-reconciler-type=none"}},
		},
	}
	return p, dir
}

func TestParsePlan(t *testing.T) {
	p, _ := validPlan(t)
	good, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePlan(good)
	if err != nil {
		t.Fatalf("valid plan refused: %v", err)
	}
	if got.Migration.Mode != "auto" || got.Replicating() || got.Proxy.FenceMode != admin.ModeRefuse || got.Migration.RevisionBump != DefaultRevisionBump || got.Proxy.AdminSocket == "" || got.Timeouts.Verify == 0 {
		t.Errorf("defaults not applied: %+v", got)
	}
	cases := []struct {
		name   string
		mutate func(*Plan)
		want   []string
	}{
		{"many problems at once", func(p *Plan) {
			p.StateDir = ""
			p.Blue.APIServer.URL = "10.0.0.1:6443"
			p.Green.Etcd.Members = append(p.Green.Etcd.Members, p.Green.Etcd.Members[0])
			p.Green.APIServer.Command = nil
			p.Migration.Mode = "magic"
		}, []string{"stateDir is required", `blue.apiserver.url "10.0.0.1:6443"`, "members: 2 given, want 1 or 3", "is used twice", "give command", `migration.mode "magic"`}},
		{"v2 without a member dir", func(p *Plan) { p.Migration.Mode = "v2-to-v3" }, []string{"needs blue.etcd.dataDir"}},
		{"bad conflict rule", func(p *Plan) {
			p.Migration.Mode, p.Blue.Etcd.DataDir, p.Migration.OnConflict = "auto", p.StateDir, "mine"
		}, []string{`onConflict "mine"`}},
		{"missing fields", func(p *Plan) { p.Green.Etcd.Binary = ""; p.Blue.APIServer.Kubeconfig = "" }, []string{"green.etcd.binary is required", "blue.apiserver.kubeconfig is required"}},
		{"relative data dir", func(p *Plan) { p.Green.Etcd.Members[0].DataDir = "green" }, []string{"must be absolute"}},
		// The run lock and the journal are found through it: relative, a run from another
		// directory would find neither, and a second run would start.
		{"relative state dir", func(p *Plan) { p.StateDir = "state" }, []string{`stateDir "state" must be absolute`}},
		{"negative timeout", func(p *Plan) { p.Timeouts.Window = Duration(-time.Second) }, []string{`"-1s" is negative`}},
		// etcd binds to them: an IP (or localhost) and a port, no path, or it refuses to start.
		{"green etcd URLs etcd cannot bind", func(p *Plan) {
			m := &p.Green.Etcd.Members[0]
			m.ClientURL, m.PeerURL, m.MetricsURL = "http://green-etcd.example:2479", "http://127.0.0.1", "http://127.0.0.1:2381/metrics"
		}, []string{`clientURL "http://green-etcd.example:2479"`, `peerURL "http://127.0.0.1"`, `metricsURL "http://127.0.0.1:2381/metrics"`}},
		{"metrics URL taken", func(p *Plan) { m := &p.Green.Etcd.Members[0]; m.MetricsURL = m.PeerURL }, []string{"is used twice"}},
		{"same url", func(p *Plan) { p.Green.APIServer.URL = p.Blue.APIServer.URL }, []string{"is blue's URL"}},
		{"version not exact", func(p *Plan) { p.Green.Etcd.Version = "3.6" }, []string{`green.etcd.version: "3.6" is not an etcd version`}},
		{"both launchers", func(p *Plan) { p.Green.APIServer.StaticPod = &StaticPod{Manifest: "x", ManifestDir: "/"} }, []string{"not both"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			tc.mutate(p)
			data, _ := yaml.Marshal(p)
			_, err := ParsePlan(data)
			if err == nil {
				t.Fatal("plan accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if _, err := ParsePlan([]byte("apiVersion: kubefence.io/v1alpha1\nkind: CutoverPlan\nstatedir: x\n")); err == nil || !strings.Contains(err.Error(), "field statedir not found") {
		t.Errorf("unknown field: %v", err)
	}
}

// TestCheckFiles: parsing checks the plan's shape only, so a plan naming files of another
// machine parses; CheckFiles (the CLI's load and the preflight) names every missing one.
func TestCheckFiles(t *testing.T) {
	p, _ := validPlan(t)
	if err := p.CheckFiles(); err != nil {
		t.Fatalf("valid plan: %v", err)
	}
	p.Green.Etcd.Binary = "/nonexistent/etcd"
	p.Blue.Etcd.CAFile = "/nonexistent/ca.crt"
	p.Migration.Mode, p.Blue.Etcd.DataDir = "auto", t.TempDir()
	p.Green.APIServer.Command = nil
	p.Green.APIServer.StaticPod = &StaticPod{Manifest: "/nonexistent/green.yaml", ManifestDir: "/nonexistent/manifests"}
	data, _ := yaml.Marshal(p)
	parsed, err := ParsePlan(data)
	if err != nil {
		t.Fatalf("ParsePlan looked at files: %v", err)
	}
	err = parsed.CheckFiles()
	for _, w := range []string{"green.etcd.binary: stat /nonexistent/etcd", "blue.etcd.caFile", "staticPod.manifest: stat", `manifestDir "/nonexistent/manifests" is not a directory`, "is not an etcd member data dir"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("CheckFiles: %v; want %q", err, w)
		}
	}

	// A proxy's admin client files, blue's WAL dir, and binaries that are no program.
	p, _ = validPlan(t)
	notExec := filepath.Join(t.TempDir(), "etcd")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.Green.Etcd.Binary = notExec
	p.Green.APIServer.Command = []string{t.TempDir(), "--etcd-servers=https://10.0.0.2:2379"}
	p.Proxies = []ProxyRef{{AdminAddress: "https://10.0.0.5:9443", CertFile: "/nonexistent/admin.crt", KeyFile: "/nonexistent/admin.key", CAFile: "/nonexistent/admin-ca.crt"}}
	p.Migration.Mode, p.Blue.Etcd.DataDir, p.Blue.Etcd.WALDir = "auto", t.TempDir(), "/nonexistent/wal"
	if err := os.Mkdir(filepath.Join(p.Blue.Etcd.DataDir, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	err = p.CheckFiles()
	for _, w := range []string{"green.etcd.binary " + strconv.Quote(notExec) + " is not executable", "green.apiserver.command[0]", "proxies[0].certFile", "proxies[0].keyFile", "proxies[0].caFile", `blue.etcd.walDir "/nonexistent/wal" is not a directory`} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("CheckFiles: %v; want %q", err, w)
		}
	}
}

// TestGreenApartFromBlue: a green data dir inside blue's member (through a symlink) parses,
// and is refused by CheckFiles.
func TestGreenApartFromBlue(t *testing.T) {
	p, _ := validPlan(t)
	blue := filepath.Join(filepath.Dir(p.StateDir), "blue")
	_ = os.MkdirAll(filepath.Join(blue, "member"), 0o700)
	_ = os.Symlink(blue, filepath.Join(filepath.Dir(p.StateDir), "blue-link"))
	p.Migration.Mode, p.Blue.Etcd.DataDir = "auto", blue
	p.Green.Etcd.Members[0].DataDir = filepath.Join(filepath.Dir(p.StateDir), "blue-link", "green")
	data, _ := yaml.Marshal(p)
	parsed, err := ParsePlan(data)
	if err != nil {
		t.Fatalf("ParsePlan: %v", err)
	}
	err = parsed.CheckFiles()
	for _, w := range []string{"green.etcd.members[0].dataDir", "must not be inside blue.etcd.dataDir", "outside blue's"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("CheckFiles: %v; want %q", err, w)
		}
	}
}

// TestGreenDataDirsApart: green members' data dirs on this host are apart from one another
// (the same dir written twice, with a trailing slash, or one inside another: two etcds on one
// dir), and none lies inside an etcd member's data dir, blue's included when the plan does not
// name it (mode replicate: /var/lib/etcd/green would be deleted with blue's).
func TestGreenDataDirsApart(t *testing.T) {
	etcdDir := t.TempDir() // an etcd data dir the plan does not name
	if err := os.MkdirAll(filepath.Join(etcdDir, "member", "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		dirs func(base string) []string
		want string
	}{
		{"apart", func(b string) []string { return []string{filepath.Join(b, "g0"), filepath.Join(b, "g1")} }, ""},
		{"one written twice", func(b string) []string { return []string{filepath.Join(b, "g"), filepath.Join(b, "g") + "/"} }, "green.etcd.members[1].dataDir"},
		{"one inside another", func(b string) []string { return []string{filepath.Join(b, "g"), filepath.Join(b, "g", "m1")} }, "green.etcd.members[1].dataDir"},
		{"inside an etcd member's data dir", func(string) []string { return []string{filepath.Join(etcdDir, "green")} }, "inside an etcd data dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			base := t.TempDir()
			dirs := tc.dirs(base)
			m := p.Green.Etcd.Members[0]
			p.Green.Etcd.Members = nil
			for i, d := range dirs {
				m.Name, m.DataDir = fmt.Sprintf("g%d", i), d
				m.ClientURL, m.PeerURL = fmt.Sprintf("http://127.0.0.1:%d", 2479+10*i), fmt.Sprintf("http://127.0.0.1:%d", 2480+10*i)
				p.Green.Etcd.Members = append(p.Green.Etcd.Members, m)
			}
			err := p.CheckFiles()
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckFiles: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestDryRunNamesExactActions(t *testing.T) {
	p, _ := validPlan(t)
	data, _ := yaml.Marshal(p)
	p, err := ParsePlan(data)
	if err != nil {
		t.Fatal(err)
	}
	steps := DryRun(p)
	if len(steps) != len(Steps) {
		t.Fatalf("%d steps", len(steps))
	}
	all := ""
	for _, s := range steps {
		all += s.Step + ": " + s.Action + "\n"
	}
	for _, want := range []string{"--name g0 --data-dir " + p.Green.Etcd.Members[0].DataDir, "--etcd-servers=http://127.0.0.1:2479", "backend set https://10.0.0.2:6443", "revision +1000000000"} {
		if !strings.Contains(all, want) {
			t.Errorf("dry run lacks %q:\n%s", want, all)
		}
	}
	if _, err := os.Stat(p.StateDir); err == nil {
		t.Error("dry run created the state dir")
	}
}

func obj(uid, rv string, data string) rawObject {
	n, _ := strconv.ParseInt(rv, 10, 64)
	return rawObject{uid: uid, rv: n, raw: []byte(`{"metadata":{"uid":"` + uid + `","resourceVersion":"` + rv + `"},"data":"` + data + `"}`)}
}

// TestCompare: what changed after the copy is a mismatch unless verify can explain it (green's
// apiserver wrote it, blue's apiserver maintains it, an event expired).
func TestCompare(t *testing.T) {
	const snap = 100
	cms := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	leases := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	eps := schema.GroupVersionResource{Version: "v1", Resource: "endpoints"}
	slices := schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
	events := schema.GroupVersionResource{Version: "v1", Resource: "events"}
	newEvents := schema.GroupVersionResource{Group: "events.k8s.io", Version: "v1", Resource: "events"}
	none := map[string]rawObject{}
	cases := []struct {
		name        string
		gvr         schema.GroupVersionResource
		blue, green map[string]rawObject
		want        string // "same", "explained", or the mismatch's text
	}{
		{"identical", cms, map[string]rawObject{"ns/a": obj("u1", "50", "a")}, map[string]rawObject{"ns/a": obj("u1", "50", "a")}, "same"},
		{"same content reordered", cms, map[string]rawObject{"ns/a": {uid: "u", rv: 40, raw: []byte(`{"a":2,"b":1}`)}}, map[string]rawObject{"ns/a": {uid: "u", rv: 40, raw: []byte(`{"b":1,"a":2}`)}}, "same"},
		// Numbers past float64's 53 bits are told apart.
		{"large numbers differ", cms, map[string]rawObject{"ns/a": {uid: "u", rv: 40, raw: []byte(`{"size":9007199254740993}`)}}, map[string]rawObject{"ns/a": {uid: "u", rv: 40, raw: []byte(`{"size": 9007199254740992}`)}}, "ns/a: differs"},
		{"missing on green", cms, map[string]rawObject{"ns/a": obj("u1", "60", "a")}, none, "ns/a: missing on green"},
		{"differs", cms, map[string]rawObject{"ns/a": obj("u1", "70", "a")}, map[string]rawObject{"ns/a": obj("u1", "70", "b")}, "ns/a: differs"},
		{"other uid", cms, map[string]rawObject{"ns/a": obj("u4", "70", "a")}, map[string]rawObject{"ns/a": obj("u9", "70", "a")}, "differs (uid u4 vs u9)"},
		{"changed on blue after the copy", cms, map[string]rawObject{"ns/a": obj("u5", "150", "new")}, map[string]rawObject{"ns/a": obj("u5", "90", "old")}, "ns/a: changed on blue after the copy (a write that did not go through the fenced proxy"},
		{"created on blue after the copy", cms, map[string]rawObject{"ns/a": obj("u6", "160", "a")}, none, "ns/a: created on blue after the copy"},
		{"deleted on blue after the copy", cms, none, map[string]rawObject{"ns/a": obj("u7", "80", "a")}, "ns/a: on green only: deleted on blue after the copy"},
		{"created on green by its apiserver", cms, none, map[string]rawObject{"ns/a": obj("u8", "1000000200", "a")}, "explained"},
		{"changed on green by its apiserver", cms, map[string]rawObject{"ns/a": obj("u8", "90", "a")}, map[string]rawObject{"ns/a": obj("u8", "1000000200", "b")}, "explained"},
		{"apiserver identity lease renewed on blue", leases, map[string]rawObject{"kube-system/apiserver-abc": obj("u", "150", "new")}, map[string]rawObject{"kube-system/apiserver-abc": obj("u", "90", "old")}, "explained"},
		{"apiserver identity lease created on blue", leases, map[string]rawObject{"kube-system/apiserver-new": obj("u", "150", "a")}, none, "explained"},
		{"stale apiserver lease deleted on blue", leases, none, map[string]rawObject{"kube-system/apiserver-old": obj("u", "90", "a")}, "explained"},
		{"controller lease renewed on blue", leases, map[string]rawObject{"kube-system/kube-controller-manager": obj("u", "150", "new")}, map[string]rawObject{"kube-system/kube-controller-manager": obj("u", "90", "old")}, "kube-system/kube-controller-manager: changed on blue after the copy"},
		{"apiserver-named lease elsewhere", leases, map[string]rawObject{"default/apiserver-x": obj("u", "150", "new")}, map[string]rawObject{"default/apiserver-x": obj("u", "90", "old")}, "default/apiserver-x: changed on blue"},
		{"kubernetes endpoints", eps, map[string]rawObject{"default/kubernetes": obj("u", "150", "new")}, map[string]rawObject{"default/kubernetes": obj("u", "90", "old")}, "explained"},
		{"kubernetes endpointslice", slices, map[string]rawObject{"default/kubernetes": obj("u", "150", "new")}, map[string]rawObject{"default/kubernetes": obj("u", "90", "old")}, "explained"},
		{"other endpoints", eps, map[string]rawObject{"default/web": obj("u", "150", "new")}, map[string]rawObject{"default/web": obj("u", "90", "old")}, "default/web: changed on blue"},
		{"kubernetes configmap is no endpoint", cms, map[string]rawObject{"default/kubernetes": obj("u", "150", "new")}, map[string]rawObject{"default/kubernetes": obj("u", "90", "old")}, "default/kubernetes: changed on blue"},
		{"event expired on blue", events, none, map[string]rawObject{"ns/e": obj("u", "90", "a")}, "explained"},
		{"events.k8s.io event expired on blue", newEvents, none, map[string]rawObject{"ns/e": obj("u", "90", "a")}, "explained"},
		{"event created on blue after the copy", events, map[string]rawObject{"ns/e": obj("u", "150", "a")}, none, "ns/e: created on blue after the copy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := &VerifyReport{}
			var changed, mismatched int
			compare(rep, tc.gvr, tc.blue, tc.green, snap, &changed, &mismatched)
			switch tc.want {
			case "same":
				if rep.Objects != 1 || changed+mismatched != 0 {
					t.Fatalf("want identical: %+v", rep)
				}
			case "explained":
				if changed != 1 || mismatched != 0 {
					t.Fatalf("want explained: %+v", rep)
				}
			default:
				if mismatched != 1 || changed != 0 || !strings.Contains(rep.Mismatches[0], tc.want) {
					t.Fatalf("want the mismatch %q: %+v", tc.want, rep)
				}
			}
		})
	}
}

func TestJournalRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadJournal(dir); err != errNoJournal {
		t.Fatalf("empty dir: %v", err)
	}
	j := &Journal{Version: 1, ID: "x", State: StateRunning, GreenPIDs: map[string]int{"g0": 42}, Done: []StepRecord{{Step: StepPreflight}}}
	if err := j.save(dir); err != nil {
		t.Fatal(err)
	}
	got, err := LoadJournal(dir)
	if err != nil || got.ID != "x" || got.GreenPIDs["g0"] != 42 || !got.done(StepPreflight) || got.done(StepFence) {
		t.Fatalf("journal = %+v, %v", got, err)
	}
	if err := os.WriteFile(journalPath(dir), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadJournal(dir); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt journal: %v", err)
	}
}

func TestStaticPodPlacement(t *testing.T) {
	dir := t.TempDir()
	manifest := writeFile(t, dir, "kube-apiserver-green.yaml", "apiVersion: v1\nkind: Pod\n")
	kubeletDir := filepath.Join(dir, "manifests")
	if err := os.Mkdir(kubeletDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sp := &StaticPod{Manifest: manifest, ManifestDir: kubeletDir}
	if err := placeStaticPod(sp); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(kubeletDir, "kube-apiserver-green.yaml"))
	if err != nil || string(got) != "apiVersion: v1\nkind: Pod\n" {
		t.Fatalf("placed manifest = %q, %v", got, err)
	}
	entries, _ := os.ReadDir(kubeletDir)
	if len(entries) != 1 {
		t.Fatalf("the kubelet dir holds %d files (a temp file left behind?)", len(entries))
	}
}

// TestReportSaysOnlyWhatIsTrue: the proxy counts 429s; it cannot know whether clients retried
// them, and a watch ended at the switch reconnects only if its client does.
func TestReportSaysOnlyWhatIsTrue(t *testing.T) {
	cases := []struct {
		name, got string
		want      []string
		wantNot   []string
	}{
		{"refused writes", RefusedWritesLine(7), []string{"refused with 429 while fenced: 7", "clients that do not retry saw an error"}, []string{"retried by clients"}},
		{"switch", switchDetail(admin.BackendResponse{Status: admin.Status{Backend: "https://green"}, Drain: admin.Drain{Streams: 3}}), []string{"3 watch(es)", "were ended", "kubectl get -w` exits"}, []string{"reconnect to green", "WARNING"}},
		// Writes a policy rule let through, in flight at the switch, were answered by blue
		// after the copy: green does not have them, and the step must say so.
		{"switch after writes a policy let through", switchDetail(admin.BackendResponse{Status: admin.Status{Backend: "https://green"}, Drain: admin.Drain{Writes: 2}}), []string{"WARNING", "2 write(s)", "not on green"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.want {
				if !strings.Contains(tc.got, w) {
					t.Errorf("%q lacks %q", tc.got, w)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(tc.got, w) {
					t.Errorf("%q still claims %q", tc.got, w)
				}
			}
		})
	}
}

// TestMismatchAdvice: at one revision (mode replicate) a difference is green's own, not a
// write around the proxy, which replication would have carried over.
func TestMismatchAdvice(t *testing.T) {
	if err := mismatchError(1, []string{"ns/a: differs"}, 42); strings.Contains(err.Error(), "around the proxy") || !strings.Contains(err.Error(), "revision 42") {
		t.Errorf("replicate mode: %v", err)
	}
	if err := mismatchError(1, []string{"ns/a: differs"}, 0); !strings.Contains(err.Error(), "around the proxy") {
		t.Errorf("copy mode: %v", err)
	}
}

// TestListableTargets: what verify lists is what etcd stores: the APIs an aggregated server
// answers (metrics.k8s.io from metrics-server: made up at each request) and componentstatuses
// (probed at each request) are left out, and their
// discovery failing (an APIService unavailable) does not stop verify; another group's does.
func TestListableTargets(t *testing.T) {
	lists := []*metav1.APIResourceList{
		// componentstatuses: listable, but each apiserver probes the scheduler, the controller
		// manager and its etcd when asked; nothing of it is stored (a probe that failed on one
		// apiserver and not the other aborted a cutover's verify).
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "configmaps", Verbs: []string{"list"}}, {Name: "pods/status", Verbs: []string{"get"}}, {Name: "bindings", Verbs: []string{"create"}}, {Name: "componentstatuses", Verbs: []string{"get", "list"}}}},
		{GroupVersion: "metrics.k8s.io/v1beta1", APIResources: []metav1.APIResource{{Name: "pods", Verbs: []string{"list"}}}},
	}
	aggregated := map[schema.GroupVersion]bool{{Group: "metrics.k8s.io", Version: "v1beta1"}: true, {Group: "custom.metrics.k8s.io", Version: "v1beta2"}: true}
	failedAggregated := &discovery.ErrGroupDiscoveryFailed{Groups: map[schema.GroupVersion]error{{Group: "custom.metrics.k8s.io", Version: "v1beta2"}: errors.New("503")}}
	failedStored := &discovery.ErrGroupDiscoveryFailed{Groups: map[schema.GroupVersion]error{{Group: "apps", Version: "v1"}: errors.New("503")}}
	cases := []struct {
		name    string
		err     error
		want    string
		wantErr string
	}{
		{"aggregated left out", nil, "/v1, Resource=configmaps", ""},
		{"an aggregated API unavailable", failedAggregated, "/v1, Resource=configmaps", ""},
		{"a stored API unavailable", failedStored, "", "apps/v1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := listableTargets(lists, tc.err, aggregated)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != 1 || got[0].String() != tc.want {
				t.Fatalf("targets %v, %v; want [%s]", got, err, tc.want)
			}
		})
	}
}

// TestV2TTLClock: every green member of a v2 migration, those a resumed run builds later too,
// measures TTLs against one time: the end of the journaled copy step.
func TestV2TTLClock(t *testing.T) {
	start := time.Date(2026, 11, 26, 1, 2, 3, 0, time.UTC)
	r := &runner{j: &Journal{ID: "x", Done: []StepRecord{{Step: StepPreflight}, {Step: StepCopy, Started: start, Duration: 90 * time.Second}}}}
	for range 2 { // the same on every call
		if got, err := r.ttlClock(); err != nil || !got.Equal(start.Add(90*time.Second)) {
			t.Fatalf("ttlClock = %v, %v; want the copy's end", got, err)
		}
	}
	r.j.Done = r.j.Done[:1]
	if _, err := r.ttlClock(); err == nil || !strings.Contains(err.Error(), "no finished copy step") {
		t.Fatalf("ttlClock without a copy = %v", err)
	}
}

// TestDryRunPerProxyCommands: with several proxies, each in front of its own apiservers, the
// dry run's switch and unfence name each proxy's own command (the runbook calls them the exact
// commands, for a hand recovery), not the plan's green URL for all and a bare fence off.
func TestDryRunPerProxyCommands(t *testing.T) {
	p, _ := validPlan(t)
	green := p.Green.APIServer.URL
	p.Proxies = []ProxyRef{
		{AdminSocket: "/run/a.sock"},
		{AdminAddress: "https://n2:9443", CertFile: "c", KeyFile: "k", CAFile: "ca", BlueURL: "https://n2:6443", GreenURL: "https://n2:7443"},
	}
	all := ""
	for _, s := range DryRun(p) {
		all += s.Step + ": " + s.Action + "\n"
	}
	for _, want := range []string{
		"kubefence backend set " + green + " --admin-socket /run/a.sock",
		"kubefence backend set https://n2:7443 --admin-address https://n2:9443 --admin-cert-file c --admin-key-file k --admin-ca-file ca",
		"kubefence fence off --expect-backend " + green + " --admin-socket /run/a.sock",
		"kubefence fence off --expect-backend https://n2:7443 --admin-address https://n2:9443",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("dry run lacks %q:\n%s", want, all)
		}
	}
}

// TestDryRunRehearsal: the dry run of a rehearsal lists what a rehearsal does: the steps up to
// the fence and the measured drain, no fence, switch or unfence, and then its teardown, which
// stops processes and removes data (it was not listed).
func TestDryRunRehearsal(t *testing.T) {
	p, _ := validPlan(t)
	p.Migration.Mode = ModeReplicate
	var names []string
	planned := DryRunRehearsal(p)
	for _, s := range planned {
		names = append(names, s.Step)
	}
	n := len(names)
	if slices.Contains(names, StepFence) || slices.Contains(names, StepSwitch) || slices.Contains(names, StepUnfence) || names[n-2] != rehearseSteps[len(rehearseSteps)-1].name() {
		t.Fatalf("rehearsal dry run %v: want the steps before the fence, then the measured drain", names)
	}
	last := planned[n-1]
	if last.Step != StepTeardown || !strings.Contains(last.Action, p.Green.Etcd.Members[0].DataDir) || !strings.Contains(last.Action, "blue-snapshot.db") {
		t.Fatalf("rehearsal dry run ends with %+v: want the teardown, naming green's data dirs and blue's snapshot", last)
	}
}

// TestMemberNamesApartFromTheAPIServers: the journal keeps green's pids by name; a member named
// as the apiserver's entry lost its pid to it, and an abort or cleanup left that etcd running
// and removed its data dir under it. The preflight refuses such a name (the plan still parses:
// a cutover under way with it must still be aborted).
func TestMemberNamesApartFromTheAPIServers(t *testing.T) {
	for name, refused := range map[string]bool{"apiserver": true, "apiservers-0": true, "apiservers-x": false, "green-0": false} {
		p, _ := validPlan(t)
		p.Green.Etcd.Members[0].Name = name
		if err := checkMemberNames(p); (err != nil) != refused || err != nil && !strings.Contains(err.Error(), strconv.Quote(name)) {
			t.Errorf("member %q: %v, want refused %v", name, err, refused)
		}
	}
}

// TestPlanURLsAsTheProxySeesThem: a proxy keeps the URL it was switched to as backendurl.Parse writes it (scheme
// and host in lower case); a plan's "HTTPS://..." was then never the proxy's backend at the
// unfence (switched again, its moved watches ended; its fence off expecting the plan's spelling
// refused for good). The plan's URLs are read in that form.
func TestPlanURLsAsTheProxySeesThem(t *testing.T) {
	p, _ := validPlan(t)
	p.Green.APIServer.URL = "HTTPS://Green.Example:7443"
	p.Blue.APIServer.URL = "https://BLUE.example:6443"
	p.Proxies = []ProxyRef{{AdminSocket: "/run/kubefence/admin.sock", GreenURL: "HTTPS://Green.Example:7443", BlueURL: "Https://blue.example:6443"}}
	b, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePlan(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Green.APIServer.URL != "https://green.example:7443" || got.Blue.APIServer.URL != "https://blue.example:6443" ||
		got.Proxies[0].GreenURL != "https://green.example:7443" || got.Proxies[0].BlueURL != "https://blue.example:6443" {
		t.Errorf("plan URLs %q %q %q %q; want them as a proxy keeps them", got.Green.APIServer.URL, got.Blue.APIServer.URL, got.Proxies[0].GreenURL, got.Proxies[0].BlueURL)
	}
}

// TestVerifyCountsWhatItDoesNotList: the verify report lists the first 50 differences it
// explained, and counts them all: the step said "51 differences explained" for hundreds (the
// 50 listed and the line saying how many more).
func TestVerifyCountsWhatItDoesNotList(t *testing.T) {
	rep := &VerifyReport{}
	changed, mismatched := 0, 0
	for i := range 60 {
		rep.add(&rep.ChangedAfterCopy, fmt.Sprintf("events default/e%02d: expired on blue", i), &changed)
	}
	if err := rep.finish(changed, mismatched, 0); err != nil {
		t.Fatal(err)
	}
	if rep.Explained != 60 || len(rep.ChangedAfterCopy) != maxListed+1 || rep.ChangedAfterCopy[maxListed] != "... and 10 more" {
		t.Errorf("report counts %d explained, lists %d (last %q); want 60, the first 50 and a line for the 10 more", rep.Explained, len(rep.ChangedAfterCopy), rep.ChangedAfterCopy[len(rep.ChangedAfterCopy)-1])
	}
}
