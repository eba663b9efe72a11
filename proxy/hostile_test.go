package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"
)

// rawExchange writes payload on a fresh TCP connection and reads what comes back until the
// server closes or goes quiet for quiet; once answers whole responses have come (0: no such
// count), for 200 ms only, to see whether more follow.
func rawExchange(t *testing.T, addr, payload string, answers int, quiet time.Duration) (resp string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		wait := quiet
		if answers > 0 && len(statusCodes(b.String())) >= answers {
			wait = 200 * time.Millisecond
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		n, err := c.Read(buf)
		b.Write(buf[:n])
		if err == io.EOF {
			return b.String(), true
		}
		if err != nil {
			return b.String(), false
		}
	}
}

func statusCodes(resp string) []string {
	var codes []string
	r := bufio.NewReader(strings.NewReader(resp))
	for {
		res, err := http.ReadResponse(r, nil)
		if err != nil {
			return codes
		}
		codes = append(codes, res.Status[:3])
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
}

// TestHostileInput sends broken and malicious requests on raw sockets to a fenced proxy and
// checks the answer, that the proxy keeps serving, and what (if anything) reached the backend.
func TestHostileInput(t *testing.T) {
	api := newFakeAPI(t, "blue")
	p := startProxy(t, api.URL, func(o *Options) {
		o.MaxHeaderBytes = 8 << 10
		o.ReadHeaderTimeout = 300 * time.Millisecond
	})
	if _, err := p.FenceOn(t.Context(), "hostile", "", time.Second); err != nil {
		t.Fatal(err)
	}
	addr := p.Addr().String()
	big := strings.Repeat("a", 20<<10)
	cases := []struct {
		name      string
		payload   string
		want      []string // status codes, in order
		backend   []string // request lines the backend must have seen (method + URI prefix)
		mustClose bool
	}{
		{"conflicting content-length", "POST /api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: k\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
			[]string{"400"}, nil, true},
		// Framed by Transfer-Encoding alone, answered, and the connection closed (RFC 9112 §6.1):
		// the DELETE behind it is never read, let alone forwarded.
		{"content-length and chunked smuggling a delete", "GET /api/v1/namespaces HTTP/1.1\r\nHost: k\r\nContent-Length: 60\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nDELETE /api/v1/namespaces/kube-system HTTP/1.1\r\nHost: k\r\n\r\n",
			[]string{"200"}, []string{"GET /api/v1/namespaces"}, true},
		{"oversized headers", "GET /api/v1/namespaces HTTP/1.1\r\nHost: k\r\nX-Big: " + big + "\r\n\r\n", []string{"431"}, nil, true},
		{"absurd query string", "GET /api/v1/namespaces?q=" + big + " HTTP/1.1\r\nHost: k\r\n\r\n", []string{"431"}, nil, true},
		{"bad escape", "GET /api/v1/%zz HTTP/1.1\r\nHost: k\r\n\r\n", []string{"400"}, nil, true},
		{"relative path", "GET api/v1/namespaces HTTP/1.1\r\nHost: k\r\n\r\n", []string{"400"}, nil, true},
		{"bad method", "G(T /api/v1/namespaces HTTP/1.1\r\nHost: k\r\n\r\n", []string{"400"}, nil, true},
		{"dot segments while fenced", "GET /api/v1/namespaces/a/configmaps/../../../secrets HTTP/1.1\r\nHost: k\r\n\r\n", []string{"429"}, nil, false},
		{"encoded slash exec while fenced", "GET /api/v1/namespaces/a/pods/p%2Fexec HTTP/1.1\r\nHost: k\r\n\r\n", []string{"429"}, nil, false},
		{"body on GET is framed, not smuggled", "GET /api/v1/namespaces HTTP/1.1\r\nHost: k\r\nContent-Length: 45\r\n\r\nDELETE /api/v1/namespaces/x HTTP/1.1\r\nHost: k\r\n",
			[]string{"200"}, []string{"GET /api/v1/namespaces"}, false},
		{"pipelined read then write", "GET /api/v1/namespaces HTTP/1.1\r\nHost: k\r\n\r\nDELETE /api/v1/namespaces/x HTTP/1.1\r\nHost: k\r\n\r\n",
			[]string{"200", "429"}, []string{"GET /api/v1/namespaces"}, false},
		{"absolute-form target", "GET http://evil.example/api/v1/namespaces HTTP/1.1\r\nHost: evil.example\r\n\r\n", []string{"200"}, []string{"GET /api/v1/namespaces"}, false},
		{"lowercase chunked header on a write", "POST /api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: k\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", []string{"429"}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(api.requests())
			// Up to 5 s for the answers (a loaded machine), then a look for more.
			resp, closed := rawExchange(t, addr, tc.payload, len(tc.want), 5*time.Second)
			codes := statusCodes(resp)
			if tc.want != nil && strings.Join(codes, ",") != strings.Join(tc.want, ",") {
				t.Errorf("status codes %v, want %v; response:\n%.300s", codes, tc.want, resp)
			}
			if tc.mustClose && !closed {
				t.Errorf("connection left open")
			}
			seen := api.requests()[before:]
			if len(seen) != len(tc.backend) {
				t.Fatalf("backend saw %q, want %q", seen, tc.backend)
			}
			for i, want := range tc.backend {
				if !strings.HasPrefix(seen[i], want) {
					t.Errorf("backend saw %q, want %q", seen[i], want)
				}
			}
			for _, s := range seen {
				if strings.Contains(s, "DELETE") {
					t.Errorf("a smuggled DELETE reached the backend: %q", s)
				}
			}
		})
	}
	t.Run("slowloris", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		_, _ = io.WriteString(c, "GET /api/v1/namespaces HTTP/1.1\r\nHost: k\r\n")
		for i := 0; i < 20; i++ {
			time.Sleep(50 * time.Millisecond)
			if _, err := io.WriteString(c, "X-Slow: 1\r\n"); err != nil {
				break
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = io.ReadAll(c)
		if err != nil {
			t.Fatalf("connection not closed by the server: %v", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("slow client held the connection %s", d)
		}
	})
	// The proxy still serves after all of that.
	if resp, _ := do(t, "GET", p.url+"/api/v1/namespaces"); resp.StatusCode != 200 {
		t.Fatalf("proxy no longer serves: %d", resp.StatusCode)
	}
}

// TestUpgradeRefusedByBackend checks that an upgrade the backend answers without 101 is not
// spliced: the answer is returned and both connections close (CVE-2018-1002105's class).
func TestUpgradeRefusedByBackend(t *testing.T) {
	api := newFakeAPI(t, "blue") // answers 200, never 101
	p := startProxy(t, api.URL)
	payload := "GET /api/v1/namespaces/a/pods/p/exec?command=sh HTTP/1.1\r\nHost: k\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" +
		"GET /api/v1/namespaces/a/secrets HTTP/1.1\r\nHost: k\r\n\r\n"
	resp, closed := rawExchange(t, p.Addr().String(), payload, 0, time.Second)
	if codes := statusCodes(resp); strings.Join(codes, ",") != "200" {
		t.Fatalf("codes %v, want the backend's one answer", codes)
	}
	if !closed {
		t.Fatal("client connection left open after a refused upgrade")
	}
	for _, s := range api.requests() {
		if strings.Contains(s, "secrets") {
			t.Fatalf("bytes after a refused upgrade reached the backend: %q", s)
		}
	}
}

func TestTLSBelow12Refused(t *testing.T) {
	f := newIdentityFixture(t)
	for _, v := range []uint16{tls.VersionTLS10, tls.VersionTLS11} {
		c, err := tls.Dial("tcp", strings.TrimPrefix(f.proxyURL, "https://"), &tls.Config{RootCAs: f.serverCAs, MinVersion: v, MaxVersion: v})
		if err == nil {
			c.Close()
			t.Fatalf("TLS version %x accepted", v)
		}
	}
	c, err := tls.Dial("tcp", strings.TrimPrefix(f.proxyURL, "https://"), &tls.Config{RootCAs: f.serverCAs, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("TLS 1.2+ refused: %v", err)
	}
	c.Close()
}

// TestWriteBodyNotAllocatedAhead: a client that announces a large body and sends one byte
// must not make the proxy allocate the announced size before the bytes arrive (a connection
// per such request, or 1,000 HTTP/2 streams, would each hold it until --write-body-timeout).
func TestWriteBodyNotAllocatedAhead(t *testing.T) {
	const announced = 3_000_000
	r := httptest.NewRequest(http.MethodPost, "/api/v1/namespaces/d/configmaps", io.MultiReader(strings.NewReader("{"), iotest.ErrReader(io.ErrUnexpectedEOF)))
	r.ContentLength = announced
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := readWriteBody(httptest.NewRecorder(), r, bodyLimits{max: 4 << 20, timeout: time.Second, budget: newBodyBudget(4<<20, 4<<20, false)}, false)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a body cut short was read without an error")
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > announced/4 {
		t.Fatalf("reading 1 byte of a body announced as %d bytes allocated %d bytes", announced, got)
	}
}

// metricValue scrapes the proxy's /metrics for one sample's value ("" when absent).
func metricValue(t *testing.T, p *testProxy, sample string) string {
	t.Helper()
	_, body := do(t, "GET", "http://"+p.MetricsAddr().String()+"/metrics")
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), sample+" "); ok {
			return v
		}
	}
	return ""
}

