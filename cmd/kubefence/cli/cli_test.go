package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/migrator/datadir"
	"github.com/kubefence/kubefence/proxy/admin"
)

var update = flag.Bool("update", false, "rewrite docs/cli.md from the code")

func TestCLIReference(t *testing.T) {
	path := filepath.Join("..", "..", "..", "docs", "cli.md")
	got := MarkdownReference()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Fatal("docs/cli.md is out of date: run go test ./cmd/kubefence/cli -run TestCLIReference -update")
	}
}

func runCLI(args ...string) (code int, out, errOut string) {
	var o, e bytes.Buffer
	code = Main(args, strings.NewReader(""), &o, &e)
	return code, o.String(), e.String()
}

func TestExitCodes(t *testing.T) {
	badPlan := filepath.Join(t.TempDir(), "plan.yaml")
	if err := os.WriteFile(badPlan, []byte("apiVersion: kubefence.io/v1alpha1\nkind: CutoverPlan\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A complete plan whose files (/etc/kubernetes/...) are not on this machine.
	examplePlan := filepath.Join("..", "..", "..", "deploy", "examples", "cutover-plan-kubeadm.yaml")
	// A data dir whose parent must stay empty: a command line refused must create nothing (no
	// kubefence-backups next to it).
	dataParent := t.TempDir()
	dataDir, binDir := filepath.Join(dataParent, "etcd"), t.TempDir()
	snap, copyOut := filepath.Join(t.TempDir(), "snap.db"), filepath.Join(t.TempDir(), "copy")
	cases := []struct {
		name string
		args []string
		code int
		out  string
		err  string
	}{
		{"version", []string{"version"}, ExitOK, "kubefence ", ""},
		{"version json", []string{"version", "-o", "json"}, ExitOK, `"goVersion"`, ""},
		{"bad output", []string{"version", "-o", "yaml"}, ExitUsage, "", `unknown output format "yaml"`},
		{"unknown flag", []string{"fence", "on", "--bogus"}, ExitUsage, "", "unknown flag: --bogus"},
		{"unknown command", []string{"frobnicate"}, ExitUsage, "", "unknown command"},
		{"extra args", []string{"fence", "off", "now"}, ExitUsage, "", "unknown command \"now\""},
		{"mistyped fence subcommand", []string{"fence", "of"}, ExitUsage, "", `unknown command "of" for "kubefence fence": did you mean off?`},
		{"fence alone prints its help", []string{"fence"}, ExitOK, "Available Commands", ""},
		{"mistyped backend subcommand", []string{"backend", "sett", "https://x:6443"}, ExitUsage, "", `unknown command "sett" for "kubefence backend"`},
		{"mistyped migrate subcommand", []string{"migrate", "detcet"}, ExitUsage, "", `unknown command "detcet" for "kubefence migrate"`},
		{"backend set needs url", []string{"backend", "set"}, ExitUsage, "", "accepts 1 arg"},
		{"backend set bad url", []string{"backend", "set", "10.0.0.1:6443"}, ExitUsage, "", "give the apiserver as https://"},
		{"backend prepare bad url", []string{"backend", "prepare", "10.0.0.1:6443"}, ExitUsage, "", "give the apiserver as https://"},
		{"copy of a stopped member with etcd's TLS flags", []string{"migrate", "copy", "--data-dir", dataDir, "--output-dir", copyOut, "--cacert", "/etc/etcd/ca.crt"}, ExitUsage, "", "--cacert, --cert and --key are for talking to etcd"},
		// Each proxy counts its own generation: one number for several would switch some.
		{"one --expect-generation for several proxies", []string{"backend", "set", "https://x:6443", "--expect-generation", "7", "--admin-socket", "/run/a.sock", "--admin-socket", "/run/b.sock"}, ExitUsage, "", "--expect-generation is one proxy's generation"},
		// Negative durations are refused before anything runs.
		{"negative --step-timeout", []string{"migrate", "upgrade", "--data-dir", dataDir, "--target-version", "3.6.16", "--bin-dir", binDir, "--step-timeout", "-1s"}, ExitUsage, "", "--step-timeout must be positive"},
		{"zero copy --timeout", []string{"migrate", "copy", "--endpoints", "https://127.0.0.1:1", "--snapshot", snap, "--timeout", "0s"}, ExitUsage, "", "--timeout must be positive"},
		{"negative --shutdown-timeout", []string{"proxy", "--upstream", "https://x:6443", "--shutdown-timeout", "-1s"}, ExitUsage, "", "--shutdown-timeout"},
		{"bad log level", []string{"-v", "loud", "version"}, ExitUsage, "", "unknown log level"},
		{"proxy without tls", []string{"proxy", "--upstream", "https://x:6443"}, ExitUsage, "", "--tls-cert-file and --tls-key-file are required"},
		{"cutover without a plan", []string{"cutover"}, ExitUsage, "", "--plan is required"},
		{"cutover with a bad plan", []string{"cutover", "--plan", badPlan, "--dry-run"}, ExitUsage, "", "stateDir is required"},
		{"usage hint names the command", []string{"cutover", "--plan", badPlan, "--dry-run"}, ExitUsage, "", "Run 'kubefence cutover --help' for usage."},
		{"cutover abort with a bad plan", []string{"cutover", "abort", "--plan", badPlan}, ExitUsage, "", "green.etcd.binary is required"},
		// The way out needs the journal and the proxies, not the files the plan names (a green
		// binary or certificate gone must not keep writes fenced): here, no journal at all.
		{"cutover abort, plan files missing", []string{"cutover", "abort", "--plan", examplePlan}, ExitFailure, "", "no cutover to abort"},
		{"cutover status, plan files missing", []string{"cutover", "status", "--plan", examplePlan}, ExitFailure, "", "no cutover"},
		{"migrate without flags", []string{"migrate", "v2-to-v3"}, ExitUsage, "", "--data-dir is required"},
		{"migrate bad conflict policy", []string{"migrate", "v2-to-v3", "--on-conflict", "both"}, ExitUsage, "", `--on-conflict "both"`},
		{"migrate bad clock", []string{"migrate", "v2-to-v3", "--ttl-clock", "yesterday"}, ExitUsage, "", "--ttl-clock"},
		// Each member built against its own now would keep a TTL key expiring in between on
		// one and not the other: their revisions apart for good at the lease's revoke.
		{"migrate one of several members without a clock", []string{"migrate", "v2-to-v3", "--name", "a", "--initial-cluster", "a=https://10.0.0.1:2380,b=https://10.0.0.2:2380,a=https://[::1]:2380"},
			ExitUsage, "", "--initial-cluster names 2 members: build every one with the same --ttl-clock"},
		{"empty --admin-socket", []string{"fence", "on", "--admin-socket", ""}, ExitUsage, "", "no proxy named"},
		{"empty --admin-socket=", []string{"fence", "status", "--admin-socket="}, ExitUsage, "", "no proxy named"},
		{"empty --admin-address", []string{"fence", "off", "--admin-address", ""}, ExitUsage, "", "no proxy named"},
		{"empty --admin-socket, backend set", []string{"backend", "set", "https://x:6443", "--admin-socket="}, ExitUsage, "", "no proxy named"},
		{"empty entry in --admin-socket", []string{"fence", "status", "--admin-socket", "/run/a.sock,"}, ExitUsage, "", "--admin-socket has an empty entry"},
		{"zero --timeout", []string{"fence", "off", "--timeout", "0s"}, ExitUsage, "", "--timeout must be positive"},
		// One proxy named twice: fenced twice at once, the second flip makes the first's
		// barrier answer 409 'the fence changed', every time.
		{"one socket twice", []string{"fence", "on", "--admin-socket", "/run/kf/admin.sock,/run/kf/../kf/admin.sock"}, ExitUsage, "", "named twice"},
		{"one address twice", []string{"fence", "on", "--admin-address", "https://LB1:7443", "--admin-address", "https://lb1:7443/"}, ExitUsage, "", "named twice"},
		// Refused before anything runs, as migrate v2-to-v3 refuses it; a dry run would
		// print a clean plan.
		{"upgrade bad --on-conflict", []string{"migrate", "upgrade", "--data-dir", dataDir, "--target-version", "3.6.16", "--bin-dir", binDir, "--on-conflict", "both"}, ExitUsage, "", `--on-conflict "both": use v3 or v2`},
		{"upgrade bad --on-conflict, dry run", []string{"migrate", "upgrade", "--data-dir", dataDir, "--target-version", "3.6.16", "--bin-dir", binDir, "--on-conflict", "V3", "--dry-run"}, ExitUsage, "", `--on-conflict "V3": use v3 or v2`},
		{"upgrade without --data-dir", []string{"migrate", "upgrade", "--target-version", "3.6.16", "--bin-dir", binDir}, ExitUsage, "", "--data-dir is required"},
		{"downgrade without --data-dir", []string{"migrate", "downgrade", "--target-version", "3.5.21", "--bin-dir", binDir}, ExitUsage, "", "--data-dir is required"},
		{"detect --wal-dir with several data dirs", []string{"migrate", "detect", "--data-dir", "/var/lib/etcd-a", "--data-dir", "/var/lib/etcd-b", "--wal-dir", "/var/lib/wal"}, ExitUsage, "", "--wal-dir goes with a single --data-dir"},
		{"copy --endpoints --output-dir", []string{"migrate", "copy", "--endpoints", "https://127.0.0.1:1", "--timeout", "1s", "--snapshot", snap, "--output-dir", "/tmp/o"}, ExitUsage, "", "--output-dir is for a copy of --data-dir"},
		{"copy --endpoints --live", []string{"migrate", "copy", "--endpoints", "https://127.0.0.1:1", "--timeout", "1s", "--snapshot", snap, "--live"}, ExitUsage, "", "--live is for a copy of --data-dir"},
		{"copy --endpoints --endpoint", []string{"migrate", "copy", "--endpoints", "https://127.0.0.1:1", "--timeout", "1s", "--snapshot", snap, "--endpoint", "https://127.0.0.1:1"}, ExitUsage, "", "--endpoint is for a copy of --data-dir"},
		{"copy --endpoints --wal-dir", []string{"migrate", "copy", "--endpoints", "https://127.0.0.1:1", "--timeout", "1s", "--snapshot", snap, "--wal-dir", "/var/lib/wal"}, ExitUsage, "", "--wal-dir is for a copy of --data-dir"},
		{"copy --endpoint without --live", []string{"migrate", "copy", "--data-dir", dataDir, "--output-dir", copyOut, "--endpoint", "https://127.0.0.1:1"}, ExitUsage, "", "--endpoint is used only with --live"},
		{"copy --data-dir --snapshot", []string{"migrate", "copy", "--data-dir", dataDir, "--output-dir", copyOut, "--snapshot", snap}, ExitUsage, "", "--snapshot is for a copy of a live cluster"},
		{"copy --data-dir --timeout", []string{"migrate", "copy", "--data-dir", dataDir, "--output-dir", copyOut, "--timeout", "5m"}, ExitUsage, "", "--timeout is for a copy of a live cluster"},
		{"no proxy running", []string{"fence", "status", "--admin-socket", filepath.Join(t.TempDir(), "none.sock")}, ExitFailure, "", "cannot reach the kubefence admin API"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(tc.args...)
			if code != tc.code || !strings.Contains(out, tc.out) || !strings.Contains(errOut, tc.err) {
				t.Errorf("kubefence %v = %d\nstdout: %s\nstderr: %s\nwant %d, stdout ~ %q, stderr ~ %q", tc.args, code, out, errOut, tc.code, tc.out, tc.err)
			}
		})
	}
	if left, _ := os.ReadDir(dataParent); len(left) > 0 {
		t.Errorf("command lines refused left %v in %s", left, dataParent)
	}
}

// TestAdminAddressFromTheEnvironment: a proxy address taken from $KUBEFENCE_ADMIN_ADDRESS that
// cannot be used is refused naming the variable, not only the --admin-address the command line
// never gave.
func TestAdminAddressFromTheEnvironment(t *testing.T) {
	for _, tc := range []struct{ address, want string }{
		{"https://127.0.0.1:7443", "--admin-address (or $KUBEFENCE_ADMIN_ADDRESS) needs --admin-cert-file"},
		{"127.0.0.1:7443", `--admin-address (or $KUBEFENCE_ADMIN_ADDRESS) "127.0.0.1:7443": give https://HOST:PORT`},
	} {
		t.Setenv(envAdminAddress, tc.address)
		code, out, errOut := runCLI("fence", "status")
		if code != ExitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("fence status with %s=%s = %d\n%s%s\nwant %d, stderr ~ %q", envAdminAddress, tc.address, code, out, errOut, ExitUsage, tc.want)
		}
	}
}

