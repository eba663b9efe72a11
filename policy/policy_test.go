package policy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func req(method, target string, hdr ...string) *http.Request {
	r := httptest.NewRequest(method, "https://kube.example"+target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

var upgradeWS = []string{"Connection", "Upgrade", "Upgrade", "websocket"}
var upgradeSPDY = []string{"Connection", "Upgrade", "Upgrade", "SPDY/3.1"}

// resourcePaths covers core, grouped, cluster-scoped and namespaced resources.
var resourcePaths = []struct {
	name, collection, item string
}{
	{"core namespaced", "/api/v1/namespaces/default/configmaps", "/api/v1/namespaces/default/configmaps/cm1"},
	{"core cluster-scoped", "/api/v1/nodes", "/api/v1/nodes/n1"},
	{"core namespaces", "/api/v1/namespaces", "/api/v1/namespaces/default"},
	{"grouped namespaced", "/apis/apps/v1/namespaces/kube-system/deployments", "/apis/apps/v1/namespaces/kube-system/deployments/coredns"},
	{"grouped cluster-scoped", "/apis/rbac.authorization.k8s.io/v1/clusterroles", "/apis/rbac.authorization.k8s.io/v1/clusterroles/admin"},
	{"custom resource", "/apis/example.com/v1alpha1/namespaces/ns/widgets", "/apis/example.com/v1alpha1/namespaces/ns/widgets/w"},
}

func TestDefaultsEveryVerb(t *testing.T) {
	type tc struct {
		method, target string
		verb           string
		want           Class
	}
	var cases []tc
	for _, p := range resourcePaths {
		cases = append(cases,
			tc{"GET", p.collection, "list", Read},
			tc{"GET", p.collection + "?watch=true", "watch", Read},
			tc{"GET", p.collection + "?watch=1&resourceVersion=10", "watch", Read},
			tc{"GET", p.item, "get", Read},
			tc{"HEAD", p.item, "get", Read},
			tc{"POST", p.collection, "create", Write},
			tc{"PUT", p.item, "update", Write},
			tc{"PATCH", p.item, "patch", Write},
			tc{"DELETE", p.item, "delete", Write},
			tc{"DELETE", p.collection, "deletecollection", Write},
			// kube-apiserver changes nothing for OPTIONS (see TestOptions): a read where GET is.
			tc{"OPTIONS", p.item, "", Read},
			tc{"OPTIONS", p.collection, "", Read},
			tc{"PROPFIND", p.item, "", Write},
			tc{"GET", p.item + "/status", "get", Read},
			tc{"PUT", p.item + "/status", "update", Write},
			tc{"PATCH", p.item + "/scale", "patch", Write},
		)
	}
	pol := &Policy{}
	for _, c := range cases {
		t.Run(c.method+" "+c.target, func(t *testing.T) {
			a := NewClassifier().Classify(req(c.method, c.target))
			if a.Verb != c.verb {
				t.Errorf("verb = %q, want %q", a.Verb, c.verb)
			}
			d := pol.Decide(&a)
			if d.Class != c.want || d.Allow != (c.want == Read) {
				t.Errorf("decision = %+v, want class %v allow %v", d, c.want, c.want == Read)
			}
		})
	}
}

// decisionCase is a request and what the default policy decides for it.
type decisionCase struct {
	name   string
	r      *http.Request
	allow  bool
	reason string
}

// checkDecisions classifies each case's request and checks the default policy's decision.
func checkDecisions(t *testing.T, cases []decisionCase) {
	t.Helper()
	pol := &Policy{}
	c := NewClassifier()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := c.Classify(tc.r)
			d := pol.Decide(&a)
			if d.Allow != tc.allow || d.Reason != tc.reason {
				t.Errorf("%s %s: decision %+v (attrs %+v), want allow=%v reason=%q", tc.r.Method, tc.r.URL, d, a, tc.allow, tc.reason)
			}
		})
	}
}