// TestWriteBodyBudget: write bodies are read before any authentication, so what all of them may
// hold at once is bounded (--max-buffered-write-bytes), reserved as their bytes arrive and
// released when they end. Anonymous clients sending all but the last byte of large bodies hold
// it; a write whose bytes then grow past what is left gets 429 + Retry-After + a Status at once,
// never forwarded; once they leave, writes pass again.
func TestWriteBodyBudget(t *testing.T) {
	const size = 40_000
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL, func(o *Options) {
		o.MaxWriteBodyBytes, o.MaxBufferedWriteBytes, o.WriteBodyTimeout = size, 2*size+size/2, 10*time.Second
	})
	addr := strings.TrimPrefix(p.url, "http://")
	dial := func(head, body string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, head+body); err != nil {
			t.Fatal(err)
		}
		return c
	}
	const post = "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	stalled := fmt.Sprintf("%sContent-Length: %d\r\n\r\n", post, size)
	first, second := dial(stalled, strings.Repeat("x", size-1)), dial(stalled, strings.Repeat("x", size-1))
	waitForT(t, 10*time.Second, "the two stalled bodies reserved (kubefence_buffered_write_bytes 80000)", func() bool {
		return metricValue(t, p, "kubefence_buffered_write_bytes") == "80000"
	})
	cases := []struct{ name, head, body string }{
		{"body growing past what is left", stalled, strings.Repeat("x", size)},
		{"chunked body growing past what is left", post + "Transfer-Encoding: chunked\r\n\r\n", fmt.Sprintf("%x\r\n%s", size, strings.Repeat("x", size))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(tc.head, tc.body)
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			r, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer at once (%v), want 429 while %d bytes of bodies are held", err, 2*size)
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") != "1" ||
				!strings.Contains(string(b), `"reason":"TooManyRequests"`) || !strings.Contains(string(b), "--max-buffered-write-bytes") {
				t.Fatalf("answer %d Retry-After=%q %s, want 429, Retry-After 1 and a Status naming --max-buffered-write-bytes", r.StatusCode, r.Header.Get("Retry-After"), b)
			}
		})
	}
	if n := api.count(); n != 0 {
		t.Fatalf("%d write(s) forwarded, want none", n)
	}
	first.Close() // its client went away: its reservation goes with it
	waitFor(t, func() bool { return metricValue(t, p, "kubefence_buffered_write_bytes") == "40000" })
	if got := send(t, "POST", p.url+"/api/v1/namespaces/default/configmaps", "application/json", strings.Repeat("x", size)); got != http.StatusOK || api.count() != 1 {
		t.Fatalf("a write once budget was free = %d (%d forwarded), want 200, forwarded", got, api.count())
	}
	second.Close()
	waitFor(t, func() bool { return metricValue(t, p, "kubefence_buffered_write_bytes") == "0" })
	if got := metricValue(t, p, "kubefence_buffered_write_full_total"); got != "2" {
		t.Errorf("kubefence_buffered_write_full_total = %q, want 2", got)
	}
}

