// Package policy decides, from a request alone, whether it may pass the write fence.
//
// It is pure: no I/O, no globals, no clock. Classify turns an *http.Request into Attributes with
// k8s.io/apiserver's RequestInfoFactory plus the cases the verb alone gets wrong; Policy.Decide
// applies the operator's rules and then the defaults. Anything the classifier does not recognise
// is a write: the fence fails closed.
package policy

import (
	"net/http"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// Class is what a request is for the fence.
type Class uint8

const (
	// Write is anything that may change cluster state, and anything not recognised.
	Write Class = iota
	// Read is get, list and watch of resources, GET/HEAD of the known read-only paths, and
	// OPTIONS where a GET is a read.
	Read
)

func (c Class) String() string {
	if c == Read {
		return "read"
	}
	return "write"
}

// Attributes are what the fence knows of a request.
type Attributes struct {
	// Verb is the Kubernetes verb (get, list, watch, create, update, patch, delete,
	// deletecollection, proxy), or the lower-case HTTP method for non-resource paths. Empty for
	// an OPTIONS of a resource (kube-apiserver's authorizer sees no verb either) and when the
	// request could not be classified.
	Verb string
	// Method is the HTTP method exactly as sent (methods are case-sensitive).
	Method            string
	IsResourceRequest bool
	APIGroup          string
	APIVersion        string
	Resource          string
	Subresource       string
	Namespace         string
	Name              string
	Path              string
	// Upgrade is set for a protocol upgrade (WebSocket, SPDY).
	Upgrade bool
	// DryRun is set when every dryRun value is "All": the apiserver persists nothing. For a
	// DELETE that carries a body the query does not count (see BodyDecidesDryRun).
	DryRun bool
	// HasBody is set when the request may carry a body (a Content-Length above zero, or a body
	// of unknown length).
	HasBody bool
	// Unknown says why the request's shape was not recognised (it is then a write).
	Unknown string
	// User and Groups are the authenticated client identity, when the proxy knows it.
	User   string
	Groups []string
}

// Class is the request's class before any rule: the fence's default view of it.
func (a *Attributes) Class() Class {
	if a.Unknown != "" {
		return Write
	}
	if a.Method == http.MethodOptions {
		return a.optionsClass()
	}
	if a.Upgrade && !a.readOnlyUpgrade() {
		// exec, attach, port-forward and any aggregated API's streaming subresource.
		return Write
	}
	if a.IsResourceRequest {
		// RequestInfoFactory calls any method on a /watch/ path "watch", and any method on a
		// /proxy/ path "proxy": only a plain GET or HEAD can be a read.
		if a.Method != http.MethodGet && a.Method != http.MethodHead {
			return Write
		}
		switch a.Subresource {
		case "exec", "attach", "portforward", "proxy":
			return Write
		}
		switch a.Verb {
		case "get", "list", "watch":
			return Read
		}
		return Write
	}
	// RequestInfoFactory lower-cases the method of non-resource requests; "HEAd" is not HEAD.
	if (a.Method == http.MethodGet || a.Method == http.MethodHead) && readOnlyPath(a.Path) {
		return Read
	}
	return Write
}

// readOnlyUpgrade reports the protocol upgrades that can be reads (the method is checked by
// Class): two shapes only.
//
// A watch of a resource: k8s.io/apiserver serves it as a WebSocket stream of events
// (endpoints/handlers/watch.go). Not a watch of a subresource: RequestInfoFactory also calls
// "watch" a GET on a /watch/ path to a subresource, e.g.
// .../watch/.../virtualmachineinstances/v/console, an aggregated API's session.
//
// A get of pods/log in the core group: LogREST is a GetterWithOptions only, whose Get returns a
// LocationStreamer that GETs the kubelet (kubernetes pkg/registry/core/pod/rest/log.go,
// apiserver registry/generic/rest/streamer.go). StreamObject sends it over a WebSocket with
// wsstream's Reader, which discards whatever the client sends (IgnoreReceives), and ignores any
// other upgrade (apiserver endpoints/handlers/responsewriters/writers.go, StreamObject). /api is
// kube-apiserver's own: kube-aggregator serves it through the local APIService "v1." and hands
// extension apiservers /apis/<group>/<version> only (kube-aggregator pkg/apiserver/apiserver.go).
//
// A plain get or list with upgrade headers stays a write: kube-apiserver's own handlers ignore
// the upgrade (handlers/get.go serializes the object), but the classifier cannot tell an
// aggregated group, and an extension apiserver may serve a resource's own path with a
// Connecter (apiserver endpoints/installer.go registers CONNECT on itemPath), which after the
// upgrade takes whatever the client sends.
func (a *Attributes) readOnlyUpgrade() bool {
	if !a.IsResourceRequest {
		return false
	}
	if a.Verb == "watch" && a.Subresource == "" {
		return true
	}
	return a.Verb == "get" && a.APIGroup == "" && a.Resource == "pods" && a.Subresource == "log"
}

// optionsClass classes an OPTIONS (a browser's CORS preflight, say): a read where a GET of the
// same shape is, else a write. kube-apiserver changes nothing for it: its CORS filter answers
// an OPTIONS from an allowed origin with 204 before any handler (apiserver
// server/filters/cors.go, WithCORS, outside authentication in server/config.go); otherwise it
// reaches the handlers, where no route takes OPTIONS (endpoints/installer.go registers GET,
// POST, PUT, PATCH, DELETE and the connecters' methods; go-restful answers 405, the CRD handler
// MethodNotSupported) except the */proxy connecters, which forward it to the pod, node or
// service (kubernetes pkg/registry/core/pod/rest/subresources.go, node/rest/proxy.go, service:
// proxyMethods). An aggregated API gets it from kube-aggregator as it gets a GET, which is a
// read already. The preflight headers (Origin, Access-Control-Request-Method) are not required:
// they change where the request goes only when the CORS filter answers it, which the fence cannot
// know. Non-resource paths and upgrades are no more a read than a GET of them would be.
func (a *Attributes) optionsClass() Class {
	if a.Upgrade {
		return Write
	}
	if !a.IsResourceRequest {
		if readOnlyPath(a.Path) {
			return Read
		}
		return Write
	}
	if a.Verb != "" {
		// RequestInfoFactory's path verbs: "watch" on /watch/ (GET-only routes) and "proxy".
		return Write
	}
	switch a.Subresource {
	case "exec", "attach", "portforward", "proxy":
		return Write
	}
	return Read
}

// Session reports a write that opens a session rather than changes stored state: exec, attach,
// port-forward, a */proxy request, or a protocol upgrade to another subresource kube-apiserver
// does not store (an aggregated API's console, say) or to a non-resource path (one this
// classifier parsed: an odd path it could not parse is a write like any other). It passes the
// fence only while it is open, but the fence's barrier does not wait for it: it goes to
// kubelets, pods and services, not etcd, and may last for hours (docs/proxy.md). Upgrade
// headers on a write to an object itself or to a subresource kube-apiserver stores change
// nothing of what the apiserver does with it: that is a write like any other.
func (a *Attributes) Session() bool {
	if a.Class() != Write {
		return false
	}
	switch {
	case sessionSubresources[a.Subresource], a.Verb == "proxy":
		return true
	case !a.Upgrade, a.Unknown != "": // a path not parsed here may still name a stored object
		return false
	case !a.IsResourceRequest:
		return true
	}
	return a.Subresource != "" && !storedSubresources[a.Subresource]
}

// sessionSubresources are kube-apiserver's own session subresources.
var sessionSubresources = map[string]bool{"exec": true, "attach": true, "portforward": true, "proxy": true}

// storedSubresources are the subresources through which kube-apiserver writes its objects.
var storedSubresources = map[string]bool{
	"status": true, "scale": true, "binding": true, "eviction": true, "approval": true,
	"finalize": true, "ephemeralcontainers": true, "resize": true,
}

// Classifier classifies requests. The zero value is not usable; use NewClassifier.
type Classifier struct {
	info *request.RequestInfoFactory
}

// NewClassifier returns a classifier for the Kubernetes API prefixes /api and /apis.
func NewClassifier() *Classifier {
	return &Classifier{info: &request.RequestInfoFactory{
		APIPrefixes:          sets.NewString("api", "apis"),
		GrouplessAPIPrefixes: sets.NewString("api"),
	}}
}

// Classify reads the request line and headers (never the body) and returns its attributes.
func (c *Classifier) Classify(r *http.Request) Attributes {
	a := Attributes{Path: r.URL.Path, Method: r.Method, Upgrade: isUpgrade(r.Header),
		HasBody: r.ContentLength != 0 || len(r.TransferEncoding) > 0}
	if why := oddPath(r.URL); why != "" {
		a.Unknown = why
		return a
	}
	info, err := c.info.NewRequestInfo(r)
	if err != nil {
		a.Unknown = "request info: " + err.Error()
		return a
	}
	a.Verb = info.Verb
	a.IsResourceRequest = info.IsResourceRequest
	a.APIGroup = info.APIGroup
	a.APIVersion = info.APIVersion
	a.Resource = info.Resource
	a.Subresource = info.Subresource
	a.Namespace = info.Namespace
	a.Name = info.Name
	if a.Verb == "" && r.Method != http.MethodOptions {
		// RequestInfoFactory has no verb for OPTIONS on a resource path either: Class knows it.
		a.Unknown = "method " + r.Method + " has no Kubernetes verb"
	}
	if !a.BodyDecidesDryRun() {
		a.DryRun = isDryRunAll(r.URL.RawQuery)
	}
	return a
}

// BodyDecidesDryRun reports a delete or deletecollection that carries a body: kube-apiserver
// then decodes its DeleteOptions from the body alone and ignores the query
// (k8s.io/apiserver endpoints/handlers/delete.go), so `?dryRun=All` on such a request says
// nothing. Only DeleteOptionsDryRun, given the body, can make it a dry run.
func (a *Attributes) BodyDecidesDryRun() bool {
	return a.HasBody && (a.Verb == "delete" || a.Verb == "deletecollection")
}

// SetDryRunFromBody decides, once its body is read, the dry run of a request whose body
// decides it (BodyDecidesDryRun): by the body's DeleteOptions (DeleteOptionsDryRun), or by the
// query when the body, of a length unknown until read, is empty (kube-apiserver decodes
// DeleteOptions from the body only when it has bytes).
func (a *Attributes) SetDryRunFromBody(contentType string, body []byte, rawQuery string) {
	if len(body) == 0 {
		a.DryRun = isDryRunAll(rawQuery)
		return
	}
	a.DryRun = DeleteOptionsDryRun(contentType, body)
}

// isUpgrade reports a protocol upgrade request (Connection: upgrade with an Upgrade header).
func isUpgrade(h http.Header) bool {
	if len(h["Upgrade"]) == 0 {
		return false
	}
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// oddPath returns why a path is not in the canonical shape the classifier trusts, or "".
// Empty or dot segments and encoded slashes can be read differently by the apiserver's router
// than by RequestInfoFactory, so such requests are writes whatever their method.
func oddPath(u *url.URL) string {
	p := u.Path
	if p == "" || p[0] != '/' {
		return "path does not start with /"
	}
	if u.RawPath != "" && strings.Contains(strings.ToLower(u.RawPath), "%2f") {
		return "encoded slash in path"
	}
	rest := strings.TrimSuffix(p[1:], "/")
	if rest == "" {
		return ""
	}
	for seg := range strings.SplitSeq(rest, "/") {
		switch seg {
		case "":
			return "empty path segment"
		case ".", "..":
			return "dot segment in path"
		}
	}
	return ""
}

// readOnlyPaths are non-resource paths whose GET and HEAD change nothing.
var readOnlyPrefixes = []string{"/healthz", "/livez", "/readyz", "/version", "/openapi", "/api", "/apis", "/metrics", "/.well-known/openid-configuration", "/openid/v1/jwks"}

func readOnlyPath(p string) bool {
	for _, prefix := range readOnlyPrefixes {
		if p == prefix || p == prefix+"/" || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}

// isDryRunAll reports whether the query carries dryRun and every value of it is "All", the only
// value the apiserver accepts. A query that does not parse cleanly is not a dry run.
func isDryRunAll(rawQuery string) bool {
	if !strings.Contains(rawQuery, "dryRun") {
		return false
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return false
	}
	vals := q["dryRun"]
	if len(vals) == 0 {
		return false
	}
	for _, v := range vals {
		if v != "All" {
			return false
		}
	}
	return true
}
