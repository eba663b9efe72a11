package cutover

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// No writer around the fence (invariant no-bypass): the preflight watches blue etcd for
// preflight.bypassWatch and compares the writes it sees with the writes the proxies forwarded in
// the same time, per resource and namespace. A write that did not pass a proxy is not fenced: it
// reaches blue during the window, and after the switch it lands on blue, where nobody reads it.

// blueWrite is one write seen in blue etcd.
type blueWrite struct {
	resource, namespace string
	manager             string // the newest managedFields entry's manager, or why there is none
}

// apiserverOwnKeys are the keys kube-apiserver writes itself (leases, the kubernetes Service's
// endpoints, IP allocations, flow control and API registration status, compaction): they never
// pass a proxy and are not clients' writes.
var apiserverOwnKeys = []string{
	"compact_rev_key",
	"/registry/masterleases/",
	"/registry/leases/kube-system/apiserver-",
	"/registry/services/endpoints/default/kubernetes\x00",
	"/registry/endpointslices/default/kubernetes\x00",
	"/registry/ranges/",
	"/registry/ipaddresses/",
	"/registry/servicecidrs/",
	"/registry/flowschemas/",
	"/registry/prioritylevelconfigurations/",
	"/registry/apiregistration.k8s.io/apiservices/",
	"/registry/apiextensions.k8s.io/customresourcedefinitions/",
	"/registry/storageversions/",
	"/registry/configmaps/kube-system/kube-apiserver-legacy-service-account-token-tracking",
}

// keyResource is the resource and namespace of a kube-apiserver etcd key
// (/registry/[group/]resource/[namespace/]name), with the keys whose layout differs from the
// resource's name: services/specs, services/endpoints, minions (nodes), ingress. ok is false for
// a key outside /registry/.
func keyResource(key string) (resource, namespace string, ok bool) {
	rest, found := strings.CutPrefix(key, "/registry/")
	if !found {
		return "", "", false
	}
	segs := strings.Split(rest, "/")
	if len(segs) > 1 && strings.Contains(segs[0], ".") { // a group: /registry/<group>/<resource>/...
		segs = segs[1:]
	}
	resource, segs = segs[0], segs[1:]
	switch resource {
	case "services":
		if len(segs) > 0 {
			if segs[0] == "endpoints" {
				resource = "endpoints"
			}
			segs = segs[1:]
		}
	case "minions":
		resource = "nodes"
	case "controllers":
		resource = "replicationcontrollers"
	case "ingress":
		resource = "ingresses"
	}
	if len(segs) >= 2 {
		namespace = segs[0]
	}
	return resource, namespace, true
}

// lastManager is the manager of the newest managedFields entry of an object as kube-apiserver
// stores it: protobuf behind "k8s\x00" (field 1 of every type is its ObjectMeta), or JSON.
func lastManager(value []byte) string {
	var meta metav1.ObjectMeta
	switch {
	case bytes.HasPrefix(value, []byte("k8s:enc:")):
		return "(encrypted at rest)"
	case bytes.HasPrefix(value, []byte("k8s\x00")):
		var u runtime.Unknown
		if err := u.Unmarshal(value[4:]); err != nil {
			return "(undecodable)"
		}
		raw := objectMetaField(u.Raw)
		if raw == nil || meta.Unmarshal(raw) != nil {
			return "(undecodable)"
		}
	default:
		var obj struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if json.Unmarshal(value, &obj) != nil {
			return "(not a Kubernetes object)"
		}
		meta = obj.Metadata
	}
	var newest *metav1.ManagedFieldsEntry
	for i, e := range meta.ManagedFields {
		if newest == nil || e.Time != nil && (newest.Time == nil || e.Time.After(newest.Time.Time)) {
			newest = &meta.ManagedFields[i]
		}
	}
	if newest == nil {
		return "(no managedFields)"
	}
	return fmt.Sprintf("%s (%s)", newest.Manager, newest.Operation)
}

// objectMetaField is field 1 (length-delimited) of a protobuf message, or nil.
func objectMetaField(b []byte) []byte {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil
			}
			return v
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil
		}
		b = b[m:]
	}
	return nil
}