// TestFenceCommands drives a real in-process proxy through the CLI, human and JSON output.
func TestFenceCommands(t *testing.T) {
	hold := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			<-hold
		}
		_, _ = w.Write([]byte("{}"))
	}))
	defer api.Close()
	var once sync.Once
	releaseHold := func() { once.Do(func() { close(hold) }) }
	defer releaseHold()
	green := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("{}")) }))
	defer green.Close()

	s := startTestProxy(t, api.URL)
	sock := []string{"--admin-socket", s.AdminSocket()}

	code, out, _ := runCLI(append([]string{"fence", "status"}, sock...)...)
	if code != 0 || !strings.Contains(out, "OPEN (writes flow)") || !strings.Contains(out, api.URL) {
		t.Fatalf("status = %d %q", code, out)
	}
	code, _, errOut := runCLI(append([]string{"backend", "set", green.URL}, sock...)...)
	if code != ExitFailure || !strings.Contains(errOut, "only while fenced") {
		t.Fatalf("backend set while open = %d %q", code, errOut)
	}

	// A write held open by the backend keeps the barrier from completing. Its result is checked
	// once the backend lets it go: admitted before the fence, it must succeed.
	held := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://"+s.Addr().String()+"/api/v1/namespaces/a/configmaps/held", nil)
		if err != nil {
			held <- err
			return
		}
		req.Header.Set("User-Agent", "held-writer")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- err
			return
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %s", resp.Status)
		}
		held <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); s.Status().InflightWrites == 0; time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-held:
			t.Fatalf("the held write ended before the fence: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the held write was not in flight at the proxy after 10s")
		}
	}
	code, out, errOut = runCLI(append([]string{"fence", "on", "--reason", "test", "--wait-timeout", "50ms"}, sock...)...)
	if code != ExitFailure || !strings.Contains(out, "fence is ON") || !strings.Contains(out, "update configmaps -n a held (held-writer)") ||
		!strings.Contains(errOut, "1 write(s) admitted before it were still running") {
		t.Fatalf("fence on with a held write = %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, _ = runCLI(append([]string{"fence", "status", "-o", "json"}, sock...)...)
	var st admin.Status
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || !st.Fenced || st.Reason != "test" || st.InflightWrites != 1 {
		t.Fatalf("status json = %d %v %s", code, err, out)
	}
	// No switch while that write still runs on blue: blue could acknowledge it after the switch.
	code, _, errOut = runCLI(append([]string{"backend", "set", green.URL}, sock...)...)
	if code != ExitFailure || !strings.Contains(errOut, "still running") {
		t.Fatalf("backend set with a write in flight = %d %q, want refused", code, errOut)
	}
	releaseHold()
	select {
	case err := <-held:
		if err != nil {
			t.Errorf("the write admitted before the fence: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write admitted before the fence had not ended 10s after its backend answered")
	}
	for deadline := time.Now().Add(10 * time.Second); s.Status().InflightWrites > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the write was still registered 10s after it ended")
		}
	}
	code, out, _ = runCLI(append([]string{"backend", "prepare", green.URL}, sock...)...)
	if code != 0 || !strings.Contains(out, green.URL+" prepared: ") {
		t.Fatalf("backend prepare = %d %q", code, out)
	}
	code, out, _ = runCLI(append([]string{"backend", "set", green.URL}, sock...)...)
	if code != 0 || !strings.Contains(out, "backend is "+green.URL) || !strings.Contains(out, "over the connections 'backend prepare' opened") {
		t.Fatalf("backend set = %d %q", code, out)
	}
	code, out, _ = runCLI(append([]string{"fence", "off", "-o", "json"}, sock...)...)
	var fr admin.FenceResponse
	if err := json.Unmarshal([]byte(out), &fr); code != 0 || err != nil || fr.Status.Fenced || fr.Status.Backend != green.URL {
		t.Fatalf("fence off json = %d %v %s", code, err, out)
	}
}

