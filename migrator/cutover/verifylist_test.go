package cutover

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestListRawSaysWhyAndRetries: a list the apiserver refuses says why (the Status message, not
// only the HTTP status), a 410 for a compacted revision says the verify outlasted the compaction
// and what to do, and a 429 (API priority and fairness) or 503 is tried again after its
// Retry-After, within the step's context, rather than aborting the cutover.
func TestListRawSaysWhyAndRetries(t *testing.T) {
	const ok = `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"namespace":"ns","name":"a","uid":"u1","resourceVersion":"5"}}]}`
	status := func(code int, reason, msg string) string {
		return fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":%q,"message":%q,"code":%d}`, reason, msg, code)
	}
	for _, tc := range []struct {
		name    string
		answers []func(w http.ResponseWriter)
		want    string // in the error; "" for a list that succeeds
	}{
		{name: "compacted", answers: []func(w http.ResponseWriter){func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusGone)
			_, _ = w.Write([]byte(status(410, "Expired", "too old resource version: 5 (90)")))
		}}, want: "compacted"},
		{name: "forbidden", answers: []func(w http.ResponseWriter){func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(status(403, "Forbidden", `configmaps is forbidden: User "x" cannot list resource`)))
		}}, want: "cannot list resource"},
		{name: "throttled once", answers: []func(w http.ResponseWriter){func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(status(429, "TooManyRequests", "too many requests")))
		}}},
		{name: "unavailable once", answers: []func(w http.ResponseWriter){func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if i := int(n.Add(1)) - 1; i < len(tc.answers) {
					tc.answers[i](w)
					return
				}
				_, _ = w.Write([]byte(ok))
			}))
			defer srv.Close()
			start := time.Now()
			got, err := listRaw(t.Context(), srv.Client(), srv.URL, schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, 5)
			if tc.want == "" {
				if err != nil || len(got) != 1 {
					t.Fatalf("list = %v, %v; want the one object after a retry", got, err)
				}
				if took := time.Since(start); tc.name == "throttled once" && took < 900*time.Millisecond {
					t.Errorf("retried after %s, before its Retry-After of 1s", took)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("list = %v; want an error saying %q", err, tc.want)
			}
		})
	}
}
