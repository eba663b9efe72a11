package proxy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubefence/kubefence/proxy/admin"
)

// statusFrame is the ERROR event kube-apiserver sends on a watch it will not serve, e.g. from a
// resourceVersion older than its watch cache (410 Expired, with the revision the cache begins
// at in the message).
func statusFrame(t *testing.T, fr framing, code int32, msg string) []byte {
	t.Helper()
	st := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Reason: metav1.StatusReasonExpired, Code: code, Message: msg}
	return frameOf(t, fr, "ERROR", "Status", st)
}

// tooOld is kube-apiserver's message for a watch from 9 when its cache begins at 15: the
// watches here delivered one event, at 10, and go on from the revision before it (the rest of
// revision 10's events, if any, come again: rvTracker.batch).
const tooOld = "too old resource version: 9 (15)"

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

// pages answers the lists of the collection exactly at 9 (before revision 10: only b, which
// revision 10 did not change; see withAt9), at 10 (in one page) and at 15 (in two: the second
// asked with the continue token "next", without a resourceVersion, as kube-apiserver requires);
// "410" answers Expired, as for a compacted revision.
func pages(at10, at15a, at15b string) func(r *http.Request) (int, string) {
	return withAt9(metaList("9", "", "b@7"), at10, at15a, at15b)
}

