package cli

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubefence/kubefence/internal/tlsutil"
	"github.com/kubefence/kubefence/proxy"
	"github.com/kubefence/kubefence/proxy/admin"
)

// startTestProxy starts an in-process proxy in front of upstream and returns its admin socket.
func startTestProxy(t *testing.T, upstream string, mutate ...func(*proxy.Options)) *proxy.Server {
	t.Helper()
	dir := t.TempDir()
	o := proxy.NewOptions()
	o.Listen, o.InsecureListen, o.Upstream, o.MetricsListen = "127.0.0.1:0", true, upstream, ""
	o.AdminSocket, o.StateFile = filepath.Join(dir, "a.sock"), filepath.Join(dir, "state.json")
	o.AllowedBackends = []string{"http://127.0.0.1:*"}
	for _, m := range mutate {
		m(o)
	}
	cfg, err := o.Complete()
	if err != nil {
		t.Fatal(err)
	}
	s, err := proxy.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(time.Second) })
	return s
}

// TestSeveralProxies: the fence commands act on every proxy named (flags repeated, or the
// environment), show them side by side, and fail naming the ones that did not acknowledge.
func TestSeveralProxies(t *testing.T) {
	blue := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) }))
	defer blue.Close()
	green := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) }))
	defer green.Close()
	a, b := startTestProxy(t, blue.URL), startTestProxy(t, blue.URL)
	socks := []string{a.AdminSocket(), b.AdminSocket()}
	both := []string{"--admin-socket", socks[0], "--admin-socket", socks[1]}

	if code, out, errOut := runCLI(append([]string{"fence", "on", "--mode", "hold"}, both...)...); code != 0 || strings.Count(out, "fence is ON") != 2 {
		t.Fatalf("fence on, two proxies = %d\n%s%s", code, out, errOut)
	}
	if !a.Status().Fenced || !b.Status().Fenced || b.Status().Mode != admin.ModeHold {
		t.Fatal("not every proxy was fenced")
	}
	t.Setenv(envAdminSocket, strings.Join(socks, ","))
	code, out, errOut := runCLI("backend", "set", green.URL)
	if code != 0 || a.Status().Backend != green.URL || b.Status().Backend != green.URL {
		t.Fatalf("backend set through %s = %d\n%s%s", envAdminSocket, code, out, errOut)
	}
	code, out, _ = runCLI("fence", "status")
	if code != 0 || !strings.Contains(out, "PROXY") || strings.Count(out, fmt.Sprintf("(%d)", admin.APILevel)) != 2 || strings.Count(out, green.URL) != 2 || strings.Count(out, "FENCED") != 2 {
		t.Fatalf("status side by side = %d\n%s", code, out)
	}
	code, out, _ = runCLI("fence", "status", "-o", "json")
	var res []admin.Result[admin.Status]
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res) != 2 || res[1].Proxy != socks[1] {
		t.Fatalf("status -o json = %d %s", code, out)
	}
	gone := filepath.Join(t.TempDir(), "gone.sock")
	code, out, errOut = runCLI("fence", "off", "--admin-socket", socks[0], "--admin-socket", gone)
	if code != ExitFailure || !strings.Contains(errOut, "1 of 2 proxies did not acknowledge") || !strings.Contains(errOut, gone) {
		t.Fatalf("fence off with one proxy gone = %d\n%s%s", code, out, errOut)
	}
	if a.Status().Fenced {
		t.Fatal("the reachable proxy was not unfenced")
	}
}

// TestFenceOffRefusesDisagreeingProxies: after a partial switch (one proxy on green, one still
// on blue), fence off naming both without --expect-backend opens neither: it would send writes
// to two etcds. It names each proxy's backend; with --expect-backend only the proxy on that
// backend opens.
func TestFenceOffRefusesDisagreeingProxies(t *testing.T) {
	blue, green := emptyAPI(t), emptyAPI(t)
	a, b, both := twoFencedProxies(t, blue.URL, blue.URL)
	if code, out, errOut := runCLI("backend", "set", green.URL, "--admin-socket", a.AdminSocket()); code != 0 {
		t.Fatalf("backend set on one proxy = %d\n%s%s", code, out, errOut)
	}

	code, out, errOut := runCLI(append([]string{"fence", "off"}, both...)...)
	for _, want := range []string{a.AdminSocket() + " is on " + green.URL, b.AdminSocket() + " is on " + blue.URL, "--expect-backend"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("fence off, proxies on different backends: stderr lacks %q", want)
		}
	}
	if code != ExitFailure || !a.Status().Fenced || !b.Status().Fenced {
		t.Fatalf("fence off, proxies on different backends = %d (fenced: %v, %v), want %d and both still fenced\n%s%s",
			code, a.Status().Fenced, b.Status().Fenced, ExitFailure, out, errOut)
	}

	code, out, errOut = runCLI(append([]string{"fence", "off", "--expect-backend", green.URL}, both...)...)
	if code != ExitFailure || a.Status().Fenced || !b.Status().Fenced || !strings.Contains(errOut, b.AdminSocket()) {
		t.Fatalf("fence off --expect-backend green = %d (fenced: %v, %v), want only the proxy on green open\n%s%s",
			code, a.Status().Fenced, b.Status().Fenced, out, errOut)
	}

	// Once they agree, fence off opens them all.
	if code, out, errOut := runCLI("backend", "set", green.URL, "--admin-socket", b.AdminSocket()); code != 0 {
		t.Fatalf("backend set on the other proxy = %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(append([]string{"fence", "off"}, both...)...); code != 0 || a.Status().Fenced || b.Status().Fenced {
		t.Fatalf("fence off, proxies on one backend = %d\n%s%s", code, out, errOut)
	}
}

