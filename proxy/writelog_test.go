package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/policy"
)

// TestWriteLog: the log answers the writes at or after a time, oldest first, and says whether
// it still reaches back that far once the ring has wrapped.
func TestWriteLog(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	cases := []struct {
		name         string
		writes       int // writes at t0+0s, +1s, …
		since        int
		want         []string
		wantComplete bool
		started      int // the proxy started at t0+started
	}{
		{"empty", 0, 0, nil, true, 0},
		{"not wrapped", 3, 1, []string{"w1", "w2"}, true, 0},
		{"wrapped, reaches back", 6, 3, []string{"w3", "w4", "w5"}, true, 0},
		{"wrapped, dropped some", 6, 0, []string{"w2", "w3", "w4", "w5"}, false, 0},
		// A proxy restarted since: what it forwarded before is not in its log.
		{"asked from before the proxy started", 3, 0, []string{"w1", "w2"}, false, 1},
		{"empty, asked from before the proxy started", 0, 0, nil, false, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newWriteLog(4)
			l.started = at(tc.started)
			for i := tc.started; i < tc.writes; i++ {
				l.add(&policy.Attributes{Verb: "create", Resource: "configmaps", Name: "w" + string(rune('0'+i))}, at(i), time.Millisecond)
			}
			resp := l.since(at(tc.since))
			var got []string
			for _, w := range resp.Writes {
				got = append(got, w.Name)
			}
			if len(got) != len(tc.want) || resp.Complete != tc.wantComplete {
				t.Fatalf("since %d: %v complete %v, want %v complete %v", tc.since, got, resp.Complete, tc.want, tc.wantComplete)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("since %d: %v, want %v", tc.since, got, tc.want)
				}
			}
		})
	}
}

// TestWriteLogOnlyApplied: a write the backend refused (409, 422, 5xx) never reached etcd, so
// it is not in the log: counted, it would hide a writer around the proxy in the same resource
// and namespace from the cutover's preflight.
func TestWriteLogOnlyApplied(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/taken"):
			w.WriteHeader(http.StatusConflict)
		case strings.HasSuffix(r.URL.Path, "/bad"):
			w.WriteHeader(http.StatusUnprocessableEntity)
		default:
			w.WriteHeader(http.StatusOK)
		}
	}))
	t.Cleanup(backend.Close)
	tp := startProxy(t, backend.URL)
	since := time.Now()
	for _, name := range []string{"ok", "taken", "bad", "ok2", "dry?dryRun=All"} {
		resp, _ := do(t, http.MethodPut, tp.url+"/api/v1/namespaces/ns/configmaps/"+name)
		t.Logf("PUT %s: %d", name, resp.StatusCode)
	}
	// Nor are reviews: answered 2xx, they store nothing.
	do(t, http.MethodPost, tp.url+"/apis/authorization.k8s.io/v1/subjectaccessreviews")
	var got []string
	for _, w := range tp.writes.since(since).Writes {
		got = append(got, w.Resource+"/"+w.Name)
	}
	if strings.Join(got, ",") != "configmaps/ok,configmaps/ok2" {
		t.Errorf("write log %v, want only the applied writes ok, ok2", got)
	}
}

// TestStatusWriterSkipsInformational: a 100 Continue relayed from the backend is not the
// answer; the final status is (else an applied write would not be logged, and the metrics would
// count a 100).
func TestStatusWriterSkipsInformational(t *testing.T) {
	cases := []struct {
		codes []int
		want  int
	}{
		{[]int{http.StatusContinue, http.StatusCreated}, http.StatusCreated},
		{[]int{http.StatusEarlyHints, http.StatusConflict}, http.StatusConflict},
		{[]int{http.StatusSwitchingProtocols}, http.StatusSwitchingProtocols},
		{[]int{http.StatusOK, http.StatusInternalServerError}, http.StatusOK},
	}
	for _, tc := range cases {
		sw := &statusWriter{ResponseWriter: httptest.NewRecorder()}
		for _, c := range tc.codes {
			sw.WriteHeader(c)
		}
		if sw.code != tc.want {
			t.Errorf("after %v: code %d, want %d", tc.codes, sw.code, tc.want)
		}
	}
}

// TestWriteLogKeepsLatency: each logged write says how long the backend took to answer it, so
// that a rehearsal can tell how long the fence will wait for the writes in flight at the flip.
func TestWriteLogKeepsLatency(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(backend.Close)
	tp := startProxy(t, backend.URL)
	since := time.Now()
	if resp, _ := do(t, http.MethodPut, tp.url+"/api/v1/namespaces/ns/configmaps/slow"); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d", resp.StatusCode)
	}
	ws := tp.writes.since(since).Writes
	if len(ws) != 1 || time.Duration(ws[0].Took) < 50*time.Millisecond || time.Duration(ws[0].Took) > 5*time.Second {
		t.Fatalf("write log %+v, want the write with the backend's 50 ms in took", ws)
	}
}