// watchBlueWrites watches blue etcd for d and returns the writes clients made (not kube-apiserver's
// own keys, not the deletes of a lease expiry), how many events it saw in all, and when it
// ended. Once d is up it reads blue's revision and goes on until it has seen that revision, so
// every write blue acknowledged before the end is in it, and nothing after that revision is.
func watchBlueWrites(ctx context.Context, cli *clientv3.Client, d time.Duration) ([]blueWrite, int, time.Time, error) {
	from, err := replicate.Revision(ctx, cli)
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := cli.Watch(wctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(from+1), clientv3.WithPrevKV())
	timer := time.NewTimer(d)
	defer timer.Stop()
	var out []blueWrite
	var end time.Time
	last, upTo, seen := from, int64(0), 0 // upTo: blue's revision at the end, once d is up
	for upTo == 0 || last < upTo {
		select {
		case <-timer.C:
			end = time.Now() // before the read: a write acknowledged by then is at most upTo
			if upTo, err = replicate.Revision(ctx, cli); err != nil {
				return nil, seen, end, fmt.Errorf("reading blue's revision at the end of the watch: %w", err)
			}
		case resp, ok := <-wch:
			if err := cmp.Or(resp.Err(), ctx.Err()); err != nil || !ok {
				return nil, seen, end, fmt.Errorf("watching blue etcd: %w", cmp.Or(err, errors.New("the watch ended")))
			}
			for _, ev := range resp.Events {
				if upTo > 0 && ev.Kv.ModRevision > upTo {
					last = upTo // every revision up to upTo has been seen
					break
				}
				last, seen = ev.Kv.ModRevision, seen+1
				if w, ok := clientWrite(ev); ok {
					out = append(out, w)
				}
			}
		}
	}
	return out, seen, end, nil
}

// clientWrite is the write ev records, unless it is kube-apiserver's own or a lease expiry.
func clientWrite(ev *clientv3.Event) (blueWrite, bool) {
	key := string(ev.Kv.Key)
	for _, own := range apiserverOwnKeys {
		// A trailing NUL marks a whole key (the kubernetes Service's own objects, not kubernetes-*).
		if exact, ok := strings.CutSuffix(own, "\x00"); ok && key == exact || !ok && strings.HasPrefix(key, own) {
			return blueWrite{}, false
		}
	}
	value := ev.Kv.Value
	if ev.Type == clientv3.EventTypeDelete {
		if ev.PrevKv == nil || ev.PrevKv.Lease != 0 {
			return blueWrite{}, false // a lease's expiry (events), or nothing to say who
		}
		value = ev.PrevKv.Value
	}
	res, ns, ok := keyResource(key)
	if !ok {
		first, _, _ := strings.Cut(strings.TrimPrefix(key, "/"), "/")
		return blueWrite{resource: "etcd key /" + first + "/… (not kube-apiserver's)", manager: "an etcd client"}, true
	}
	return blueWrite{resource: res, namespace: ns, manager: lastManager(value)}, true
}

// bypassGroup is the writes to one resource in one namespace that went around the proxies.
type bypassGroup struct {
	Resource  string   `json:"resource"`
	Namespace string   `json:"namespace,omitempty"`
	InEtcd    int      `json:"inEtcd"`
	Forwarded int      `json:"forwarded"`
	Managers  []string `json:"managers"`
}

func (b bypassGroup) String() string {
	where := b.Resource
	if b.Namespace != "" {
		where += " in namespace " + b.Namespace
	}
	return fmt.Sprintf("%s: %d write(s) in blue etcd, %d through a proxy; written by %s", where, b.InEtcd, b.Forwarded, strings.Join(b.Managers, ", "))
}

// compareWrites groups blue's writes by resource and namespace and returns the groups with more
// writes in etcd than the proxies forwarded (a deletecollection through a proxy accounts for any
// number of deletes).
func compareWrites(blue []blueWrite, forwarded map[[2]string]int) []bypassGroup {
	groups := map[[2]string]*bypassGroup{}
	for _, w := range blue {
		k := [2]string{w.resource, w.namespace}
		g := groups[k]
		if g == nil {
			g = &bypassGroup{Resource: w.resource, Namespace: w.namespace, Forwarded: forwarded[k]}
			groups[k] = g
		}
		g.InEtcd++
		if !slices.Contains(g.Managers, w.manager) {
			g.Managers = append(g.Managers, w.manager)
		}
	}
	var out []bypassGroup
	for _, g := range groups {
		if g.Forwarded >= 0 && g.InEtcd > g.Forwarded {
			out = append(out, *g)
		}
	}
	slices.SortFunc(out, func(a, b bypassGroup) int {
		return strings.Compare(a.Resource+"/"+a.Namespace, b.Resource+"/"+b.Namespace)
	})
	return out
}

// writesLister is a proxy admin API that lists the writes it forwarded.
type writesLister interface {
	Writes(ctx context.Context, since time.Time) (admin.WritesResponse, error)
}

