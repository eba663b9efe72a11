package cutover

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/proxy/admin"
)

// fakeProxy answers the admin API on a unix socket like a proxy does: every change of its
// state grows the generation.
type fakeProxy struct {
	mu sync.Mutex
	st admin.Status
	// afterStatus, if set, runs once after a status answer: another operator acting just
	// after the caller looked.
	afterStatus func(st *admin.Status)
}

func startFakeProxy(t *testing.T, st admin.Status) (*fakeProxy, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "kf-admin") // short: a socket path has ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeProxy{st: st}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return f, sock
}

func (f *fakeProxy) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out any
	switch r.URL.Path {
	case "/v1/status":
		out = speaking(f.st)
		if f.afterStatus != nil {
			f.afterStatus(&f.st)
			f.afterStatus = nil
		}
	case "/v1/fence":
		var req admin.FenceRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.st.Fenced, f.st.Reason = req.Fenced, req.Reason
		f.st.Generation++
		resp := admin.FenceResponse{Status: speaking(f.st)}
		if req.Fenced {
			resp.Barrier = &admin.Barrier{Complete: true}
		}
		out = resp
	case "/v1/backend":
		var req admin.BackendRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		if !f.st.Fenced {
			w.WriteHeader(http.StatusConflict)
			out = admin.Error{Error: "not fenced"}
			break
		}
		if req.ExpectGeneration != 0 && req.ExpectGeneration != f.st.Generation {
			w.WriteHeader(http.StatusConflict)
			out = admin.Error{Error: fmt.Sprintf("concurrent fence change: at generation %d, not %d", f.st.Generation, req.ExpectGeneration)}
			break
		}
		prev := f.st.Backend
		f.st.Backend = req.URL
		f.st.Generation++
		out = admin.BackendResponse{Status: f.st, Previous: prev}
	default:
		w.WriteHeader(http.StatusNotFound)
		out = admin.Error{Error: "no such path"}
	}
	_ = json.NewEncoder(w).Encode(out)
}

func (f *fakeProxy) status() admin.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

// testRunner is a runner for p whose journal is a running cutover, talking to the proxy at sock.
func testRunner(t *testing.T, p *Plan, sock string) *runner {
	t.Helper()
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	j := &Journal{Version: 1, ID: "test", State: StateRunning, GreenPIDs: map[string]int{}}
	return (&runner{p: p, j: j, adm: admin.NewClient(sock), procs: osProcesses, steps: steps}).forward()
}

// TestSwitchRefusedWhenFenceChanged: the switch happens only if the proxy's state is still the
// one the cutover's fence on left (same generation, fenced); fence off/on by hand in between is
// refused, since writes may have reached blue after the copy.
func TestSwitchRefusedWhenFenceChanged(t *testing.T) {
	p, _ := validPlan(t)
	blue, green := p.Blue.APIServer.URL, p.Green.APIServer.URL
	cases := []struct {
		name    string
		byHand  func(t *testing.T, a *admin.Client, fp *fakeProxy)
		want    string // "" switches
		backend string
	}{
		{"fence held", func(*testing.T, *admin.Client, *fakeProxy) {}, "", green},
		{"fence off and on by hand", func(t *testing.T, a *admin.Client, _ *fakeProxy) {
			for _, on := range []bool{false, true} {
				if _, err := a.Fence(t.Context(), admin.FenceRequest{Fenced: on}); err != nil {
					t.Fatal(err)
				}
			}
		}, "someone ran fence off/on", blue},
		{"fence off and on by hand just after the switch looked", func(_ *testing.T, _ *admin.Client, fp *fakeProxy) {
			fp.afterStatus = func(st *admin.Status) { st.Generation += 2 }
		}, "concurrent fence change", blue},
		{"fence off by hand", func(t *testing.T, a *admin.Client, _ *fakeProxy) {
			if _, err := a.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
				t.Fatal(err)
			}
		}, "the proxy is not fenced", blue},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fp, sock := startFakeProxy(t, admin.Status{Backend: blue, Generation: 7})
			r := testRunner(t, p, sock)
			if _, err := (fenceStep{}).run(t.Context(), r); err != nil {
				t.Fatal(err)
			}
			if r.j.FenceGeneration != 8 {
				t.Fatalf("journaled generation %d, want the proxy's after fence on (8)", r.j.FenceGeneration)
			}
			tc.byHand(t, r.adm.(*admin.Client), fp)
			_, err := (switchStep{}).run(t.Context(), r)
			if tc.want == "" && err != nil {
				t.Fatalf("switch refused: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("switch error %v, want %q", err, tc.want)
			}
			if got := fp.status().Backend; got != tc.backend {
				t.Errorf("proxy backend %s, want %s", got, tc.backend)
			}
			if tc.want == "" {
				// A resume after a crash between the switch and its journal entry switches again.
				if _, err := (switchStep{}).run(t.Context(), r); err != nil {
					t.Errorf("switch again after a crash: %v", err)
				}
			}
		})
	}
}