// TestCutoverReportWording: the report claims only what the proxy knows: how many writes got a
// 429, not that clients retried them.
func TestCutoverReportWording(t *testing.T) {
	var buf bytes.Buffer
	printReport(&buf, &cutover.Report{ID: "x", Result: "done", RefusedWrites: 3})
	out := buf.String()
	if !strings.Contains(out, "writes refused with 429 while fenced: 3 (client-go retries them; clients that do not retry saw an error)") {
		t.Errorf("report lacks the refused writes line:\n%s", out)
	}
	if strings.Contains(out, "retried by clients") {
		t.Errorf("report claims clients retried:\n%s", out)
	}
	buf.Reset()
	printReport(&buf, &cutover.Report{ID: "x", Result: "done", WriteUnavailability: 86 * time.Millisecond, FenceBarrier: 3100 * time.Microsecond})
	if out := buf.String(); !strings.Contains(out, "window (fence on -> fence off): 86ms, of which 3.1ms the fence waiting for the writes admitted before it") {
		t.Errorf("report does not split the window by the barrier:\n%s", out)
	}
	// A run that never fenced (a rehearsal, a refused preflight) has no refused writes to count.
	buf.Reset()
	printReport(&buf, &cutover.Report{ID: "x", Result: cutover.ResultRehearsed})
	if out := buf.String(); strings.Contains(out, "429") {
		t.Errorf("a report without a window counts refused writes:\n%s", out)
	}
	// A rollback's report says it rolled back, and of which cutover: "cutover R: done" read as
	// "green serves".
	buf.Reset()
	printReport(&buf, &cutover.Report{ID: "r", Cutover: "c", Result: cutover.ResultRolledBack, WriteUnavailability: time.Millisecond})
	if out := buf.String(); !strings.Contains(out, "rollback r of cutover c: rolled-back") || strings.Contains(out, "cutover r:") {
		t.Errorf("a rollback's report:\n%s", out)
	}
}

