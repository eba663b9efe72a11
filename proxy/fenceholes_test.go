package proxy

import (
	"bufio"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kubefence/kubefence/internal/testenv"
	"github.com/kubefence/kubefence/proxy/admin"
)

// recordingAPI records every request that reached it with its body and headers.
type recordingAPI struct {
	*httptest.Server
	mu   sync.Mutex
	seen []*http.Request
	body []string
}

func newRecordingAPI(t *testing.T) *recordingAPI {
	a := &recordingAPI{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.seen = append(a.seen, r)
		a.body = append(a.body, string(b))
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"Status","status":"Success"}`)
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *recordingAPI) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seen)
}

func fenceOn(t *testing.T, p *testProxy, wait time.Duration) admin.FenceResponse {
	t.Helper()
	resp, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Reason: "test", WaitTimeout: admin.Duration(wait)})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func send(t *testing.T, method, url, contentType, body string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if body == "" {
		req.Body = http.NoBody
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestFencedDeleteBodyDecidesDryRun: kube-apiserver reads a DELETE's options from its body when
// there is one, so ?dryRun=All with a body is a real delete and must be refused; a body that
// itself says dryRun All is forwarded, body intact.
func TestFencedDeleteBodyDecidesDryRun(t *testing.T) {
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL)
	fenceOn(t, p, time.Second)
	const cm = "/api/v1/namespaces/default/configmaps/cm1"
	cases := []struct {
		name, target, body string
		want               int
	}{
		{"query dry run, DeleteOptions body", cm + "?dryRun=All", `{"kind":"DeleteOptions","apiVersion":"v1"}`, 429},
		{"query dry run, empty object body", cm + "?dryRun=All", `{}`, 429},
		{"deletecollection, query dry run, body", "/api/v1/namespaces/default/configmaps?dryRun=All", `{}`, 429},
		{"query dry run, no body", cm + "?dryRun=All", "", 200},
		{"body dry run", cm, `{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}`, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := api.count()
			if got := send(t, "DELETE", p.url+tc.target, "application/json", tc.body); got != tc.want {
				t.Fatalf("DELETE %s body %q = %d, want %d", tc.target, tc.body, got, tc.want)
			}
			forwarded := api.count() - before
			if tc.want == 429 && forwarded != 0 {
				t.Fatalf("a refused delete reached the backend")
			}
			if tc.want == 200 {
				api.mu.Lock()
				got := api.body[len(api.body)-1]
				api.mu.Unlock()
				if forwarded != 1 || got != tc.body {
					t.Fatalf("backend got %d request(s), last body %q, want the body %q", forwarded, got, tc.body)
				}
			}
		})
	}
}

// TestFencedWatchPathWrites: a non-GET method on a /watch/ path is a write.
func TestFencedWatchPathWrites(t *testing.T) {
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL)
	fenceOn(t, p, time.Second)
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		if got := send(t, m, p.url+"/api/v1/watch/namespaces/default/configmaps/cm1", "application/json", `{}`); got != 429 {
			t.Errorf("%s on a /watch/ path while fenced = %d, want 429", m, got)
		}
	}
	if api.count() != 0 {
		t.Fatalf("%d write(s) on /watch/ paths reached the backend", api.count())
	}
}

// TestBarrierWaitsForCancelledWrite: a write that reached the backend is still running there
// after its client gives up; the barrier must wait for the backend's answer.
func TestBarrierWaitsForCancelledWrite(t *testing.T) {
	api, releaseHold := heldAPI(t)
	p := startProxy(t, api.URL)

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "PUT", p.url+"/api/v1/namespaces/default/configmaps/c", strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitFor(t, func() bool { return api.writesIn.Load() == 1 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled client got an answer")
	}
	resp := fenceOn(t, p, 300*time.Millisecond)
	if resp.Barrier.Complete {
		t.Fatal("the barrier completed while the backend was still applying a write whose client went away")
	}
	releaseHold()
	if resp := fenceOn(t, p, 5*time.Second); !resp.Barrier.Complete {
		t.Fatalf("barrier after the backend answered: %+v", resp.Barrier)
	}
}

// TestSlowBodyCannotHoldBarrier: a write trickling its body is not admitted until the body is in,
// so 'fence on' does not wait for it; finished after the flip, it is refused and never forwarded.
func TestSlowBodyCannotHoldBarrier(t *testing.T) {
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL)
	c, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"slow"}}`
	fmt.Fprintf(c, "PUT /api/v1/namespaces/default/configmaps/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
	time.Sleep(100 * time.Millisecond)

	start := time.Now()
	resp := fenceOn(t, p, 2*time.Second)
	// A barrier that waited for the body would end incomplete at its 2 s; the bound leaves the
	// state file's fsyncs room on a loaded machine.
	if !resp.Barrier.Complete || time.Since(start) > 1900*time.Millisecond {
		t.Fatalf("fence on took %s with barrier %+v: a trickling body held it", time.Since(start), resp.Barrier)
	}
	if _, err := io.WriteString(c, body[10:]); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 429 || api.count() != 0 {
		t.Fatalf("slow write finished after the flip: %d, %d forwarded; want 429, none", r.StatusCode, api.count())
	}
}

// TestWriteBodyBounds: a body that never finishes gets 408 after --write-body-timeout; one over
// --max-write-body-bytes gets 413. Neither is forwarded.
func TestWriteBodyBounds(t *testing.T) {
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL, func(o *Options) { o.WriteBodyTimeout = 300 * time.Millisecond; o.MaxWriteBodyBytes = 1 << 10 })
	c, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled body = %d, want 408", r.StatusCode)
	}
	if got := send(t, "POST", p.url+"/api/v1/namespaces/default/configmaps", "application/json", strings.Repeat("x", 2<<10)); got != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body = %d, want 413", got)
	}
	if api.count() != 0 {
		t.Fatalf("%d bad write(s) forwarded", api.count())
	}
}

