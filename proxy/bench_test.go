package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkForwardList measures the proxy's own cost per forwarded list request (plain HTTP on
// both sides, so TLS does not hide it). `make bench-proxy` measures the whole path with TLS
// against HAProxy; this one is for profiling: go test -bench Forward -benchmem -memprofile.
func BenchmarkForwardList(b *testing.B) {
	body := []byte(strings.Repeat("x", 4300))
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer api.Close()
	p := startProxy(b, api.URL)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	url := p.url + "/api/v1/namespaces/default/configmaps"
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Get(url)
			if err != nil {
				b.Error(err) // not Fatal: this is not the benchmark's goroutine
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

// BenchmarkForwardWrite is BenchmarkForwardList for writes: a ConfigMap-sized create, whose body
// the proxy reads whole (and reserves against --max-buffered-write-bytes) before forwarding it.
func BenchmarkForwardWrite(b *testing.B) {
	body := `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"},"data":{"k":"` + strings.Repeat("x", 1000) + `"}}`
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, body)
	}))
	defer api.Close()
	p := startProxy(b, api.URL)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	url := p.url + "/api/v1/namespaces/default/configmaps"
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