func TestDefaultsSpecialCases(t *testing.T) {
	cases := []decisionCase{
		// Streaming subresources are writes whatever the verb says.
		{"exec websocket", req("GET", "/api/v1/namespaces/ns/pods/p/exec?command=sh&stdin=true", upgradeWS...), false, "write"},
		{"exec spdy post", req("POST", "/api/v1/namespaces/ns/pods/p/exec?command=sh", upgradeSPDY...), false, "write"},
		{"exec without upgrade", req("GET", "/api/v1/namespaces/ns/pods/p/exec"), false, "write"},
		{"attach websocket", req("GET", "/api/v1/namespaces/ns/pods/p/attach", upgradeWS...), false, "write"},
		{"portforward websocket", req("GET", "/api/v1/namespaces/ns/pods/p/portforward?ports=80", upgradeWS...), false, "write"},
		{"portforward spdy", req("POST", "/api/v1/namespaces/ns/pods/p/portforward", upgradeSPDY...), false, "write"},
		{"aggregated streaming subresource", req("GET", "/apis/subresources.kubevirt.io/v1/namespaces/ns/virtualmachineinstances/vm/console", upgradeWS...), false, "write"},
		{"node proxy", req("GET", "/api/v1/nodes/n1/proxy/stats/summary"), false, "write"},
		{"service proxy", req("GET", "/api/v1/namespaces/ns/services/svc:80/proxy/"), false, "write"},
		{"pod proxy", req("GET", "/api/v1/namespaces/ns/pods/p/proxy/metrics"), false, "write"},
		{"legacy proxy verb", req("GET", "/api/v1/proxy/namespaces/ns/pods/p/"), false, "write"},
		{"pod log", req("GET", "/api/v1/namespaces/ns/pods/p/log?follow=true"), true, "read"},
		// kube-apiserver streams pods/log over a WebSocket one way and ignores what the client sends.
		{"websocket pod log", req("GET", "/api/v1/namespaces/ns/pods/p/log?follow=true", upgradeWS...), true, "read"},
		{"spdy pod log", req("GET", "/api/v1/namespaces/ns/pods/p/log?container=c", upgradeSPDY...), true, "read"},
		{"websocket post to pod log", req("POST", "/api/v1/namespaces/ns/pods/p/log", upgradeWS...), false, "write"},
		{"websocket on the watch path of pod log", req("GET", "/api/v1/watch/namespaces/ns/pods/p/log", upgradeWS...), false, "write"},
		{"websocket log of an aggregated group's pods", req("GET", "/apis/example.com/v1/namespaces/ns/pods/p/log", upgradeWS...), false, "write"},
		{"websocket log of another core resource", req("GET", "/api/v1/nodes/n/log", upgradeWS...), false, "write"},
		// Upgrade headers on a plain get or list stay a write: an aggregated API may serve a
		// resource's own path with a Connecter (k8s.io/apiserver endpoints/installer.go).
		{"websocket get of one object", req("GET", "/api/v1/namespaces/ns/configmaps/c", upgradeWS...), false, "write"},
		{"websocket list", req("GET", "/apis/apps/v1/namespaces/ns/deployments", upgradeWS...), false, "write"},
		{"websocket watch", req("GET", "/api/v1/namespaces/ns/pods?watch=true", upgradeWS...), true, "read"},
		// An upgrade is a read only as a watch of a resource: RequestInfoFactory calls any GET on a
		// /watch/ path, or with ?watch=true, "watch", a streaming subresource's too.
		{"websocket on the watch path of a streaming subresource", req("GET", "/apis/subresources.kubevirt.io/v1/watch/namespaces/a/virtualmachineinstances/v/console", upgradeWS...), false, "write"},
		{"websocket watch=true of a streaming subresource", req("GET", "/apis/subresources.kubevirt.io/v1/namespaces/a/virtualmachineinstances/v/vnc?watch=true", upgradeWS...), false, "write"},
		{"spdy on the watch path of a status subresource", req("GET", "/api/v1/watch/namespaces/ns/pods/p/status", upgradeSPDY...), false, "write"},
		{"websocket watch of one object", req("GET", "/api/v1/watch/namespaces/ns/pods/p", upgradeWS...), true, "read"},
		{"legacy watch path", req("GET", "/api/v1/watch/namespaces/ns/pods"), true, "read"},
		{"watch then unwatch", req("GET", "/api/v1/pods?watch=true&watch=false"), true, "read"},
		// RequestInfoFactory calls every method on a /watch/ path "watch": only GET and HEAD are reads.
		{"post to legacy watch path", req("POST", "/api/v1/watch/pods"), false, "write"},
		{"put to legacy watch path", req("PUT", "/api/v1/watch/namespaces/ns/configmaps/c"), false, "write"},
		{"delete on legacy watch path", req("DELETE", "/apis/apps/v1/watch/namespaces/ns/deployments/d"), false, "write"},
		{"patch on legacy watch path", req("PATCH", "/api/v1/watch/namespaces/ns/pods"), false, "write"},
		// Reviews persist nothing.
		{"tokenreview", req("POST", "/apis/authentication.k8s.io/v1/tokenreviews"), true, "review"},
		{"selfsubjectreview", req("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews"), true, "review"},
		{"subjectaccessreview", req("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews"), true, "review"},
		{"localsubjectaccessreview", req("POST", "/apis/authorization.k8s.io/v1/namespaces/ns/localsubjectaccessreviews"), true, "review"},
		{"selfsubjectaccessreview", req("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"), true, "review"},
		{"selfsubjectrulesreview", req("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"), true, "review"},
		{"review kind in wrong group", req("POST", "/apis/example.com/v1/tokenreviews"), false, "write"},
		// Only the versions kube-apiserver 1.36 serves: v1. Another version of these groups is not its
		// review: an APIService registered for it may persist objects while fenced.
		{"subjectaccessreview v1beta1 (not served since 1.22)", req("POST", "/apis/authorization.k8s.io/v1beta1/subjectaccessreviews"), false, "write"},
		{"localsubjectaccessreview v1beta1 (not served since 1.22)", req("POST", "/apis/authorization.k8s.io/v1beta1/namespaces/ns/localsubjectaccessreviews"), false, "write"},
		{"selfsubjectaccessreview v1beta1 (not served since 1.22)", req("POST", "/apis/authorization.k8s.io/v1beta1/selfsubjectaccessreviews"), false, "write"},
		{"selfsubjectrulesreview v1beta1 (not served since 1.22)", req("POST", "/apis/authorization.k8s.io/v1beta1/selfsubjectrulesreviews"), false, "write"},
		{"tokenreview v1beta1 (not served since 1.22)", req("POST", "/apis/authentication.k8s.io/v1beta1/tokenreviews"), false, "write"},
		{"selfsubjectreview v1beta1 (not served since 1.33)", req("POST", "/apis/authentication.k8s.io/v1beta1/selfsubjectreviews"), false, "write"},
		{"selfsubjectreview v1alpha1 (not served since 1.32)", req("POST", "/apis/authentication.k8s.io/v1alpha1/selfsubjectreviews"), false, "write"},
		{"review at an unknown version", req("POST", "/apis/authorization.k8s.io/v9/subjectaccessreviews"), false, "write"},
		{"review at an alpha version", req("POST", "/apis/authentication.k8s.io/v2alpha1/tokenreviews"), false, "write"},
		{"delete of a review", req("DELETE", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews/x"), false, "write"},
		{"token request", req("POST", "/api/v1/namespaces/ns/serviceaccounts/default/token"), false, "write"},
		// Dry runs persist nothing.
		{"dry run create", req("POST", "/api/v1/namespaces/ns/configmaps?dryRun=All"), true, "dry-run"},
		{"dry run patch", req("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d?fieldManager=x&dryRun=All"), true, "dry-run"},
		{"dry run twice", req("DELETE", "/api/v1/namespaces/ns/configmaps/c?dryRun=All&dryRun=All"), true, "dry-run"},
		{"dry run mixed", req("POST", "/api/v1/namespaces/ns/configmaps?dryRun=All&dryRun=None"), false, "write"},
		{"dry run lower case", req("POST", "/api/v1/namespaces/ns/configmaps?dryRun=all"), false, "write"},
		{"dry run empty", req("POST", "/api/v1/namespaces/ns/configmaps?dryRun="), false, "write"},
		{"dry run other key case", req("POST", "/api/v1/namespaces/ns/configmaps?dryrun=All"), false, "write"},
		{"dry run bad query", req("POST", "/api/v1/namespaces/ns/configmaps?dryRun=All;x=1"), false, "write"},
		{"dry run subresource", req("POST", "/api/v1/namespaces/ns/pods/p/eviction?dryRun=All"), false, "write"},
		// The legacy proxy path: verb proxy, no subresource; dryRun means nothing to it.
		{"dry run on the proxy path", req("POST", "/api/v1/proxy/namespaces/default/pods/foo/x?dryRun=All"), false, "write"},
		// Non-resource paths.
		{"healthz", req("GET", "/healthz"), true, "read"},
		{"healthz check", req("GET", "/healthz/etcd"), true, "read"},
		{"livez", req("GET", "/livez?verbose"), true, "read"},
		{"readyz", req("HEAD", "/readyz"), true, "read"},
		{"version", req("GET", "/version"), true, "read"},
		{"openapi v2", req("GET", "/openapi/v2"), true, "read"},
		{"openapi v3", req("GET", "/openapi/v3/apis/apps/v1"), true, "read"},
		{"api discovery", req("GET", "/api"), true, "read"},
		{"api version discovery", req("GET", "/api/v1"), true, "read"},
		{"apis discovery", req("GET", "/apis"), true, "read"},
		{"group discovery", req("GET", "/apis/apps"), true, "read"},
		{"group version discovery", req("GET", "/apis/apps/v1"), true, "read"},
		{"metrics", req("GET", "/metrics"), true, "read"},
		{"oidc discovery", req("GET", "/.well-known/openid-configuration"), true, "read"},
		{"post healthz", req("POST", "/healthz"), false, "write"},
		{"put version", req("PUT", "/version"), false, "write"},
		{"unknown non-resource get", req("GET", "/logs/kube-apiserver.log"), false, "write"},
		{"debug flags put", req("PUT", "/debug/flags/v"), false, "write"},
		{"apis prefix lookalike", req("GET", "/apisx"), false, "write"},
		{"method case matters", req("HEAd", "/api"), false, "write"},
		{"lower-case get of a resource", req("get", "/api/v1/namespaces"), false, "unrecognised: method get has no Kubernetes verb"},
		// Odd shapes.
		{"double slash", req("GET", "//api/v1/namespaces"), false, "unrecognised: empty path segment"},
		{"double slash write", req("POST", "//api/v1/namespaces/ns/configmaps"), false, "unrecognised: empty path segment"},
		{"empty segment inside", req("GET", "/api/v1//namespaces"), false, "unrecognised: empty path segment"},
		{"dot dot", req("GET", "/api/v1/namespaces/ns/configmaps/../pods/p/exec"), false, "unrecognised: dot segment in path"},
		{"encoded slash", req("GET", "/api/v1/namespaces/ns/pods/p%2Fexec"), false, "unrecognised: encoded slash in path"},
		{"encoded letters", req("GET", "/api/v1/namespaces/ns/pods/p/ex%65c"), false, "write"},
		{"trailing slash read", req("GET", "/api/v1/namespaces/"), true, "read"},
		{"trailing slash write", req("POST", "/api/v1/namespaces/ns/configmaps/"), false, "write"},
		{"trailing slash review", req("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews/"), true, "review"},
	}
	checkDecisions(t, cases)
}

func TestRules(t *testing.T) {
	pol, err := Parse([]byte(`apiVersion: kubefence.io/v1alpha1
kind: FencePolicy
rules:
- name: leader-election
  action: allow
  verbs: [get, create, update]
  apiGroups: [coordination.k8s.io]
  resources: [leases]
  namespaces: [kube-system]
- name: no-secret-reads
  action: refuse
  resources: [secrets]
- name: evictions
  action: allow
  resources: ["pods/*"]
  groups: [system:masters]
- name: flags
  action: allow
  nonResourceURLs: ["/debug/flags/*"]
- action: allow
  users: [system:kube-scheduler]
- name: any-certificate-user
  action: allow
  verbs: [create]
  resources: [configmaps]
  users: ["*"]
`))
	if err != nil {
		t.Fatal(err)
	}
	c := NewClassifier()
	cases := []struct {
		name   string
		r      *http.Request
		user   string
		groups []string
		allow  bool
		reason string
	}{
		{"lease update allowed", req("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-controller-manager"), "", nil, true, `rule "leader-election"`},
		{"lease in other namespace", req("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/x"), "", nil, false, "write"},
		{"lease delete not listed", req("DELETE", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x"), "", nil, false, "write"},
		{"secret read refused", req("GET", "/api/v1/namespaces/ns/secrets/s"), "", nil, false, `rule "no-secret-reads"`},
		{"secret options refused by a rule without verbs", req("OPTIONS", "/api/v1/namespaces/ns/secrets/s"), "", nil, false, `rule "no-secret-reads"`},
		{"options has no verb for a rule with verbs", req("OPTIONS", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x"), "", nil, true, "read"},
		{"eviction by group", req("POST", "/api/v1/namespaces/ns/pods/p/eviction"), "u", []string{"a", "system:masters"}, true, `rule "evictions"`},
		{"eviction without group", req("POST", "/api/v1/namespaces/ns/pods/p/eviction"), "u", []string{"a"}, false, "write"},
		{"pods itself not matched by pods/*", req("DELETE", "/api/v1/namespaces/ns/pods/p"), "u", []string{"system:masters"}, false, "write"},
		{"non-resource rule", req("PUT", "/debug/flags/v"), "", nil, true, `rule "flags"`},
		{"non-resource rule does not match resources", req("PUT", "/api/v1/namespaces/ns/configmaps/debug"), "", nil, false, "write"},
		{"by user", req("POST", "/api/v1/namespaces/ns/events"), "system:kube-scheduler", nil, true, "rule #5"},
		{"unknown shape ignores rules", req("POST", "//api/v1/namespaces/ns/events"), "system:kube-scheduler", nil, false, "unrecognised: empty path segment"},
		// users: ["*"] is any user the proxy knows; a client without a verified certificate has none.
		{"any user: a certificate user", req("POST", "/api/v1/namespaces/ns/configmaps"), "alice", nil, true, `rule "any-certificate-user"`},
		{"any user: no identity", req("POST", "/api/v1/namespaces/ns/configmaps"), "", nil, false, "write"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := c.Classify(tc.r)
			a.User, a.Groups = tc.user, tc.groups
			d := pol.Decide(&a)
			if d.Allow != tc.allow || d.Reason != tc.reason || d.ByRule != strings.HasPrefix(tc.reason, "rule ") {
				t.Errorf("decision %+v, want allow=%v reason=%s, by a rule of the file only when it names one", d, tc.allow, tc.reason)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string
	}{
		{"empty", "", []string{"empty document"}},
		{"syntax", "apiVersion: kubefence.io/v1alpha1\nkind: [\n", []string{"line 2"}},
		{"unknown field", "apiVersion: kubefence.io/v1alpha1\nkind: FencePolicy\nrules:\n- action: allow\n  verb: [get]\n", []string{"line 5", "field verb not found"}},
		{"wrong kind and version", "apiVersion: v1\nkind: Policy\nrules: []\n", []string{`line 1: apiVersion "v1"`, `line 2: kind "Policy"`}},
		{"bad rules", "apiVersion: kubefence.io/v1alpha1\nkind: FencePolicy\nrules:\n- action: permit\n- name: x\n  action: allow\n  verbs: [frobnicate]\n- action: refuse\n  resources: [a/b/c]\n  nonResourceURLs: [healthz]\n",
			[]string{`line 4: rule #1: action "permit"`, `line 5: rule "x": verb "frobnicate"`, `line 8: rule #3: nonResourceURLs cannot`, `line 8: rule #3: nonResourceURL "healthz"`, `line 8: rule #3: resource "a/b/c"`}},
		{"missing action", "apiVersion: kubefence.io/v1alpha1\nkind: FencePolicy\nrules:\n- verbs: [get]\n", []string{"line 4: rule #1: action is missing"}},
		// Rules that can never match: RBAC's */status (kubefence matches resource/sub or
		// resource/*), a resource with an empty part, an HTTP verb on resources and a
		// Kubernetes verb on non-resource URLs.
		{"dead rules", "apiVersion: kubefence.io/v1alpha1\nkind: FencePolicy\nrules:\n- action: allow\n  resources: [\"*/status\"]\n- action: allow\n  resources: [pods/]\n- action: refuse\n  verbs: [post]\n  resources: [pods]\n- action: refuse\n  verbs: [create]\n  nonResourceURLs: [/metrics]\n",
			[]string{`line 4: rule #1: resource "*/status"`, `line 6: rule #2: resource "pods/"`, `line 8: rule #3: verb "post" is not a verb of resource requests`, `line 11: rule #4: verb "create" is not a verb of non-resource requests`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// FuzzClassify checks that classification never panics, that nothing but a plain GET or HEAD
// of a recognised shape, or an OPTIONS without upgrade whose GET would be a read, is ever called
// a read, that no upgrade but a watch of a resource or a get of core pods/log is a read, and that
// a DELETE with a body is never a dry run by its query.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{"/api/v1/pods", "/api/v1/watch/pods", "/api/v1/watch/namespaces/ns/configmaps/c", "/api/v1/namespaces/a/pods/b/exec", "//api", "/apis/apps/v1/namespaces/x/deployments?watch=true&watch=false", "/api/v1/nodes/n/proxy", "/healthz", "/%2F", "/api/v1/namespaces/ns/pods/p/ex%65c", "/api/v1/namespaces/ns/pods/p/log?follow=true", "/apis/x.io/v1/namespaces/ns/pods/p/log", "/debug/flags/v"} {
		for _, m := range []string{"GET", "POST", "HEAD", "PATCH", "PUT", "DELETE", "OPTIONS"} {
			f.Add(m, s, false, "")
			f.Add(m, s, true, "")
		}
	}
	for _, s := range []string{"/api/v1/namespaces/ns/configmaps/cm1?dryRun=All", "/api/v1/namespaces/ns/configmaps?dryRun=All"} {
		f.Add("DELETE", s, false, `{"kind":"DeleteOptions","apiVersion":"v1"}`)
		f.Add("DELETE", s, false, `{}`)
	}
	c := NewClassifier()
	pol := &Policy{}
	f.Fuzz(func(t *testing.T, method, target string, upgrade bool, body string) {
		var rb io.Reader
		if body != "" {
			rb = strings.NewReader(body)
		}
		r, err := http.NewRequest(method, "https://kube.example"+target, rb)
		if err != nil || r.URL.Host != "kube.example" {
			return
		}
		if upgrade {
			r.Header.Set("Connection", "Upgrade")
			r.Header.Set("Upgrade", "websocket")
		}
		a := c.Classify(r)
		if a.BodyDecidesDryRun() && a.DryRun {
			t.Fatalf("%s %q with a body: dry run taken from the query, which the apiserver ignores", method, target)
		}
		d := pol.Decide(&a)
		if d.Class != Read {
			return
		}
		switch r.Method {
		case "GET", "HEAD":
		case "OPTIONS":
			// The one other method that can be a read, and never more than a GET of it.
			g := r.Clone(r.Context())
			g.Method = "GET"
			ga := c.Classify(g)
			if upgrade || (a.IsResourceRequest && a.Verb != "") || ga.Class() != Read {
				t.Fatalf("OPTIONS %q classified as read, GET of it %v: %+v", target, ga.Class(), a)
			}
		default:
			t.Fatalf("%s %q classified as read: %+v", method, target, a)
		}
		podLog := a.Verb == "get" && a.IsResourceRequest && a.APIGroup == "" && a.Resource == "pods" && a.Subresource == "log"
		if a.Unknown != "" || (upgrade && a.Verb != "watch" && !podLog) {
			t.Fatalf("%q classified as read: %+v", target, a)
		}
		switch a.Subresource {
		case "exec", "attach", "portforward", "proxy":
			t.Fatalf("%q classified as read: %+v", target, a)
		}
		if strings.Contains(r.URL.Path, "//") || strings.Contains(r.URL.Path, "/../") || strings.Contains(r.URL.Path, "/./") {
			t.Fatalf("odd path %q classified as read", r.URL.Path)
		}
	})
}

// TestDryRunQueryAndBody covers every verb × (query, body): kube-apiserver reads a DELETE's
// DeleteOptions from its body whenever the body is not empty and then ignores the query, so only
// the body can make such a request a dry run; other verbs take dryRun from the query alone.
func TestDryRunQueryAndBody(t *testing.T) {
	const item, coll = "/api/v1/namespaces/ns/configmaps/cm1", "/api/v1/namespaces/ns/configmaps"
	const optsAll = `{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}`
	cases := []struct {
		name, method, target, body, contentType string
		want                                    bool // allowed while fenced
		unknownLength                           bool // chunked, or HTTP/2 without content-length
	}{
		{"delete, query, no body", "DELETE", item + "?dryRun=All", "", "", true, false},
		// The body's length unknown until read, then empty: the apiserver reads the query.
		{"delete, query, body of unknown length turned out empty", "DELETE", item + "?dryRun=All", "", "", true, true},
		{"delete, no query, body of unknown length turned out empty", "DELETE", item, "", "", false, true},
		{"delete, query, empty object body", "DELETE", item + "?dryRun=All", `{}`, "application/json", false, false},
		{"delete, query, DeleteOptions body", "DELETE", item + "?dryRun=All", `{"kind":"DeleteOptions","apiVersion":"v1"}`, "application/json", false, false},
		{"delete, query, body says None", "DELETE", item + "?dryRun=All", `{"dryRun":[]}`, "application/json", false, false},
		{"delete, no query, body says All", "DELETE", item, optsAll, "application/json", true, false},
		{"delete, no query, body says All, no content type", "DELETE", item, optsAll, "", true, false},
		{"delete, body says All twice", "DELETE", item, `{"dryRun":["All","All"]}`, "application/json", true, false},
		{"delete, body says All then None", "DELETE", item, `{"dryRun":["All","None"]}`, "application/json", false, false},
		{"delete, body dryRun key in other case", "DELETE", item, `{"DryRun":["All"]}`, "application/json", false, false},
		{"delete, body dryRun duplicate, last empty", "DELETE", item, `{"dryRun":["All"],"dryRun":[]}`, "application/json", false, false},
		{"delete, body dryRun duplicate, last All", "DELETE", item, `{"dryRun":[],"dryRun":["All"]}`, "application/json", true, false},
		{"delete, body dryRun as string", "DELETE", item, `{"dryRun":"All"}`, "application/json", false, false},
		{"delete, body yaml", "DELETE", item, "dryRun: [All]\n", "application/yaml", false, false},
		{"delete, body protobuf", "DELETE", item, optsAll, "application/vnd.kubernetes.protobuf", false, false},
		{"delete, body not JSON", "DELETE", item, `dryRun`, "application/json", false, false},
		{"delete, body trailing garbage", "DELETE", item, optsAll + `x`, "application/json", false, false},
		{"delete, body null", "DELETE", item, `null`, "application/json", false, false},
		{"deletecollection, query, no body", "DELETE", coll + "?dryRun=All", "", "", true, false},
		{"deletecollection, query, body", "DELETE", coll + "?dryRun=All", `{}`, "application/json", false, false},
		{"deletecollection, body says All", "DELETE", coll, optsAll, "application/json", true, false},
		{"create, query, body", "POST", coll + "?dryRun=All", `{"kind":"ConfigMap"}`, "application/json", true, false},
		{"create, no query, body says All", "POST", coll, `{"dryRun":["All"]}`, "application/json", false, false},
		{"update, query, body", "PUT", item + "?dryRun=All", `{"kind":"ConfigMap"}`, "application/json", true, false},
		{"patch, query, body", "PATCH", item + "?dryRun=All", `{}`, "application/merge-patch+json", true, false},
		{"patch, no query", "PATCH", item, `{}`, "application/merge-patch+json", false, false},
	}
	c := NewClassifier()
	pol := &Policy{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			r := httptest.NewRequest(tc.method, "https://kube.example"+tc.target, body)
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			if tc.unknownLength {
				r.ContentLength = -1
			}
			a := c.Classify(r)
			if a.BodyDecidesDryRun() {
				a.SetDryRunFromBody(r.Header.Get("Content-Type"), []byte(tc.body), r.URL.RawQuery) // as the proxy does, once it has read the body
			}
			if d := pol.Decide(&a); d.Allow != tc.want {
				t.Errorf("%s %s body %q: decision %+v, want allow=%v", tc.method, tc.target, tc.body, d, tc.want)
			}
		})
	}
}

func TestHasBodyUnknownLength(t *testing.T) {
	r := httptest.NewRequest("DELETE", "https://kube.example/api/v1/namespaces/ns/configmaps/c?dryRun=All", nil)
	r.ContentLength = -1 // HTTP/2 without content-length, or chunked: a body may follow
	a := NewClassifier().Classify(r)
	if !a.BodyDecidesDryRun() || a.DryRun {
		t.Fatalf("a DELETE whose body length is unknown must not be a dry run by its query: %+v", a)
	}
}

func TestSession(t *testing.T) {
	c := NewClassifier()
	cases := []struct {
		r    *http.Request
		want bool
	}{
		{req("GET", "/api/v1/namespaces/ns/pods/p/exec?command=sh", upgradeWS...), true},
		{req("POST", "/api/v1/namespaces/ns/pods/p/portforward", upgradeSPDY...), true},
		{req("GET", "/api/v1/namespaces/ns/services/s:80/proxy/x"), true},
		{req("GET", "/api/v1/proxy/namespaces/ns/pods/p/"), true},
		{req("GET", "/api/v1/namespaces/ns/pods?watch=true", upgradeWS...), false}, // a read
		{req("POST", "/api/v1/namespaces/ns/configmaps"), false},
		{req("GET", "/api/v1/namespaces/ns/pods/p/log"), false},
		{req("GET", "/api/v1/namespaces/ns/pods/p/log?follow=true", upgradeWS...), false}, // a read
		{req("OPTIONS", "/api/v1/namespaces/ns/pods/p/proxy/", "Origin", "https://x.example"), true},
		// An aggregated API's streaming subresource (KubeVirt's console, say) is a session.
		{req("GET", "/apis/subresources.kubevirt.io/v1/namespaces/ns/virtualmachineinstances/v/console", upgradeWS...), true},
		{req("GET", "/apis/subresources.kubevirt.io/v1/watch/namespaces/a/virtualmachineinstances/v/console", upgradeWS...), true},
		// Upgrade headers change nothing of what kube-apiserver does with a write to an object
		// or to a subresource it stores: they are writes the barrier waits for.
		{req("POST", "/api/v1/namespaces/ns/configmaps", upgradeWS...), false},
		{req("PUT", "/api/v1/namespaces/ns/configmaps/c", upgradeSPDY...), false},
		{req("DELETE", "/apis/apps/v1/namespaces/ns/deployments/d", upgradeWS...), false},
		{req("PUT", "/api/v1/namespaces/ns/pods/p/status", upgradeWS...), false},
		{req("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", upgradeWS...), false},
		{req("POST", "/api/v1/namespaces/ns/pods/p/binding", upgradeWS...), false},
		{req("POST", "/api/v1/namespaces/ns/pods/p/eviction", upgradeWS...), false},
		// A path the classifier does not parse (kube-apiserver routes on the decoded one) is a
		// write whatever its headers say.
		{req("POST", "/api/v1/namespaces%2Fns%2Fconfigmaps", upgradeWS...), false},
		{req("POST", "/api/v1/namespaces/x/../ns/configmaps", upgradeWS...), false},
		{req("PUT", "/api/v1//namespaces/ns/configmaps/c", upgradeSPDY...), false},
	}
	for _, tc := range cases {
		a := c.Classify(tc.r)
		if got := a.Session(); got != tc.want {
			t.Errorf("%s %s: Session() = %v, want %v", tc.r.Method, tc.r.URL, got, tc.want)
		}
	}
}

// TestOptions covers OPTIONS, a browser's CORS preflight among them. kube-apiserver changes
// nothing for it: its CORS filter answers a preflight from an allowed origin itself, and
// otherwise no route but the */proxy connecters takes OPTIONS. So OPTIONS is a read exactly
// where a GET of the same shape is, with or without the preflight headers, which do not change
// where the request goes.
func TestOptions(t *testing.T) {
	preflight := []string{"Origin", "https://console.example", "Access-Control-Request-Method", "GET"}
	cases := []decisionCase{
		{"preflight of a list", req("OPTIONS", "/api/v1/namespaces/ns/pods", preflight...), true, "read"},
		{"preflight of a watch", req("OPTIONS", "/api/v1/namespaces/ns/pods?watch=true", preflight...), true, "read"},
		{"preflight of a grouped object", req("OPTIONS", "/apis/apps/v1/namespaces/ns/deployments/d", preflight...), true, "read"},
		{"preflight of an aggregated resource", req("OPTIONS", "/apis/metrics.k8s.io/v1beta1/namespaces/ns/pods", preflight...), true, "read"},
		{"preflight of pod log", req("OPTIONS", "/api/v1/namespaces/ns/pods/p/log", preflight...), true, "read"},
		{"preflight of a status subresource", req("OPTIONS", "/api/v1/namespaces/ns/pods/p/status", preflight...), true, "read"},
		{"preflight of discovery", req("OPTIONS", "/apis", preflight...), true, "read"},
		{"preflight of version", req("OPTIONS", "/version", preflight...), true, "read"},
		{"options without preflight headers", req("OPTIONS", "/api/v1/namespaces"), true, "read"},
		{"options with dry run", req("OPTIONS", "/api/v1/namespaces/ns/configmaps?dryRun=All"), true, "read"},
		// The */proxy connecters take OPTIONS and forward it to the pod, node or service.
		{"preflight of pod proxy", req("OPTIONS", "/api/v1/namespaces/ns/pods/p/proxy/x", preflight...), false, "write"},
		{"preflight of service proxy", req("OPTIONS", "/api/v1/namespaces/ns/services/s:80/proxy/", preflight...), false, "write"},
		{"preflight of node proxy", req("OPTIONS", "/api/v1/nodes/n/proxy/stats", preflight...), false, "write"},
		{"preflight of legacy proxy", req("OPTIONS", "/api/v1/proxy/namespaces/ns/pods/p/", preflight...), false, "write"},
		// No more a read than a GET of the same shape.
		{"preflight of exec", req("OPTIONS", "/api/v1/namespaces/ns/pods/p/exec", preflight...), false, "write"},
		{"preflight of attach", req("OPTIONS", "/api/v1/namespaces/ns/pods/p/attach", preflight...), false, "write"},
		{"preflight of portforward", req("OPTIONS", "/api/v1/namespaces/ns/pods/p/portforward", preflight...), false, "write"},
		{"options on a watch path", req("OPTIONS", "/api/v1/watch/namespaces/ns/pods", preflight...), false, "write"},
		{"options with upgrade", req("OPTIONS", "/api/v1/namespaces/ns/pods", upgradeWS...), false, "write"},
		{"options with upgrade on pod log", req("OPTIONS", "/api/v1/namespaces/ns/pods/p/log", upgradeWS...), false, "write"},
		{"preflight of an unknown non-resource path", req("OPTIONS", "/logs/kube-apiserver.log", preflight...), false, "write"},
		{"preflight of debug flags", req("OPTIONS", "/debug/flags/v", preflight...), false, "write"},
		{"preflight of an odd path", req("OPTIONS", "//api/v1/namespaces", preflight...), false, "unrecognised: empty path segment"},
		{"lower-case options", req("options", "/api/v1/namespaces", preflight...), false, "unrecognised: method options has no Kubernetes verb"},
	}
	checkDecisions(t, cases)
}

// TestIdentityRulesWarned: a rule naming users or groups never matches on a proxy that forwards
// no identity (no --client-ca-file); nor does one naming system:authenticated, which the proxy's
// certificate authentication does not add (kube-apiserver does, after it).
func TestIdentityRulesWarned(t *testing.T) {
	p := &Policy{Rules: []Rule{
		{Name: "ci", Action: Refuse, Users: []string{"ci-bot"}},
		{Name: "everyone", Action: Allow, Groups: []string{"system:authenticated"}},
		{Name: "plain", Action: Allow, Resources: []string{"leases"}},
	}}
	without := strings.Join(p.Warnings(false), "\n")
	for _, want := range []string{`rule "ci" names users or groups`, `rule "everyone" names users or groups`} {
		if !strings.Contains(without, want) {
			t.Errorf("warnings without identity %q: want %q", without, want)
		}
	}
	with := strings.Join(p.Warnings(true), "\n")
	if strings.Contains(with, `"ci"`) || !strings.Contains(with, `rule "everyone": group system:authenticated`) || strings.Contains(with, `"plain"`) {
		t.Errorf("warnings with identity %q: want only the system:authenticated one", with)
	}
}

// TestShippedExampleParses: deploy/examples/policy.yaml is a policy the proxy takes, with no
// warning on a proxy that forwards identities.
func TestShippedExampleParses(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "deploy", "examples", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse(data)
	if err != nil {
		t.Fatalf("deploy/examples/policy.yaml: %v", err)
	}
	if w := p.Warnings(true); len(w) > 0 {
		t.Errorf("deploy/examples/policy.yaml: %q", w)
	}
}