// TestAbortAfterCancel: a cutover whose context is cancelled (Ctrl-C, SIGTERM) still aborts
// back to blue: the abort does not reuse the cancelled context.
func TestAbortAfterCancel(t *testing.T) {
	p, _ := validPlan(t)
	fp, sock := startFakeProxy(t, admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 3})
	r := testRunner(t, p, sock)
	r.j.FencedAt = time.Now().UTC() // the run fenced
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rep, err := r.fail(ctx, copyStep{}, ctx.Err())
	if err == nil || rep == nil || rep.Result != "aborted" {
		t.Fatalf("report %+v, err %v; want aborted", rep, err)
	}
	if st := fp.status(); st.Fenced || st.Backend != p.Blue.APIServer.URL {
		t.Fatalf("after the abort the proxy is %+v; want open on blue", st)
	}
	j, err := LoadJournal(p.StateDir)
	if err != nil || j.State != StateAborted {
		t.Fatalf("journal %+v, %v; want aborted", j, err)
	}
}

// TestStateLock: one cutover command at a time per state dir; the error names the holder.
func TestStateLock(t *testing.T) {
	dir := t.TempDir()
	l, err := lockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockStateDir(dir)
	if err == nil || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second lock: %v; want an error naming pid %d", err, os.Getpid())
	}
	p, _ := validPlan(t)
	p.StateDir = dir
	for name, run := range map[string]func() error{
		"run":    func() error { _, err := Run(t.Context(), Options{Plan: p}); return err },
		"resume": func() error { _, err := Run(t.Context(), Options{Plan: p, Resume: true}); return err },
		"abort":  func() error { _, err := Abort(t.Context(), Options{Plan: p}); return err },
	} {
		if err := run(); err == nil || !strings.Contains(err.Error(), "another kubefence cutover") {
			t.Errorf("%s while locked: %v", name, err)
		}
	}
	// A baking process holds the lock for days: it is not one to wait for.
	l.markBaking()
	_, err = lockStateDir(dir)
	for _, want := range []string{"baking", "kubefence cutover status --plan PLAN", "kubefence cutover rollback --plan PLAN", "kubefence cutover finish --plan PLAN"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("lock held by a baking process: %v; want it to say %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "wait for it to finish") {
		t.Errorf("lock held by a baking process: %v; a bake does not finish by itself", err)
	}
	l.unlock()
	l2, err := lockStateDir(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	l2.unlock()
}

// TestGreenEtcdVersionExact: the preflight's version check is datadir's exact one: 3.6.16 is
// not 3.6.1.
func TestGreenEtcdVersionExact(t *testing.T) {
	bin := writeFile(t, t.TempDir(), "etcd", "#!/bin/sh\nprintf 'etcd Version: 3.6.16\\nGit SHA: x\\nGo Version: go1.24\\n'\n")
	cases := []struct {
		version string
		ok      bool
	}{{"3.6.16", true}, {"3.6.1", false}, {"3.6", false}, {"3.6.160", false}}
	for _, tc := range cases {
		err := datadir.CheckBinaryVersion(t.Context(), bin, tc.version)
		if (err == nil) != tc.ok {
			t.Errorf("version %s: %v, want ok=%v", tc.version, err, tc.ok)
		}
	}
}

func writeKubeconfig(t *testing.T, dir, name, server string) string {
	t.Helper()
	return writeFile(t, dir, name, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, server))
}

