package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

func TestEachNamesEveryProxyThatFailed(t *testing.T) {
	g := Group{{Name: "a", Client: NewClient("/a")}, {Name: "b", Client: NewClient("/b")}, {Name: "c", Client: NewClient("/c")}}
	res, err := Each(context.Background(), g, func(_ context.Context, c *Client) (string, error) {
		if c == g[1].Client {
			return "", errors.New("unreachable")
		}
		return "ok", nil
	})
	if err == nil || !strings.Contains(err.Error(), "1 of 3 proxies") || !strings.Contains(err.Error(), "proxy b: unreachable") {
		t.Fatalf("error %v, want it to name proxy b", err)
	}
	if len(res) != 3 || res[0].Value != "ok" || res[1].Error != "unreachable" || res[2].Proxy != "c" {
		t.Fatalf("results %+v", res)
	}
	if _, err := Each(context.Background(), g, func(context.Context, *Client) (int, error) { return 1, nil }); err != nil {
		t.Fatalf("all acknowledged: %v", err)
	}
}

// TestOlderProxyNamedInTheError: a proxy from before a request field refuses it as unknown; the
// client says that the proxy is older and what to do, not only "bad request".
func TestOlderProxyNamedInTheError(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"bad request body: json: unknown field \"expectBackend\""}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, err = NewClient(sock).Fence(t.Context(), FenceRequest{ExpectBackend: "https://green:6443"})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusBadRequest || !strings.Contains(err.Error(), "unknown field") || !strings.Contains(err.Error(), "older admin API") || !strings.Contains(err.Error(), "upgrade the proxy") {
		t.Fatalf("error %v, want the 400 saying the proxy is older and what to do", err)
	}
}

// TestFailedResultIsNull: in -o json, a proxy that did not answer has no result, not a zero
// one ("fenced": false would read as an answer in a pipeline that ignores the exit code).
func TestFailedResultIsNull(t *testing.T) {
	rs := []Result[Status]{
		{Proxy: "a.sock", Value: Status{Fenced: true}},
		{Proxy: "gone.sock", Err: errors.New("no such socket"), Error: "no such socket"},
	}
	b, err := json.Marshal(rs)
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got[1]["result"] != nil || got[1]["error"] != "no such socket" {
		t.Errorf("the failed proxy as JSON: %s; want result null and its error", b)
	}
	if r, ok := got[0]["result"].(map[string]any); !ok || r["fenced"] != true {
		t.Errorf("the proxy that answered as JSON: %s; want its result", b)
	}
}