// TestFenceOffEachOwnBackend: in an HA control plane each proxy stands in front of its own
// node's apiserver, so their backends always differ: --each-own-backend opens each on the
// backend it is on when read, and the refusal without it says so.
func TestFenceOffEachOwnBackend(t *testing.T) {
	a, b, both := twoFencedProxies(t, emptyAPI(t).URL, emptyAPI(t).URL)
	if code, _, errOut := runCLI(append([]string{"fence", "off"}, both...)...); code != ExitFailure || !strings.Contains(errOut, "--each-own-backend") {
		t.Fatalf("fence off of proxies on their own backends = %d, stderr %q: want refused, naming --each-own-backend", code, errOut)
	}
	if code, out, errOut := runCLI(append([]string{"fence", "off", "--each-own-backend"}, both...)...); code != 0 || a.Status().Fenced || b.Status().Fenced {
		t.Fatalf("fence off --each-own-backend = %d (fenced: %v, %v)\n%s%s", code, a.Status().Fenced, b.Status().Fenced, out, errOut)
	}
}

// TestFenceOffStartFencedProxies: proxies that started fenced with no state file are on
// --upstream only for want of anything else (after a cutover, a lost state file leaves --upstream
// on the old side). Reading their backends and expecting them, as fence off does for several
// proxies, would confirm that guess: only a backend the operator names opens them.
func TestFenceOffStartFencedProxies(t *testing.T) {
	blue := emptyAPI(t)
	fenced := func(o *proxy.Options) { o.StartFenced = true }
	a, b := startTestProxy(t, blue.URL, fenced), startTestProxy(t, blue.URL, fenced)
	both := []string{"--admin-socket", a.AdminSocket(), "--admin-socket", b.AdminSocket()}
	for _, extra := range [][]string{nil, {"--each-own-backend"}} {
		code, _, errOut := runCLI(append(append([]string{"fence", "off"}, extra...), both...)...)
		if code != ExitFailure || !strings.Contains(errOut, "--expect-backend") || !a.Status().Fenced || !b.Status().Fenced {
			t.Fatalf("fence off %v of start-fenced proxies = %d, stderr %q: want refused naming --expect-backend, both fenced", extra, code, errOut)
		}
	}
	if code, _, errOut := runCLI("fence", "off", "--admin-socket", a.AdminSocket()); code != ExitFailure || !strings.Contains(errOut, "--expect-backend") {
		t.Fatalf("fence off of one start-fenced proxy = %d, stderr %q: want refused naming --expect-backend", code, errOut)
	}
	if code, out, errOut := runCLI(append([]string{"fence", "off", "--expect-backend", blue.URL}, both...)...); code != 0 || a.Status().Fenced || b.Status().Fenced {
		t.Fatalf("fence off --expect-backend = %d (fenced: %v, %v)\n%s%s", code, a.Status().Fenced, b.Status().Fenced, out, errOut)
	}
}

// emptyAPI is a backend answering {} to everything, closed at the end of the test.
func emptyAPI(t *testing.T) *httptest.Server {
	t.Helper()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) }))
	t.Cleanup(api.Close)
	return api
}

// twoFencedProxies starts two proxies on backends a and b and fences both with the CLI; both
// are the flags naming them.
func twoFencedProxies(t *testing.T, backendA, backendB string) (a, b *proxy.Server, both []string) {
	t.Helper()
	a, b = startTestProxy(t, backendA), startTestProxy(t, backendB)
	both = []string{"--admin-socket", a.AdminSocket(), "--admin-socket", b.AdminSocket()}
	if code, out, errOut := runCLI(append([]string{"fence", "on"}, both...)...); code != 0 {
		t.Fatalf("fence on = %d\n%s%s", code, out, errOut)
	}
	return a, b, both
}

