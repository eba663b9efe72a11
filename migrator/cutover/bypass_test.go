package cutover

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kubefence/kubefence/proxy/admin"
)

// TestKeyResource: kube-apiserver's etcd keys name their resource and namespace, the odd
// layouts included.
func TestKeyResource(t *testing.T) {
	cases := []struct{ key, resource, namespace string }{
		{"/registry/configmaps/demo/a", "configmaps", "demo"},
		{"/registry/namespaces/demo", "namespaces", ""},
		{"/registry/services/specs/default/web", "services", "default"},
		{"/registry/services/endpoints/default/web", "endpoints", "default"},
		{"/registry/minions/node-1", "nodes", ""},
		{"/registry/ingress/shop/web", "ingresses", "shop"},
		{"/registry/deployments/shop/web", "deployments", "shop"},
		{"/registry/example.com/widgets/shop/w1", "widgets", "shop"},
		{"/registry/apiregistration.k8s.io/apiservices/v1.apps", "apiservices", ""},
		{"/registry/controllers/shop/rc", "replicationcontrollers", "shop"},
	}
	for _, tc := range cases {
		res, ns, ok := keyResource(tc.key)
		if !ok || res != tc.resource || ns != tc.namespace {
			t.Errorf("%s: %q %q %v, want %q %q", tc.key, res, ns, ok, tc.resource, tc.namespace)
		}
	}
	if _, _, ok := keyResource("/flannel/network/config"); ok {
		t.Error("a key outside /registry/ is not kube-apiserver's")
	}
}