// TestLongProxyGetCannotHoldBarrier: a */proxy GET streaming for as long as it likes does not
// make 'fence on' wait; new ones are refused once fenced.
func TestLongProxyGetCannotHoldBarrier(t *testing.T) {
	release := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer api.Close()
	defer close(release)
	p := startProxy(t, api.URL)
	resp, err := http.Get(p.url + "/api/v1/namespaces/default/services/s:80/proxy/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	if fr := fenceOn(t, p, 2*time.Second); !fr.Barrier.Complete || time.Since(start) > 1900*time.Millisecond {
		t.Fatalf("fence on took %s with barrier %+v: a */proxy stream held it", time.Since(start), fr.Barrier)
	}
	if got := send(t, "GET", p.url+"/api/v1/namespaces/default/services/s:80/proxy/other", "", ""); got != 429 {
		t.Fatalf("a new */proxy request while fenced = %d, want 429", got)
	}
}

// TestUpgradeHeadersDoNotEscapeBarrier: a write to an object with upgrade headers is a write
// like any other (the apiserver ignores the headers and commits it): fence on's barrier waits
// for it, as for any write admitted before the flip.
func TestUpgradeHeadersDoNotEscapeBarrier(t *testing.T) {
	for _, path := range []string{
		"/api/v1/namespaces/default/configmaps",
		"/api/v1/namespaces%2Fdefault%2Fconfigmaps", // not parsed here; kube-apiserver decodes it
	} {
		t.Run(path, func(t *testing.T) { upgradeHeadersWrite(t, path) })
	}
}

// upgradeHeadersWrite sends a create with upgrade headers to path, fences while the backend
// holds it, and expects the barrier to wait for it.
func upgradeHeadersWrite(t *testing.T, path string) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()
	p := startProxy(t, api.URL)
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", p.url+path, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-arrived // at the backend: admitted before the flip
	if fr := fenceOn(t, p, 300*time.Millisecond); fr.Barrier.Complete {
		t.Errorf("fence on's barrier complete while a write with upgrade headers was at the backend: %+v", fr.Barrier)
	}
	close(release)
	if code := <-done; code != http.StatusCreated {
		t.Errorf("the write got %d, want 201", code)
	}
}

// TestStartFenced: with --start-fenced and no state file the proxy starts fenced; the state file
// it then writes decides later starts.
func TestStartFenced(t *testing.T) {
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL, func(o *Options) { o.StartFenced = true })
	if st := p.Status(); !st.Fenced || st.Unconfirmed {
		t.Fatalf("status = %+v, want fenced (and confirmed)", st)
	}
	if got := send(t, "POST", p.url+"/api/v1/namespaces/default/configmaps", "application/json", "{}"); got != 429 {
		t.Fatalf("write = %d, want 429", got)
	}
	if got := send(t, "GET", p.url+"/api/v1/namespaces/default/configmaps", "", ""); got != 200 {
		t.Fatalf("read = %d, want 200", got)
	}
}

// TestStartFencedNeedsTheBackendNamed: a proxy that started fenced with no state file is on
// --upstream only because nothing else was known (after a cutover a lost state file leaves
// --upstream on blue, while green holds the acknowledged writes). A plain fence off must not open
// writes there; one that names the backend does, as does a backend set, and what it confirmed
// survives a restart.
func TestStartFencedNeedsTheBackendNamed(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	p := startProxy(t, blue.URL, func(o *Options) { o.StartFenced = true })
	if st := p.Status(); !st.Unchecked {
		t.Fatalf("status = %+v, want the backend shown unchecked", st)
	}
	ctx := t.Context()
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err == nil || !strings.Contains(err.Error(), "--expect-backend") {
		t.Fatalf("plain fence off: %v, want refused naming --expect-backend", err)
	}
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false, ExpectBackend: green.URL}); err == nil || !strings.Contains(err.Error(), "not "+green.URL) {
		t.Fatalf("fence off expecting green: %v, want refused: the proxy is on blue", err)
	}
	if st := p.Status(); !st.Fenced || !st.Unchecked {
		t.Fatalf("status after the refusals = %+v, want still fenced and unchecked", st)
	}
	// A fence on meanwhile saves the state: a restart must still know the backend unchecked.
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: true, Reason: "by hand"}); err != nil {
		t.Fatal(err)
	}
	p = restartProxy(t, p)
	if st := p.Status(); !st.Fenced || !st.Unchecked {
		t.Fatalf("restarted status = %+v, want fenced and still unchecked", st)
	}
	if _, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL}); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); st.Unchecked {
		t.Fatalf("status after backend set = %+v, want checked", st)
	}
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatalf("fence off after backend set: %v", err)
	}
	p = restartProxy(t, p)
	if st := p.Status(); st.Fenced || st.Unchecked || st.Backend != green.URL {
		t.Fatalf("restarted status = %+v, want open on green, checked", st)
	}
}

