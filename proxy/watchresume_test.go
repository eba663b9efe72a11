package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubefence/kubefence/proxy/admin"
)

// watchAPI is a kube-apiserver stand-in for watches: each watch request it gets is recorded,
// answered with status (200 unless set) and then fed the bytes the test sends it.
type watchAPI struct {
	*httptest.Server
	fr      framing
	mu      sync.Mutex
	status  int
	answer  chan struct{} // when set, a watch is answered only once it is closed
	watches []*apiWatch
	// lists, when set, answers every request that is not a watch (and is recorded in listed).
	lists  func(r *http.Request) (status int, body string)
	listed []*http.Request
}

type apiWatch struct {
	query  url.Values
	header http.Header
	feed   chan []byte
	last   chan []byte // written, then the response ends (no flush between)
}

func newWatchAPI(t *testing.T, name string, fr framing) *watchAPI {
	a := &watchAPI{fr: fr}
	a.Server = httptest.NewServer(a.handler(name))
	t.Cleanup(a.Close)
	return a
}

func (a *watchAPI) handler(name string) http.Handler {
	fr := a.fr
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			a.answerList(w, r, name)
			return
		}
		wt := &apiWatch{query: r.URL.Query(), header: r.Header.Clone(), feed: make(chan []byte, 16), last: make(chan []byte, 1)}
		a.mu.Lock()
		a.watches = append(a.watches, wt)
		status, answer := a.status, a.answer
		a.mu.Unlock()
		if answer != nil {
			select {
			case <-answer:
			case <-r.Context().Done():
				return
			}
		}
		if status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"kind":"Status","code":%d}`, status)
			return
		}
		w.Header().Set("Content-Type", contentTypeOf(fr))
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		for {
			select {
			case b := <-wt.feed:
				_, _ = w.Write(b)
				http.NewResponseController(w).Flush()
			case b := <-wt.last:
				_, _ = w.Write(b)
				return
			case <-r.Context().Done():
				return
			}
		}
	})
}

func (a *watchAPI) answerList(w http.ResponseWriter, r *http.Request, name string) {
	a.mu.Lock()
	lists := a.lists
	if lists != nil {
		a.listed = append(a.listed, r.Clone(context.Background()))
	}
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if lists == nil {
		fmt.Fprintf(w, `{"from":%q}`, name)
		return
	}
	status, body := lists(r)
	w.WriteHeader(status)
	fmt.Fprint(w, body)
}

func contentTypeOf(fr framing) string {
	if fr == framingProtobuf {
		return "application/vnd.kubernetes.protobuf;stream=watch"
	}
	return "application/json"
}

// watch waits for the backend's n-th watch request (1-based).
func (a *watchAPI) watch(t *testing.T, n int) *apiWatch {
	t.Helper()
	var wt *apiWatch
	waitFor(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.watches) >= n {
			wt = a.watches[n-1]
		}
		return wt != nil
	})
	return wt
}

func (a *watchAPI) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.watches)
}

// testEvent is one watch event as the client decodes it.
type testEvent struct{ typ, name, rv string }

// frame encodes a watch event as kube-apiserver does: a JSON line, or a length-prefixed
// metav1.WatchEvent whose object is "k8s\x00" + runtime.Unknown (apimachinery's own types).
func frame(t *testing.T, fr framing, ev testEvent, annotations map[string]string) []byte {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ev.name, Namespace: "default", ResourceVersion: ev.rv, Annotations: annotations}}
	return frameObject(t, fr, ev.typ, cm)
}

func frameObject(t *testing.T, fr framing, typ string, cm *corev1.ConfigMap) []byte {
	return frameOf(t, fr, typ, "ConfigMap", cm)
}

// frameOf encodes a watch event of type typ carrying obj, a core/v1 kind (or Status).
func frameOf(t *testing.T, fr framing, typ, kind string, obj interface{ Marshal() ([]byte, error) }) []byte {
	t.Helper()
	if fr == framingJSON {
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		line, err := json.Marshal(metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}})
		if err != nil {
			t.Fatal(err)
		}
		return append(line, '\n')
	}
	raw, err := obj.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	unk, err := (&runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: kind}, Raw: raw, ContentType: "application/vnd.kubernetes.protobuf"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	we, err := (&metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: append([]byte("k8s\x00"), unk...)}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(we))), we...)
}

// watchClient reads one watch response through the proxy, decoding events independently of the
// proxy's own parser.
type watchClient struct {
	fr   framing
	body io.ReadCloser
	r    *bufio.Reader
}

func openWatch(t *testing.T, p *testProxy, fr framing, query string) *watchClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", p.url+"/api/v1/namespaces/default/configmaps?watch=true&"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", contentTypeOf(fr))
	req.Header.Set("Authorization", "Bearer client-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("watch through the proxy = %s", resp.Status)
	}
	return &watchClient{fr: fr, body: resp.Body, r: bufio.NewReader(resp.Body)}
}

// next reads one event; io.EOF when the watch ended cleanly between events.
func (c *watchClient) next() (testEvent, error) {
	var raw []byte
	if c.fr == framingJSON {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			if len(line) > 0 {
				return testEvent{}, fmt.Errorf("partial event %q: %w", line, err)
			}
			return testEvent{}, err
		}
		var we struct {
			Type   string
			Object corev1.ConfigMap
		}
		if err := json.Unmarshal(line, &we); err != nil {
			return testEvent{}, err
		}
		return testEvent{we.Type, we.Object.Name, we.Object.ResourceVersion}, nil
	}
	var hdr [4]byte
	if n, err := io.ReadFull(c.r, hdr[:]); err != nil {
		if n > 0 {
			return testEvent{}, fmt.Errorf("partial frame header: %w", err)
		}
		return testEvent{}, err
	}
	raw = make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(c.r, raw); err != nil {
		return testEvent{}, fmt.Errorf("partial frame: %w", err)
	}
	var we metav1.WatchEvent
	if err := we.Unmarshal(raw); err != nil {
		return testEvent{}, err
	}
	var unk runtime.Unknown
	if err := unk.Unmarshal(we.Object.Raw[4:]); err != nil {
		return testEvent{}, err
	}
	var cm corev1.ConfigMap
	if err := cm.Unmarshal(unk.Raw); err != nil {
		return testEvent{}, err
	}
	return testEvent{we.Type, cm.Name, cm.ResourceVersion}, nil
}

func (c *watchClient) expect(t *testing.T, want testEvent) {
	t.Helper()
	got, err := c.next()
	if err != nil || got != want {
		t.Fatalf("watch event = %+v, %v; want %+v", got, err, want)
	}
}

func (c *watchClient) expectEnd(t *testing.T) {
	t.Helper()
	got, err := c.next()
	if err != io.EOF {
		t.Fatalf("watch gave %+v, %v; want a clean end between events", got, err)
	}
}

func switchTo(t *testing.T, p *testProxy, to string, resume bool) admin.BackendResponse {
	t.Helper()
	if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: true}); err != nil {
		t.Fatal(err)
	}
	resp, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: to, ResumeWatches: resume})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

var framings = []framing{framingJSON, framingProtobuf}

func (f framing) String() string {
	return map[framing]string{framingJSON: "json", framingProtobuf: "protobuf", framingUnknown: "unknown"}[f]
}

// TestWatchResumesAcrossSwitch: a watch open through the proxy keeps streaming across a
// resuming backend switch, on one response: events from blue, then from green, which was asked
// for the watch from the last resourceVersion delivered (a bookmark's), with the client's
// headers and without resourceVersionMatch; and again on a second switch, back to blue.
func TestWatchResumesAcrossSwitch(t *testing.T) {
	for _, fr := range framings {
		t.Run(fr.String(), func(t *testing.T) {
			blue, green := newWatchAPI(t, "blue", fr), newWatchAPI(t, "green", fr)
			p := startProxy(t, blue.URL)
			c := openWatch(t, p, fr, "resourceVersion=5&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
			bw := blue.watch(t, 1)
			bw.feed <- append(frame(t, fr, testEvent{"ADDED", "a", "10"}, nil), frame(t, fr, testEvent{"MODIFIED", "a", "11"}, nil)...)
			c.expect(t, testEvent{"ADDED", "a", "10"})
			c.expect(t, testEvent{"MODIFIED", "a", "11"})
			bw.feed <- frame(t, fr, testEvent{"BOOKMARK", "", "15"}, nil)
			c.expect(t, testEvent{"BOOKMARK", "", "15"})

			// The watch is idle (blocked in Read) when the switch comes.
			sw := switchTo(t, p, green.URL, true)
			if sw.Drain.Streams != 1 || sw.Drain.Resumed != 1 || sw.Drain.Ended != 0 || sw.Drain.Forced != 0 {
				t.Fatalf("drain = %+v, want the one watch resumed", sw.Drain)
			}
			gw := green.watch(t, 1)
			if got := gw.query.Get("resourceVersion"); got != "15" {
				t.Fatalf("green was asked to watch from resourceVersion %q, want 15 (the bookmark's)", got)
			}
			if gw.query.Has("resourceVersionMatch") || gw.query.Get("allowWatchBookmarks") != "true" || gw.query.Get("watch") != "true" {
				t.Fatalf("resumed query = %v", gw.query)
			}
			if gw.header.Get("Authorization") != "Bearer client-token" || gw.header.Get("Accept") != contentTypeOf(fr) {
				t.Fatalf("resumed request headers = %v", gw.header)
			}
			gw.feed <- frame(t, fr, testEvent{"ADDED", "b", "16"}, nil)
			c.expect(t, testEvent{"ADDED", "b", "16"})
			if st := p.Status(); st.OpenStreams != 1 || st.Backend != green.URL {
				t.Fatalf("status after resume = %+v, want the watch tracked on green", st)
			}

			// Back to blue while an event is half sent: the proxy waits for its end.
			ev := frame(t, fr, testEvent{"DELETED", "a", "17"}, nil)
			gw.feed <- ev[:len(ev)/2]
			done := make(chan admin.BackendResponse, 1)
			go func() {
				resp, _ := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: blue.URL, ResumeWatches: true})
				done <- resp
			}()
			time.Sleep(100 * time.Millisecond)
			if blue.count() != 1 {
				t.Fatal("the watch moved in the middle of an event")
			}
			gw.feed <- ev[len(ev)/2:]
			c.expect(t, testEvent{"DELETED", "a", "17"})
			var sw2 admin.BackendResponse
			select {
			case sw2 = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("second switch did not return")
			}
			if sw2.Drain.Resumed != 1 {
				t.Fatalf("second drain = %+v", sw2.Drain)
			}
			bw2 := blue.watch(t, 2)
			if got := bw2.query.Get("resourceVersion"); got != "17" {
				t.Fatalf("blue was asked to resume from %q, want 17", got)
			}
			bw2.feed <- frame(t, fr, testEvent{"ADDED", "c", "18"}, nil)
			c.expect(t, testEvent{"ADDED", "c", "18"})
		})
	}
}

// TestWatchEndsWithoutResume: the default switch ends the watch between events, as before;
// green never sees it.
func TestWatchEndsWithoutResume(t *testing.T) {
	for _, fr := range framings {
		t.Run(fr.String(), func(t *testing.T) {
			blue, green := newWatchAPI(t, "blue", fr), newWatchAPI(t, "green", fr)
			p := startProxy(t, blue.URL)
			c := openWatch(t, p, fr, "resourceVersion=5")
			blue.watch(t, 1).feed <- frame(t, fr, testEvent{"ADDED", "a", "10"}, nil)
			c.expect(t, testEvent{"ADDED", "a", "10"})
			sw := switchTo(t, p, green.URL, false)
			c.expectEnd(t)
			if sw.Drain.Streams != 1 || sw.Drain.Resumed != 0 || sw.Drain.Ended != 1 {
				t.Fatalf("drain = %+v", sw.Drain)
			}
			if green.count() != 0 {
				t.Fatal("a switch without resume re-issued the watch")
			}
		})
	}
}

// TestWatchNotResumable: watches the proxy cannot continue exactly end cleanly, as without
// resume: initial events (sendInitialEvents) not finished, an event without a resourceVersion,
// and a new backend that refuses the resourceVersion (410) or fails (500).
func TestWatchNotResumable(t *testing.T) {
	initialEnd := map[string]string{initialEventsEnd: "true"}
	cases := []struct {
		name        string
		query       string
		events      []testEvent
		annotations map[string]string // of the last event
		greenStatus int
		wantGreen   int // watch requests green gets
	}{
		{name: "initial events pending", query: "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
			events: []testEvent{{"ADDED", "a", "7"}, {"ADDED", "b", "3"}}},
		{name: "bookmark without the initial-events-end annotation", query: "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
			events: []testEvent{{"ADDED", "a", "7"}, {"BOOKMARK", "", "9"}}},
		{name: "an event without a resourceVersion", query: "resourceVersion=5", events: []testEvent{{"ADDED", "a", ""}}},
		// Started without a resourceVersion, or at 0: the watch begins with the state as
		// synthetic ADDED events, each at its object's own resourceVersion, in key order.
		{name: "started without a resourceVersion", events: []testEvent{{"ADDED", "a", "10"}, {"ADDED", "b", "3"}}},
		{name: "started at resourceVersion 0", query: "resourceVersion=0", events: []testEvent{{"ADDED", "a", "10"}, {"ADDED", "b", "3"}}},
		// No initial events, from "now": until an event came there is no revision to resume
		// from; the resource version asked for is none.
		{name: "sendInitialEvents=false from now, nothing delivered", query: "sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=0"},
		// The apiserver takes any value but 0 or false as true.
		{name: "sendInitialEvents=1, initial events pending", query: "sendInitialEvents=1&resourceVersionMatch=NotOlderThan&resourceVersion=5",
			events: []testEvent{{"ADDED", "a", "3"}}},
		{name: "green answers 410", query: "resourceVersion=5", events: []testEvent{{"ADDED", "a", "10"}}, greenStatus: http.StatusGone, wantGreen: 1},
		{name: "green answers 500", query: "resourceVersion=5", events: []testEvent{{"ADDED", "a", "10"}}, greenStatus: http.StatusInternalServerError, wantGreen: 1},
		{name: "initial events done, green fails", query: "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
			events: []testEvent{{"ADDED", "a", "7"}, {"BOOKMARK", "", "9"}}, annotations: initialEnd, greenStatus: http.StatusGone, wantGreen: 1},
	}
	for _, fr := range framings {
		for _, tc := range cases {
			t.Run(fr.String()+"/"+tc.name, func(t *testing.T) {
				blue, green := newWatchAPI(t, "blue", fr), newWatchAPI(t, "green", fr)
				green.status = tc.greenStatus
				p := startProxy(t, blue.URL)
				c := openWatch(t, p, fr, tc.query)
				bw := blue.watch(t, 1)
				for i, ev := range tc.events {
					var ann map[string]string
					if i == len(tc.events)-1 {
						ann = tc.annotations
					}
					bw.feed <- frame(t, fr, ev, ann)
					c.expect(t, ev)
				}
				sw := switchTo(t, p, green.URL, true)
				c.expectEnd(t)
				// One green refuses left blue to be re-issued (the switch does not wait for
				// green's answer): moved, then counted as ended by green.
				moved := tc.wantGreen
				if sw.Drain.Streams != 1 || sw.Drain.Resumed != moved || sw.Drain.Ended != 1-moved || sw.Drain.Forced != 0 {
					t.Fatalf("drain = %+v, want the watch ended (or moved, then ended by green), not forced", sw.Drain)
				}
				if got := p.Status().ResumedThenEnded; got != int64(moved) {
					t.Fatalf("status: %d watch(es) resumed then ended by green, want %d", got, moved)
				}
				if got := green.count(); got != tc.wantGreen {
					t.Fatalf("green got %d watch requests, want %d", got, tc.wantGreen)
				}
				if tc.wantGreen > 0 && green.watch(t, 1).query.Has("sendInitialEvents") {
					t.Fatalf("resumed watch kept sendInitialEvents: %v", green.watch(t, 1).query)
				}
				if st := p.Status(); st.OpenStreams != 0 {
					t.Fatalf("status = %+v, want no stream left on green", st)
				}
			})
		}
	}
}

// TestWatchResumesAfterInitialEvents: once the initial-events-end bookmark is delivered, a
// sendInitialEvents watch resumes from it, without sendInitialEvents.
func TestWatchResumesAfterInitialEvents(t *testing.T) {
	for _, fr := range framings {
		t.Run(fr.String(), func(t *testing.T) {
			blue, green := newWatchAPI(t, "blue", fr), newWatchAPI(t, "green", fr)
			p := startProxy(t, blue.URL)
			c := openWatch(t, p, fr, "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
			bw := blue.watch(t, 1)
			bw.feed <- append(frame(t, fr, testEvent{"ADDED", "a", "7"}, nil), frame(t, fr, testEvent{"ADDED", "b", "3"}, nil)...)
			c.expect(t, testEvent{"ADDED", "a", "7"})
			c.expect(t, testEvent{"ADDED", "b", "3"})
			bw.feed <- frame(t, fr, testEvent{"BOOKMARK", "", "9"}, map[string]string{initialEventsEnd: "true"})
			c.expect(t, testEvent{"BOOKMARK", "", "9"})
			if sw := switchTo(t, p, green.URL, true); sw.Drain.Resumed != 1 {
				t.Fatalf("drain = %+v", sw.Drain)
			}
			gw := green.watch(t, 1)
			if q := gw.query; q.Get("resourceVersion") != "9" || q.Has("sendInitialEvents") || q.Has("resourceVersionMatch") {
				t.Fatalf("resumed query = %v", q)
			}
			// And green's events reach the client on the same response.
			gw.feed <- frame(t, fr, testEvent{"MODIFIED", "a", "10"}, nil)
			c.expect(t, testEvent{"MODIFIED", "a", "10"})
		})
	}
}

// TestRVTracker checks the parser on what apiservers send: unstructured objects (keys sorted,
// so annotations come before resourceVersion), ERROR events (the apiserver ends the watch after
// one), events split across reads, and bytes that do not parse.
func TestRVTracker(t *testing.T) {
	unstructured := `{"type":"MODIFIED","object":{"apiVersion":"x/v1","kind":"Y","metadata":{"annotations":{"note":"\"resourceVersion\":\"999\""},"name":"n","resourceVersion":"42"}}}` + "\n"
	errorEvent := `{"type":"ERROR","object":{"kind":"Status","code":410,"metadata":{}}}` + "\n"
	cases := []struct {
		name    string
		fr      framing
		reads   []string
		wantRV  string
		wantOK  bool
		initial bool
	}{
		{name: "unstructured", fr: framingJSON, reads: []string{unstructured}, wantRV: "42", wantOK: true},
		{name: "split across reads", fr: framingJSON, reads: []string{unstructured[:20], unstructured[20:90], unstructured[90:]}, wantRV: "42", wantOK: true},
		{name: "ERROR ends the watch", fr: framingJSON, reads: []string{unstructured + errorEvent}, wantOK: false},
		{name: "last of several", fr: framingJSON, reads: []string{errorEvent[:10], errorEvent[10:] + unstructured}, wantRV: "42", wantOK: true},
		{name: "garbage", fr: framingJSON, reads: []string{"{nope\n"}, wantOK: false},
		{name: "protobuf garbage", fr: framingProtobuf, reads: []string{"\x00\x00\x00\x03\xff\xff\xff"}, wantOK: false},
		{name: "nothing delivered", fr: framingJSON, wantRV: "5", wantOK: true},
		{name: "initial events pending", fr: framingJSON, reads: []string{unstructured}, initial: true, wantOK: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWatchBody(io.NopCloser(strings.NewReader(strings.Join(tc.reads, ""))), func() {}, tc.fr)
			w.rv = &rvTracker{fr: tc.fr, start: "5", initialPending: tc.initial}
			for _, r := range tc.reads {
				w.advance([]byte(r))
			}
			rv, ok := w.rv.from()
			if rv != tc.wantRV || ok != tc.wantOK {
				t.Fatalf("from() = %q, %v; want %q, %v (%s)", rv, ok, tc.wantRV, tc.wantOK, w.rv.why())
			}
		})
	}
}

// BenchmarkWatchBody measures what tracking the resourceVersion adds to a watch stream: 1,000
// configmap events (~1 KB each, with managed fields as the apiserver sends them), one event per
// read (the apiserver flushes each), read through a watchBody as ReverseProxy copies them, with
// and without the tracker. It reports the proxy's own cost per event.
func BenchmarkWatchBody(b *testing.B) {
	for _, fr := range framings {
		var events [][]byte
		t := &testing.T{}
		for i := range 1000 {
			cm := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i), Namespace: "default",
				ResourceVersion: fmt.Sprint(1000 + i), Labels: map[string]string{"app": "bench"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: "Update", APIVersion: "v1",
					FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{".":{},"f:a":{}},"f:metadata":{"f:labels":{".":{},"f:app":{}}}}`)}}}},
				Data: map[string]string{"a": strings.Repeat("x", 600)}}
			events = append(events, frameObject(t, fr, "MODIFIED", &cm))
		}
		for _, track := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/track=%v", fr, track), func(b *testing.B) {
				buf := make([]byte, 32<<10)
				b.ReportAllocs()
				for b.Loop() {
					w := newWatchBody(&eventReader{events: events}, func() {}, fr)
					if track {
						w.rv = &rvTracker{fr: fr}
					}
					for {
						if _, err := w.Read(buf); err != nil {
							break
						}
					}
					if rv, _ := w.rv.from(); track && rv != "1999" {
						b.Fatalf("tracked %q (%v)", rv, w.rv.err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
			})
		}
	}
}