// TestFrozenProxyTimesOut: a proxy whose admin socket accepts requests and never answers makes
// every admin command fail within its --timeout, naming the proxy, instead of hanging.
func TestFrozenProxyTimesOut(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "frozen.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs first: Close waits for the handlers

	for _, args := range [][]string{
		{"fence", "off"},
		{"fence", "status"},
		{"backend", "set", "https://green:6443"},
		{"fence", "on", "--wait-timeout", "50ms"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			done := make(chan struct{})
			var code int
			var errOut string
			go func() {
				defer close(done)
				code, _, errOut = runCLI(append(args, "--admin-socket", sock, "--timeout", "100ms")...)
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("kubefence %v still waiting for the frozen proxy after 20s", args)
			}
			if code != ExitFailure || !strings.Contains(errOut, "proxy "+sock+": no answer within") {
				t.Errorf("kubefence %v = %d, stderr %q; want %d naming %s", args, code, errOut, ExitFailure, sock)
			}
		})
	}
}

// TestMigrateCopyTimeoutHelp: migrate copy --endpoints runs the whole copy (member checks, the
// wait for convergence and the snapshot stream) under --timeout; its help must say so, or a
// large snapshot cut at the default looks like a bug.
func TestMigrateCopyTimeoutHelp(t *testing.T) {
	root, closeLogs := NewRootCommand(Streams{})
	defer closeLogs()
	cmd, _, err := root.Find([]string{"migrate", "copy"})
	if err != nil {
		t.Fatal(err)
	}
	usage := cmd.Flags().Lookup("timeout").Usage
	if !strings.Contains(usage, "streaming the snapshot") {
		t.Errorf("migrate copy --timeout: %q does not say it bounds the snapshot stream", usage)
	}
	if !strings.Contains(cmd.Long, "--timeout bounds") {
		t.Errorf("migrate copy's description does not say what --timeout bounds:\n%s", cmd.Long)
	}
}

