package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// Resuming past the new backend's watch cache. kube-apiserver serves watches from a cache that
// begins at the revision its apiserver listed when it started, S, and answers a watch from an
// older resourceVersion R with one ERROR event, 410 Expired, "too old resource version: R (S)".
// A moved watch of a resource nothing changed lately (most of a controller manager's
// informers) holds such an R: the last event or bookmark blue sent it. The revisions being the
// same on both backends, the proxy lists the watched collection (its path and selectors,
// metadata only) on the new backend exactly at R and at S: when both hold the same objects at
// the same resourceVersions, the watch is re-issued from S, on the same stream; everything after
// S the new backend's watch delivers. S must be at most the newest revision an event from the old
// backend carried, on any watch moved, before the switch (deliveredBefore): the old backend had
// then reached S, and any event of this watch in (R, S] it would have delivered too, moving the
// watch past R. That covers what the lists cannot see: an object created and deleted again
// inside (R, S], or one that entered the selector and left it again (short of the old backend
// holding this watch's events undelivered while it sent others'; a relist would not show them
// either). A cache that began after that revision (it relisted after the switch, or dropped the
// events since) ends the watch. So do a difference, or a list that cannot be had (the revision
// compacted, the list refused): its client relists, as before.

// noteDelivered records rv, the resourceVersion of the last event a watch moved to b had from
// the old backend, in b.deliveredBefore (the newest of them).
func (b *backend) noteDelivered(rv string) {
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return
	}
	for {
		cur := b.deliveredBefore.Load()
		if n <= cur || b.deliveredBefore.CompareAndSwap(cur, n) {
			return
		}
	}
}

// expiredError is what a resumed watch's first-event guard returns when the new backend ended
// the watch with 410 Expired, naming the oldest revision its cache holds.
type expiredError struct{ asked, oldest string }

func (e *expiredError) Error() string {
	return "the new backend answered the resumed watch with 410 Expired (its watch cache begins at " + e.oldest + ")"
}

// expiredMessage is kube-apiserver's 410 on a watch older than its cache: the watch's
// resourceVersion, and the revision the cache begins at.
var expiredMessage = regexp.MustCompile(`too old resource version: (\d+) \((\d+)\)`)

// pastExpiryChecks bounds the collections a backend is asked to list at once; it is smaller
// than resumeConcurrency, and separate, so that the lists never keep the other moved watches
// from asking.
const pastExpiryChecks = 8

// metaPageLimit is the page size of the lists that compare a collection at two revisions.
const metaPageLimit = 100

// maxMetaPage bounds the bytes read of one page (from a backend that ignores limit, or objects
// with large annotations): a larger page ends the watch instead.
const maxMetaPage = 8 << 20

// metaListAccept asks for the objects' metadata only (any backend that cannot falls back to
// its JSON list, which has the same shape).
const metaListAccept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"