// eventReader returns one event per Read.
type eventReader struct{ events [][]byte }

func (r *eventReader) Read(p []byte) (int, error) {
	if len(r.events) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.events[0])
	r.events = r.events[1:]
	return n, nil
}

func (r *eventReader) Close() error { return nil }

// TestWatchBodyInterruptedMidEvent: when the switch closes an idle-looking body just as an
// event arrives, the bytes of the cut event are not passed on (the new backend sends it again
// from the last resourceVersion delivered); whole events before it are.
func TestWatchBodyInterruptedMidEvent(t *testing.T) {
	for _, fr := range framings {
		t.Run(fr.String(), func(t *testing.T) {
			whole := frame(t, fr, testEvent{"ADDED", "a", "10"}, nil)
			cut := frame(t, fr, testEvent{"ADDED", "b", "11"}, nil)
			w := newWatchBody(io.NopCloser(strings.NewReader("")), func() {}, fr)
			w.rv = &rvTracker{fr: fr, start: "5"}
			w.interrupted = true
			chunk := append(append([]byte(nil), whole...), cut[:len(cut)/2]...)
			if n := w.advance(chunk); n != len(whole) {
				t.Fatalf("passed on %d bytes, want %d (the whole event only)", n, len(whole))
			}
			if !w.boundary {
				t.Fatal("not at a boundary after the cut")
			}
			if rv, ok := w.rv.from(); rv != "10" || !ok {
				t.Fatalf("from() = %q, %v; want 10", rv, ok)
			}
		})
	}
}