// writeLoadablePlan writes a plan (the kubeadm example's shape) whose files all exist, empty,
// under a temp dir, so that cutover.LoadPlan accepts it; it returns the plan and its stateDir.
func writeLoadablePlan(t *testing.T) (plan, stateDir string) {
	t.Helper()
	root := t.TempDir()
	for _, f := range []string{"blue.conf", "green.conf", "blue-ca.crt", "blue.crt", "blue.key", "green-apiserver.yaml",
		"pki/ca.crt", "pki/server.crt", "pki/server.key", "pki/peer.crt", "pki/peer.key", "pki/healthcheck-client.crt", "pki/healthcheck-client.key"} {
		writeFile(t, filepath.Join(root, f), "", 0o600)
	}
	writeFile(t, filepath.Join(root, "bin", "etcd-3.6.16"), "#!/bin/sh\n", 0o755)
	if err := os.Mkdir(filepath.Join(root, "manifests"), 0o700); err != nil {
		t.Fatal(err)
	}
	stateDir = filepath.Join(root, "state")
	plan = filepath.Join(root, "plan.yaml")
	writeFile(t, plan, fmt.Sprintf(`apiVersion: kubefence.io/v1alpha1
kind: CutoverPlan
stateDir: %[1]s/state
proxy:
  adminSocket: %[1]s/admin.sock
blue:
  apiserver: {url: "https://127.0.0.1:6443", kubeconfig: %[1]s/blue.conf}
  etcd: {endpoints: ["https://127.0.0.1:2379"], caFile: %[1]s/blue-ca.crt, certFile: %[1]s/blue.crt, keyFile: %[1]s/blue.key}
green:
  etcd:
    binary: %[1]s/bin/etcd-3.6.16
    version: 3.6.16
    members: [{name: green-0, dataDir: %[1]s/green, clientURL: "https://127.0.0.1:2479", peerURL: "https://127.0.0.1:2480"}]
    tls: {pkiDir: %[1]s/pki}
  apiserver:
    url: https://127.0.0.1:7443
    kubeconfig: %[1]s/green.conf
    staticPod: {manifest: %[1]s/green-apiserver.yaml, manifestDir: %[1]s/manifests}
migration:
  mode: replicate
`, root), 0o600)
	return plan, stateDir
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// TestCutoverFlagsRefusedBeforeAnything: flags that cannot go together are a usage error found
// before the state dir is created or locked.
func TestCutoverFlagsRefusedBeforeAnything(t *testing.T) {
	plan, stateDir := writeLoadablePlan(t)
	if code, out, errOut := runCLI("cutover", "--plan", plan, "--dry-run"); code != ExitOK {
		t.Fatalf("the test plan does not load: cutover --dry-run = %d\n%s%s", code, out, errOut)
	}
	// The preflight's checks of the plan alone, in the dry run too: a proxy listed twice.
	data, err := os.ReadFile(plan)
	if err != nil {
		t.Fatal(err)
	}
	twice := filepath.Join(filepath.Dir(plan), "twice-plan.yaml")
	writeFile(t, twice, strings.Replace(string(data), "proxy:\n  adminSocket: "+filepath.Dir(plan)+"/admin.sock\n",
		"proxies:\n  - adminSocket: "+filepath.Dir(plan)+"/admin.sock\n  - adminSocket: "+filepath.Dir(plan)+"/./admin.sock\n", 1), 0o600)
	if code, _, errOut := runCLI("cutover", "--plan", twice, "--dry-run"); code != ExitUsage || !strings.Contains(errOut, "named twice") {
		t.Errorf("cutover --dry-run of a plan listing a proxy twice = %d, stderr %q; want %d naming it", code, errOut, ExitUsage)
	}
	code, _, errOut := runCLI("cutover", "--plan", plan, "--rehearse", "--resume")
	if code != ExitUsage || !strings.Contains(errOut, "--rehearse and --resume do not go together") {
		t.Errorf("cutover --rehearse --resume = %d, stderr %q; want %d", code, errOut, ExitUsage)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("a refused command line made the state dir %s (%v)", stateDir, err)
	}
	// The same plan copying under the fence (mode snapshot) has nothing to rehearse.
	copyPlan := filepath.Join(filepath.Dir(plan), "copy-plan.yaml")
	writeFile(t, copyPlan, strings.Replace(string(data), "mode: replicate", "mode: snapshot", 1), 0o600)
	code, _, errOut = runCLI("cutover", "--plan", copyPlan, "--rehearse")
	if code != ExitUsage || !strings.Contains(errOut, "needs a replicating plan") {
		t.Errorf("cutover --rehearse of a copying plan = %d, stderr %q; want %d", code, errOut, ExitUsage)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("a refused command line made the state dir %s (%v)", stateDir, err)
	}
}

// TestFenceOnWording: fence on says what happens to writes in the mode the proxy is in.
func TestFenceOnWording(t *testing.T) {
	done := &admin.Barrier{Complete: true}
	running := &admin.Barrier{Remaining: []admin.InflightWrite{{Verb: "update", Resource: "configmaps"}}}
	cases := []struct {
		name    string
		resp    admin.FenceResponse
		want    string
		notWant string
	}{
		{"refuse", admin.FenceResponse{Status: admin.Status{Fenced: true, Mode: admin.ModeRefuse}, Barrier: done}, "writes refused", "held"},
		{"refuse, writes running", admin.FenceResponse{Status: admin.Status{Fenced: true, Mode: admin.ModeRefuse}, Barrier: running}, "writes refused", "held"},
		{"hold", admin.FenceResponse{Status: admin.Status{Fenced: true, Mode: admin.ModeHold}, Barrier: done}, "writes held until fence off", "refused"},
		{"hold, writes running", admin.FenceResponse{Status: admin.Status{Fenced: true, Mode: admin.ModeHold}, Barrier: running}, "writes held until fence off", "refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			printFenceOn(&buf, tc.resp)
			if out := buf.String(); !strings.Contains(out, tc.want) || strings.Contains(out, tc.notWant) {
				t.Errorf("fence on, mode %s: %q; want %q and not %q", tc.resp.Status.Mode, out, tc.want, tc.notWant)
			}
		})
	}
}