// TestListsReachEtcd: the preflight names a blue etcd to which kube-apiserver sends every
// consistent list (older than 3.4.31, or than 3.5.13 in 3.5, by kube-apiserver's own rule),
// whose lists of big collections slow blue's writes and so the window.
func TestListsReachEtcd(t *testing.T) {
	for _, tc := range []struct {
		versions []string
		want     string // in the note; "" for none
	}{
		{[]string{"3.4.23"}, "blue etcd 3.4.23 predates"},
		{[]string{"3.4.31", "3.4.30", "3.4.31"}, "blue etcd 3.4.30 predates"},
		{[]string{"3.5.12"}, "blue etcd 3.5.12 predates"},
		{[]string{"3.5.0"}, "blue etcd 3.5.0 predates"},
		{[]string{"3.3.27"}, "blue etcd 3.3.27 predates"},
		{[]string{"3.4.31-rc.0"}, "blue etcd 3.4.31-rc.0 predates"},
		{[]string{"not a version"}, `blue etcd not a version predates`}, // kube-apiserver assumes the worst too
		{[]string{"3.4.31"}, ""},
		{[]string{"3.5.13", "3.5.21"}, ""},
		{[]string{"3.5.0-alpha.0"}, ""}, // below 3.5.0 for semver, above 3.4.31: kube-apiserver trusts it
		{[]string{"3.6.0-alpha.0", "3.6.16"}, ""},
		{nil, ""},
	} {
		var sts []datadir.MemberStatus
		for _, v := range tc.versions {
			sts = append(sts, datadir.MemberStatus{Version: v})
		}
		got := listsReachEtcd(sts)
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.versions, got, tc.want)
		}
	}
}

// TestCheckGreenKubeconfig: a green kubeconfig that reaches blue or the proxy (verify would
// compare blue with blue) is refused at preflight.
func TestCheckGreenKubeconfig(t *testing.T) {
	proxy := httptest.NewTLSServer(http.NotFoundHandler()) // something already listening
	t.Cleanup(proxy.Close)
	greenURL := "https://" + closedAddr(t)
	cases := []struct {
		name, server string
		// other: the kubeconfig is that of green.apiservers[0], which its host starts (no
		// command), behind a proxy with a blue apiserver of its own.
		other bool
		want  string
		// at: green.apiserver.url, when not greenURL.
		at string
	}{
		{"green", greenURL, false, "", ""},
		{"blue's url", "https://10.0.0.1:6443", false, "is blue's apiserver", ""},
		{"blue kubeconfig's server", "https://blue.example:6443", false, "server of blue.apiserver.kubeconfig", ""},
		{"the proxy", proxy.URL, false, "already answers before green is started", ""},
		{"another host's, started there", proxy.URL, true, "", ""},
		{"another host's, at that proxy's blue", "https://n2:6443", true, "green.apiservers[0].kubeconfig's server https://n2:6443 is proxies[0].blueURL", ""},
		// Green's own address already serving (a green apiserver an earlier run left): the
		// advice is not to point the kubeconfig where it points.
		{"green's address, already serving", proxy.URL, false, "kubefence cutover cleanup", proxy.URL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, dir := validPlan(t)
			p.Blue.APIServer.Kubeconfig = writeKubeconfig(t, dir, "blue.kubeconfig", "https://blue.example:6443")
			p.Green.APIServer.URL = cmp.Or(tc.at, greenURL)
			p.Green.APIServer.Kubeconfig = writeKubeconfig(t, dir, "green.kubeconfig", tc.server)
			if tc.other {
				p.Green.APIServer.Kubeconfig = writeKubeconfig(t, dir, "green.kubeconfig", greenURL)
				p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://n2:6445", Kubeconfig: writeKubeconfig(t, dir, "green-2.kubeconfig", tc.server)}}}
				p.Proxies = []ProxyRef{{AdminSocket: "/a", BlueURL: "https://n2:6443", GreenURL: "https://n2:6445"}}
			}
			err := checkGreenKubeconfig(t.Context(), p)
			if tc.want == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if err != nil && tc.at != "" && strings.Contains(err.Error(), "point green.apiserver.kubeconfig") {
				t.Fatalf("error %v: the kubeconfig points at green already", err)
			}
		})
	}
}