// TestWatchResumeEndsOnExpired: kube-apiserver answers a watch from a resourceVersion its cache
// no longer holds with 200 and one ERROR event (410 Expired), not with an HTTP 410. A resumed
// watch that the new backend answers so ends cleanly between events: the ERROR is not passed on
// (informers relist as after any end; kubectl get -w ends instead of failing). Status counts it.
func TestWatchResumeEndsOnExpired(t *testing.T) {
	for _, fr := range framings {
		for _, ends := range []bool{false, true} { // the backend ends the response with the ERROR
			t.Run(fmt.Sprintf("%s/response ends %v", fr, ends), func(t *testing.T) {
				blue, green := newWatchAPI(t, "blue", fr), newWatchAPI(t, "green", fr)
				p := startProxy(t, blue.URL)
				c := openWatch(t, p, fr, "resourceVersion=5")
				ev := testEvent{"ADDED", "a", "10"}
				blue.watch(t, 1).feed <- frame(t, fr, ev, nil)
				c.expect(t, ev)
				if sw := switchTo(t, p, green.URL, true); sw.Drain.Resumed != 1 {
					t.Fatalf("drain = %+v, want the watch resumed", sw.Drain)
				}
				gw, expired := green.watch(t, 1), frame(t, fr, testEvent{"ERROR", "", ""}, nil)
				if ends {
					gw.last <- expired
				} else {
					gw.feed <- expired
				}
				c.expectEnd(t)
				// Counted, so that a cutover does not report it as a watch that goes on.
				if st := p.Status(); st.ResumedThenEnded != 1 {
					t.Fatalf("status says %d watch(es) resumed then ended by the new backend, want 1", st.ResumedThenEnded)
				}
			})
		}
	}
}