// resumePastExpiry is Read's answer to an *expiredError: it compares the watched collection at
// the watch's resourceVersion and at oldest on the new backend, and when they match re-issues
// the watch from oldest and makes its body the stream's (invariant watch-resume-past-expiry).
// Meanwhile the watch is tracked nowhere, as a moved watch is before the new backend answers
// it: a switch away from the new backend neither waits for it nor moves it (it ends). It
// returns true when Read should go on (the watch re-issued, or a switch began to move it before
// this started), false when the watch ends.
func (w *watchBody) resumePastExpiry(exp *expiredError) bool {
	oldest := exp.oldest
	ri := w.resume
	nb := ri.on
	w.mu.Lock()
	if w.draining {
		w.mu.Unlock()
		return true
	}
	rv, ok := w.rv.from()
	asked := w.asked
	var had []eventKey // asked from the revision before rv: the events of rv the client has
	if ok && asked != rv {
		had = slices.Clone(w.rv.atRV)
	}
	ri.untrack()
	w.mu.Unlock()
	log := ri.log.With("path", ri.req.URL.Path, "to", nb.url.String(), "resourceVersion", rv, "oldest", oldest)
	nb.resumesPending.Add(1)
	defer nb.resumesPending.Add(-1)
	var resp *http.Response
	var err error
	switch {
	case !ok:
		err = errors.New(w.rv.why())
	case exp.asked != asked:
		err = fmt.Errorf("the 410 names resourceVersion %s, not the one the watch asked from (%s)", exp.asked, asked)
	case ri.lapsed():
		err = errors.New("the client's certificate no longer verifies")
	default:
		resp, err = reissuePastExpiry(ri, nb, rv, oldest, had)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.draining {
		// A switch away from nb took the watch in its drain before the lists untracked it:
		// Read moves it on, or ends it, as that switch asked.
		if resp != nil {
			_ = resp.Body.Close()
		}
		return true
	}
	if err == nil {
		err = nb.track(ri.s) // fails once a switch away from nb began
	}
	if err != nil {
		if resp != nil {
			_ = resp.Body.Close()
		}
		if ri.req.Context().Err() == nil && !closed(nb.leavingCh()) {
			nb.resumedThenEnded.Add(1)
		}
		log.Info("watch resumed, then ended by the new backend (410 Expired: its watch cache begins after the watch's resourceVersion) and not provably unchanged since; ended cleanly", "reason", err)
		return false
	}
	_ = w.rc.Close() // the 410's body
	// No lists when the cache begins at the watch's own revision: a resume, not past expiry.
	if oldest == rv {
		w.rc = &firstEventGuard{rc: resp.Body, fr: w.fr, log: log, ended: &nb.resumedThenEnded}
		log.Info("watch resumed from its own resourceVersion, where the new backend's watch cache begins")
		return true
	}
	w.rc = &firstEventGuard{rc: resp.Body, fr: w.fr, log: log, ended: &nb.resumedThenEnded, undo: &nb.resumedPastExpiry}
	w.rv.rv, w.rv.cur = oldest, w.rv.cur[:0]
	w.rv.atRV, w.rv.atRVKnown, w.rv.bookmarked = w.rv.atRV[:0], true, true // as after a BOOKMARK at oldest
	nb.resumedPastExpiry.Add(1)
	log.Info("watch resumed from the revision the new backend's watch cache begins at: the watched collection is the same there as at the watch's resourceVersion")
	return true
}

// reissuePastExpiry takes one of nb's check slots, checks that the collection ri watches is
// the same on nb at rv and at oldest, and re-issues the watch from oldest. had, when the watch
// asked from the revision before rv (it moved after some of rv's events: rvTracker.batch),
// are the objects whose events at rv its client has: the lists must show they are all rv
// changed, else the rest of rv's events, which no watch from oldest sends, would be lost.
func reissuePastExpiry(ri *resumeInfo, nb *backend, rv, oldest string, had []eventKey) (*http.Response, error) {
	from, err1 := strconv.ParseUint(rv, 10, 64)
	to, err2 := strconv.ParseUint(oldest, 10, 64)
	switch {
	case err1 != nil || err2 != nil || from > to:
		return nil, fmt.Errorf("the backend's cache begins at %q, not at a revision after the watch's resourceVersion %q", oldest, rv)
	case from == to && had == nil:
		return reissueChecked(ri, nb, rv) // nothing to compare: the watch's own revision
	case from < to && to > nb.deliveredBefore.Load():
		// Its cache began (or began again) after what the old backend is known to have
		// delivered before the switch: events between may have reached no watch.
		return nil, fmt.Errorf("the backend's cache begins at %s, after %d, the newest revision the old backend delivered to a moved watch", oldest, nb.deliveredBefore.Load())
	}
	ctx, cancel := context.WithCancel(ri.req.Context())
	defer cancel()
	go func() { // a switch away from nb: the lists are for nothing
		select {
		case <-nb.leavingCh():
			cancel()
		case <-ctx.Done():
		}
	}()
	if !takeSlot(ctx, nb, nb.checkSlots) {
		return nil, errors.New("its client left, or the proxy switched away from the new backend")
	}
	defer func() { <-nb.checkSlots }()
	if ri.lapsed() { // the lists and the watch go in the client's name: checked again after the wait
		return nil, errors.New("the client's certificate no longer verifies")
	}
	listCtx, cancelList := context.WithTimeoutCause(ctx, resumeAnswerTimeout, fmt.Errorf("the lists took over %s", resumeAnswerTimeout))
	defer cancelList()
	if err := comparePastExpiry(listCtx, ri, nb, from, to, had); err != nil {
		return nil, err
	}
	if left, ok := ri.timeoutLeft(); ok && left <= 0 {
		return nil, errors.New("its timeoutSeconds passed while the proxy listed")
	}
	return reissueChecked(ri, nb, oldest)
}

// comparePastExpiry makes the lists reissuePastExpiry needs: at rv-1 and rv when had is set
// (rv changed only objects in had), then at rv and oldest (the same there) when they differ.
func comparePastExpiry(ctx context.Context, ri *resumeInfo, nb *backend, rv, oldest uint64, had []eventKey) error {
	if had != nil {
		if err := revisionHad(ctx, ri, nb, rv, had); err != nil {
			return err
		}
	}
	if rv == oldest {
		return nil
	}
	return sameAt(ctx, ri, nb, strconv.FormatUint(rv, 10), strconv.FormatUint(oldest, 10))
}

// reissueChecked re-issues the watch ri to nb from rv and checks nb's answer.
func reissueChecked(ri *resumeInfo, nb *backend, rv string) (*http.Response, error) {
	resp, err := reissue(ri, nb, rv)
	if err != nil {
		return nil, err
	}
	if err := ri.acceptable(resp); err != nil {
		_ = resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// metaItem is what the comparison looks at of one object.
type metaItem struct {
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
}

// metaPage is one page of a list, as much of it as the comparison reads.
type metaPage struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata metaItem `json:"metadata"`
	} `json:"items"`
}

// sameAt lists the collection ri watches on nb exactly at a and at b, page by page (both in
// key order), and returns nil when the two hold the same objects at the same resourceVersions.
func sameAt(ctx context.Context, ri *resumeInfo, nb *backend, a, b string) error {
	then, now, err := collectionAt(ctx, ri, nb, a, b)
	if err != nil {
		return err
	}
	return eachChanged(then, now, func(k metaItem) error {
		return fmt.Errorf("the collection differs between %s and %s (%s/%s)", a, b, k.Namespace, k.Name)
	})
}

// revisionHad lists the collection ri watches on nb exactly at rv-1 and at rv, page by page
// (both in etcd's key order), and returns nil when every object revision rv created, changed
// or deleted there is one of had.
func revisionHad(ctx context.Context, ri *resumeInfo, nb *backend, rv uint64, had []eventKey) error {
	then, now, err := collectionAt(ctx, ri, nb, strconv.FormatUint(rv-1, 10), strconv.FormatUint(rv, 10))
	if err != nil {
		return err
	}
	return eachChanged(then, now, func(k metaItem) error {
		if slices.Contains(had, eventKey{k.Namespace, k.Name}) {
			return nil
		}
		return fmt.Errorf("revision %d changed %s/%s, whose event at %d the watch had not delivered when it moved", rv, k.Namespace, k.Name, rv)
	})
}

// eachChanged walks two lists of one collection in key order and calls changed with each
// object they do not hold alike (in one only, or at another resourceVersion), until it returns
// an error.
func eachChanged(then, now *listCursor, changed func(metaItem) error) error {
	x, more, err := then.next()
	if err != nil {
		return err
	}
	y, moreNow, err := now.next()
	if err != nil {
		return err
	}
	for more || moreNow {
		c := compareKeys(x, y, more, moreNow)
		if c != 0 || x.ResourceVersion != y.ResourceVersion {
			if err := changed(map[bool]metaItem{true: x, false: y}[c < 0]); err != nil {
				return err
			}
		}
		if c <= 0 {
			if x, more, err = then.next(); err != nil {
				return err
			}
		}
		if c >= 0 {
			if y, moreNow, err = now.next(); err != nil {
				return err
			}
		}
	}
	return nil
}

// compareKeys orders two items of lists in etcd's key order (namespace, "/", name), an item
// past the end of its list (ok false) after every other: negative when x comes first.
func compareKeys(x, y metaItem, xok, yok bool) int {
	switch {
	case !yok:
		return -1
	case !xok:
		return 1
	}
	return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
}

// collectionAt is a cursor over the collection ri watches on nb listed exactly at a, and one
// at b, with the watch's selectors.
func collectionAt(ctx context.Context, ri *resumeInfo, nb *backend, a, b string) (*listCursor, *listCursor, error) {
	if legacyWatchPath(ri.req.URL.Path) {
		return nil, nil, errors.New("a watch on the legacy /watch/ path: no collection to list")
	}
	base := url.Values{"limit": {strconv.Itoa(metaPageLimit)}}
	q := ri.req.URL.Query()
	for _, k := range []string{"labelSelector", "fieldSelector", "shardSelector"} {
		if v := q.Get(k); v != "" {
			base.Set(k, v)
		}
	}
	get := func(q url.Values) (*metaPage, error) { return listPage(ctx, ri, nb, q) }
	at := func(rv string) *listCursor {
		return &listCursor{get: get, base: base, rv: rv, first: url.Values{"resourceVersion": {rv}, "resourceVersionMatch": {"Exact"}}}
	}
	return at(a), at(b), nil
}

// legacyWatchPath reports a path of the deprecated form /api/v1/watch/... or
// /apis/GROUP/VERSION/watch/...
func legacyWatchPath(p string) bool {
	segs := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case len(segs) > 2 && segs[0] == "api":
		return segs[2] == "watch"
	case len(segs) > 3 && segs[0] == "apis":
		return segs[3] == "watch"
	}
	return false
}

