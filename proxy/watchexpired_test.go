package proxy

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubefence/kubefence/proxy/admin"
)

// statusFrame is the ERROR event kube-apiserver sends on a watch it will not serve, e.g. from a
// resourceVersion older than its watch cache (410 Expired).
func statusFrame(t *testing.T, fr framing, code int32) []byte {
	t.Helper()
	st := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Reason: metav1.StatusReasonExpired, Code: code, Message: "too old resource version: 10 (15)"}
	if fr == framingJSON {
		obj, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		line, err := json.Marshal(metav1.WatchEvent{Type: "ERROR", Object: runtime.RawExtension{Raw: obj}})
		if err != nil {
			t.Fatal(err)
		}
		return append(line, '\n')
	}
	obj, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	unk, err := (&runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: "Status"}, Raw: obj, ContentType: "application/vnd.kubernetes.protobuf"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	we, err := (&metav1.WatchEvent{Type: "ERROR", Object: runtime.RawExtension{Raw: append([]byte("k8s\x00"), unk...)}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(we))), we...)
}

// metaList is one page of a list as kube-apiserver answers it in metadata form; items are
// "name@resourceVersion" in namespace default.
func metaList(rv, cont string, items ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":%q,"continue":%q},"items":[`, rv, cont)
	for i, it := range items {
		name, irv, _ := strings.Cut(it, "@")
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"metadata":{"name":%q,"namespace":"default","resourceVersion":%q}}`, name, irv)
	}
	b.WriteString("]}")
	return b.String()
}

// pages answers the lists of the collection: now (no resourceVersion: a consistent read at 20,
// in two pages) and at 10 (exactly), from the pages given; "410" answers Expired.
func pages(now1, now2, at10 string) func(r *http.Request) (int, string) {
	return func(r *http.Request) (int, string) {
		q := r.URL.Query()
		page := now1
		switch {
		case q.Get("continue") == "next":
			page = now2
		case q.Get("resourceVersion") == "10" && q.Get("resourceVersionMatch") == "Exact":
			page = at10
		case q.Has("resourceVersion"):
			return http.StatusBadRequest, `{"kind":"Status","code":400}`
		}
		if page == "410" {
			return http.StatusGone, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}`
		}
		return http.StatusOK, page
	}
}

// TestResumePastExpiry: the new apiserver ends a moved watch at once with 410 Expired when its
// resourceVersion is older than its watch cache, which starts when that apiserver started (the
// informers of a quiet resource hold such a resourceVersion). The revisions being the same on
// both backends, the proxy then lists the watched collection on the new backend at that
// resourceVersion and now: when both hold the same objects at the same resourceVersions, nothing
// happened to the watch in between, and it re-issues the watch from now, on the same stream; on
// any difference, or when it cannot tell, the watch ends cleanly as before (the client relists).
func TestResumePastExpiry(t *testing.T) {
	now1, now2 := metaList("20", "next", "a@10"), metaList("20", "", "b@7")
	cases := []struct {
		name          string
		lists         func(*http.Request) (int, string)
		code          int32 // of the ERROR the new backend answers the moved watch with
		againExpired  bool  // the watch from now is answered 410 too
		resumed       bool
		wantListsSeen bool
	}{
		{name: "unchanged", lists: pages(now1, now2, metaList("10", "", "a@10", "b@7")), code: 410, resumed: true, wantListsSeen: true},
		{name: "modified since", lists: pages(now1, metaList("20", "", "b@15"), metaList("10", "", "a@10", "b@7")), code: 410, wantListsSeen: true},
		{name: "deleted since", lists: pages(metaList("20", "", "a@10"), "", metaList("10", "", "a@10", "b@7")), code: 410, wantListsSeen: true},
		{name: "created since", lists: pages(now1, metaList("20", "", "b@7", "c@18"), metaList("10", "", "a@10", "b@7")), code: 410, wantListsSeen: true},
		{name: "history compacted", lists: pages(now1, now2, "410"), code: 410, wantListsSeen: true},
		{name: "expired again from now", lists: pages(now1, now2, metaList("10", "", "a@10", "b@7")), code: 410, againExpired: true, wantListsSeen: true},
		{name: "another error", lists: pages(now1, now2, metaList("10", "", "a@10", "b@7")), code: 500},
	}
	for _, fr := range framings {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", fr, tc.name), func(t *testing.T) {
				blue, green := newWatchAPI(t, "blue", fr), newWatchAPI(t, "green", fr)
				green.lists = tc.lists
				p := startProxy(t, blue.URL)
				c := openWatch(t, p, fr, "resourceVersion=5&labelSelector=app%3Dx&allowWatchBookmarks=true&timeoutSeconds=300")
				ev := testEvent{"ADDED", "a", "10"}
				blue.watch(t, 1).feed <- frame(t, fr, ev, nil)
				c.expect(t, ev)
				if sw := switchTo(t, p, green.URL, true); sw.Drain.Resumed != 1 {
					t.Fatalf("drain = %+v, want the watch moving", sw.Drain)
				}
				if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
					t.Fatal(err)
				}
				if rv := green.watch(t, 1).query.Get("resourceVersion"); rv != "10" {
					t.Fatalf("green asked from %q, want 10", rv)
				}
				green.watch(t, 1).last <- statusFrame(t, fr, tc.code)
				checkLists(t, green, tc.wantListsSeen)
				if !tc.resumed && !tc.againExpired {
					c.expectEnd(t)
					waitFor(t, func() bool { return p.Status().ResumedThenEnded == 1 })
					if st := p.Status(); st.ResumedPastExpiry != 0 || green.count() != 1 {
						t.Fatalf("status %+v, %d watches asked of green; want the watch ended, not re-issued", st, green.count())
					}
					return
				}
				again := green.watch(t, 2)
				if rv := again.query.Get("resourceVersion"); rv != "20" {
					t.Fatalf("the watch re-issued from %q, want 20 (the lists' now)", rv)
				}
				if tc.againExpired {
					again.last <- statusFrame(t, fr, 410)
					c.expectEnd(t)
					waitFor(t, func() bool { return p.Status().ResumedThenEnded == 1 })
					return
				}
				next := testEvent{"MODIFIED", "b", "21"}
				again.feed <- frame(t, fr, next, nil)
				c.expect(t, next)
				if st := p.Status(); st.ResumedPastExpiry != 1 || st.ResumedThenEnded != 0 || st.ResumesPending != 0 {
					t.Fatalf("status = %+v, want one watch resumed past the expiry, none ended", st)
				}
			})
		}
	}
}

// checkLists checks what the proxy listed: the watched collection with the watch's selectors,
// in metadata form, nothing of the watch's own parameters; or nothing at all.
func checkLists(t *testing.T, api *watchAPI, want bool) {
	t.Helper()
	if !want {
		api.mu.Lock()
		defer api.mu.Unlock()
		if len(api.listed) != 0 {
			t.Fatalf("the proxy listed %s; want no list for this error", api.listed[0].URL)
		}
		return
	}
	waitFor(t, func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return len(api.listed) >= 2
	})
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, r := range api.listed {
		q := r.URL.Query()
		if r.URL.Path != "/api/v1/namespaces/default/configmaps" || q.Get("labelSelector") != "app=x" ||
			q.Has("watch") || q.Has("allowWatchBookmarks") || q.Has("timeoutSeconds") || q.Get("limit") == "" {
			t.Fatalf("the proxy listed %s", r.URL)
		}
		if !strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadataList") || r.Header.Get("Authorization") != "Bearer client-token" {
			t.Fatalf("list headers %v: want metadata only, in the client's name", r.Header)
		}
	}
}