// TestSwitchDoesNotWaitForTheNewBackend: a resuming switch returns once every watch has left
// the old backend (nothing more of it reaches a client), not once the new backend has answered
// the re-issued watches: that wait, which grows with the watches open through the proxy and with
// how fast the new apiserver takes them, stays out of the write window. The watches then go on
// as before; one the new backend refuses ends cleanly and is counted.
func TestSwitchDoesNotWaitForTheNewBackend(t *testing.T) {
	for _, refused := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused %v", refused), func(t *testing.T) {
			blue, green := newWatchAPI(t, "blue", framingJSON), newWatchAPI(t, "green", framingJSON)
			answer := make(chan struct{})
			green.mu.Lock()
			green.answer = answer
			if refused {
				green.status = http.StatusForbidden
			}
			green.mu.Unlock()
			p := startProxy(t, blue.URL)
			const watches = 5
			clients := openWatches(t, p, blue, watches)
			done := make(chan admin.BackendResponse, 1)
			go func() { done <- switchTo(t, p, green.URL, true) }()
			var sw admin.BackendResponse
			select {
			case sw = <-done:
			case <-time.After(5 * time.Second):
				close(answer)
				t.Fatal("the switch waited for the new backend to answer the re-issued watches")
			}
			if sw.Drain.Resumed != watches || sw.Drain.Ended != 0 {
				t.Fatalf("drain = %+v, want all %d watches moving to green", sw.Drain, watches)
			}
			for i := range watches { // already asked, before it answers
				green.watch(t, i+1)
			}
			close(answer)
			if refused {
				for _, c := range clients {
					c.expectEnd(t)
				}
				waitFor(t, func() bool { return p.Status().ResumedThenEnded == watches })
				return
			}
			sendAll(t, green, clients, testEvent{"MODIFIED", "a", "11"})
			if st := p.Status(); st.OpenStreams != watches || st.ResumedThenEnded != 0 {
				t.Fatalf("status = %+v, want the watches tracked on green", st)
			}
		})
	}
}