// TestStaticPodOnlyOurs: a green manifest whose name is already in the kubelet's dir is
// refused, and abort removes only a manifest the cutover placed.
func TestStaticPodOnlyOurs(t *testing.T) {
	p, dir := validPlan(t)
	kubeletDir := filepath.Join(dir, "manifests")
	if err := os.Mkdir(kubeletDir, 0o700); err != nil {
		t.Fatal(err)
	}
	manifest := writeFile(t, dir, "kube-apiserver.yaml", "metadata: {name: kube-apiserver-green, namespace: kube-system}\n")
	existing := writeFile(t, kubeletDir, "kube-apiserver.yaml", "blue\n")
	p.Green.APIServer.Command = nil
	p.Green.APIServer.StaticPod = &StaticPod{Manifest: manifest, ManifestDir: kubeletDir}
	fp, sock := startFakeProxy(t, admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true})
	r := testRunner(t, p, sock)
	if err := manifestAbsent(p.Green.APIServer.StaticPod); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("preflight check: %v", err)
	}
	if err := r.placeGreenManifest(); err == nil {
		t.Fatal("placed over the kubelet's own manifest")
	}
	if err := r.abort(t.Context(), "test", nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(existing); err != nil || string(b) != "blue\n" {
		t.Fatalf("abort touched a manifest it did not place: %q, %v", b, err)
	}
	// A manifest of its own name is placed, journaled, and removed by abort.
	if err := os.Rename(manifest, filepath.Join(dir, "kube-apiserver-green.yaml")); err != nil {
		t.Fatal(err)
	}
	p.Green.APIServer.StaticPod.Manifest = filepath.Join(dir, "kube-apiserver-green.yaml")
	fp.st.Fenced = true
	r = testRunner(t, p, sock)
	if err := r.placeGreenManifest(); err != nil {
		t.Fatal(err)
	}
	if j, err := LoadJournal(p.StateDir); err != nil || j.StaticPodPlaced != filepath.Join(kubeletDir, "kube-apiserver-green.yaml") {
		t.Fatalf("journal %+v, %v: placement not journaled", j, err)
	}
	if err := r.abort(t.Context(), "test", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(kubeletDir, "kube-apiserver-green.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("abort left green's manifest: %v", err)
	}
	if _, err := os.Stat(existing); err != nil {
		t.Errorf("abort removed the kubelet's own manifest: %v", err)
	}
}

// TestStaticPodWaitsForReadyz: in static-pod mode, as in command mode, the step ends only when
// green's /readyz says ok (through green's kubeconfig), and fails at its timeout otherwise.
func TestStaticPodWaitsForReadyz(t *testing.T) {
	cases := []struct {
		name     string
		notReady int32 // /readyz answers 503 this many times
		wantErr  string
	}{
		{"ready after a while", 3, ""},
		{"never ready", 1 << 30, "not ready"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			green := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/readyz" {
					http.NotFound(w, r)
					return
				}
				if calls.Add(1) <= tc.notReady {
					http.Error(w, "etcd not ready", http.StatusServiceUnavailable)
				}
			}))
			t.Cleanup(green.Close)
			p, dir := validPlan(t)
			kubeletDir := filepath.Join(dir, "manifests")
			if err := os.Mkdir(kubeletDir, 0o700); err != nil {
				t.Fatal(err)
			}
			p.Green.APIServer.Command = nil
			p.Green.APIServer.StaticPod = &StaticPod{Manifest: writeFile(t, dir, "green.yaml", "kind: Pod\nmetadata: {name: green}\n"), ManifestDir: kubeletDir}
			p.Green.APIServer.URL = green.URL
			p.Green.APIServer.Kubeconfig = writeKubeconfig(t, dir, "green.kubeconfig", green.URL)
			r := testRunner(t, p, "/nonexistent")
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			_, err := (greenAPIServerStep{}).run(ctx, r)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("step failed: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("step error %v, want %q", err, tc.wantErr)
			}
			if calls.Load() < min(tc.notReady+1, 2) {
				t.Errorf("/readyz asked %d times", calls.Load())
			}
		})
	}
}