// TestWriteBodyBudgetHTTP2Streams: an announced Content-Length costs --max-buffered-write-bytes
// nothing until its bytes arrive, and one connection may hold only its share of the budget. One
// anonymous HTTP/2 connection opening streams that each announce a body of
// --max-write-body-bytes and send none of it, or all but its last byte, must not make a write
// from another client get 429 (as kubelet lease renewals would, fenced or not, until
// --write-body-timeout).
func TestWriteBodyBudgetHTTP2Streams(t *testing.T) {
	const maxBody = 1 << 20
	cases := []struct {
		name    string
		streams int
		send    int // body bytes each stream sends of the maxBody it announces
		post    int // the other client's write
	}{
		{"headers only", 8, 0, 100},
		{"all but the last byte", 4, maxBody - 1, maxBody},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newIdentityFixture(t, func(o *Options, _ string) {
				o.MaxWriteBodyBytes, o.MaxBufferedWriteBytes = maxBody, 4*maxBody
			})
			openStalledStreams(t, f, tc.streams, maxBody, tc.send)
			req, _ := http.NewRequest("POST", f.proxyURL+"/api/v1/namespaces/default/configmaps", strings.NewReader(strings.Repeat("x", tc.post)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := f.h2Client(nil).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("a %d-byte write from another connection = %d %s (%d bytes of the budget reserved), want 200",
					tc.post, resp.StatusCode, b, f.p.bodyBudget.used.Load())
			}
		})
	}
}

