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
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// Resuming past the new backend's watch cache. kube-apiserver serves watches from a cache that
// begins at the revision its apiserver listed when it started, and answers a watch from an
// older resourceVersion with one ERROR event, 410 Expired. A moved watch of a resource nothing
// changed lately (most of a controller manager's informers) holds such a resourceVersion: the
// last event or bookmark blue sent it. The revisions being the same on both backends, the proxy
// can still tell whether anything happened to that watch since: it lists the watched collection
// (its path and selectors, metadata only) on the new backend exactly at the watch's
// resourceVersion and now, and when both hold the same objects at the same resourceVersions,
// no event of the watch lies between the two (a creation, change or deletion changes one or the
// other), so the watch goes on from now, on the same stream. On any difference, or when a list
// cannot be had (the revision compacted, the list refused), the watch ends as before, and its
// client relists.

// errResumeExpired is what a resumed watch's first-event guard returns when the new backend
// ended the watch with 410 Expired and the proxy may try resumePastExpiry.
var errResumeExpired = errors.New("the new backend answered the resumed watch with 410 Expired")

// metaPageLimit is the page size of the lists that compare a collection at two revisions.
const metaPageLimit = 500

// maxMetaPage bounds the bytes read of one page (from a backend that ignores limit).
const maxMetaPage = 32 << 20

// metaListAccept asks for the objects' metadata only (any backend that cannot falls back to
// its JSON list, which has the same shape).
const metaListAccept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"

