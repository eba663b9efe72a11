package cutover

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// VerifyReport is what the verify step found.
type VerifyReport struct {
	// Revision is the etcd revision both sides were compared at (mode replicate; 0 otherwise):
	// the changes after it are compared revision by revision until the switch.
	Revision      int64 `json:"revision,omitempty"`
	ResourceTypes int   `json:"resourceTypes"`
	// Objects were identical (UID and content) on blue and green.
	Objects int `json:"objects"`
	// ChangedAfterCopy are differences verify can explain: objects green's apiserver wrote, objects
	// the apiservers maintain themselves (their identity leases, the kubernetes endpoints), events
	// that expired on blue. Every other difference is a mismatch.
	ChangedAfterCopy []string `json:"changedAfterCopy,omitempty"`
	// Explained counts those differences (ChangedAfterCopy lists the first maxListed).
	Explained int `json:"explained,omitempty"`
	// Mismatches are objects that should be identical and are not: the cutover must not go on.
	Mismatches []string `json:"mismatches,omitempty"`
}

const maxListed = 50

func (r *VerifyReport) add(list *[]string, s string, n *int) {
	*n++
	if len(*list) < maxListed {
		*list = append(*list, s)
	}
}

// verifyObjects compares every listable resource type (from blue's discovery) between blue and
// green. Objects whose resourceVersion is at most the snapshot's revision existed at the copy
// and must be identical; what changed after the copy must be explained (compare).
//
// Lists are read as raw JSON and objects compared byte for byte (the same stored object served by
// the same apiserver version encodes identically); only objects whose bytes differ are decoded
// and compared semantically. Blue and green are listed at the same time, in pages of 5,000.
func verifyObjects(ctx context.Context, blue, green *rest.Config, snapRev int64) (*VerifyReport, error) {
	return verifyWith(ctx, blue, green, 0, func(rep *VerifyReport, tg schema.GroupVersionResource, b, g map[string]rawObject, changed, mismatched *int) {
		compare(rep, tg, b, g, snapRev, changed, mismatched)
	})
}

// verifyAt compares blue and green as they were at revision rev (mode replicate: both hold it,
// with the same revisions): lists at exactly resourceVersion rev; every difference is a mismatch.
func verifyAt(ctx context.Context, blue, green *rest.Config, rev int64) (*VerifyReport, error) {
	return verifyWith(ctx, blue, green, rev, compareExact)
}

// compareFunc classifies the objects of one resource type listed on blue and green.
type compareFunc func(rep *VerifyReport, tg schema.GroupVersionResource, b, g map[string]rawObject, changed, mismatched *int)

// verifyWith lists every resource type on blue and green (at exactly resourceVersion at, or
// current lists for 0) and compares them with cmp.
func verifyWith(ctx context.Context, blue, green *rest.Config, at int64, cmp compareFunc) (*VerifyReport, error) {
	for _, c := range []*rest.Config{blue, green} {
		c.QPS, c.Burst = 200, 400
		c.WarningHandler = rest.NoWarnings{} // deprecated types are listed on purpose
	}
	bhc, err := rest.HTTPClientFor(blue)
	if err != nil {
		return nil, err
	}
	targets, err := listableResources(ctx, blue, bhc)
	if err != nil {
		return nil, err
	}
	ghc, err := rest.HTTPClientFor(green)
	if err != nil {
		return nil, err
	}
	rep := &VerifyReport{ResourceTypes: len(targets)}
	var mu sync.Mutex
	var errs []error
	var changed, mismatched int
	sem := make(chan struct{}, 3)
	var wg sync.WaitGroup
	for _, tg := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var b, g map[string]rawObject
			var berr, gerr error
			var inner sync.WaitGroup
			inner.Add(2)
			go func() { defer inner.Done(); b, berr = listRaw(ctx, bhc, blue.Host, tg, at) }()
			go func() { defer inner.Done(); g, gerr = listRaw(ctx, ghc, green.Host, tg, at) }()
			inner.Wait()
			mu.Lock()
			defer mu.Unlock()
			if err := errors.Join(berr, gerr); err != nil {
				errs = append(errs, fmt.Errorf("list %s: %w", tg, err))
				return
			}
			cmp(rep, tg, b, g, &changed, &mismatched)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return rep, err
	}
	return rep, rep.finish(changed, mismatched, at)
}