// TestStartFencedOpenedByName: fence off naming the proxy's backend opens writes and checks it.
func TestStartFencedOpenedByName(t *testing.T) {
	blue := newFakeAPI(t, "blue")
	p := startProxy(t, blue.URL, func(o *Options) { o.StartFenced = true })
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false, ExpectBackend: blue.URL}); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); st.Fenced || st.Unchecked {
		t.Fatalf("status = %+v, want open and checked", st)
	}
}

func TestStateDirChecked(t *testing.T) {
	api := newRecordingAPI(t)
	o := NewOptions()
	o.Listen, o.InsecureListen, o.Upstream, o.MetricsListen = "127.0.0.1:0", true, api.URL, ""
	o.AdminSocket = filepath.Join(t.TempDir(), "admin.sock")
	o.StateFile = filepath.Join(t.TempDir(), "missing", "state.json")
	cfg, err := o.Complete()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg, discardLog()); err == nil || !strings.Contains(err.Error(), "writable") {
		t.Fatalf("state file in a missing directory: %v, want an error at start naming the directory", err)
	}
}

// TestXRealIPStripped: kube-apiserver takes X-Real-Ip as the client's address in audit logs.
func TestXRealIPStripped(t *testing.T) {
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL)
	req, _ := http.NewRequest("GET", p.url+"/api/v1/namespaces", nil)
	req.Header.Set("X-Real-Ip", "10.9.9.9")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.seen) != 1 || api.seen[0].Header.Get("X-Real-Ip") != "" {
		t.Fatalf("backend saw X-Real-Ip %q", api.seen[0].Header.Get("X-Real-Ip"))
	}
}

// TestAdminSocketDirTightened: the socket's directory is 0700 before the socket exists; a shared
// directory is refused rather than tightened.
func TestAdminSocketDirTightened(t *testing.T) {
	api := newRecordingAPI(t)
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	startProxy(t, api.URL, func(o *Options) { o.AdminSocket = filepath.Join(dir, "admin.sock") })
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("admin socket dir mode = %v (%v), want 0700", fi.Mode(), err)
	}
	sticky := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(sticky, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := privateDir(sticky); err == nil || !strings.Contains(err.Error(), "shared") {
		t.Fatalf("sticky dir: %v, want refused as shared", err)
	}
	// A 0700 directory of another user: its owner could replace the socket.
	if err := privateDirOf(dir, os.Geteuid()+1, nil); err == nil || !strings.Contains(err.Error(), "owned by uid") {
		t.Fatalf("another user's dir: %v, want refused naming its owner", err)
	}
}