// openStalledStreams opens n write streams on one anonymous HTTP/2 connection, each announcing
// a body of length bytes and sending send of them, and returns once the proxy has every one:
// it has either refused it or reserved at least the bytes it sent.
func openStalledStreams(t *testing.T, f *identityFixture, n, length, send int) {
	t.Helper()
	openStalledStreamsWith(t, f, f.h2Client(nil), nil, n, length, send)
}

// openStalledStreamsWith is openStalledStreams on a connection of c's, each request carrying
// header.
func openStalledStreamsWith(t *testing.T, f *identityFixture, c *http.Client, header http.Header, n, length, send int) {
	t.Helper()
	if code, _ := getReused(t, c, f.proxyURL); code != 200 { // one connection for all the streams
		t.Fatal("warm-up read failed")
	}
	before := f.p.bodyBudget.used.Load() // other streams' still open
	var refused atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // cleanups run last first: this one after the pipes below are closed
	for range n {
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF) })
		req, _ := http.NewRequest("POST", f.proxyURL+"/api/v1/namespaces/default/configmaps", pr)
		req.ContentLength = int64(length)
		maps.Copy(req.Header, header)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
				refused.Add(1)
			}
		}()
		go func() { _, _ = pw.Write(make([]byte, send)) }()
	}
	// Once in, a stream holds at least what it sent, or its buffer's first bytes (512).
	each := int64(max(send, min(length, 512)))
	waitForT(t, 5*time.Second, "the streams in", func() bool {
		return f.p.bodyBudget.used.Load() >= before+(int64(n)-refused.Load())*each
	})
}

// TestFencedWriteRefusedBeforeItsBody: fenced in refuse mode, a write whose body cannot change
// the decision is refused as soon as its headers are in: its body is never buffered (nothing is
// reserved of --max-buffered-write-bytes) and it is never forwarded. A DELETE with a body (the
// body may make it a dry run) and a write the policy allows are read whole as before. A client
// that never sends its body keeps its connection no longer than --write-body-timeout.
func TestFencedWriteRefusedBeforeItsBody(t *testing.T) {
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL, func(o *Options) { o.WriteBodyTimeout = time.Second })
	fenceOn(t, p, time.Second)
	addr := strings.TrimPrefix(p.url, "http://")
	cases := []struct {
		name, method, path, body string
		early                    bool
		want                     int
	}{
		{"create", "POST", "/api/v1/namespaces/default/configmaps", `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"}}`, true, 429},
		{"update", "PUT", "/api/v1/namespaces/default/configmaps/c", `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"}}`, true, 429},
		{"delete whose body says dry run", "DELETE", "/api/v1/namespaces/default/configmaps/c", `{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}`, false, 200},
		{"review create (allowed)", "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", `{"kind":"SelfSubjectAccessReview","apiVersion":"authorization.k8s.io/v1","spec":{}}`, false, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			refused, forwarded := metricValue(t, p, "kubefence_refused_writes_total"), api.count()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", tc.method, tc.path, len(tc.body), tc.body[:10])
			if tc.early {
				for deadline := time.Now().Add(2 * time.Second); metricValue(t, p, "kubefence_refused_writes_total") == refused; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("not refused while its body was coming (%s body bytes reserved), want refused at once, nothing reserved",
							metricValue(t, p, "kubefence_buffered_write_bytes"))
					}
				}
				if got := metricValue(t, p, "kubefence_buffered_write_bytes"); got != "0" {
					t.Fatalf("refused write: %s body bytes reserved, want none", got)
				}
			} else {
				waitFor(t, func() bool { return metricValue(t, p, "kubefence_buffered_write_bytes") == fmt.Sprint(len(tc.body)) })
			}
			if _, err := io.WriteString(c, tc.body[10:]); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			r, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			r.Body.Close()
			wantForwarded := 0
			if tc.want == http.StatusOK {
				wantForwarded = 1
			}
			if n := api.count() - forwarded; r.StatusCode != tc.want || n != wantForwarded {
				t.Fatalf("%s %s = %d, %d forwarded; want %d", tc.method, tc.path, r.StatusCode, n, tc.want)
			}
		})
	}
	resp, closed := rawExchange(t, addr, "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", 0, 3*time.Second)
	if codes := statusCodes(resp); len(codes) != 1 || codes[0] != "429" || !closed {
		t.Fatalf("a body never sent: answers %v, connection closed %v; want one 429, then closed", codes, closed)
	}
}