// resumePastExpiry is Read's answer to errResumeExpired: it compares the watched collection at
// the watch's resourceVersion and now on the new backend, and when they match re-issues the
// watch from now and makes its body the stream's. It returns true when Read should go on (the
// watch re-issued, or a switch away from the new backend began meanwhile: Read then moves or
// ends it), false when the watch ends.
func (w *watchBody) resumePastExpiry() bool {
	ri := w.resume
	nb := ri.on
	w.mu.Lock()
	rv, ok := w.rv.from()
	moving := w.draining
	w.mu.Unlock()
	if moving {
		return true
	}
	log := ri.log.With("path", ri.req.URL.Path, "to", nb.url.String(), "resourceVersion", rv)
	nb.resumesPending.Add(1)
	defer nb.resumesPending.Add(-1)
	var now string
	var resp *http.Response
	err := errors.New(w.rv.why())
	if ok {
		now, resp, err = reissuePastExpiry(ri, nb, rv)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.draining {
		if resp != nil {
			_ = resp.Body.Close()
		}
		return true
	}
	if err != nil {
		if ri.req.Context().Err() == nil {
			nb.resumedThenEnded.Add(1)
		}
		log.Info("watch resumed, then ended by the new backend (410 Expired: its watch cache starts after the watch's resourceVersion); not resumed from now; ended cleanly", "reason", err)
		return false
	}
	w.rc = &firstEventGuard{rc: resp.Body, fr: w.fr, log: log, ended: &nb.resumedThenEnded}
	w.rv.rv, w.rv.cur = now, w.rv.cur[:0]
	nb.resumedPastExpiry.Add(1)
	log.Info("watch resumed from the new backend's current revision: the watched collection is the same there as at the watch's resourceVersion", "from", now)
	return true
}

// reissuePastExpiry takes one of nb's resume slots, checks that the collection ri watches is
// unchanged on nb since rv, and re-issues the watch from the revision of that check.
func reissuePastExpiry(ri *resumeInfo, nb *backend, rv string) (string, *http.Response, error) {
	ctx, cancel := context.WithTimeoutCause(ri.req.Context(), resumeAnswerTimeout,
		fmt.Errorf("the lists took over %s", resumeAnswerTimeout))
	defer cancel()
	go func() { // a switch away from nb: the lists and the watch are for nothing

		select {
		case <-nb.leavingCh():
			cancel()
		case <-ctx.Done():
		}
	}()
	if !takeSlot(ctx, nb) {
		return "", nil, errors.New("its client left, or the proxy switched away from the new backend")
	}
	defer func() { <-nb.resumeSlots }()
	now, err := unchangedSince(ctx, ri, nb, rv)
	if err != nil {
		return "", nil, err
	}
	resp, err := reissue(ri.req, nb, ri.identity, now)
	if err != nil {
		return "", nil, err
	}
	if err := ri.acceptable(resp); err != nil {
		_ = resp.Body.Close()
		return "", nil, err
	}
	return now, resp, nil
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

// unchangedSince lists the collection ri watches on nb exactly at rv and now, page by page
// (both in key order), and returns now's resourceVersion when the two hold the same objects at
// the same resourceVersions.
func unchangedSince(ctx context.Context, ri *resumeInfo, nb *backend, rv string) (string, error) {
	if legacyWatchPath(ri.req.URL.Path) {
		return "", errors.New("a watch on the legacy /watch/ path: no collection to list")
	}
	base := url.Values{"limit": {strconv.Itoa(metaPageLimit)}}
	q := ri.req.URL.Query()
	for _, k := range []string{"labelSelector", "fieldSelector"} {
		if v := q.Get(k); v != "" {
			base.Set(k, v)
		}
	}
	get := func(q url.Values) (*metaPage, error) { return listPage(ctx, ri, nb, q) }
	now := &listCursor{get: get, base: base}
	then := &listCursor{get: get, base: base, first: url.Values{"resourceVersion": {rv}, "resourceVersionMatch": {"Exact"}}}
	for {
		a, more, err := now.next()
		if err != nil {
			return "", fmt.Errorf("list now: %w", err)
		}
		b, moreThen, err := then.next()
		if err != nil {
			return "", fmt.Errorf("list at %s: %w", rv, err)
		}
		if more != moreThen || a != b {
			return "", fmt.Errorf("the collection changed between %s and %s (%+v, then %+v)", rv, now.rv, b, a)
		}
		if !more {
			break
		}
	}
	from, err1 := strconv.ParseUint(rv, 10, 64)
	to, err2 := strconv.ParseUint(now.rv, 10, 64)
	if err1 != nil || err2 != nil || to < from {
		return "", fmt.Errorf("resourceVersions %q and %q are not revisions in order", rv, now.rv)
	}
	return now.rv, nil
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
	page        *metaPage
	i           int
	rv          string // the list's resourceVersion (its first page's)
}

// next returns the next item, or false after the last.
func (c *listCursor) next() (metaItem, bool, error) {
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
		if c.page == nil {
			c.rv = page.Metadata.ResourceVersion
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
	out.Header.Del("Accept-Encoding") // the transport asks for gzip and decodes it
	out.Header.Del("Content-Type")
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

// expiredEvent reports whether a watch's ERROR event carries 410 (Gone: Expired), as
// kube-apiserver's answer to a watch from a resourceVersion older than its cache.
func expiredEvent(fr framing, ev []byte) bool {
	if fr == framingJSON {
		var v struct {
			Type   string `json:"type"`
			Object struct {
				Code int32 `json:"code"`
			} `json:"object"`
		}
		return json.Unmarshal(ev, &v) == nil && v.Type == "ERROR" && v.Object.Code == http.StatusGone
	}
	if len(ev) < 4 {
		return false
	}
	ext, _, err := protoField(ev[4:], fieldWatchEventObject)
	if err != nil {
		return false
	}
	raw, _, err := protoField(ext, fieldRawExtensionRaw)
	if err != nil || !bytes.HasPrefix(raw, protobufMagic) {
		return false
	}
	status, _, err := protoField(raw[len(protobufMagic):], fieldUnknownRaw)
	if err != nil {
		return false
	}
	return protoVarint(status, fieldStatusCode) == http.StatusGone
}

// fieldStatusCode is metav1.Status.code.
const fieldStatusCode = 6

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