// TestGreenAPIServerNotOnBlueEtcd: a green apiserver whose --etcd-servers name blue's etcd (a
// command or manifest copied from blue's) would serve blue's data: verify would compare blue
// with blue, and the switch would send every request to blue's etcd through it. The preflight
// refuses it.
func TestGreenAPIServerNotOnBlueEtcd(t *testing.T) {
	manifest := func(t *testing.T, servers string) *StaticPod {
		return apiserverPod(t, "--advertise-address=10.0.0.2", "--etcd-servers="+servers)
	}
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, p *Plan)
		want string // "" for none
	}{
		{"green's etcd", func(*testing.T, *Plan) {}, ""},
		{"blue's etcd", func(_ *testing.T, p *Plan) { p.Green.APIServer.Command[1] = "--etcd-servers=https://10.0.0.1:2379" }, "green.apiserver's --etcd-servers names https://10.0.0.1:2379"},
		{"blue's among green's, flag and value apart", func(_ *testing.T, p *Plan) {
			p.Green.APIServer.Command = append(p.Green.APIServer.Command[:1], "--etcd-servers", "http://127.0.0.1:2479,https://10.0.0.1:2379/")
		}, "https://10.0.0.1:2379/"},
		{"a static pod on blue's etcd", func(t *testing.T, p *Plan) {
			p.Green.APIServer.Command, p.Green.APIServer.StaticPod = nil, manifest(t, "https://10.0.0.1:2379")
		}, "blue.etcd.endpoints"},
		{"a static pod on green's", func(t *testing.T, p *Plan) {
			p.Green.APIServer.Command, p.Green.APIServer.StaticPod = nil, manifest(t, "http://127.0.0.1:2479")
		}, ""},
		// A typo would keep green's apiserver from ever becoming ready, in the window of a
		// fenced copy: the preflight names it.
		{"a port no green member has", func(_ *testing.T, p *Plan) { p.Green.APIServer.Command[1] = "--etcd-servers=http://127.0.0.1:9999" }, "on a green member's host but none of green.etcd.members' clientURLs"},
		{"http to a member serving https", func(_ *testing.T, p *Plan) {
			p.Green.Etcd.Members[0].ClientURL = "https://127.0.0.1:2479"
		}, "on a green member's host but none of green.etcd.members' clientURLs"},
		{"localhost for 127.0.0.1", func(_ *testing.T, p *Plan) { p.Green.APIServer.Command[1] = "--etcd-servers=http://localhost:2479" }, ""},
		{"a load balancer in front of green", func(_ *testing.T, p *Plan) {
			p.Green.APIServer.Command[1] = "--etcd-servers=https://green-etcd-lb.invalid:2379"
		}, ""},
		// A per-resource override copied from blue's command: green's apiserver would write
		// those resources (events) to blue's etcd, ungated, before the switch and after it.
		{"an override on blue's etcd", func(_ *testing.T, p *Plan) {
			p.Green.APIServer.Command = append(p.Green.APIServer.Command, "--etcd-servers-overrides=/events#https://10.0.0.1:2379;http://127.0.0.1:2479")
		}, "green.apiserver's --etcd-servers-overrides names https://10.0.0.1:2379"},
		// kube-apiserver's flags add up (a slice) or the last one counts (a scalar): every
		// occurrence is read.
		{"a second override on blue's etcd", func(_ *testing.T, p *Plan) {
			p.Green.APIServer.Command = append(p.Green.APIServer.Command, "--etcd-servers-overrides=/events#https://127.0.0.1:2482", "--etcd-servers-overrides=/pods#https://10.0.0.1:2379")
		}, "names https://10.0.0.1:2379"},
		{"blue's etcd given last", func(_ *testing.T, p *Plan) {
			p.Green.APIServer.Command = append(p.Green.APIServer.Command, "--etcd-servers=https://10.0.0.1:2379")
		}, "green.apiserver's --etcd-servers names https://10.0.0.1:2379"},
		{"blue's etcd given first, green's after (a list: both count)", func(_ *testing.T, p *Plan) {
			p.Green.APIServer.Command = append(p.Green.APIServer.Command[:1], "--etcd-servers=https://10.0.0.1:2379", "--etcd-servers=http://127.0.0.1:2479")
		}, "green.apiserver's --etcd-servers names https://10.0.0.1:2379"},
		{"an override on an events etcd of its own", func(_ *testing.T, p *Plan) {
			p.Green.APIServer.Command = append(p.Green.APIServer.Command, "--etcd-servers-overrides", "/events#https://127.0.0.1:2482,apps/deployments#https://127.0.0.1:2483")
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			tc.edit(t, p)
			err := checkGreenEtcdServers(t.Context(), p)
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkGreenEtcdServers = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestGreenAPIServerNotOnBlueEtcdWrittenOtherwise: blue's etcd written another way than in
// blue.etcd.endpoints (127.0.0.1 for a host address kubeadm's etcd also listens on, localhost,
// a name) is found by asking the URL: it answers with blue's cluster ID.
func TestGreenAPIServerNotOnBlueEtcdWrittenOtherwise(t *testing.T) {
	blue := startTestEtcd(t)
	ep := blue.Endpoints()[0]
	if _, after, ok := strings.Cut(ep, "://"); ok {
		ep = after
	}
	_, port, err := net.SplitHostPort(ep)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := validPlan(t)
	p.Blue.Etcd.Endpoints = []string{"http://localhost:" + port}
	p.Green.APIServer.Command[1] = "--etcd-servers=http://127.0.0.1:2479,http://127.0.0.1:" + port
	err = checkGreenEtcdServers(t.Context(), p)
	if err == nil || !strings.Contains(err.Error(), "http://127.0.0.1:"+port) || !strings.Contains(err.Error(), "blue's cluster") {
		t.Fatalf("checkGreenEtcdServers = %v, want blue's etcd found by its cluster ID", err)
	}
}

// TestGreenQuotaFitsBlue: green etcd starts with etcd's default 2 GiB quota unless
// green.etcd.extraArgs sets one; a blue database near it (a cluster that raised blue's quota)
// would be refused writes on green soon after the restore, in the window of a fenced copy.
func TestGreenQuotaFitsBlue(t *testing.T) {
	const gib = int64(1) << 30
	for _, tc := range []struct {
		name   string
		extra  []string
		blueDB int64
		want   string
	}{
		{"1 GiB under the default", nil, gib, ""},
		{"1.9 GiB under the default", nil, 19 * gib / 10, "--quota-backend-bytes"},
		{"1.9 GiB under 8 GiB", []string{"--quota-backend-bytes=8589934592"}, 19 * gib / 10, ""},
		{"flag and value apart", []string{"--quota-backend-bytes", "1073741824"}, gib, "1.0 GiB"},
		{"no quota", []string{"--quota-backend-bytes=-1"}, 100 * gib, ""},
		// etcd parses its flags with Go's flag package: one dash is as good as two.
		{"no quota, value apart", []string{"--quota-backend-bytes", "-1"}, 100 * gib, ""},
		{"one dash", []string{"-quota-backend-bytes=8589934592"}, 19 * gib / 10, ""},
		{"one dash, value apart", []string{"-quota-backend-bytes", "8589934592"}, 19 * gib / 10, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			p.Green.Etcd.ExtraArgs = tc.extra
			err := checkGreenQuota(p, tc.blueDB)
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkGreenQuota = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestSpaceCountedPerFilesystem: what the cutover writes in the state dir (the snapshot) and in
// a green data dir (the restored member) on one filesystem (kubeadm's /) is counted together,
// with one database's worth of room for the WAL and compaction: each was checked as if alone.
func TestSpaceCountedPerFilesystem(t *testing.T) {
	dir := t.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	db := free * 2 / 5 // 2x fits, 3x does not
	state, green := filepath.Join(dir, "state"), filepath.Join(dir, "green")
	if errs := enoughSpaceTogether([]spaceNeed{{state, db}}, db); len(errs) != 0 {
		t.Fatalf("one location: %v", errs)
	}
	errs := enoughSpaceTogether([]spaceNeed{{state, db}, {green, db}}, db)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "together") || !strings.Contains(errs[0].Error(), green) {
		t.Fatalf("two locations on one filesystem: %v, want one refusal naming both", errs)
	}
}

// apiserverPod is a green static pod whose kube-apiserver container runs with args.
func apiserverPod(t *testing.T, args ...string) *StaticPod {
	t.Helper()
	command := "kube-apiserver"
	for _, a := range args {
		command += fmt.Sprintf(", %q", a)
	}
	m := writeFile(t, t.TempDir(), "kube-apiserver-green.yaml", `apiVersion: v1
kind: Pod
metadata: {name: kube-apiserver-green, namespace: kube-system}
spec:
  containers:
  - name: kube-apiserver
    image: registry.k8s.io/kube-apiserver:v1.36.0
    command: [`+command+`]
`)
	return &StaticPod{Manifest: m, ManifestDir: t.TempDir()}
}

// TestPlanChecksForTheWindow: plans the parser takes but that would fail late, inside the
// window or past the point of no return, are refused by the preflight, before anything is
// fenced: one proxy named twice (fenced twice, its generation then never what the switch
// expects), a member URL with a path (etcd refuses it when the restore or green starts), a
// state dir inside blue's data dir (the snapshot written into blue), and a CA file a proxy
// would open relative to its own working directory.
func TestPlanChecksForTheWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(p *Plan, dir string)
		want string
	}{
		{"fine", func(*Plan, string) {}, ""},
		{"one socket twice", func(p *Plan, dir string) {
			s := filepath.Join(dir, "admin.sock")
			p.Proxies = []ProxyRef{{AdminSocket: s}, {AdminSocket: s + "/."}}
		}, "named twice"},
		{"one address twice", func(p *Plan, _ string) {
			p.Proxies = []ProxyRef{{AdminAddress: "https://10.0.0.11:9446"}, {AdminAddress: "https://10.0.0.11:9446/"}}
		}, "named twice"},
		{"a member URL with a path", func(p *Plan, _ string) { p.Green.Etcd.Members[0].PeerURL += "/" }, "must have no path"},
		{"the state dir in blue's data dir", func(p *Plan, dir string) {
			p.Blue.Etcd.DataDir = filepath.Join(dir, "blue-etcd")
			p.StateDir = filepath.Join(p.Blue.Etcd.DataDir, "kubefence")
		}, "stateDir"},
		{"a relative CA file for the proxies", func(p *Plan, _ string) { p.Green.APIServer.CAFile = "green-ca.crt" }, "absolute path"},
		// The abort removes green's manifest from it, maybe run from another directory.
		{"a relative kubelet manifest dir", func(p *Plan, _ string) {
			p.Green.APIServer.StaticPod = &StaticPod{Manifest: "/srv/green.yaml", ManifestDir: "manifests"}
		}, "green.apiserver.staticPod.manifestDir \"manifests\" must be an absolute path"},
		// Once its writes are let through, green's apiserver would point the kubernetes
		// Service at itself: in-cluster clients around every proxy (a rollback's fence and
		// gate then leave them on a green that refuses their writes for good).
		{"a green command keeping the endpoint reconciler", func(p *Plan, _ string) {
			p.Green.APIServer.Command = []string{p.Green.APIServer.Command[0], "--etcd-servers=http://127.0.0.1:2479"}
		}, "green.apiserver.command gives --endpoint-reconciler-type=lease (the default)"},
		// kubefence knows green's processes by their command line: one that execs another
		// runs under the other's, and an abort would neither find nor stop it.
		{"a green command through env", func(p *Plan, _ string) {
			p.Green.APIServer.Command = append([]string{"/usr/bin/env", "GOMEMLIMIT=8GiB"}, p.Green.APIServer.Command...)
		}, "green.apiserver.command: /usr/bin/env execs the program it is given"},
		{"another green apiserver's command with the lease reconciler", func(p *Plan, _ string) {
			p.Green.APIServers = []GreenAPIServer{{APIServerRef: APIServerRef{URL: "https://10.0.0.3:6443"}, Command: []string{"kube-apiserver", "--endpoint-reconciler-type", "lease"}}}
		}, "green.apiservers[0].command gives --endpoint-reconciler-type=lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, dir := validPlan(t)
			tc.edit(p, dir)
			err := checkPlanForTheWindow(p)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("checkPlanForTheWindow: %v; want %q", err, tc.want)
			}
		})
	}
}

// TestBarrierWithinTheWindow: in mode replicate the fence's barrier is part of the window's
// budget (timeouts.window, 5 s by default): it waits at most that long, not proxy.waitTimeout
// (30 s by default), after which the drain would have found the budget spent anyway.
func TestBarrierWithinTheWindow(t *testing.T) {
	p := replicatePlan(t)
	p.Proxy.WaitTimeout, p.Timeouts.Window = Duration(30*time.Second), Duration(5*time.Second)
	if got := p.barrierWait(); got != 5*time.Second {
		t.Errorf("replicating: barrier waits %s; want the window, 5s", got)
	}
	s, _ := validPlan(t)
	s.Proxy.WaitTimeout = Duration(30 * time.Second)
	if got := s.barrierWait(); got != 30*time.Second {
		t.Errorf("snapshot mode: barrier waits %s; want proxy.waitTimeout, 30s", got)
	}
}

// TestGreenExtraArgsKeepKubefencesFlags: green.etcd.extraArgs come last on green etcd's command
// line, where etcd takes the last value: one of the flags kubefence sets and checks (the data
// dir, the URLs, TLS; in mode replicate a smaller --max-request-bytes than replication needs)
// would undo it, so the preflight refuses it; other flags pass.
func TestGreenExtraArgsKeepKubefencesFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--quota-backend-bytes=8589934592", "--snapshot-count", "10000"}, ""},
		{[]string{"--max-request-bytes=20971520"}, ""},
		{[]string{"--data-dir=/var/lib/etcd"}, "--data-dir"},
		{[]string{"--listen-client-urls", "https://0.0.0.0:2379"}, "--listen-client-urls"},
		{[]string{"-cert-file=/etc/etcd/server.crt"}, "--cert-file"},
		{[]string{"--max-request-bytes=1572864"}, "--max-request-bytes"},
		{[]string{"--max-request-bytes", "20971520"}, ""},
		{[]string{"-max-request-bytes", "20971520"}, ""},
		{[]string{"--max-request-bytes", "1572864"}, "--max-request-bytes"},
		// One blue revision is applied as one txn of at most etcd's default 128 operations.
		{[]string{"--max-txn-ops", "64"}, "--max-txn-ops"},
		{[]string{"--max-txn-ops=1024"}, ""},
	} {
		p := replicatePlan(t)
		p.Green.Etcd.ExtraArgs = tc.args
		err := checkGreenExtraArgs(p)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("extraArgs %v: %v; want %q", tc.args, err, tc.want)
		}
	}
}