// TestAdminSocketDirNoSymlink: the proxy (often root) tightens the admin socket's directory to
// 0700; a symbolic link there (a local user's /tmp/kf -> /usr) must be refused, never followed,
// and a directory reached through a linked parent is checked as the directory it really is.
func TestAdminSocketDirNoSymlink(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mkdir := func(name string) string {
		d := filepath.Join(tmp, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	link := func(target, name string) string {
		l := filepath.Join(tmp, name)
		if err := os.Symlink(target, l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	usr, shared := mkdir("usr"), mkdir("system/run")
	cases := []struct {
		name, dir, untouched, want string
		cwd                        string // run from there
	}{
		{"link to another directory", link(usr, "kf"), usr, "symbolic link", ""},
		{"link to a directory not made yet", link(filepath.Join(tmp, "later"), "kf2"), "", "symbolic link", ""},
		{"linked parent, shared directory", filepath.Join(link(filepath.Join(tmp, "system"), "sys"), "run"), shared, "shared", ""},
		// --admin-socket=run/admin.sock from / would tighten /run.
		{"a relative path to a shared directory", "run", shared, "shared", filepath.Join(tmp, "system")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cwd != "" {
				t.Chdir(tc.cwd)
			}
			err := privateDirOf(tc.dir, os.Geteuid(), map[string]bool{shared: true})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("privateDir(%s) = %v, want an error saying %q", tc.dir, err, tc.want)
			}
			if tc.untouched == "" {
				return
			}
			if fi, err := os.Stat(tc.untouched); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s is now %v (%v), want it left 0755", tc.untouched, fi.Mode(), err)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(tmp, "later")); err == nil {
		t.Errorf("a directory was made through a dangling link")
	}
}

// TestAdminSocketDirAncestors: a directory above the admin socket's that another user owns, or
// may write to, is refused before anything is made or tightened: its owner could rename the
// socket's directory away and put one holding a fake socket in its place (--admin-socket=
// /home/ops/kf/admin.sock, the proxy root). A root-owned sticky one (/tmp) is enough.
func TestAdminSocketDirAncestors(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mkdir := ownedDirs(t, tmp)
	me := os.Geteuid()
	cases := []struct {
		name, dir, want string // want "": accepted
	}{
		{"parent of another user", filepath.Join(mkdir("home/ops", 0o755, 12345), "kf"), "uid 12345"},
		{"grandparent of another user, socket dir made", filepath.Join(mkdir("home2/ops", 0o755, 12345), "a", "kf"), "uid 12345"},
		{"parent others may write to", filepath.Join(mkdir("open", 0o777, me), "kf"), "others can write"},
		{"sticky parent of root", filepath.Join(mkdir("tmp", 0o777|os.ModeSticky, 0), "kf"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "made") {
				if err := os.MkdirAll(tc.dir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			err := privateDirOf(tc.dir, me, nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("privateDir(%s) = %v, want accepted", tc.dir, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("privateDir(%s) = %v, want an error saying %q", tc.dir, err, tc.want)
			}
			if _, err := os.Lstat(tc.dir); !strings.Contains(tc.name, "made") && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("%s was made (%v) in a directory another user controls", tc.dir, err)
			}
		})
	}
}

// TestAdminSocketBornPrivate: the admin socket is 0600 from the moment it exists, whatever the
// process's umask, not only after a chmod.
func TestAdminSocketBornPrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := bindUnixSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket created with mode %v (%v), want 0600 before any chmod", fi.Mode().Perm(), err)
	}
}

// TestBackendSetChecked: only --upstream and --allowed-backends may be switched to, and an https
// backend's certificate must verify with the CA file given.
func TestBackendSetChecked(t *testing.T) {
	blue := newRecordingAPI(t)
	green := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer green.Close()
	dir := t.TempDir()
	goodCA := filepath.Join(dir, "green-ca.crt")
	writePEMCert(t, goodCA, green.Certificate().Raw)
	otherCA := newTestCA(t, dir, "other")

	p := startProxy(t, blue.URL, func(o *Options) { o.AllowedBackends = []string{"https://127.0.0.1:*"} })
	fenceOn(t, p, time.Second)
	ctx := t.Context()
	if _, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: "https://10.255.0.1:6443", CAFile: goodCA}); err == nil || !strings.Contains(err.Error(), "allowed-backends") {
		t.Fatalf("switch to a URL not allowed: %v", err)
	}
	if _, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL, CAFile: otherCA.pem}); err == nil || !strings.Contains(err.Error(), "TLS handshake") {
		t.Fatalf("switch with a CA that does not verify green: %v", err)
	}
	if st := p.Status(); st.Backend != blue.URL {
		t.Fatalf("a refused switch changed the backend to %s", st.Backend)
	}
	if _, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL, CAFile: goodCA}); err != nil {
		t.Fatalf("switch to an allowed, verified backend: %v", err)
	}
}

// TestBackendSetRefusedBeforeReading: 'backend set' checks the URL and the allow-list before it
// reads the CA file the admin names (a device like /dev/zero must never be read), and refuses a
// URL whose userinfo (a password would land in the state file, status and logs), fragment or
// query is not a backend's, without repeating the password.
func TestBackendSetRefusedBeforeReading(t *testing.T) {
	blue, green := newRecordingAPI(t), newRecordingAPI(t)
	hostPort := strings.TrimPrefix(green.URL, "http://")
	dir := t.TempDir()
	p := startProxy(t, blue.URL) // allows http://127.0.0.1:*
	fenceOn(t, p, time.Second)
	cases := []struct {
		name, url, caFile, want string
	}{
		{"not allowed, CA file a directory", "http://10.255.0.1:6443", dir, "allowed-backends"},
		{"userinfo", "http://admin:s3cret@" + hostPort, "", "user"},
		{"user only", "http://admin@" + hostPort, "", "user"},
		{"fragment", green.URL + "#x", "", "fragment"},
		{"query", green.URL + "?x=1", "", "query"},
		{"empty query", green.URL + "?", "", "query"},
		{"allowed, CA file a directory", green.URL, dir, "regular file"},
	}
	// A FIFO would block the read for good (and /dev/zero fill memory): the CA bundle is read
	// only as a regular file of bounded size, by backend prepare too.
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, struct{ name, url, caFile, want string }{"allowed, CA file a FIFO", green.URL, fifo, "regular file"})
	// Its own listen address matches --allowed-backends (the stacked recipe allows any port on
	// the node's address, where the apiserver was): the requests would come back to it.
	cases = append(cases, struct{ name, url, caFile, want string }{"itself", "http://" + p.Addr().String(), "", "this proxy's own --listen"})
	calls := map[string]func(ctx context.Context, url, caFile string) error{
		"set": func(ctx context.Context, url, caFile string) error {
			_, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: url, CAFile: caFile})
			return err
		},
		"prepare": func(ctx context.Context, url, caFile string) error {
			_, err := p.admin.PrepareBackend(ctx, admin.PrepareRequest{URL: url, CAFile: caFile})
			return err
		},
	}
	for call, do := range calls {
		for _, tc := range cases {
			t.Run(call+" "+tc.name, func(t *testing.T) {
				done := make(chan error, 1)
				go func() { done <- do(t.Context(), tc.url, tc.caFile) }()
				var err error
				select {
				case err = <-done:
				case <-time.After(5 * time.Second):
					t.Fatalf("backend %s %s (CA %q) still reading after 5s", call, tc.url, tc.caFile)
				}
				if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
					t.Errorf("backend %s %s (CA %q) = %v, want an error saying %q (and no password)", call, tc.url, tc.caFile, err, tc.want)
				}
				if st := p.Status(); st.Backend != blue.URL {
					t.Fatalf("a refused switch changed the backend to %s", st.Backend)
				}
			})
		}
	}
}