// openWatches opens n JSON watches through p from resourceVersion 5, and has blue deliver each
// one event (ADDED a, at 10): each is then resumable from 10.
func openWatches(t *testing.T, p *testProxy, blue *watchAPI, n int) []*watchClient {
	t.Helper()
	clients := make([]*watchClient, n)
	for i := range clients {
		clients[i] = openWatch(t, p, framingJSON, "resourceVersion=5")
		blue.watch(t, i+1).feed <- frame(t, framingJSON, testEvent{"ADDED", "a", "10"}, nil)
		clients[i].expect(t, testEvent{"ADDED", "a", "10"})
	}
	return clients
}

// sendAll has api send ev on its first len(clients) watches (they came in any order) and
// checks that every client gets it.
func sendAll(t *testing.T, api *watchAPI, clients []*watchClient, ev testEvent) {
	t.Helper()
	for i := range clients {
		api.watch(t, i+1).feed <- frame(t, framingJSON, ev, nil)
	}
	for _, c := range clients {
		c.expect(t, ev)
	}
}

// TestMain shortens how long a moved watch waits for the fence to lift: most tests switch
// without lifting it and would each wait the production 5 s (TestMovedWatchesWaitForTheFence
// sets it back).
func TestMain(m *testing.M) {
	resumeDeferral = 50 * time.Millisecond
	os.Exit(m.Run())
}