// finish sorts what was listed and counts what was not: changed differences explained (of which
// at most maxListed are listed) and mismatched objects.
func (r *VerifyReport) finish(changed, mismatched int, at int64) error {
	sort.Strings(r.ChangedAfterCopy)
	sort.Strings(r.Mismatches)
	if mismatched > 0 {
		return mismatchError(mismatched, r.Mismatches, at)
	}
	r.Explained = changed
	if changed > len(r.ChangedAfterCopy) {
		r.ChangedAfterCopy = append(r.ChangedAfterCopy, fmt.Sprintf("... and %d more", changed-len(r.ChangedAfterCopy)))
	}
	return nil
}

// mismatchError says what differing objects mean. Compared at one revision (mode replicate),
// what blue took was replicated: green itself diverged. Compared with the copy, a write reached
// blue without the fence.
func mismatchError(n int, mismatches []string, at int64) error {
	what := strings.Join(mismatches, "; ")
	if at != 0 {
		return fmt.Errorf("%d object(s) differ between blue and green at revision %d: %s. Green does not hold what blue held: replication went wrong, something wrote to green, or the two apiservers serve the data differently (version, encryption config, an aggregated API). Abort; green is rebuilt by the next run", n, at, what)
	}
	return fmt.Errorf("%d object(s) differ between blue and green, green would not have them as blue does: %s. Find what wrote to blue around the proxy (straight to its apiserver or etcd), stop it, and run the cutover again", n, what)
}

// listableResources is every resource type blue's discovery lists (its preferred versions) and
// etcd stores, in order: the APIs aggregated servers answer are left out (aggregatedOn).
func listableResources(ctx context.Context, blue *rest.Config, hc *http.Client) ([]schema.GroupVersionResource, error) {
	aggregated, err := aggregatedOn(ctx, hc, blue.Host)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(blue)
	if err != nil {
		return nil, err
	}
	lists, err := dc.ServerPreferredResources()
	return listableTargets(lists, err, aggregated)
}

// listableTargets picks from discovery's lists the resource types to compare: listable, no
// subresource, stored (notStored), not served by an aggregated server. A discovery failure (discErr) is tolerated
// only for aggregated APIs: an unavailable APIService (a stale metrics.k8s.io) stores nothing.
func listableTargets(lists []*metav1.APIResourceList, discErr error, aggregated map[schema.GroupVersion]bool) ([]schema.GroupVersionResource, error) {
	if discErr != nil {
		var failed *discovery.ErrGroupDiscoveryFailed
		if !errors.As(discErr, &failed) {
			return nil, fmt.Errorf("discovery on blue: %w", discErr)
		}
		for gv := range failed.Groups {
			if !aggregated[gv] {
				return nil, fmt.Errorf("discovery on blue: %w", discErr)
			}
		}
	}
	var targets []schema.GroupVersionResource
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			return nil, err
		}
		if aggregated[gv] {
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !contains(r.Verbs, "list") || notStored(gv, r.Name) {
				continue
			}
			targets = append(targets, gv.WithResource(r.Name))
		}
	}
	sort.Slice(targets, func(i, j int) bool { return targets[i].String() < targets[j].String() })
	return targets, nil
}

// notStored says whether a listable resource is made up by the apiserver when asked, not read
// from etcd: componentstatuses (core v1) probe the scheduler, the controller manager and etcd at
// each request, and two apiservers' probes may answer differently.
func notStored(gv schema.GroupVersion, resource string) bool {
	return gv.Group == "" && resource == "componentstatuses"
}