// TestPreflightRefusesGreenScripts: a script (#!) as green's etcd binary or a green apiserver's
// program runs as its interpreter, or as what it execs, never under the command line kubefence
// knows it by; proc.Daemon refuses it at start-green-*, after the snapshot, the restore and
// (in snapshot mode, fenced) the copy. The preflight refuses it first, with the same check.
func TestPreflightRefusesGreenScripts(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(p *Plan, dir string)
		want string
	}{
		{"programs", func(p *Plan, dir string) {
			p.Green.Etcd.Binary, p.Green.APIServer.Command[0] = "/bin/true", "/bin/true"
		}, ""},
		{"a script as green etcd", func(p *Plan, dir string) { p.Green.APIServer.Command[0] = "/bin/true" }, "green.etcd.binary: "},
		{"a script as green's apiserver", func(p *Plan, dir string) { p.Green.Etcd.Binary = "/bin/true" }, "green.apiserver.command: "},
		{"a script as green etcd, every member on its own host", func(p *Plan, dir string) {
			p.Green.APIServer.Command[0] = "/bin/true"
			for i := range p.Green.Etcd.Members {
				p.Green.Etcd.Members[i].External = true
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, dir := validPlan(t) // its etcd and apiserver are scripts
			tc.edit(p, dir)
			// The preflight (which fails here for other reasons too: nothing of blue answers)
			// names the script among its errors.
			r := (&runner{o: Options{Plan: p}, p: p, adm: memProxy(&admin.Status{Backend: p.Blue.APIServer.URL}, new([]string)), procs: fakeProcesses(map[int]bool{}, new([]int)), steps: steps}).forward()
			r.j = &Journal{ID: "x", GreenPIDs: map[string]int{}}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			_, err := preflightStep{}.run(ctx, r)
			script := err != nil && strings.Contains(err.Error(), "is a script")
			if tc.want == "" && script || tc.want != "" && (!script || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("preflight: %v; want %q", err, tc.want)
			}
		})
	}
}