// TestMovedWatchesWaitForTheFence: watches a switch moved ask the new backend once the fence
// lifts, not inside the window (where the new apiserver answering them would slow the steps
// left); with the fence left on, they ask it anyway after resumeDeferral.
func TestMovedWatchesWaitForTheFence(t *testing.T) {
	defer func(d time.Duration) { resumeDeferral = d }(resumeDeferral)
	for _, lift := range []bool{true, false} {
		t.Run(fmt.Sprintf("fence lifted %v", lift), func(t *testing.T) {
			resumeDeferral = time.Hour
			if !lift {
				resumeDeferral = 300 * time.Millisecond
			}
			blue, green := newWatchAPI(t, "blue", framingJSON), newWatchAPI(t, "green", framingJSON)
			p := startProxy(t, blue.URL)
			c := openWatches(t, p, blue, 1)[0]
			switched := time.Now()
			if sw := switchTo(t, p, green.URL, true); sw.Drain.Resumed != 1 {
				t.Fatalf("drain = %+v", sw.Drain)
			}
			if lift {
				time.Sleep(200 * time.Millisecond)
				if n := green.count(); n != 0 {
					t.Fatalf("green was asked for %d watch(es) while the fence was on", n)
				}
				if st := p.Status(); st.ResumesPending != 1 {
					t.Fatalf("status says %d moved watch(es) waiting, want 1", st.ResumesPending)
				}
				if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
					t.Fatal(err)
				}
			}
			green.watch(t, 1).feed <- frame(t, framingJSON, testEvent{"MODIFIED", "a", "11"}, nil)
			c.expect(t, testEvent{"MODIFIED", "a", "11"})
			if waited := time.Since(switched); !lift && waited < resumeDeferral {
				t.Fatalf("the watch was re-issued %s after the switch, the fence on: want no sooner than %s", waited, resumeDeferral)
			}
		})
	}
}

// TestMovedWatchesAskAFewAtATime: at most resumeConcurrency moved watches wait for the new
// backend's answer at once, so that the writes released at the unfence do not queue behind
// every watch of the proxy asking at the same moment.
func TestMovedWatchesAskAFewAtATime(t *testing.T) {
	blue, green := newWatchAPI(t, "blue", framingJSON), newWatchAPI(t, "green", framingJSON)
	answer := make(chan struct{})
	green.mu.Lock()
	green.answer = answer
	green.mu.Unlock()
	p := startProxy(t, blue.URL)
	const watches = resumeConcurrency + 8
	clients := openWatches(t, p, blue, watches)
	switchTo(t, p, green.URL, true) // the fence stays on: they ask after resumeDeferral
	waitFor(t, func() bool { return green.count() == resumeConcurrency })
	time.Sleep(200 * time.Millisecond)
	if n := green.count(); n != resumeConcurrency {
		t.Fatalf("green was asked for %d watches at once, want %d", n, resumeConcurrency)
	}
	close(answer)
	waitFor(t, func() bool { return green.count() == watches })
	sendAll(t, green, clients, testEvent{"MODIFIED", "a", "11"})
}

// TestMovedWatchEndsWhenTheNewBackendHangs: a new backend that never answers a moved watch
// does not keep its client's stream silent for good, nor a resume slot taken: after
// resumeAnswerTimeout the watch ends cleanly and is counted.
func TestMovedWatchEndsWhenTheNewBackendHangs(t *testing.T) {
	defer func(d time.Duration) { resumeAnswerTimeout = d }(resumeAnswerTimeout)
	resumeAnswerTimeout = 200 * time.Millisecond
	blue, green := newWatchAPI(t, "blue", framingJSON), newWatchAPI(t, "green", framingJSON)
	green.mu.Lock()
	green.answer = make(chan struct{}) // never closed
	green.mu.Unlock()
	p := startProxy(t, blue.URL)
	c := openWatches(t, p, blue, 1)[0]
	switchTo(t, p, green.URL, true)
	c.expectEnd(t)
	if st := p.Status(); st.ResumedThenEnded != 1 || st.ResumesPending != 0 || len(p.active.Load().resumeSlots) != 0 {
		t.Fatalf("status %+v, %d slot(s) taken; want the watch counted as ended by green, none pending, no slot taken", st, len(p.active.Load().resumeSlots))
	}
}

// TestSwitchAwayFromPendingWatches: watches moved to a backend the proxy switches away from
// before they asked it (a partial switch undone, a quick rollback) end cleanly at once, without
// asking the backend the proxy left.
func TestSwitchAwayFromPendingWatches(t *testing.T) {
	defer func(d time.Duration) { resumeDeferral = d }(resumeDeferral)
	resumeDeferral = time.Hour
	blue, green := newWatchAPI(t, "blue", framingJSON), newWatchAPI(t, "green", framingJSON)
	p := startProxy(t, blue.URL)
	c := openWatches(t, p, blue, 1)[0]
	switchTo(t, p, green.URL, true)
	if _, err := p.admin.SetBackend(t.Context(), admin.BackendRequest{URL: blue.URL, ResumeWatches: true}); err != nil {
		t.Fatal(err)
	}
	c.expectEnd(t)
	if n := green.count(); n != 0 {
		t.Fatalf("green, switched away from, was asked for %d watch(es)", n)
	}
}

