package cutover

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// VerifyReport is what the verify step found.
type VerifyReport struct {
	ResourceTypes int `json:"resourceTypes"`
	// Objects were identical (UID and content) on blue and green.
	Objects int `json:"objects"`
	// ChangedAfterCopy are objects written after the copy by something the fence does not stop:
	// the apiservers themselves (their leases, endpoints) or writes a policy rule let through.
	ChangedAfterCopy []string `json:"changedAfterCopy,omitempty"`
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
// and must be identical; anything newer changed after the copy and is listed, not failed.
func verifyObjects(ctx context.Context, blue, green *rest.Config, snapRev int64) (*VerifyReport, error) {
	for _, c := range []*rest.Config{blue, green} {
		c.QPS, c.Burst = 200, 400
		c.WarningHandler = rest.NoWarnings{} // deprecated types are listed on purpose
	}
	dc, err := discovery.NewDiscoveryClientForConfig(blue)
	if err != nil {
		return nil, err
	}
	lists, err := dc.ServerPreferredResources()
	if err != nil {
		return nil, fmt.Errorf("discovery on blue: %w", err)
	}
	var gvrs []schema.GroupVersionResource
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			return nil, err
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !contains(r.Verbs, "list") {
				continue
			}
			gvrs = append(gvrs, gv.WithResource(r.Name))
		}
	}
	sort.Slice(gvrs, func(i, j int) bool { return gvrs[i].String() < gvrs[j].String() })
	bdc, err := dynamic.NewForConfig(blue)
	if err != nil {
		return nil, err
	}
	gdc, err := dynamic.NewForConfig(green)
	if err != nil {
		return nil, err
	}
	rep := &VerifyReport{ResourceTypes: len(gvrs)}
	var mu sync.Mutex
	var errs []error
	var changed, mismatched int
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, gvr := range gvrs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			b, err := listAll(ctx, bdc, gvr)
			if err == nil {
				var g map[string]*unstructured.Unstructured
				if g, err = listAll(ctx, gdc, gvr); err == nil {
					mu.Lock()
					compare(rep, gvr, b, g, snapRev, &changed, &mismatched)
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			errs = append(errs, fmt.Errorf("list %s: %w", gvr, err))
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return rep, err
	}
	sort.Strings(rep.ChangedAfterCopy)
	sort.Strings(rep.Mismatches)
	if mismatched > 0 {
		return rep, fmt.Errorf("%d object(s) differ between blue and green: %s", mismatched, strings.Join(rep.Mismatches, "; "))
	}
	if changed > len(rep.ChangedAfterCopy) {
		rep.ChangedAfterCopy = append(rep.ChangedAfterCopy, fmt.Sprintf("... and %d more", changed-len(rep.ChangedAfterCopy)))
	}
	return rep, nil
}

func compare(rep *VerifyReport, gvr schema.GroupVersionResource, blue, green map[string]*unstructured.Unstructured, snapRev int64, changed, mismatched *int) {
	kind := gvr.Resource
	if gvr.Group != "" {
		kind += "." + gvr.Group
	}
	after := func(o *unstructured.Unstructured) bool {
		rv, err := strconv.ParseInt(o.GetResourceVersion(), 10, 64)
		return err == nil && rv > snapRev
	}
	for key, b := range blue {
		g, ok := green[key]
		switch {
		case !ok && after(b):
			rep.add(&rep.ChangedAfterCopy, kind+" "+key+": created on blue after the copy", changed)
		case !ok:
			rep.add(&rep.Mismatches, kind+" "+key+": missing on green", mismatched)
		case b.GetUID() == g.GetUID() && reflect.DeepEqual(b.Object, g.Object):
			rep.Objects++
		case after(b) || after(g):
			rep.add(&rep.ChangedAfterCopy, kind+" "+key+": changed after the copy", changed)
		default:
			rep.add(&rep.Mismatches, kind+" "+key+": differs (uid "+string(b.GetUID())+" vs "+string(g.GetUID())+")", mismatched)
		}
	}
	for key, g := range green {
		if _, ok := blue[key]; ok {
			continue
		}
		if after(g) {
			rep.add(&rep.ChangedAfterCopy, kind+" "+key+": created on green by its apiserver", changed)
		} else {
			rep.add(&rep.Mismatches, kind+" "+key+": on green only", mismatched)
		}
	}
}

func listAll(ctx context.Context, c dynamic.Interface, gvr schema.GroupVersionResource) (map[string]*unstructured.Unstructured, error) {
	out := map[string]*unstructured.Unstructured{}
	opts := metav1.ListOptions{Limit: 500}
	for {
		l, err := c.Resource(gvr).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range l.Items {
			o := &l.Items[i]
			out[o.GetNamespace()+"/"+o.GetName()] = o
		}
		if l.GetContinue() == "" {
			return out, nil
		}
		opts.Continue = l.GetContinue()
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
