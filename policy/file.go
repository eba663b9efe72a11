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
	for _, v := range r.Verbs {
		if !knownVerbs[v] {
			bad("verb %q is not a Kubernetes verb (get, list, watch, create, update, patch, delete, deletecollection, proxy, or * )", v)
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
		if res == "" || strings.Count(res, "/") > 1 {
			bad("resource %q: use resource, resource/subresource or resource/*", res)
		}
	}
	return errs
}