// TestRVTrackerKeepsLittle: an event larger than what the tracker keeps, arriving over many
// reads, is not kept for the watch's life once it has passed: thousands of watches on one
// large object would otherwise hold a copy each.
func TestRVTrackerKeepsLittle(t *testing.T) {
	big := `{"type":"MODIFIED","object":{"metadata":{"name":"n","resourceVersion":"41"},"data":{"x":"` + strings.Repeat("x", 800<<10) + `"}}}` + "\n"
	next := `{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"42"}}}` + "\n"
	w := newWatchBody(io.NopCloser(strings.NewReader("")), func() {}, framingJSON)
	w.rv = &rvTracker{fr: framingJSON, start: "5"}
	for i := 0; i < len(big); i += 16 << 10 {
		w.advance([]byte(big[i:min(i+16<<10, len(big))]))
	}
	w.advance([]byte(next))
	if c := cap(w.rv.cur) + cap(w.rv.last); c > 2*maxKeptEvent {
		t.Fatalf("the tracker keeps %d bytes after an %d-byte event passed, want at most %d", c, len(big), 2*maxKeptEvent)
	}
	if rv, ok := w.rv.from(); rv != "42" || !ok {
		t.Fatalf("from() = %q, %v", rv, ok)
	}
}

// TestBusyWatchMovesAtAnEventEnd: a busy watch whose backend reads never end exactly at an event
// boundary (kube-apiserver flushes only when its queue is empty, and a client slower than the
// stream gets reads out of a backlog) is still moved at a switch, not cut mid-event at the drain
// timeout: the read is cut back to its last whole event, and what followed comes again from the
// new backend (resumed from the last resourceVersion delivered) or the client's own re-watch.
func TestBusyWatchMovesAtAnEventEnd(t *testing.T) {
	for _, fr := range framings {
		for _, resume := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/resume=%v", fr, resume), func(t *testing.T) {
				blue, green := newWatchAPI(t, "blue", fr), newWatchAPI(t, "green", fr)
				p := startProxy(t, blue.URL)
				c := openWatch(t, p, fr, "resourceVersion=5")
				stop := busyFeed(t, fr, blue.watch(t, 1))
				c.expect(t, testEvent{"MODIFIED", "a", "10"})
				sw := switchTo(t, p, green.URL, resume)
				close(stop)
				if sw.Drain.Forced != 0 || sw.Drain.Streams != 1 {
					t.Fatalf("drain = %+v, want the busy watch moved without being cut", sw.Drain)
				}
				if resume {
					green.watch(t, 1).feed <- frame(t, fr, testEvent{"ADDED", "b", "1000"}, nil)
				}
				last := "10"
				for {
					got, err := c.next()
					if err == io.EOF && !resume {
						break
					}
					if err != nil {
						t.Fatalf("after resourceVersion %s: %v (drain %+v)", last, err, sw.Drain)
					}
					if got.name == "b" {
						break
					}
					last = got.rv
				}
				switch {
				case !resume && green.count() != 0:
					t.Fatal("a switch without resume re-issued the watch")
				case resume && green.watch(t, 1).query.Get("resourceVersion") != last:
					t.Fatalf("green asked from resourceVersion %s, the client's last event from blue is %s", green.watch(t, 1).query.Get("resourceVersion"), last)
				}
			})
		}
	}
}