// TestLastManager: the newest managedFields entry is read from an object as kube-apiserver
// stores it, protobuf or JSON.
func TestLastManager(t *testing.T) {
	old, newer := metav1.NewTime(time.Unix(100, 0)), metav1.NewTime(time.Unix(200, 0))
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "demo", ManagedFields: []metav1.ManagedFieldsEntry{
			{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, Time: &old},
			{Manager: "kubectl-create", Operation: metav1.ManagedFieldsOperationUpdate, Time: &newer},
		}},
	}
	pb, err := runtime.Encode(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), cm)
	if err != nil {
		t.Fatal(err)
	}
	js, err := runtime.Encode(scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), cm)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		value []byte
		want  string
	}{
		{"protobuf", pb, "kubectl-create (Update)"},
		{"json", js, "kubectl-create (Update)"},
		{"encrypted", []byte("k8s:enc:aescbc:v1:key1:xxxx"), "(encrypted at rest)"},
		{"not an object", []byte("plain value"), "(not a Kubernetes object)"},
		{"no managed fields", []byte(`{"metadata":{"name":"a"}}`), "(no managedFields)"},
	}
	for _, tc := range cases {
		if got := lastManager(tc.value); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestCompareWrites: a resource and namespace with more writes in blue etcd than the proxies
// forwarded is reported with its managers; a deletecollection through a proxy covers any number
// of deletes.
func TestCompareWrites(t *testing.T) {
	blue := []blueWrite{
		{"configmaps", "demo", "kubectl-create (Update)"}, {"configmaps", "demo", "kubectl-create (Update)"},
		{"configmaps", "demo", "script (Update)"},
		{"leases", "kube-node-lease", "kubelet (Update)"},
		{"pods", "shop", "kube-scheduler (Update)"},
		{"events", "shop", "(no managedFields)"}, {"events", "shop", "(no managedFields)"},
		{"namespaces", "", "kubectl-edit (Update)"},
	}
	fw := forwardedCounts([]admin.ForwardedWrite{
		{Verb: "create", Resource: "configmaps", Namespace: "demo"},
		{Verb: "create", Resource: "pods", Subresource: "binding", Namespace: "shop"},
		{Verb: "deletecollection", Resource: "events", Namespace: "shop"},
		{Verb: "create", Resource: "events", Namespace: "shop"},
		{Verb: "update", Resource: "namespaces", Namespace: "shop", Name: "shop"},
	}, time.Now())
	got := compareWrites(blue, fw)
	want := []bypassGroup{
		{Resource: "configmaps", Namespace: "demo", InEtcd: 3, Forwarded: 1, Managers: []string{"kubectl-create (Update)", "script (Update)"}},
		{Resource: "leases", Namespace: "kube-node-lease", InEtcd: 1, Forwarded: 0, Managers: []string{"kubelet (Update)"}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range got {
		if got[i].String() != want[i].String() || !slices.Equal(got[i].Managers, want[i].Managers) {
			t.Errorf("got %s, want %s", got[i], want[i])
		}
	}
}

// TestForwardedWritesThatStoreNothing: a TokenRequest (serviceaccounts/token) or a request
// through pods/proxy writes no key of its resource: counted, each would hide a write around the
// proxies to that resource and namespace.
func TestForwardedWritesThatStoreNothing(t *testing.T) {
	fw := forwardedCounts([]admin.ForwardedWrite{
		{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Namespace: "x"},
		{Verb: "create", Resource: "pods", Subresource: "proxy", Namespace: "x"},
		{Verb: "update", Resource: "pods", Subresource: "status", Namespace: "x"},
	}, time.Now())
	got := compareWrites([]blueWrite{{"serviceaccounts", "x", "script (Update)"}, {"pods", "x", "kubelet (Update)"}}, fw)
	if len(got) != 1 || got[0].Resource != "serviceaccounts" {
		t.Fatalf("groups %+v: want the serviceaccounts write around the proxies reported", got)
	}
}

// TestApiserverOwnKeys: kube-apiserver's own keys are left out, a whole key only where it
// names one object (the kubernetes Service's endpoints, not kubernetes-dashboard's).
func TestApiserverOwnKeys(t *testing.T) {
	cases := []struct {
		key  string
		want bool
	}{
		{"/registry/masterleases/10.0.0.10", false},
		{"/registry/endpointslices/default/kubernetes", false},
		{"/registry/endpointslices/default/kubernetes-dashboard", true},
		{"/registry/configmaps/default/app", true},
	}
	for _, tc := range cases {
		ev := &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(tc.key), Value: []byte(`{"metadata":{}}`)}}
		if _, got := clientWrite(ev); got != tc.want {
			t.Errorf("%s: a client's write %v, want %v", tc.key, got, tc.want)
		}
	}
}

// TestForwardedCountsUntil: writes the proxies answered after the watch ended (and its slack)
// are not counted: they cannot be in what the watch saw, and counted they would hide as many
// writes around the proxies.
func TestForwardedCountsUntil(t *testing.T) {
	end := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ws := []admin.ForwardedWrite{
		{At: end.Add(-time.Second), Verb: "create", Resource: "configmaps", Namespace: "demo"},
		{At: end.Add(bypassSlack), Verb: "create", Resource: "configmaps", Namespace: "demo"},
		{At: end.Add(bypassSlack + time.Millisecond), Verb: "create", Resource: "configmaps", Namespace: "demo"},
	}
	if got := forwardedCounts(ws, end)[[2]string{"configmaps", "demo"}]; got != 2 {
		t.Errorf("counted %d writes, want the 2 answered by the watch's end and its slack", got)
	}
}

// skewedProxy is a proxy whose clock is off by skew: its status and its forwarded writes carry
// its time; since is what the cutover asked it for.
type skewedProxy struct {
	funcProxy
	skew   time.Duration
	writes []admin.ForwardedWrite
	since  time.Time
}

func (p *skewedProxy) Writes(_ context.Context, since time.Time) (admin.WritesResponse, error) {
	p.since = since
	return admin.WritesResponse{Writes: p.writes, Complete: true}, nil
}

// TestWritesOnOurClock: a proxy whose clock is seconds off (no NTP on its host) still has its
// forwarded writes compared with the right part of the watch: the cutover measures its clock
// against its own from the proxy's status, asks for its writes since the proxy's time of the
// start, and gives back their times on its own clock. A proxy from before statuses carried the
// time is taken as it is.
func TestWritesOnOurClock(t *testing.T) {
	for _, skew := range []time.Duration{3 * time.Second, -3 * time.Second, 0} {
		t.Run(skew.String(), func(t *testing.T) {
			now := time.Now()
			p := &skewedProxy{skew: skew, writes: []admin.ForwardedWrite{{At: now.Add(skew), Verb: "create", Resource: "configmaps", Namespace: "demo"}}}
			p.status = func(context.Context) (admin.Status, error) {
				return admin.Status{APILevel: admin.APILevel, Now: time.Now().Add(skew)}, nil
			}
			g := &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "b", Client: p}}}
			since := now.Add(-time.Minute)
			got, err := g.Writes(t.Context(), since)
			if err != nil {
				t.Fatal(err)
			}
			const tolerance = 100 * time.Millisecond
			if d := p.since.Sub(since.Add(skew)).Abs(); d > tolerance {
				t.Errorf("asked the proxy for writes since %s, want its time for %s (%s off)", p.since, since, d)
			}
			if d := got.Writes[0].At.Sub(now).Abs(); len(got.Writes) != 1 || d > tolerance {
				t.Errorf("write at %s on our clock, want %s (%s off)", got.Writes[0].At, now, d)
			}
			if o := g.clocks["b"].offset; (o - skew).Abs() > tolerance {
				t.Errorf("proxy b's clock measured %s off, want %s", o, skew)
			}
			summary, problems := g.clockNotes()
			want := map[time.Duration]string{3 * time.Second: "b 3s ahead of", -3 * time.Second: "b 3s behind", 0: ""}[skew]
			if (want == "") != (summary == "") || !strings.Contains(summary, want) || len(problems) > 0 {
				t.Errorf("clock notes %q, %q; want %q", summary, problems, want)
			}
		})
	}
	t.Run("slow admin API", func(t *testing.T) {
		p := &skewedProxy{}
		p.status = func(context.Context) (admin.Status, error) {
			time.Sleep(3 * bypassSlack / 2)
			return admin.Status{Now: time.Now()}, nil
		}
		g := &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "b", Client: p}}}
		if _, err := g.Writes(t.Context(), time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, problems := g.clockNotes(); len(problems) != 1 || !strings.Contains(problems[0], "proxy b's clock could not be measured") {
			t.Errorf("problems %q, want proxy b's clock named as unmeasurable", problems)
		}
	})
	t.Run("older proxy", func(t *testing.T) {
		p := &skewedProxy{writes: []admin.ForwardedWrite{{At: time.Unix(100, 0)}}}
		p.status = func(context.Context) (admin.Status, error) { return admin.Status{}, nil }
		g := &proxyGroup{proxies: []admin.Target[proxyAdmin]{{Name: "b", Client: p}}}
		got, err := g.Writes(t.Context(), time.Unix(50, 0))
		if err != nil || !p.since.Equal(time.Unix(50, 0)) || !got.Writes[0].At.Equal(time.Unix(100, 0)) {
			t.Errorf("writes %+v since %s (%v): want them as the proxy gave them", got, p.since, err)
		}
	})
}