// listCursor walks one list's items across its pages.
type listCursor struct {
	get         func(url.Values) (*metaPage, error)
	base, first url.Values // every page's query; the first page's own parameters
	rv          string     // the resourceVersion every page must be answered at
	page        *metaPage
	i           int
}

// next returns the next item, or false after the last; an error says which list it is of.
func (c *listCursor) next() (metaItem, bool, error) {
	it, ok, err := c.step()
	if err != nil {
		return metaItem{}, false, fmt.Errorf("list at %s: %w", c.rv, err)
	}
	return it, ok, nil
}

// step is next, its error not yet naming the list.
func (c *listCursor) step() (metaItem, bool, error) {
	for c.page == nil || c.i == len(c.page.Items) {
		q := url.Values{}
		for k, v := range c.base {
			q[k] = v
		}
		switch {
		case c.page == nil:
			for k, v := range c.first {
				q[k] = v
			}
		case c.page.Metadata.Continue == "":
			return metaItem{}, false, nil
		default:
			q.Set("continue", c.page.Metadata.Continue)
		}
		page, err := c.get(q)
		if err != nil {
			return metaItem{}, false, err
		}
		if page.Metadata.ResourceVersion != c.rv {
			// A backend that does not list at an exact revision would compare now with now.
			return metaItem{}, false, fmt.Errorf("answered at resourceVersion %q, not %s", page.Metadata.ResourceVersion, c.rv)
		}
		c.page, c.i = page, 0
	}
	c.i++
	return c.page.Items[c.i-1].Metadata, true, nil
}