// TestRefusedUnreadBodyAndTheConnection: fenced in refuse mode, a write refused from its
// headers over HTTP/1.1 has the rest of its body discarded by Go's server, up to 256 KiB, so
// that the connection carries the next request; a body with more left is not read, and the
// connection is closed after the 429 (docs/proxy.md says which).
func TestRefusedUnreadBodyAndTheConnection(t *testing.T) {
	api := newRecordingAPI(t)
	p := startProxy(t, api.URL)
	fenceOn(t, p, time.Second)
	addr := strings.TrimPrefix(p.url, "http://")
	cases := []struct {
		name       string
		size       int
		chunked    bool
		wantCodes  []string
		wantClosed bool
	}{
		{"body within 256 KiB", 200 << 10, false, []string{"429", "200"}, false},
		{"body over 256 KiB", 300 << 10, false, []string{"429"}, true},
		{"chunked body over 256 KiB", 300 << 10, true, []string{"429"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			head, body := fmt.Sprintf("Content-Length: %d\r\n\r\n", tc.size), strings.Repeat("x", tc.size)
			if tc.chunked {
				head, body = "Transfer-Encoding: chunked\r\n\r\n", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", tc.size, body)
			}
			payload := "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + head + body +
				"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\n\r\n"
			forwarded := api.count()
			resp, closed := exchangeWhileWriting(t, addr, payload, 500*time.Millisecond)
			if codes := statusCodes(resp); !slices.Equal(codes, tc.wantCodes) || closed != tc.wantClosed {
				t.Fatalf("answers %v, connection closed %v; want %v, closed %v", codes, closed, tc.wantCodes, tc.wantClosed)
			}
			if n := api.count() - forwarded; n != len(tc.wantCodes)-1 {
				t.Fatalf("%d request(s) forwarded, want the read after the refused write only", n)
			}
		})
	}
}

// exchangeWhileWriting is rawExchange for a payload the server may stop reading: it is written
// while the answers are read. A connection reset counts as closed.
func exchangeWhileWriting(t *testing.T, addr, payload string, quiet time.Duration) (resp string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() { _, _ = io.WriteString(c, payload) }() // fails once the server closes: that is the point
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		_ = c.SetReadDeadline(time.Now().Add(quiet))
		n, err := c.Read(buf)
		b.Write(buf[:n])
		switch {
		case err == io.EOF, errors.Is(err, syscall.ECONNRESET):
			return b.String(), true
		case err != nil:
			return b.String(), false
		}
	}
}