// withAt9 is pages with the list at 9 given.
func withAt9(at9, at10, at15a, at15b string) func(r *http.Request) (int, string) {
	return func(r *http.Request) (int, string) {
		q := r.URL.Query()
		page := ""
		switch {
		case q.Get("continue") == "next" && !q.Has("resourceVersion") && !q.Has("resourceVersionMatch"):
			page = at15b
		case q.Get("resourceVersionMatch") != "Exact" || q.Has("continue"):
		case q.Get("resourceVersion") == "9":
			page = at9
		case q.Get("resourceVersion") == "10":
			page = at10
		case q.Get("resourceVersion") == "15":
			page = at15a
		}
		switch page {
		case "":
			return http.StatusBadRequest, `{"kind":"Status","code":400}`
		case "410":
			return http.StatusGone, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}`
		}
		return http.StatusOK, page
	}
}

// TestResumePastExpiry: the new apiserver ends a moved watch at once with 410 Expired when its
// resourceVersion is older than its watch cache, which begins when that apiserver started (the
// informers of a quiet resource hold such a resourceVersion), and names the revision the cache
// begins at. The revisions being the same on both backends, the proxy then lists the watched
// collection on the new backend exactly at the watch's resourceVersion and at that revision:
// when both hold the same objects at the same resourceVersions, it re-issues the watch from that
// revision, on the same stream, and the new backend delivers everything after it; on any
// difference, or when it cannot tell, the watch ends cleanly as before (the client relists).
func TestResumePastExpiry(t *testing.T) {
	at10 := metaList("10", "", "a@10", "b@7")
	at15a, at15b := metaList("15", "next", "a@10"), metaList("15", "", "b@7")
	cases := []struct {
		name         string
		lists        func(*http.Request) (int, string)
		code         int32 // of the ERROR the new backend answers the moved watch with
		msg          string
		againExpired bool // the watch from 15 is answered 410 too
		resumed      bool
		listed       bool
		// busy: the newest revision blue delivered before the switch (to another watch), "20"
		// unless set; green's cache beginning after it ends the watch.
		busy string
	}{
		{name: "unchanged", lists: pages(at10, at15a, at15b), code: 410, msg: tooOld, resumed: true, listed: true},
		{name: "modified in between", lists: pages(at10, at15a, metaList("15", "", "b@12")), code: 410, msg: tooOld, listed: true},
		{name: "deleted in between", lists: pages(at10, metaList("15", "", "a@10"), ""), code: 410, msg: tooOld, listed: true},
		{name: "created in between", lists: pages(at10, at15a, metaList("15", "", "b@7", "c@13")), code: 410, msg: tooOld, listed: true},
		{name: "history compacted", lists: pages("410", at15a, at15b), code: 410, msg: tooOld, listed: true},
		{name: "list not at the revision asked", lists: pages(metaList("15", "", "a@10", "b@7"), at15a, at15b), code: 410, msg: tooOld, listed: true},
		{name: "expired again", lists: pages(at10, at15a, at15b), code: 410, msg: tooOld, againExpired: true, listed: true},
		{name: "410 without the cache's revision", lists: pages(at10, at15a, at15b), code: 410, msg: "too old resource version: 9"},
		{name: "another error", lists: pages(at10, at15a, at15b), code: 500, msg: tooOld},
		{name: "410 for another resourceVersion", lists: pages(at10, at15a, at15b), code: 410, msg: "too old resource version: 8 (15)"},
		{name: "cache begins after what blue delivered", lists: pages(at10, at15a, at15b), code: 410, msg: tooOld, busy: "12"},
		// The watch moved after a@10, its only event delivered at 10, and asked from 9: the
		// lists at 9 and 10 must show that a is all revision 10 changed, else the client lacks
		// the rest of it (here c's deletion), which nothing would send it.
		{name: "the rest of revision 10 not delivered", lists: withAt9(metaList("9", "", "b@7", "c@8"), at10, at15a, at15b), code: 410, msg: tooOld, listed: true},
		{name: "revision 10 cannot be listed", lists: withAt9("410", at10, at15a, at15b), code: 410, msg: tooOld, listed: true},
	}
	// kubectl get -w's default output asks for Tables (application/json;as=Table), which
	// kube-apiserver sends as JSON: each event a Table whose metadata has no name, the object's
	// in its one row.
	for _, fr := range []eventShape{framingJSON, framingProtobuf, framingTable} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", fr, tc.name), func(t *testing.T) {
				blue, green := newWatchAPI(t, "blue", fr.wire()), newWatchAPI(t, "green", fr.wire())
				green.lists = tc.lists
				p := startProxy(t, blue.URL)
				c := openWatch(t, p, fr.wire(), "resourceVersion=5&labelSelector=app%3Dx&shardSelector=s&allowWatchBookmarks=true&timeoutSeconds=300")
				ev := testEvent{"ADDED", "a", "10"}
				blue.watch(t, 1).feed <- fr.frame(t, ev)
				c.expect(t, fr.seen(ev))
				openBusy(t, p, blue, fr.wire(), cmp.Or(tc.busy, "20"))
				if sw := switchTo(t, p, green.URL, true); sw.Drain.Resumed != 2 {
					t.Fatalf("drain = %+v, want both watches moving", sw.Drain)
				}
				if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
					t.Fatal(err)
				}
				// Both moved watches tracked on green, neither resume pending, before green
				// answers: what the test then finds pending or ended is the watch's alone.
				waitFor(t, func() bool { st := p.Status(); return st.OpenStreams == 2 && st.ResumesPending == 0 })
				green.watchWith(t, "app=x", 1).last <- statusFrame(t, fr.wire(), tc.code, tc.msg)
				if tc.listed {
					checkLists(t, green, true)
				}
				if !tc.resumed && !tc.againExpired {
					expectEnded(t, p, c)
					if !tc.listed {
						checkLists(t, green, false) // the watch ended: no list can come after
					}
					if green.count() != 2 {
						t.Fatalf("%d watches asked of green; want the watch ended, not re-issued", green.count())
					}
					return
				}
				again := green.watchWith(t, "app=x", 2)
				if rv := again.query.Get("resourceVersion"); rv != "15" {
					t.Fatalf("the watch re-issued from %q, want 15 (where green's cache begins)", rv)
				}
				if tc.againExpired {
					again.last <- statusFrame(t, fr.wire(), 410, "too old resource version: 15 (16)")
					expectEnded(t, p, c)
					return
				}
				next := testEvent{"MODIFIED", "b", "21"}
				again.feed <- fr.frame(t, next)
				c.expect(t, fr.seen(next))
				if st := p.Status(); st.ResumedPastExpiry != 1 || st.ResumedThenEnded != 0 || st.ResumesPending != 0 || st.OpenStreams != 2 {
					t.Fatalf("status = %+v, want one watch resumed past the expiry, tracked on green, none ended", st)
				}
			})
		}
	}
}

// eventShape is how a test's watch events are framed: a framing, or framingTable.
type eventShape interface {
	wire() framing
	frame(t *testing.T, ev testEvent) []byte
	seen(ev testEvent) testEvent // what watchClient decodes of ev
}

func (f framing) wire() framing                            { return f }
func (f framing) frame(t *testing.T, ev testEvent) []byte  { return frame(t, f, ev, nil) }
func (f framing) seen(ev testEvent) testEvent              { return ev }
func (tableShape) wire() framing                           { return framingJSON }
func (tableShape) String() string                          { return "json-table" }
func (tableShape) seen(ev testEvent) testEvent             { ev.name = ""; return ev }
func (tableShape) frame(t *testing.T, ev testEvent) []byte { return tableFrame(t, ev) }

// tableShape is JSON events each carrying a meta.k8s.io/v1 Table of the object (kubectl get -w).
type tableShape struct{}

var framingTable eventShape = tableShape{}

// tableFrame is ev as kube-apiserver sends it to a client that asked for Tables, with the
// object's metadata in the row (includeObject=Metadata, the default).
func tableFrame(t *testing.T, ev testEvent) []byte {
	t.Helper()
	row := metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: ev.name, Namespace: "default", ResourceVersion: ev.rv}}
	rowRaw, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	tbl := metav1.Table{TypeMeta: metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/v1"}, ListMeta: metav1.ListMeta{ResourceVersion: ev.rv},
		ColumnDefinitions: []metav1.TableColumnDefinition{{Name: "Name", Type: "string"}},
		Rows:              []metav1.TableRow{{Cells: []any{ev.name}, Object: runtime.RawExtension{Raw: rowRaw}}}}
	raw, err := json.Marshal(tbl)
	if err != nil {
		t.Fatal(err)
	}
	line, err := json.Marshal(metav1.WatchEvent{Type: ev.typ, Object: runtime.RawExtension{Raw: raw}})
	if err != nil {
		t.Fatal(err)
	}
	return append(line, '\n')
}

// openBusy opens a watch through p (labelSelector=busy) that blue, as its second watch,
// delivers an event at rv to.
func openBusy(t *testing.T, p *testProxy, blue *watchAPI, fr framing, rv string) {
	t.Helper()
	c := openWatch(t, p, fr, "resourceVersion=5&labelSelector=busy")
	ev := testEvent{"ADDED", "z", rv}
	blue.watch(t, 2).feed <- frame(t, fr, ev, nil)
	c.expect(t, ev)
}

// watchWith waits for the n-th watch api got with labelSelector selector, from the first
// resourceVersion the test's watch asks from (10, then 15).
func (a *watchAPI) watchWith(t *testing.T, selector string, n int) *apiWatch {
	t.Helper()
	var wt *apiWatch
	waitFor(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		seen := 0
		for _, w := range a.watches {
			if w.query.Get("labelSelector") == selector {
				if seen++; seen == n {
					wt = w
				}
			}
		}
		return wt != nil
	})
	if want := map[int]string{1: "9", 2: "15"}[n]; wt.query.Get("resourceVersion") != want {
		t.Fatalf("watch %d with %s asked from %q, want %s", n, selector, wt.query.Get("resourceVersion"), want)
	}
	return wt
}

// expectEnded: the client's watch ends cleanly, counted as ended by the new backend, not as
// resumed, with nothing left pending or holding a slot.
func expectEnded(t *testing.T, p *testProxy, c *watchClient) {
	t.Helper()
	c.expectEnd(t)
	waitFor(t, func() bool { return p.Status().ResumedThenEnded == 1 })
	b := p.active.Load()
	if st := p.Status(); st.ResumedPastExpiry != 0 || st.ResumesPending != 0 || len(b.resumeSlots) != 0 || len(b.checkSlots) != 0 {
		t.Fatalf("status = %+v (slots taken: %d, %d); want the watch counted as ended only, nothing pending", st, len(b.resumeSlots), len(b.checkSlots))
	}
}

// checkLists checks what the proxy listed: the watched collection with the watch's selectors,
// in metadata form, nothing of the watch's own parameters; or nothing at all (checked once the
// watch has ended, when no list can follow).
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
		return len(api.listed) >= 1
	})
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, r := range api.listed {
		q := r.URL.Query()
		if r.URL.Path != "/api/v1/namespaces/default/configmaps" || q.Get("labelSelector") != "app=x" || q.Get("shardSelector") != "s" ||
			q.Has("watch") || q.Has("allowWatchBookmarks") || q.Has("timeoutSeconds") || q.Get("limit") == "" {
			t.Fatalf("the proxy listed %s", r.URL)
		}
		if !strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadataList") || r.Header.Get("Authorization") != "Bearer client-token" {
			t.Fatalf("list headers %v: want metadata only, in the client's name", r.Header)
		}
	}
}

// TestSwitchAwayDuringThePastExpiryLists: while the proxy lists a moved watch's collection on
// the new backend, the watch is tracked nowhere (as before the new backend answered it): a
// switch away from that backend neither waits for the lists nor moves the watch; the lists are
// abandoned, and the watch ends cleanly (its client relists), its slot given back.
func TestSwitchAwayDuringThePastExpiryLists(t *testing.T) {
	blue, green, third := newWatchAPI(t, "blue", framingJSON), newWatchAPI(t, "green", framingJSON), newWatchAPI(t, "third", framingJSON)
	listing, hang := make(chan struct{}, 1), make(chan struct{})
	defer close(hang)
	green.lists = func(r *http.Request) (int, string) {
		listing <- struct{}{}
		select {
		case <-hang:
		case <-r.Context().Done():
		}
		return http.StatusServiceUnavailable, `{"kind":"Status","code":503}`
	}
	p := startProxy(t, blue.URL)
	c := openWatch(t, p, framingJSON, "resourceVersion=5&labelSelector=app%3Dx")
	blue.watch(t, 1).feed <- frame(t, framingJSON, testEvent{"ADDED", "a", "10"}, nil)
	c.expect(t, testEvent{"ADDED", "a", "10"})
	openBusy(t, p, blue, framingJSON, "20")
	switchTo(t, p, green.URL, true)
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
		t.Fatal(err)
	}
	green.watchWith(t, "app=x", 1).last <- statusFrame(t, framingJSON, 410, tooOld)
	select {
	case <-listing:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not list the collection")
	}
	gb := p.active.Load()
	done := make(chan admin.BackendResponse, 1)
	go func() { done <- switchTo(t, p, third.URL, true) }()
	select {
	case sw := <-done:
		if sw.Drain.Streams != 1 || sw.Drain.Resumed != 1 {
			t.Fatalf("drain = %+v, want only the busy watch on green, moved", sw.Drain)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the switch away from green waited for the lists")
	}
	c.expectEnd(t)
	waitFor(t, func() bool { return gb.resumesPending.Load() == 0 && len(gb.checkSlots) == 0 })
	if gb.resumedThenEnded.Load() != 0 || gb.resumedPastExpiry.Load() != 0 || third.count() > 1 {
		t.Fatalf("green counted %d ended, %d resumed; third asked %d watches: want only the busy one (the proxy left green)", gb.resumedThenEnded.Load(), gb.resumedPastExpiry.Load(), third.count())
	}
}

// TestResumeWhereTheCacheBegins: a watch that asked the new backend from the revision before
// its last event's (the rest of that revision's events come again) finds the backend's cache
// beginning at that very revision (410 "R-1 (R)"): it goes on from R, as a watch asking from R
// did before, rather than end (and relist), when the lists at R-1 and R show that its client
// has every event of R; when R changed an object whose event it had not delivered (the move
// split the revision), the watch ends: from R the new backend would never send that event.
func TestResumeWhereTheCacheBegins(t *testing.T) {
	cases := []struct {
		name    string
		at9     string
		resumed bool
	}{
		{name: "revision 10 delivered whole", at9: metaList("9", "", "b@7"), resumed: true},
		{name: "the rest of revision 10 not delivered", at9: metaList("9", "", "b@7", "c@8")},
	}
	for _, fr := range framings {
		for _, tc := range cases {
			t.Run(fr.String()+"/"+tc.name, func(t *testing.T) {
				blue, green := newWatchAPI(t, "blue", fr), newWatchAPI(t, "green", fr)
				green.lists = withAt9(tc.at9, metaList("10", "", "a@10", "b@7"), "", "")
				p := startProxy(t, blue.URL)
				c := openWatch(t, p, fr, "resourceVersion=5")
				sendOne(t, blue, 1, c, fr, testEvent{"ADDED", "a", "10"})
				switchTo(t, p, green.URL, true)
				if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
					t.Fatal(err)
				}
				if got := green.watch(t, 1).query.Get("resourceVersion"); got != "9" {
					t.Fatalf("green asked from %q, want 9", got)
				}
				green.watch(t, 1).last <- statusFrame(t, fr, 410, "too old resource version: 9 (10)")
				if !tc.resumed {
					expectEnded(t, p, c)
					return
				}
				if got := green.watch(t, 2).query.Get("resourceVersion"); got != "10" {
					t.Fatalf("after the 410, green asked from %q, want 10 (where its cache begins: the watch's own)", got)
				}
				green.watch(t, 2).feed <- frame(t, fr, testEvent{"ADDED", "b", "11"}, nil)
				c.expect(t, testEvent{"ADDED", "b", "11"})
				if st := p.Status(); st.ResumedPastExpiry != 0 || st.ResumedThenEnded != 0 {
					t.Errorf("status %d resumed past expiry, %d ended: want it resumed from its own revision", st.ResumedPastExpiry, st.ResumedThenEnded)
				}
			})
		}
	}
}