// TestAdviceNamesThePlan: the commands kubefence advises carry the plan's path, in errors and
// in what it prints, so that they can be pasted; a path a shell would need quoted keeps PLAN.
func TestAdviceNamesThePlan(t *testing.T) {
	plan, stateDir := writeLoadablePlan(t)
	writeFile(t, filepath.Join(stateDir, "journal.json"), `{"version": 1, "id": "x", "state": "running", "rehearse": true}`, 0o600)
	code, _, errOut := runCLI("cutover", "--plan", plan)
	if code == ExitOK || !strings.Contains(errOut, "'kubefence cutover abort --plan "+plan+"'") {
		t.Errorf("cutover over a rehearsal stopped partway = %d, stderr %q; want the abort with --plan %s", code, errOut, plan)
	}
	writeFile(t, filepath.Join(stateDir, "journal.json"), `{"version": 1, "id": "x", "state": "running"}`, 0o600)
	code, out, errOut := runCLI("cutover", "status", "--plan", plan)
	if code != ExitOK || !strings.Contains(out, "'kubefence cutover --resume --plan "+plan+"'") || strings.Contains(out, "PLAN") {
		t.Errorf("cutover status = %d, stdout %q, stderr %q; want the resume with --plan %s", code, out, errOut, plan)
	}
	if got := planArg("/a dir/plan.yaml"); got != "" {
		t.Errorf("planArg of a path with a space = %q; want none (PLAN stays)", got)
	}
}