func writePEMCert(t *testing.T, path string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// heldByBlue is a blue that answers code, holding each request of method until free is
// called (arrived says one came); a test's cleanup frees them before closing it.
func heldByBlue(t *testing.T, method string, code int) (url string, arrived <-chan struct{}, free func()) {
	t.Helper()
	release := make(chan struct{})
	came := make(chan struct{}, 2)
	blue := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == method {
			came <- struct{}{}
			<-release
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(blue.Close)
	free = sync.OnceFunc(func() { close(release) })
	t.Cleanup(free) // before blue.Close, which waits for the held handlers
	return blue.URL, came, free
}

// TestNoSwitchWithWritesInFlight: a write admitted before the fence and still running on blue
// (the barrier timed out) could be acknowledged by blue after the switch, and green would
// never have it. The switch is refused until it has finished, then allowed.
func TestNoSwitchWithWritesInFlight(t *testing.T) {
	blueURL, arrived, free := heldByBlue(t, http.MethodPost, http.StatusCreated)
	green := newFakeAPI(t, "green")
	p := startProxy(t, blueURL, func(o *Options) { o.AllowedBackends = []string{green.URL} })
	// The write runs in a goroutine, so it reports its error over done (t.Fatal there would end
	// only the goroutine and leave the test waiting); every wait on it is bounded.
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, _, err := doErr("POST", p.url+"/api/v1/namespaces/default/configmaps", "Content-Type", "application/json")
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{code: resp.StatusCode}
	}()
	select {
	case <-arrived:
	case r := <-done:
		t.Fatalf("the write ended (%d, %v) before it reached blue", r.code, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the write did not reach blue in 10 s")
	}
	if fr := fenceOn(t, p, 100*time.Millisecond); fr.Barrier.Complete {
		t.Fatalf("barrier complete with a write at blue: %+v", fr.Barrier)
	}
	_, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL})
	if apiErr, ok := err.(*admin.APIError); !ok || apiErr.Code != http.StatusConflict || !strings.Contains(err.Error(), "still running") {
		t.Fatalf("switch with a write in flight: %v, want 409 saying a write is still running", err)
	}
	if st := p.Status(); st.Backend != strings.TrimSuffix(blueURL, "/") {
		t.Fatalf("backend %s after a refused switch", st.Backend)
	}
	free()
	select {
	case r := <-done:
		if r.err != nil || r.code != http.StatusCreated {
			t.Fatalf("the write got %d, %v; want %d", r.code, r.err, http.StatusCreated)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write was not answered within 10 s of blue's answer")
	}
	waitFor(t, func() bool { return p.Status().InflightWrites == 0 })
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL}); err != nil {
		t.Fatalf("switch once the write finished: %v", err)
	}
}

// TestSwitchWaitsForWritesThePolicyLetThrough: a write a policy rule lets through while fenced
// (leader election, node heartbeats) is not one the barrier waits for; one in flight at the old
// backend when the switch comes must be answered before the switch returns, so that what the
// cutover does next (read blue's last revision, stop replicating it) comes after it. New ones
// go to the new backend.
func TestSwitchWaitsForWritesThePolicyLetThrough(t *testing.T) {
	// With Upgrade headers too: on a lease (a stored object) they make no session, and the
	// write is one like any other.
	for _, upgrade := range []bool{false, true} {
		t.Run(fmt.Sprintf("upgrade=%v", upgrade), func(t *testing.T) { testSwitchWaitsForLetThrough(t, upgrade) })
	}
}