// apiServices are the kube-aggregator's registrations.
var apiServices = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// aggregatedOn is every group version the apiserver at host hands to another server (an
// APIService with a spec.service): nothing of it is in etcd, and what it answers (metrics
// made up at each request) differs from one apiserver to the other.
func aggregatedOn(ctx context.Context, hc *http.Client, host string) (map[schema.GroupVersion]bool, error) {
	objs, err := listRaw(ctx, hc, host, apiServices, 0)
	if err != nil {
		return nil, fmt.Errorf("list %s on blue: %w", apiServices, err)
	}
	out := map[schema.GroupVersion]bool{}
	for _, o := range objs {
		var svc struct {
			Spec struct {
				Service *json.RawMessage `json:"service"`
				Group   string           `json:"group"`
				Version string           `json:"version"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(o.raw, &svc); err != nil {
			return nil, fmt.Errorf("an APIService on blue: %w", err)
		}
		if svc.Spec.Service != nil {
			out[schema.GroupVersion{Group: svc.Spec.Group, Version: svc.Spec.Version}] = true
		}
	}
	return out, nil
}

// rawObject is one listed object: its identity and its JSON.
type rawObject struct {
	uid string
	rv  int64
	raw json.RawMessage
}

func (o rawObject) equal(other rawObject) bool {
	if o.uid != other.uid {
		return false
	}
	if bytes.Equal(o.raw, other.raw) {
		return true
	}
	a, aerr := decodeExact(o.raw)
	b, berr := decodeExact(other.raw)
	return aerr == nil && berr == nil && reflect.DeepEqual(a, b)
}

// decodeExact decodes JSON keeping numbers as written (json.Number): as float64, integers past
// 2^53 that differ would compare equal.
func decodeExact(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// compare classifies every object of one resource type. An object blue holds as it was at the
// copy must be on green, identical. Anything else must be explained, or it is a mismatch:
//   - green's own apiserver wrote to green after the start (revision above the copy's): its
//     leases, endpoints, APF configuration; nothing else writes to green before the switch;
//   - an object the apiservers maintain themselves changed on blue (maintainedByAPIServers);
//   - an event the copy has and blue no longer holds (events expire).
//
// A blue object created, changed or deleted after the copy outside that list is a write that
// did not go through the fenced proxy (straight to blue's apiserver or etcd): it is not on green,
// so the cutover must not go on (invariant acked-on-green).
func compare(rep *VerifyReport, gvr schema.GroupVersionResource, blue, green map[string]rawObject, snapRev int64, changed, mismatched *int) {
	kind := gvr.Resource
	if gvr.Group != "" {
		kind += "." + gvr.Group
	}
	explained := func(key, why string) { rep.add(&rep.ChangedAfterCopy, kind+" "+key+": "+why, changed) }
	mismatch := func(key, why string) { rep.add(&rep.Mismatches, kind+" "+key+": "+why, mismatched) }
	const bypass = " (a write that did not go through the fenced proxy: it is not on green)"
	for key, b := range blue {
		g, ok := green[key]
		switch {
		case ok && b.equal(g):
			rep.Objects++
		case b.rv > snapRev && maintainedByAPIServers(gvr, key):
			explained(key, "written on blue after the copy by blue's apiserver (it maintains this object itself)")
		case !ok && b.rv > snapRev:
			mismatch(key, "created on blue after the copy"+bypass)
		case !ok:
			mismatch(key, "missing on green")
		case b.rv > snapRev:
			mismatch(key, "changed on blue after the copy"+bypass)
		case g.rv > snapRev:
			explained(key, "changed on green by its apiserver")
		default:
			mismatch(key, "differs (uid "+b.uid+" vs "+g.uid+")")
		}
	}
	for key, g := range green {
		if _, ok := blue[key]; ok {
			continue
		}
		switch {
		case g.rv > snapRev:
			explained(key, "created on green by its apiserver")
		case isEvent(gvr):
			explained(key, "deleted on blue after the copy (events expire)")
		case maintainedByAPIServers(gvr, key):
			explained(key, "deleted on blue after the copy by blue's apiserver (it maintains this object itself)")
		default:
			mismatch(key, "on green only: deleted on blue after the copy"+bypass)
		}
	}
}

// compareExact is compare for two lists at the same revision of the same history: any
// difference is a mismatch.
func compareExact(rep *VerifyReport, gvr schema.GroupVersionResource, blue, green map[string]rawObject, _, mismatched *int) {
	kind := gvr.Resource
	if gvr.Group != "" {
		kind += "." + gvr.Group
	}
	mismatch := func(key, why string) { rep.add(&rep.Mismatches, kind+" "+key+": "+why, mismatched) }
	for key, b := range blue {
		switch g, ok := green[key]; {
		case ok && b.equal(g):
			rep.Objects++
		case !ok:
			mismatch(key, "missing on green")
		default:
			mismatch(key, fmt.Sprintf("differs (resourceVersion %d on blue, %d on green)", b.rv, g.rv))
		}
	}
	for key := range green {
		if _, ok := blue[key]; !ok {
			mismatch(key, "on green only")
		}
	}
}

// maintainedByAPIServers says whether the apiservers write the object themselves, outside any
// proxy: their identity leases (kube-system/apiserver-*) and the kubernetes service's
// endpoints (default/kubernetes). Only these may change on blue while it is fenced.
func maintainedByAPIServers(gvr schema.GroupVersionResource, key string) bool {
	ns, name, _ := strings.Cut(key, "/")
	switch {
	case gvr.Group == "coordination.k8s.io" && gvr.Resource == "leases":
		return ns == "kube-system" && strings.HasPrefix(name, "apiserver-")
	case gvr.Group == "" && gvr.Resource == "endpoints", gvr.Group == "discovery.k8s.io" && gvr.Resource == "endpointslices":
		return key == "default/kubernetes"
	}
	return false
}

func isEvent(gvr schema.GroupVersionResource) bool {
	return gvr.Resource == "events" && (gvr.Group == "" || gvr.Group == "events.k8s.io")
}

// listRaw lists every object of gvr (all namespaces), page by page, as raw JSON.
func listRaw(ctx context.Context, hc *http.Client, host string, gvr schema.GroupVersionResource, at int64) (map[string]rawObject, error) {
	base := strings.TrimSuffix(host, "/") + "/api/" + gvr.Version + "/" + gvr.Resource
	if gvr.Group != "" {
		base = strings.TrimSuffix(host, "/") + "/apis/" + gvr.Group + "/" + gvr.Version + "/" + gvr.Resource
	}
	out := map[string]rawObject{}
	cont := ""
	for {
		q := url.Values{"limit": {"5000"}}
		if cont != "" {
			q.Set("continue", cont)
		} else if at > 0 {
			q.Set("resourceVersion", strconv.FormatInt(at, 10))
			q.Set("resourceVersionMatch", "Exact")
		}
		page, err := getListPage(ctx, hc, base, q)
		if err != nil {
			return nil, err
		}
		for _, item := range page.Items {
			var m struct {
				Metadata struct {
					Namespace       string `json:"namespace"`
					Name            string `json:"name"`
					UID             string `json:"uid"`
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(item, &m); err != nil {
				return nil, fmt.Errorf("%s: %w", base, err)
			}
			rv, _ := strconv.ParseInt(m.Metadata.ResourceVersion, 10, 64)
			out[m.Metadata.Namespace+"/"+m.Metadata.Name] = rawObject{uid: m.Metadata.UID, rv: rv, raw: item}
		}
		if page.Metadata.Continue == "" {
			return out, nil
		}
		cont = page.Metadata.Continue
	}
}

// listPage is one page of a list, as listRaw reads it.
type listPage struct {
	Metadata struct {
		Continue string `json:"continue"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// listRetryDefault is how long getListPage waits before asking again after a 429 or 503 that
// names no Retry-After.
const listRetryDefault = time.Second

// getListPage gets one page of base with query q. A 429 (API priority and fairness) or a 503 is
// asked again after the Retry-After it names (listRetryDefault without one), for as long as ctx
// (the step's timeout) allows: one throttled request must not abort the cutover. Any other
// refusal says why (listError).
func getListPage(ctx context.Context, hc *http.Client, base string, q url.Values) (*listPage, error) {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return nil, fmt.Errorf("%s: %w", base, err)
		case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
			wait := retryAfter(resp.Header.Get("Retry-After"))
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%s: %s, asked again until the step's time ran out: %w", base, statusText(resp, body), ctx.Err())
			case <-time.After(wait):
			}
			continue
		case resp.StatusCode != http.StatusOK:
			return nil, listError(base, q, resp, body)
		}
		var page listPage
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, fmt.Errorf("%s: %w", base, err)
		}
		return &page, nil
	}
}