// busyFeed sends events 10, 11, … to a backend watch, every 10 ms, each write the tail of one
// event and the head of the next: no read ends at an event boundary. Close the channel it returns
// to stop it.
func busyFeed(t *testing.T, fr framing, w *apiWatch) chan struct{} {
	stop := make(chan struct{})
	var tail []byte
	send := func(i int) bool {
		ev := frame(t, fr, testEvent{"MODIFIED", "a", fmt.Sprint(10 + i)}, nil)
		select {
		case w.feed <- append(tail, ev[:len(ev)/2]...):
		case <-stop:
			return false
		}
		tail = ev[len(ev)/2:]
		return true
	}
	go func() {
		for i := 0; send(i); i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return stop
}

// TestWatchEndRacingAnEvent: a switch that ends an idle watch (at a boundary) cancels its
// request; a Read already blocked in the backend's body may still return the head of a new
// event first. Those bytes are not passed on: the client gets a clean end, not a cut event (its
// re-watch gets that event again).
func TestWatchEndRacingAnEvent(t *testing.T) {
	ends := map[string]func(*watchBody) departure{
		"end":                        (*watchBody).endAtBoundary,
		"resuming switch, no resume": func(w *watchBody) departure { return w.moveTo(nil, false) }, // a watch that cannot be resumed ends
	}
	for _, fr := range framings {
		for how, end := range ends {
			t.Run(fr.String()+"/"+how, func(t *testing.T) { watchEndRacingAnEvent(t, fr, end) })
		}
	}
}

func watchEndRacingAnEvent(t *testing.T, fr framing, end func(*watchBody) departure) {
	ev := frame(t, fr, testEvent{"ADDED", "b", "11"}, nil)
	arrived, release := make(chan struct{}), make(chan struct{})
	rc := &gatedReader{arrived: arrived, release: release, data: ev[:len(ev)/2]}
	w := newWatchBody(rc, func() {}, fr)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(w)
		got <- b
	}()
	<-arrived // the Read is in the backend's body, the watch idle at a boundary
	if end(w) == departCut {
		t.Fatal("refused a known framing")
	}
	close(release) // the head of an event comes out before the cancel is noticed
	select {
	case b := <-got:
		if len(b) != 0 {
			t.Fatalf("the client got %q after the end, want nothing", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end")
	}
}

// gatedReader says when a Read arrives, returns data once released, then io.EOF (as the
// cancelled request's body would).
type gatedReader struct {
	arrived, release chan struct{}
	data             []byte
	once             sync.Once
	done             bool
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.done {
		return 0, io.EOF
	}
	g.once.Do(func() { close(g.arrived) })
	<-g.release
	g.done = true
	return copy(p, g.data), nil
}

func (g *gatedReader) Close() error { return nil }

// TestTakeSlotLosesToLeaving: a moved watch never takes a slot to ask a backend the proxy has
// begun to leave, nor one for a client already gone, even when a slot is free: select picks at
// random among the cases ready, so it sometimes did (one wasted request to a backend left).
func TestTakeSlotLosesToLeaving(t *testing.T) {
	cases := []struct {
		name    string
		leaving bool
		gone    bool
		want    bool
	}{
		{name: "a free slot", want: true},
		{name: "the backend being left", leaving: true},
		{name: "the client gone", gone: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nb, err := newBackend("http://127.0.0.1:1", "", TransportOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.leaving {
				close(nb.leaving)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.gone {
				cancel()
			}
			for i := range 200 {
				if got := takeSlot(ctx, nb, nb.resumeSlots); got != tc.want {
					t.Fatalf("try %d: takeSlot = %v, want %v", i, got, tc.want)
				}
				if tc.want {
					<-nb.resumeSlots
				}
				if n := len(nb.resumeSlots); n != 0 {
					t.Fatalf("try %d: %d slot(s) left taken", i, n)
				}
			}
		})
	}
}

// TestResumeKeepsTheWatchTimeout: a watch asked with timeoutSeconds is resumed with what is
// left of it, so that the client sees its watch end when it asked (a reflector's 5-10 min
// watches; it was resumed with the whole timeout again, outliving it by up to as long); one
// whose time is up by the resume ends as its apiserver would have ended it.
func TestResumeKeepsTheWatchTimeout(t *testing.T) {
	for _, tc := range []struct {
		timeout string
		resumed bool
	}{{"5", true}, {"1", false}} {
		t.Run("timeoutSeconds="+tc.timeout, func(t *testing.T) {
			blue, green := newWatchAPI(t, "blue", framingJSON), newWatchAPI(t, "green", framingJSON)
			p := startProxy(t, blue.URL)
			c := openWatch(t, p, framingJSON, "resourceVersion=5&timeoutSeconds="+tc.timeout)
			sendOne(t, blue, 1, c, framingJSON, testEvent{"ADDED", "a", "10"})
			time.Sleep(1200 * time.Millisecond)
			sw := switchTo(t, p, green.URL, true)
			if sw.Drain.Resumed != 1 {
				t.Fatalf("drain = %+v, want the watch moved", sw.Drain)
			}
			if _, err := p.admin.Fence(t.Context(), admin.FenceRequest{Fenced: false}); err != nil {
				t.Fatal(err)
			}
			if !tc.resumed {
				c.expectEnd(t)
				if n := green.count(); n != 0 {
					t.Fatalf("green was asked %d watch(es) for a watch whose timeout had passed", n)
				}
				return
			}
			gw := green.watch(t, 1)
			// 5 less the 1.2 s gone, rounded down: 3, or less on a slow machine, never 5 again.
			if got, err := strconv.Atoi(gw.query.Get("timeoutSeconds")); err != nil || got < 1 || got > 3 {
				t.Fatalf("green was asked timeoutSeconds=%q, want 1-3 of the 5 asked", gw.query.Get("timeoutSeconds"))
			}
		})
	}
}

// TestEncodedWatchHasNoBoundaries: a watch answer with a Content-Encoding (gzip, as
// kube-apiserver's watch-list compression would send) carries no event boundary the proxy can
// see: it is not resumed, and a switch cuts it rather than "end" it at a newline byte inside
// compressed data (the client's gzip reader then fails mid-member either way, but the proxy no
// longer claims a clean end). A resumed answer that comes encoded is refused: the client reads
// one stream.
func TestEncodedWatchHasNoBoundaries(t *testing.T) {
	for _, tc := range []struct {
		ct, enc string
		want    framing
	}{
		{"application/json", "", framingJSON},
		{"application/json", "gzip", framingUnknown},
		{"application/vnd.kubernetes.protobuf;stream=watch", "", framingProtobuf},
		{"application/vnd.kubernetes.protobuf;stream=watch", "gzip", framingUnknown},
	} {
		h := http.Header{"Content-Type": {tc.ct}}
		if tc.enc != "" {
			h.Set("Content-Encoding", tc.enc)
		}
		if got := streamFraming(h); got != tc.want {
			t.Errorf("%s, Content-Encoding %q: framing %v, want %v", tc.ct, tc.enc, got, tc.want)
		}
	}
	ri := &resumeInfo{contentType: "application/json"}
	resp := &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Header: http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}}
	if err := ri.acceptable(resp); err == nil {
		t.Error("a resumed answer in gzip was accepted onto a plain stream")
	}
}

// TestBatchSkip: a watch re-issued from the revision before the one its client had part of
// drops exactly the events of that revision its client has, passes the others, and from the
// first event after that revision passes everything, however the bytes come in.
func TestBatchSkip(t *testing.T) {
	for _, fr := range framings {
		t.Run(fr.String(), func(t *testing.T) {
			var in []byte
			for _, ev := range []testEvent{{"DELETED", "a", "10"}, {"DELETED", "e", "10"}, {"DELETED", "b", "10"}, {"ADDED", "c", "11"}, {"MODIFIED", "a", "12"}} {
				in = append(in, frame(t, fr, ev, nil)...)
			}
			s := &batchSkip{rc: io.NopCloser(iotest.OneByteReader(bytes.NewReader(in))), fr: fr, rv: 10,
				skip: []eventKey{{"default", "a"}, {"default", "b"}}}
			c := &watchClient{fr: fr, body: s, r: bufio.NewReader(s)}
			for _, want := range []testEvent{{"DELETED", "e", "10"}, {"ADDED", "c", "11"}, {"MODIFIED", "a", "12"}} {
				c.expect(t, want)
			}
			c.expectEnd(t)
		})
	}
}