// TestPlanHintsKeepTheTerminal: the writer that puts the plan's path in the advice still lets
// the cutover see a terminal, where it draws the line of the running step and how long writes
// have been fenced.
func TestPlanHintsKeepTheTerminal(t *testing.T) {
	tty, err := os.OpenFile("/dev/null", os.O_WRONLY, 0) // a character device, as a terminal is
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	s := Streams{Out: tty, ErrOut: tty}
	withPlanHints(&s, "plan.yaml")
	if terminal(s.Out) != tty {
		t.Fatal("behind the plan's hints the terminal is not seen: no status line of the running step")
	}
}

// TestDryRunOfAResume: the dry run lists a new cutover's steps and reads no journal, so with
// --resume it is refused, pointing at status, rather than listing steps already done as to do.
func TestDryRunOfAResume(t *testing.T) {
	plan, _ := writeLoadablePlan(t)
	code, _, errOut := runCLI("cutover", "--plan", plan, "--dry-run", "--resume")
	if code != ExitUsage || !strings.Contains(errOut, "cutover status") {
		t.Errorf("cutover --dry-run --resume = %d, stderr %q; want %d, pointing at cutover status", code, errOut, ExitUsage)
	}
}

// TestAnswerLostIsUnknown: a proxy that took a change and closed the connection before it
// answered (restarted after it saved the new state) may have acted on it: the command says the
// outcome is unknown and how to check, not that the proxy could not be reached (an operator
// who believes nothing changed may reopen writes on the wrong side).
func TestAnswerLostIsUnknown(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	for _, args := range [][]string{{"fence", "off"}, {"fence", "on"}, {"backend", "set", "https://10.0.0.2:6443"}} {
		code, _, errOut := runCLI(append(args, "--admin-socket", sock)...)
		if code != ExitFailure || !strings.Contains(errOut, "unknown") || !strings.Contains(errOut, "fence status") || strings.Contains(errOut, "running") {
			t.Errorf("kubefence %v against a proxy that closed without an answer = %d\n%s\nwant the outcome unknown, not 'is the proxy running'", args, code, errOut)
		}
	}
}

// TestCopyReportSaysItsWarnings: a member copy that is whole and matches its manifest, but
// whose contents kubefence cannot tell (a garbled version.txt), is reported with a warning; the
// text report says it (it printed nothing where the "holds" line would be).
func TestCopyReportSaysItsWarnings(t *testing.T) {
	var b strings.Builder
	printCopies(&b, []datadir.CopyReport{{Source: "/var/lib/etcd", Output: "/srv/copy/m0", Warnings: []string{"kubefence cannot tell what the copy holds"}}})
	if !strings.Contains(b.String(), "WARNING: kubefence cannot tell what the copy holds") {
		t.Errorf("text report %q: want the warning", b.String())
	}
}