// Writes lists the writes every proxy forwarded since since, their times on this host's clock
// (each proxy's clock is measured first, and kept in clocks); a proxy whose log does not reach
// back that far makes the answer incomplete.
func (g *proxyGroup) Writes(ctx context.Context, since time.Time) (admin.WritesResponse, error) {
	type onOurClock struct {
		admin.WritesResponse
		clock clockReading
	}
	res, err := admin.Each(ctx, g.proxies, func(ctx context.Context, c proxyAdmin) (onOurClock, error) {
		cr, err := readClock(ctx, c)
		if err != nil {
			return onOurClock{}, err
		}
		ws, err := listWrites(ctx, c, since.Add(cr.offset))
		for i := range ws.Writes {
			ws.Writes[i].At = ws.Writes[i].At.Add(-cr.offset)
		}
		return onOurClock{ws, cr}, err
	})
	if err != nil {
		return admin.WritesResponse{}, err
	}
	out := admin.WritesResponse{Complete: true}
	g.clocks = map[string]clockReading{}
	for _, r := range res {
		out.Writes = append(out.Writes, r.Value.Writes...)
		out.Complete = out.Complete && r.Value.Complete
		g.clocks[r.Proxy] = r.Value.clock
	}
	return out, nil
}

// clockReading is a proxy's clock against this host's: offset is how far it is ahead (behind
// if negative), within uncertainty either way.
type clockReading struct {
	offset, uncertainty time.Duration
}

// clockSamples is how many status requests readClock sends; the quickest answer counts.
const clockSamples = 3

// readClock measures c's clock from the time its status carries, against the middle of the
// request (off by at most half its round trip); the quickest of clockSamples requests counts.
// A proxy whose status has no time is taken as on this host's clock.
func readClock(ctx context.Context, c proxyAdmin) (clockReading, error) {
	best := clockReading{uncertainty: -1}
	for range clockSamples {
		t0 := time.Now()
		st, err := c.Status(ctx)
		if err != nil || st.Now.IsZero() {
			return clockReading{}, err
		}
		half := time.Since(t0) / 2
		if best.uncertainty < 0 || half < best.uncertainty {
			best = clockReading{offset: st.Now.Sub(t0.Add(half)), uncertainty: half}
		}
	}
	return best, nil
}

// clockNotes describes the proxies' clocks for the preflight: the ones more than bypassSlack/5
// away from this host's (their writes' times were corrected) in the summary, and, as problems,
// the ones that could not be measured closer than bypassSlack/2 (a slow admin API): with them
// the comparison cannot be trusted.
func (g *proxyGroup) clockNotes() (summary string, problems []string) {
	var off []string
	for _, pr := range g.proxies {
		cr := g.clocks[pr.Name]
		if cr.uncertainty > bypassSlack/2 {
			problems = append(problems, fmt.Sprintf("proxy %s's clock could not be measured closer than ±%s (its admin API answered in no less than %s): its writes cannot be placed in the watch's time", pr.Name, cr.uncertainty.Round(time.Millisecond), (2*cr.uncertainty).Round(time.Millisecond)))
		}
		if a := cr.offset.Abs(); a > bypassSlack/5 {
			way := "ahead of"
			if cr.offset < 0 {
				way = "behind"
			}
			off = append(off, fmt.Sprintf("%s %s %s", pr.Name, a.Round(time.Millisecond), way))
		}
	}
	if len(off) > 0 {
		summary = "; proxy clocks off this host's (their writes' times corrected): " + strings.Join(off, ", ")
	}
	return summary, problems
}

// listWrites lists the writes one proxy forwarded since since.
func listWrites(ctx context.Context, c proxyAdmin, since time.Time) (admin.WritesResponse, error) {
	wl, ok := c.(writesLister)
	if !ok {
		return admin.WritesResponse{}, fmt.Errorf("this proxy client cannot list forwarded writes")
	}
	return wl.Writes(ctx, since)
}

// forwardedCounts counts forwarded writes by resource and namespace; a deletecollection counts
// as any number (-1). Writes answered after end (the watch's end) and its slack are left out:
// they cannot be in what the watch saw, and counted they would hide as many writes around the
// proxies.
func forwardedCounts(ws []admin.ForwardedWrite, end time.Time) map[[2]string]int {
	out := map[[2]string]int{}
	for _, w := range ws {
		if w.At.After(end.Add(bypassSlack)) || storesNothing[w.Subresource] {
			continue
		}
		k := [2]string{w.Resource, w.Namespace}
		if w.Resource == "namespaces" {
			k[1] = "" // a namespace's own requests name it as their namespace; its key has none
		}
		switch {
		case out[k] < 0:
		case w.Verb == "deletecollection":
			out[k] = -1
		default:
			out[k]++
		}
	}
	return out
}