// retryAfter is a Retry-After header's wait in seconds, or listRetryDefault.
func retryAfter(h string) time.Duration {
	if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	return listRetryDefault
}

// statusText is an apiserver's refusal: its HTTP status and, from the body, its Status message
// (or the body's start when it is not a Status).
func statusText(resp *http.Response, body []byte) string {
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Message != "" {
		return resp.Status + ": " + st.Message
	}
	if b := strings.TrimSpace(string(body)); b != "" {
		return resp.Status + ": " + b[:min(len(b), 200)]
	}
	return resp.Status
}

// listError says why a list was refused. A 410 is the revision the verify lists at (or its
// continue token's) compacted meanwhile: kube-apiserver compacts etcd every 5 minutes by default
// (--etcd-compaction-interval), and replication brings blue's compactions to green.
func listError(base string, q url.Values, resp *http.Response, body []byte) error {
	err := fmt.Errorf("%s: %s", base, statusText(resp, body))
	if resp.StatusCode != http.StatusGone {
		return err
	}
	at := cmp.Or(q.Get("resourceVersion"), "of its continue token")
	return fmt.Errorf("%w: the revision the verify lists at (%s) was compacted while it verified: kube-apiserver compacts etcd every 5 minutes by default (its --etcd-compaction-interval), and replication brings blue's compactions to green, so the verify must finish within that: run the cutover again when blue is quieter, or with a longer --etcd-compaction-interval on blue's apiservers for the cutover", err, at)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