// TestEachOwnBackendWithOneProxy: --each-own-backend with one proxy still reads its backend and
// opens it only if it is still there (as with several), instead of opening on whatever backend.
func TestEachOwnBackendWithOneProxy(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var fenceBody string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			_ = json.NewEncoder(w).Encode(admin.Status{Fenced: true, Backend: "https://10.0.0.2:6443", APILevel: admin.APILevel})
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		fenceBody = string(b)
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(admin.FenceResponse{Status: admin.Status{Backend: "https://10.0.0.2:6443"}})
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	if code, out, errOut := runCLI("fence", "off", "--each-own-backend", "--admin-socket", sock); code != ExitOK {
		t.Fatalf("fence off --each-own-backend = %d\n%s%s", code, out, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(fenceBody, `"expectBackend":"https://10.0.0.2:6443"`) {
		t.Errorf("fence off sent %s; want it to expect the backend it read", fenceBody)
	}
}

// TestOneProxyNamedTwoWays: one proxy named by its admin socket and by its --admin-listen
// address is two names the command line alone cannot tell apart; fenced through both at once,
// the second flip would make the first's barrier answer 409 every time. Every admin command
// naming several proxies (but fence off with --expect-backend: TestFenceOffNotHeldBySilentProxy)
// compares their instances and refuses, naming both, before it changes anything.
func TestOneProxyNamedTwoWays(t *testing.T) {
	l, err := tlsutil.NewLoopback("operator")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	s := startTestProxy(t, emptyAPI(t).URL, func(o *proxy.Options) {
		o.InsecureListen, o.TLSCertFile, o.TLSKeyFile = false, l.CertFile, l.KeyFile // the admin API's serving certificate
		o.AdminListen, o.AdminClientCAFile = "127.0.0.1:0", l.CAFile
	})
	certFile, keyFile := writeClientCert(t, l.Client.Certificates[0])
	address := "https://" + s.AdminAddr().String()
	twice := []string{"--admin-socket", s.AdminSocket(), "--admin-address", address,
		"--admin-cert-file", certFile, "--admin-key-file", keyFile, "--admin-ca-file", l.CAFile}
	if code, out, errOut := runCLI(append([]string{"fence", "status"}, twice[2:]...)...); code != ExitOK || !strings.Contains(out, "OPEN") {
		t.Fatalf("fence status through the address alone = %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{
		{"fence", "on"},
		{"fence", "off"},
		{"fence", "status"},
		{"backend", "prepare", emptyAPI(t).URL},
	} {
		code, out, errOut := runCLI(append(args, twice...)...)
		if code != ExitUsage || !strings.Contains(errOut, s.AdminSocket()) || !strings.Contains(errOut, address) || !strings.Contains(errOut, "one proxy") {
			t.Errorf("%v naming one proxy by its socket and its address = %d\n%s%s\nwant %d, naming both as one proxy", args, code, out, errOut, ExitUsage)
		}
		if st := s.Status(); st.Fenced || st.Generation != 0 {
			t.Fatalf("%v changed the proxy (fenced %t, generation %d): it must refuse before acting", args, st.Fenced, st.Generation)
		}
	}
}

// writeClientCert writes c's certificate and key as PEM files for --admin-cert-file and
// --admin-key-file.
func writeClientCert(t *testing.T, c tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestFenceOffNotHeldBySilentProxy: with --expect-backend, fence off reopens writes on the
// proxies that answer at once; one that accepts and never answers (its host wedged: the
// runbook's "name them all" after a proxy host dies) does not hold the others fenced for
// --timeout first. Fence off is the same twice, so one proxy named two ways needs no check.
func TestFenceOffNotHeldBySilentProxy(t *testing.T) {
	api := emptyAPI(t)
	good := startTestProxy(t, api.URL)
	silent := silentAdminSocket(t)
	if code, out, errOut := runCLI("fence", "on", "--admin-socket", good.AdminSocket()); code != ExitOK {
		t.Fatalf("fence on = %d\n%s%s", code, out, errOut)
	}
	start := time.Now()
	done := make(chan int, 1)
	go func() {
		code, _, _ := runCLI("fence", "off", "--expect-backend", api.URL, "--admin-socket", good.AdminSocket(), "--admin-socket", silent, "--timeout", "4s")
		done <- code
	}()
	for good.Status().Fenced && time.Since(start) < 10*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the proxy that answers reopened writes %s after fence off, want at once (not after the silent one's --timeout)", took)
	}
	if code := <-done; code == ExitOK {
		t.Errorf("fence off = %d with a proxy that never answered, want a failure naming it", code)
	}
}

// silentAdminSocket is an admin socket that accepts connections and never answers (a proxy
// whose host is wedged).
func silentAdminSocket(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "silent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // accepted, never answered
		}
	}()
	return sock
}

// TestFenceOnBoundsTheNamesCheck: the check that several names are several proxies waits for a
// silent one a short while, not --timeout, before the others are fenced.
func TestFenceOnBoundsTheNamesCheck(t *testing.T) {
	good := startTestProxy(t, emptyAPI(t).URL)
	silent := silentAdminSocket(t)
	start := time.Now()
	done := make(chan int, 1)
	go func() {
		code, _, _ := runCLI("fence", "on", "--admin-socket", good.AdminSocket(), "--admin-socket", silent, "--timeout", "8s", "--wait-timeout", "1s")
		done <- code
	}()
	for !good.Status().Fenced && time.Since(start) < 30*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("the proxy that answers was fenced %s after fence on, want within the names check's %s", took, namedOnceBound)
	}
	if code := <-done; code == ExitOK {
		t.Errorf("fence on = %d with a proxy that never answered, want a failure naming it", code)
	}
}