// storesNothing are the subresources whose writes change no key of their resource: a
// TokenRequest (serviceaccounts/token) is answered without etcd, a request through */proxy goes
// to the pod, node or service. Counted, each would hide a write around the proxies.
var storesNothing = map[string]bool{"token": true, "proxy": true}

// bypassSlack is how far before the watch the proxies' writes are counted (and after it). A
// proxy logs a write when the backend answered it, after etcd applied it, so one clock would
// need none; the slack covers what is left of other hosts' clocks after proxyGroup.Writes
// corrected them (by the middle of a status request: off by at most half its round trip) and
// the time from etcd's apply to the proxy's answer. It is short: every write counted that the
// watch did not see hides one that went around the proxies.
const bypassSlack = 250 * time.Millisecond

// checkBypass watches blue etcd for preflight.bypassWatch, compares with what the proxies
// forwarded, and checks that the kubernetes Service's endpoints are proxies. What it finds fails
// the preflight unless bypass is allowed (plan preflight.allowBypass or --allow-bypass).
func (r *runner) checkBypass(ctx context.Context) (string, error) {
	d := r.p.Preflight.BypassWatch.D()
	cli, err := newEtcdClient(r.p.Blue.Etcd.EtcdClientSpec)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	start := time.Now()
	blue, seen, end, err := watchBlueWrites(ctx, cli, d)
	if err != nil {
		return "", err
	}
	g, ok := r.adm.(writesLister)
	if !ok {
		return "", fmt.Errorf("the proxies' admin API cannot list forwarded writes")
	}
	fw, err := g.Writes(ctx, start.Add(-bypassSlack))
	if err != nil {
		return "", fmt.Errorf("the writes the proxies forwarded: %w", err)
	}
	if !fw.Complete {
		// A proxy that started in the slack before the watch (its log begins then) has every
		// write the watch could see: one it forwarded before it started reached etcd before.
		if again, err := g.Writes(ctx, start); err == nil && again.Complete {
			fw.Complete = true
		}
	}
	var problems []string
	for _, b := range compareWrites(blue, forwardedCounts(fw.Writes, end)) {
		problems = append(problems, b.String())
	}
	if !fw.Complete {
		problems = append(problems, "a proxy's log of forwarded writes did not reach back to the watch's start (over 65,536 writes in it, or the proxy restarted during the watch): the comparison may be wrong; run the cutover again")
	}
	epProblems, epNotes := r.checkServiceEndpoints(ctx)
	problems = append(problems, epProblems...)
	summary := fmt.Sprintf("watched blue etcd %s: %d client write(s) (%d events), %d forwarded by the proxies", d, len(blue), seen, len(fw.Writes))
	if pg, ok := r.adm.(*proxyGroup); ok {
		note, clockProblems := pg.clockNotes()
		summary += note
		problems = append(problems, clockProblems...)
	}
	var warnings string
	for _, n := range epNotes {
		warnings += "; WARNING: " + n
	}
	if len(problems) == 0 {
		return summary + "; none of those writes went around the proxies" + warnings, nil
	}
	summary += warnings
	if r.p.Preflight.AllowBypass || r.o.AllowBypass {
		return summary + "; ALLOWED (allowBypass) although writers go around the proxies: " + strings.Join(problems, "; "), nil
	}
	return "", fmt.Errorf("writers go around the proxies (%s): %s. Their writes are not fenced and would be lost at the switch: put them behind a proxy (docs/runbook.md), or run with --allow-bypass (plan preflight.allowBypass) if you know they are harmless", summary, strings.Join(problems, "; "))
}

// serviceEndpoints are the default/kubernetes Service's endpoints (ip:port), from its
// EndpointSlices. None (kube-apiserver does not publish a loopback advertise address) is no
// problem here: then no in-cluster client reaches blue through the Service.
func serviceEndpoints(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	slices, err := cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, sl := range slices.Items {
		for _, ep := range sl.Endpoints {
			for _, a := range ep.Addresses {
				for _, p := range sl.Ports {
					if p.Port != nil {
						out = append(out, net.JoinHostPort(a, strconv.Itoa(int(*p.Port))))
					}
				}
			}
		}
	}
	return out, nil
}
