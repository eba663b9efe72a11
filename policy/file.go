package policy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kubefence/kubefence/internal/strictyaml"
)

// APIVersion and Kind of a policy file.
const (
	FileAPIVersion = "kubefence.io/v1alpha1"
	FileKind       = "FencePolicy"
)

type file struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Rules      []Rule `yaml:"rules"`
}

// Parse parses a policy document (see docs/policy.md). Every problem is reported, each with its
// line. Reading the file is the caller's business: this package does no I/O.
func Parse(data []byte) (*Policy, error) {
	var f file
	if err := strictyaml.Decode(data, &f); err != nil {
		if errors.Is(err, strictyaml.ErrEmpty) {
			return nil, errors.New("empty document: want apiVersion " + FileAPIVersion + ", kind " + FileKind + " and rules")
		}
		return nil, err
	}
	lines, err := strictyaml.LinesOf(data)
	if err != nil {
		return nil, err
	}
	ruleLines := lines.Items("rules")
	var errs []error
	if f.APIVersion != FileAPIVersion {
		errs = append(errs, fmt.Errorf("line %d: apiVersion %q: want %q", lines.Key("apiVersion"), f.APIVersion, FileAPIVersion))
	}
	if f.Kind != FileKind {
		errs = append(errs, fmt.Errorf("line %d: kind %q: want %q", lines.Key("kind"), f.Kind, FileKind))
	}
	for i := range f.Rules {
		r := &f.Rules[i]
		if i < len(ruleLines) {
			r.line = ruleLines[i]
		}
		errs = append(errs, r.validate(i)...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Policy{Rules: f.Rules}, nil
}

var knownVerbs = map[string]bool{"*": true, "get": true, "list": true, "watch": true, "create": true, "update": true, "patch": true, "delete": true, "deletecollection": true, "proxy": true, "head": true, "post": true, "put": true, "options": true}

// resourceVerbs are the verbs of resource requests (kube-apiserver's request info), and
// nonResourceVerbs those of non-resource requests: the HTTP method, in lower case.
var (
	resourceVerbs    = map[string]bool{"*": true, "get": true, "list": true, "watch": true, "create": true, "update": true, "patch": true, "delete": true, "deletecollection": true, "proxy": true}
	nonResourceVerbs = map[string]bool{"*": true, "get": true, "head": true, "post": true, "put": true, "patch": true, "delete": true, "options": true}
)

func (r *Rule) validate(i int) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("line %d: rule %s: %s", r.line, r.label(i), fmt.Sprintf(format, args...)))
	}
	switch r.Action {
	case Allow, Refuse:
	case "":
		bad("action is missing: use allow or refuse")
	default:
		bad("action %q: use allow or refuse", r.Action)
	}
	resourceRule := len(r.APIGroups) > 0 || len(r.Resources) > 0 || len(r.Namespaces) > 0
	for _, v := range r.Verbs {
		switch {
		case !knownVerbs[v]:
			bad("verb %q is not a Kubernetes verb (get, list, watch, create, update, patch, delete, deletecollection, proxy, or * )", v)
		case resourceRule && !resourceVerbs[v]:
			bad("verb %q is not a verb of resource requests, and the rule would never match: use get, list, watch, create, update, patch, delete, deletecollection, proxy or *", v)
		case len(r.NonResourceURLs) > 0 && !nonResourceVerbs[v]:
			bad("verb %q is not a verb of non-resource requests (their HTTP method), and the rule would never match: use get, head, post, put, patch, delete, options or *", v)
		}
	}
	if len(r.NonResourceURLs) > 0 && (len(r.APIGroups) > 0 || len(r.Resources) > 0 || len(r.Namespaces) > 0) {
		bad("nonResourceURLs cannot be combined with apiGroups, resources or namespaces")
	}
	for _, u := range r.NonResourceURLs {
		if !strings.HasPrefix(u, "/") && u != "*" {
			bad("nonResourceURL %q must start with /", u)
		}
	}
	for _, res := range r.Resources {
		name, sub, hasSub := strings.Cut(res, "/")
		switch {
		case res == "" || strings.Count(res, "/") > 1 || name == "" || hasSub && sub == "":
			bad("resource %q: use resource, resource/subresource or resource/*", res)
		case name == "*" && hasSub:
			bad("resource %q: a subresource is matched per resource (pods/status), or every subresource of one (pods/*), not of every resource as RBAC's */status: list the resources", res)
		}
	}
	return errs
}