// listPage GETs one page of the collection ri watches from nb, in the client's name as the
// watch itself went, metadata only.
func listPage(ctx context.Context, ri *resumeInfo, nb *backend, q url.Values) (*metaPage, error) {
	out := ri.req.Clone(ctx)
	out.Method = http.MethodGet
	out.URL.Scheme, out.URL.Host, out.URL.RawQuery = nb.url.Scheme, nb.url.Host, q.Encode()
	out.Host = ""
	out.Body, out.GetBody, out.ContentLength = nil, nil, 0
	out.Header.Set("Accept", metaListAccept)
	out.Header.Del("Accept-Encoding") // an uncompressed answer (the transport passes encodings through)
	out.Header.Del("Content-Type")
	out.Header.Del("Audit-Id") // the client's own audit ID belongs to its watch, not to these lists
	resp, err := nb.transportFor(ri.identity, &reqStateFrom(ri.req.Context()).attrs).RoundTrip(out)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || mt != "application/json" {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s, %s: %s", resp.Status, resp.Header.Get("Content-Type"), bytes.TrimSpace(msg))
	}
	var page metaPage
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxMetaPage)).Decode(&page); err != nil {
		return nil, fmt.Errorf("list page (up to %d bytes read): %w", maxMetaPage, err)
	}
	return &page, nil
}

// expiredEvent reads a watch's ERROR event: when it carries 410 (Gone: Expired) with
// kube-apiserver's message for a watch older than its cache, it returns the resourceVersion
// the watch asked from and the revision the cache begins at.
func expiredEvent(fr framing, ev []byte) (*expiredError, bool) {
	code, msg := statusOf(fr, ev)
	if code != http.StatusGone {
		return nil, false
	}
	m := expiredMessage.FindStringSubmatch(msg)
	if m == nil {
		return nil, false
	}
	return &expiredError{asked: m[1], oldest: m[2]}, true
}

// statusOf returns the code and message of an ERROR event's Status (zero when it has none).
func statusOf(fr framing, ev []byte) (uint64, string) {
	if fr == framingJSON {
		var v struct {
			Object struct {
				Code    uint64 `json:"code"`
				Message string `json:"message"`
			} `json:"object"`
		}
		if json.Unmarshal(ev, &v) != nil {
			return 0, ""
		}
		return v.Object.Code, v.Object.Message
	}
	if len(ev) < 4 {
		return 0, ""
	}
	status, err := eventObject(ev[4:])
	if err != nil {
		return 0, ""
	}
	msg, _, err := protoField(status, fieldStatusMessage)
	if err != nil {
		return 0, ""
	}
	return protoVarint(status, fieldStatusCode), string(msg)
}

// Fields of metav1.Status.
const (
	fieldStatusMessage = 3
	fieldStatusCode    = 6
)

// protoVarint returns the last varint field num of m, 0 when absent or m does not parse.
func protoVarint(m []byte, num protowire.Number) uint64 {
	var val uint64
	for len(m) > 0 {
		n, typ, k := protowire.ConsumeTag(m)
		if k < 0 {
			return 0
		}
		m = m[k:]
		if n == num && typ == protowire.VarintType {
			v, k := protowire.ConsumeVarint(m)
			if k < 0 {
				return 0
			}
			val, m = v, m[k:]
			continue
		}
		if k = protowire.ConsumeFieldValue(n, typ, m); k < 0 {
			return 0
		}
		m = m[k:]
	}
	return val
}