// TestTricklingBodyBounded: a body its client stops sending in the middle holds the connection
// no longer than --write-body-timeout, on every path that does not read it as a write's:
// a write to a path the proxy could not parse (refused while fenced, unread), a session refused
// while fenced, and a read that carries a body (forwarded; the backend answers without reading
// it, and the proxy's forward of it waited for the rest for ever).
func TestTricklingBodyBounded(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK) // never reads the body, as kube-apiserver does not a GET's
	}))
	defer api.Close()
	cases := []struct {
		name, head string
		fenced     bool
		want       string
	}{
		{"unparsed write path, fenced", "POST //api/v1/namespaces/default/configmaps HTTP/1.1", true, "429"},
		{"session, fenced", "POST /api/v1/namespaces/default/pods/p/exec?command=sh HTTP/1.1", true, "429"},
		{"read with a body", "GET /api/v1/namespaces HTTP/1.1", false, "408"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, api.URL, func(o *Options) { o.WriteBodyTimeout = time.Second })
			if tc.fenced {
				fenceOn(t, p, time.Second)
			}
			start := time.Now()
			resp, closed := rawExchange(t, p.Addr().String(), tc.head+"\r\nHost: k\r\nContent-Length: 100\r\n\r\n{", 0, 10*time.Second)
			if codes := statusCodes(resp); len(codes) != 1 || codes[0] != tc.want || !closed || time.Since(start) > 5*time.Second {
				t.Fatalf("a body stopped after its first byte: answers %v, closed %v, after %s; want one %s and the connection closed within the 1 s body timeout (and some)", codes, closed, time.Since(start), tc.want)
			}
		})
	}
	// A read's whole body, then another request on the connection past the body timeout: the
	// deadline holds nothing up once the body has come (net/http lifts it).
	p := startProxy(t, api.URL, func(o *Options) { o.WriteBodyTimeout = 500 * time.Millisecond })
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i, req := range []string{"GET /api/v1/namespaces HTTP/1.1\r\nHost: k\r\nContent-Length: 2\r\n\r\n{}", "GET /api/v1/namespaces HTTP/1.1\r\nHost: k\r\n\r\n"} {
		if i == 1 {
			time.Sleep(time.Second)
		}
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d on a connection whose first read carried a whole body: %v, %v; want 200", i+1, resp, err)
		}
		resp.Body.Close()
	}
}

// TestUpgradeReachesTheBackendAsOne: an upgrade (exec, attach, port-forward) reaches the backend
// with Connection: Upgrade as its only Connection header. kube-apiserver's websocket check and
// the SPDY upgrader (kubelet's streaming server, behind kube-apiserver's upgrade-aware proxy)
// read the first Connection value only: a "Connection: close" ahead of it (the proxy marked the
// request to close, which net/http writes first) made every session through the proxy 400.
func TestUpgradeReachesTheBackendAsOne(t *testing.T) {
	seen := make(chan []string, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Values("Connection")
		// As k8s.io/streaming's SPDY upgrader: the first Connection value must say upgrade.
		if !strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), "SPDY/3.1") {
			http.Error(w, "unable to upgrade: missing upgrade headers in request", http.StatusBadRequest)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
		_ = brw.Flush()
	}))
	t.Cleanup(backend.Close)
	p := startProxy(t, backend.URL)
	payload := "POST /api/v1/namespaces/a/pods/p/exec?command=sh HTTP/1.1\r\nHost: k\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n"
	resp, _ := rawExchange(t, p.Addr().String(), payload, 0, time.Second)
	got := <-seen
	if codes := statusCodes(resp); strings.Join(codes, ",") != "101" || len(got) != 1 {
		t.Fatalf("answers %v; the backend saw Connection %q: want 101, and Upgrade as the one Connection header", codes, got)
	}
	// The session is counted as what its client got, a protocol switch.
	_, body := do(t, "GET", "http://"+p.MetricsAddr().String()+"/metrics")
	if want := `kubefence_requests_total{class="write",code="101",decision="forwarded"} 1`; !strings.Contains(body, want) {
		t.Errorf("metrics lack %q:\n%s", want, grepLines(body, "kubefence_requests_total"))
	}
}

// TestRefusedUpgradeConnectionNotReused: a backend connection asked to upgrade and answered
// without 101 carries nothing else (CVE-2018-1002105's class): each upgrade dials its own.
func TestRefusedUpgradeConnectionNotReused(t *testing.T) {
	var conns atomic.Int32
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upgrade refused", http.StatusForbidden)
	}))
	backend.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	backend.Start()
	t.Cleanup(backend.Close)
	p := startProxy(t, backend.URL)
	payload := "POST /api/v1/namespaces/a/pods/p/exec?command=sh HTTP/1.1\r\nHost: k\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n"
	for range 2 {
		if resp, _ := rawExchange(t, p.Addr().String(), payload, 0, 500*time.Millisecond); strings.Join(statusCodes(resp), ",") != "403" {
			t.Fatalf("answer %q, want the backend's 403", resp)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("two refused upgrades used %d backend connection(s), want one each", n)
	}
}

// grepLines returns the lines of s that contain sub, for failure messages.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