// leasePolicy writes a fence policy that lets kube-system's Lease updates through.
func leasePolicy(t *testing.T) string {
	t.Helper()
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte(`apiVersion: kubefence.io/v1alpha1
kind: FencePolicy
rules:
- name: leader-election
  action: allow
  verbs: [update]
  apiGroups: [coordination.k8s.io]
  resources: [leases]
  namespaces: [kube-system]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return pol
}

const testLeaseURL = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler"

func testSwitchWaitsForLetThrough(t *testing.T, upgrade bool) {
	blueURL, arrived, free := heldByBlue(t, http.MethodPut, http.StatusOK)
	green := newFakeAPI(t, "green")
	p := startProxy(t, blueURL, func(o *Options) {
		o.AllowedBackends = []string{green.URL}
		o.PolicyFile = leasePolicy(t)
	})
	fenceOn(t, p, time.Second)
	hdr := []string{"Content-Type", "application/json"}
	if upgrade {
		hdr = append(hdr, "Connection", "Upgrade", "Upgrade", "websocket")
	}
	done := make(chan int, 1)
	go func() {
		resp, _, err := doErr("PUT", p.url+testLeaseURL, hdr...)
		if err != nil {
			done <- 0
			return
		}
		done <- resp.StatusCode
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the lease update did not reach blue in 10 s")
	}
	switched := make(chan error, 1)
	go func() {
		_, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL})
		switched <- err
	}()
	select {
	case err := <-switched:
		t.Fatalf("the switch returned (%v) while blue had not answered a write it let through", err)
	case <-time.After(300 * time.Millisecond):
	}
	// Meanwhile a new one goes to green, once the switch has made it the backend (its state
	// saved first: two fsyncs, which a loaded machine may take longer than the wait above).
	waitForT(t, 10*time.Second, "the switch to make green the backend", func() bool { return p.Status().Backend == green.URL })
	resp, _, err := doErr("PUT", p.url+testLeaseURL, "Content-Type", "application/json")
	if err != nil || resp.StatusCode != http.StatusOK || len(green.requests()) != 1 {
		t.Fatalf("a lease update during the switch: %v, green saw %q; want 200 from green", err, green.requests())
	}
	free()
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the write at blue got %d, want 200", code)
	}
	select {
	case err := <-switched:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the switch did not return within 10 s of blue's answer")
	}
}

// TestSwitchEndsWatchesWhileItWaitsForWrites: the switch's wait for a write the policy let
// through runs beside the watches' drain, not before it: a blue slow to answer the write does
// not use the drain's time up and get the watches cut instead of ended at an event boundary.
func TestSwitchEndsWatchesWhileItWaitsForWrites(t *testing.T) {
	blue := newFakeAPI(t, "blue")
	hold := make(chan struct{})
	blue.mu.Lock()
	blue.hold = hold
	blue.mu.Unlock()
	free := sync.OnceFunc(func() { close(hold) })
	defer free()
	green := newFakeAPI(t, "green")
	p := startProxy(t, blue.URL, func(o *Options) {
		o.AllowedBackends = []string{green.URL}
		o.PolicyFile = leasePolicy(t)
		o.DrainTimeout = 300 * time.Millisecond
	})
	watch, err := http.Get(p.url + "/api/v1/namespaces/default/configmaps?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Body.Close()
	go func() { _, _ = io.Copy(io.Discard, watch.Body) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	go func() {
		for i := 0; ; i++ {
			select {
			case <-tick.C:
				select {
				case blue.events <- fmt.Sprint(i):
				default:
				}
			case <-t.Context().Done():
				return
			}
		}
	}()
	fenceOn(t, p, time.Second)
	go func() { _, _, _ = doErr("PUT", p.url+testLeaseURL, "Content-Type", "application/json") }()
	waitFor(t, func() bool { return blue.writesIn.Load() == 1 })
	time.AfterFunc(time.Second, free)
	resp, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Drain; d.Streams != 1 || d.Forced != 0 || d.Writes != 1 || d.UnansweredWrites != 1 {
		t.Fatalf("drain %+v: want the watch ended at a boundary, not cut, and the write waited for up to the timeout", d)
	}
}

// TestFenceAnswerIsItsOwn: fence on answers after its barrier. If another operator turned the
// fence off and on again meanwhile (a write admitted in between), the answer must not report
// that other fence's generation as this one's barrier's: the fence it waited for is gone.
func TestFenceAnswerIsItsOwn(t *testing.T) {
	api, releaseHold := heldAPI(t)
	p := startProxy(t, api.URL)
	go func() { _, _, _ = doErr("POST", p.url+"/api/v1/namespaces/default/configmaps") }()
	waitFor(t, func() bool { return api.writesIn.Load() == 1 })
	type answer struct {
		r   admin.FenceResponse
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		r, err := p.admin.Fence(context.Background(), admin.FenceRequest{Fenced: true, Reason: "A", WaitTimeout: admin.Duration(10 * time.Second)})
		ch <- answer{r, err}
	}()
	waitFor(t, func() bool { return p.Status().Generation == 1 })
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	go func() { _, _, _ = doErr("POST", p.url+"/api/v1/namespaces/default/configmaps") }() // admitted between B's off and on
	waitFor(t, func() bool { return api.writesIn.Load() == 2 })
	go func() { _, _ = p.admin.Fence(context.Background(), admin.FenceRequest{Fenced: true, Reason: "B"}) }()
	waitFor(t, func() bool { return p.Status().Generation == 3 })
	releaseHold()
	a := <-ch
	if a.err == nil && a.r.Status.Generation != 1 {
		t.Fatalf("A's fence on answered generation %d (reason %q), another change's, with no error", a.r.Status.Generation, a.r.Status.Reason)
	}
	if a.err != nil && !strings.Contains(a.err.Error(), "changed while") {
		t.Fatalf("A's fence on: %v, want an error saying the fence changed while it waited", a.err)
	}
}

// TestWatchCutBeforeItsHeaders: a watch blue has not answered yet when the proxy switches is
// cut (nothing to resume from); its client did not go away, so it gets a Status it can act on
// (503 + Retry-After), not an empty 499.
func TestWatchCutBeforeItsHeaders(t *testing.T) {
	arrived, end := make(chan struct{}, 1), make(chan struct{})
	blue := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			arrived <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-end:
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer blue.Close()
	defer close(end) // before blue.Close, which waits for the handler
	green := newFakeAPI(t, "green")
	p := startProxy(t, blue.URL, func(o *Options) { o.AllowedBackends = []string{green.URL} })
	type answer struct {
		code       int
		retryAfter string
	}
	res := make(chan answer, 1)
	go func() {
		resp, _, err := doErr("GET", p.url+"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=5")
		if err != nil {
			res <- answer{}
			return
		}
		res <- answer{resp.StatusCode, resp.Header.Get("Retry-After")}
	}()
	<-arrived
	fenceOn(t, p, time.Second)
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL}); err != nil {
		t.Fatal(err)
	}
	if a := <-res; a.code != http.StatusServiceUnavailable || a.retryAfter == "" {
		t.Fatalf("the cut watch got %d (Retry-After %q), want 503 with Retry-After", a.code, a.retryAfter)
	}
}

// TestBackendSetExpectsGeneration: a switch naming the generation it saw refuses (409) when the
// fence changed since (off and on again by hand: writes may have reached blue in between), and
// leaves the backend alone; at that generation it switches.
func TestBackendSetExpectsGeneration(t *testing.T) {
	blue, green := newFakeAPI(t, "blue"), newFakeAPI(t, "green")
	p := startProxy(t, blue.URL, func(o *Options) { o.AllowedBackends = []string{green.URL} })
	ctx := t.Context()
	seen := fenceOn(t, p, time.Second).Status.Generation
	if _, err := p.admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	now := fenceOn(t, p, time.Second).Status.Generation
	_, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL, ExpectGeneration: seen})
	var ae *admin.APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusConflict || !strings.Contains(err.Error(), fmt.Sprint(seen)) {
		t.Fatalf("switch expecting generation %d at %d: %v; want 409 naming it", seen, now, err)
	}
	if st := p.Status(); st.Backend != strings.TrimSuffix(blue.URL, "/") || st.Generation != now {
		t.Fatalf("status %+v after a refused switch: want blue at generation %d", st, now)
	}
	if _, err := p.admin.SetBackend(ctx, admin.BackendRequest{URL: green.URL, ExpectGeneration: now}); err != nil {
		t.Fatalf("switch at the generation expected: %v", err)
	}
}

// adminPost sends body as is to the proxy's admin socket.
func adminPost(t *testing.T, p *testProxy, path, body string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", p.opts.AdminSocket)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://kubefence"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestFenceRequestMustSayWhich: a fence request that does not say "fenced", expects a backend
// for a fence on (only fence off can), or carries a second document is refused (400) and
// changes nothing: a script's malformed request must not fail open.
func TestFenceRequestMustSayWhich(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL)
	fenceOn(t, p, time.Second)
	gen := p.Status().Generation
	for _, body := range []string{
		`{}`,
		`{"reason":"maintenance","waitTimeout":"30s"}`,
		`{"fenced":true,"expectBackend":"http://x"}`,
		`{"fenced":false}{"fenced":true}`,
	} {
		code, resp := adminPost(t, p, "/v1/fence", body)
		if code != http.StatusBadRequest {
			t.Errorf("POST /v1/fence %s = %d %s, want 400", body, code, resp)
		}
		if st := p.Status(); !st.Fenced || st.Generation != gen {
			t.Fatalf("after %s: status %+v, want still fenced at generation %d", body, st, gen)
		}
	}
	if code, resp := adminPost(t, p, "/v1/fence", `{"fenced":false}`); code != http.StatusOK {
		t.Fatalf("fence off = %d %s", code, resp)
	}
}

// TestFailedFenceOnKeepsTheReason: a fence on whose state cannot be saved changes nothing, the
// reason refused writes are told included.
func TestFailedFenceOnKeepsTheReason(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL)
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Reason: "reason-A"}); err != nil {
		t.Fatal(err)
	}
	// The rename over the state file fails, even as root: it is now a directory, not empty.
	if err := os.Remove(p.opts.StateFile); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(p.opts.StateFile, "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true, Reason: "reason-B"}); err == nil {
		t.Fatal("fence on succeeded with a state file that cannot be written")
	}
	resp, body := do(t, "POST", p.url+"/api/v1/namespaces/default/configmaps")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "reason-A") || strings.Contains(body, "reason-B") {
		t.Fatalf("write after the failed fence on = %d %q, want 429 with reason-A only", resp.StatusCode, body)
	}
}

// TestBarrierEndsWhenTheBackendAnswers: a write admitted before the fence is done once the
// backend answered it (committed), not once its client has read the whole answer: a client that
// never reads must not hold the barrier, nor keep the switch refused.
func TestBarrierEndsWhenTheBackendAnswers(t *testing.T) {
	big := strings.Repeat("x", 16<<20) // past every socket buffer on the way
	answered := make(chan struct{}, 1)
	blue := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.WriteHeader(http.StatusOK)
			answered <- struct{}{}
			_, _ = io.WriteString(w, big)
		}
	}))
	green := newFakeAPI(t, "green")
	p := startProxy(t, blue.URL, func(o *Options) { o.AllowedBackends = append(o.AllowedBackends, green.URL) })
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer blue.Close()
	defer conn.Close() // before blue.Close, which waits for the handler still writing
	body := "{}"
	fmt.Fprintf(conn, "PUT /api/v1/namespaces/default/configmaps/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	<-answered // and the client reads nothing
	waitFor(t, func() bool { return p.Status().InflightWrites == 0 })
	if fr := fenceOn(t, p, 2*time.Second); !fr.Barrier.Complete {
		t.Fatalf("barrier %+v: a write its backend answered still counts, because its client does not read", fr.Barrier)
	}
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL}); err != nil {
		t.Fatalf("switch with a slow reader of a finished write: %v", err)
	}
}

// TestNoSwitchToItselfOnEveryAddress: a proxy listening on every address (--listen :6443, the
// default) is reached at any of the host's addresses; a switch to one of them at its port is
// refused as a switch to itself, loopback or not.
func TestNoSwitchToItselfOnEveryAddress(t *testing.T) {
	blue := newRecordingAPI(t)
	hosts := []string{"127.0.0.1"}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
				hosts = append(hosts, n.IP.String())
				break
			}
		}
	}
	var patterns []string
	for _, h := range hosts {
		patterns = append(patterns, "http://"+h+":*")
	}
	p := startProxy(t, blue.URL, func(o *Options) { o.Listen, o.AllowedBackends = ":0", patterns })
	fenceOn(t, p, time.Second)
	_, port, err := net.SplitHostPort(p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		_, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: "http://" + net.JoinHostPort(h, port)})
		if err == nil || !strings.Contains(err.Error(), "this proxy's own --listen") {
			t.Errorf("backend set to %s at the proxy's port: %v; want it refused as the proxy itself", h, err)
		}
	}
	if len(hosts) == 1 {
		t.Log("no IPv4 address but loopback on this host: only loopback checked")
	}
}

// TestRefusedReadSaysSo: a read a policy rule refuses while fenced gets a 429 that names the
// rule, not the fence's usual message that reads still work.
func TestRefusedReadSaysSo(t *testing.T) {
	api := newFakeAPI(t, "blue")
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("apiVersion: kubefence.io/v1alpha1\nkind: FencePolicy\nrules:\n- name: no-secret-reads\n  action: refuse\n  resources: [secrets]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, api.URL, func(o *Options) { o.PolicyFile = pol })
	fenceOn(t, p, time.Second)
	resp, body := do(t, "GET", p.url+"/api/v1/namespaces/default/secrets/s")
	if resp.StatusCode != http.StatusTooManyRequests || strings.Contains(body, "Reads and watches still work") || !strings.Contains(body, `rule \"no-secret-reads\"`) {
		t.Fatalf("a read the policy refuses: %d %s; want 429 naming the rule, not saying reads work", resp.StatusCode, body)
	}
	if resp, body := do(t, "PUT", p.url+"/api/v1/namespaces/default/configmaps/c"); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "Reads and watches still work") {
		t.Fatalf("a write while fenced: %d %s; want the fence's 429", resp.StatusCode, body)
	}
}

// ownedDirs makes directories under root given to a user, with a mode (tests run as root; off
// CI another user skips them): a directory another user owns or may write to.
func ownedDirs(t *testing.T, root string) func(name string, mode os.FileMode, uid int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root to give directories to another user")
	}
	return func(name string, mode os.FileMode, uid int) string {
		d := filepath.Join(root, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, -1); err != nil {
			t.Fatal(err)
		}
		return d
	}
}

// TestNothingWaitsForWhatStoresNothing: a review (SubjectAccessReview, TokenReview) or a
// dry run stores nothing on the backend: neither 'fence on' nor a switch waits for one in
// flight, nor counts it among the writes a policy let through (a snapshot cutover warns that
// those may be missing from green).
func TestNothingWaitsForWhatStoresNothing(t *testing.T) {
	cases := []struct{ name, method, path string }{
		{"subjectaccessreview", "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews"},
		{"dry-run patch", "PATCH", "/api/v1/namespaces/a/configmaps/c?dryRun=All"},
		{"delete whose body says dry run", "DELETE", "/api/v1/namespaces/a/configmaps/c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			blueURL, arrived, _ := heldByBlue(t, tc.method, http.StatusOK)
			green := newFakeAPI(t, "green")
			p := startProxy(t, blueURL, func(o *Options) { o.AllowedBackends = []string{green.URL} })
			ct := "application/merge-patch+json"
			if tc.method == "POST" {
				ct = "application/json"
			}
			inFlight := func() {
				go func() {
					if tc.method == "DELETE" { // decided by its body, read before the fence's decision
						req, _ := http.NewRequest(tc.method, p.url+tc.path, strings.NewReader(`{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}`))
						req.Header.Set("Content-Type", "application/json")
						if resp, err := boundedClient.Do(req); err == nil {
							resp.Body.Close()
						}
						return
					}
					_, _, _ = doErr(tc.method, p.url+tc.path, "Content-Type", ct)
				}()
				select {
				case <-arrived:
				case <-time.After(10 * time.Second):
					t.Fatal("the request did not reach blue in 10 s")
				}
			}
			inFlight() // open: forwarded at once
			start := time.Now()
			resp := fenceOn(t, p, 5*time.Second)
			if took := time.Since(start); took > 2*time.Second || (resp.Barrier != nil && !resp.Barrier.Complete) {
				t.Fatalf("fence on took %s (barrier %+v) with a %s in flight, want no wait for it", took, resp.Barrier, tc.name)
			}
			inFlight() // fenced: let through by the defaults
			start = time.Now()
			sw, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: green.URL})
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 2*time.Second || sw.Drain.Writes != 0 || sw.Drain.UnansweredWrites != 0 {
				t.Fatalf("the switch took %s and counted %+v with a %s in flight, want no wait and no write", took, sw.Drain, tc.name)
			}
		})
	}
}
