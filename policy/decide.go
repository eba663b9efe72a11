package policy

import (
	"fmt"
	"slices"
)

// Action is what a rule does with a request while the fence is on.
type Action string

const (
	// Allow lets the request through the fence.
	Allow Action = "allow"
	// Refuse answers 429 without forwarding.
	Refuse Action = "refuse"
)

// Decision is the fence's answer for one request.
type Decision struct {
	Class Class
	Allow bool
	// Reason says which rule or default decided, for logs and metrics.
	Reason string
	// ByRule is set when a rule of the policy file decided, not a default: a rule's refusal
	// is the operator's word, final while the fence is on (hold mode does not hold it).
	ByRule bool
}

// Rule matches requests; an empty list matches anything. Values are exact, except "*" which
// matches anything and, in Resources, "pods/*" style entries that match any subresource.
type Rule struct {
	Name            string   `yaml:"name" json:"name,omitempty"`
	Action          Action   `yaml:"action" json:"action"`
	Verbs           []string `yaml:"verbs" json:"verbs,omitempty"`
	APIGroups       []string `yaml:"apiGroups" json:"apiGroups,omitempty"`
	Resources       []string `yaml:"resources" json:"resources,omitempty"`
	Namespaces      []string `yaml:"namespaces" json:"namespaces,omitempty"`
	Users           []string `yaml:"users" json:"users,omitempty"`
	Groups          []string `yaml:"groups" json:"groups,omitempty"`
	NonResourceURLs []string `yaml:"nonResourceURLs" json:"nonResourceURLs,omitempty"`

	line int
}

// Policy is an ordered list of rules, then the defaults. The zero value is the defaults alone.
type Policy struct {
	Rules []Rule
}

// reviews are the reviews kube-apiserver serves, by group, version and resource: their create
// only asks it a question and persists nothing. Only the versions kube-apiserver 1.36 serves:
// authorization.k8s.io/v1beta1 and TokenReview v1beta1 were removed in 1.22, SelfSubjectReview
// v1alpha1 in 1.32 and v1beta1 in 1.33 (k8s.io/api's prerelease lifecycle; kube-apiserver
// does not serve a version past its removal). Another version of these groups is not its review:
// an APIService registered for it is served by whatever it names, which may persist objects.
var reviews = map[[3]string]bool{
	{"authentication.k8s.io", "v1", "tokenreviews"}:             true,
	{"authentication.k8s.io", "v1", "selfsubjectreviews"}:       true,
	{"authorization.k8s.io", "v1", "subjectaccessreviews"}:      true,
	{"authorization.k8s.io", "v1", "localsubjectaccessreviews"}: true,
	{"authorization.k8s.io", "v1", "selfsubjectaccessreviews"}:  true,
	{"authorization.k8s.io", "v1", "selfsubjectrulesreviews"}:   true,
}

// dryRunVerbs are the verbs kube-apiserver honours dryRun for: the storage writes (the legacy
// /proxy/ path, verb proxy, ignores it).
var dryRunVerbs = map[string]bool{"create": true, "update": true, "patch": true, "delete": true, "deletecollection": true}

// isReview reports the create of a review kube-apiserver answers without persisting anything.
func isReview(a *Attributes) bool {
	return a.Verb == "create" && reviews[[3]string{a.APIGroup, a.APIVersion, a.Resource}]
}

// Decide says whether a request may pass while the fence is on. Reads pass; writes are refused
// unless a rule allows them or they are one of the default exemptions (review creates, dry runs).
// The first matching rule wins.
func (p *Policy) Decide(a *Attributes) Decision {
	class := a.Class()
	if a.Unknown != "" {
		// Rules match on attributes an unrecognised request does not have: no rule applies.
		return Decision{Class: Write, Reason: "unrecognised: " + a.Unknown}
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.matches(a) {
			return Decision{Class: class, Allow: r.Action == Allow, Reason: "rule " + r.label(i), ByRule: true}
		}
	}
	if class == Read {
		return Decision{Class: Read, Allow: true, Reason: "read"}
	}
	switch a.storesNothing() {
	case "review":
		return Decision{Class: Write, Allow: true, Reason: "review"}
	case "dry-run":
		return Decision{Class: Write, Allow: true, Reason: "dry-run"}
	}
	return Decision{Class: Write, Reason: "write"}
}

// StoresNothing says whether a write is one kube-apiserver answers without storing anything: a
// review's create, or a dry run. A fence lets these through by default, and nothing (the fence's
// barrier, a switch) needs to wait for one to land on a backend.
func (a *Attributes) StoresNothing() bool { return a.storesNothing() != "" }

// storesNothing names the kind of write that stores nothing ("review", "dry-run"), or is "".
func (a *Attributes) storesNothing() string {
	if a.Class() != Write || !a.IsResourceRequest || a.Subresource != "" || a.Upgrade || a.Unknown != "" {
		return ""
	}
	switch {
	case isReview(a):
		return "review"
	case a.DryRun && dryRunVerbs[a.Verb]:
		return "dry-run"
	}
	return ""
}

// Warnings names rules that never match on a proxy that forwards (identity) a client
// certificate's user and groups, or does not: a rule naming users or groups needs that
// identity, and none gets system:authenticated, which kube-apiserver adds after the proxy.
func (p *Policy) Warnings(identity bool) []string {
	var out []string
	for i := range p.Rules {
		r := &p.Rules[i]
		switch {
		case !identity && (len(r.Users) > 0 || len(r.Groups) > 0):
			out = append(out, fmt.Sprintf("fence policy rule %s names users or groups, and without --client-ca-file the proxy knows no client's: it never matches", r.label(i)))
		case slices.Contains(r.Groups, "system:authenticated"):
			out = append(out, fmt.Sprintf("fence policy rule %s: group system:authenticated is added by kube-apiserver, after the proxy, which knows a client certificate's organizations only: it never matches on that group", r.label(i)))
		}
	}
	return out
}

func (r *Rule) label(i int) string {
	if r.Name != "" {
		return fmt.Sprintf("%q", r.Name)
	}
	return fmt.Sprintf("#%d", i+1)
}

func (r *Rule) matches(a *Attributes) bool {
	if !matchAny(r.Verbs, a.Verb) || !matchAny(r.Users, a.User) {
		return false
	}
	if len(r.Users) > 0 && a.User == "" {
		return false // a rule naming users, "*" too, never matches a client the proxy knows no user of
	}
	if len(r.Groups) > 0 && !slices.ContainsFunc(a.Groups, func(g string) bool { return matchAny(r.Groups, g) }) {
		return false
	}
	if a.IsResourceRequest {
		if len(r.NonResourceURLs) > 0 {
			return false
		}
		return matchAny(r.APIGroups, a.APIGroup) && matchAny(r.Namespaces, a.Namespace) && r.matchResource(a)
	}
	if len(r.APIGroups) > 0 || len(r.Resources) > 0 || len(r.Namespaces) > 0 {
		return false
	}
	return matchPath(r.NonResourceURLs, a.Path)
}

func (r *Rule) matchResource(a *Attributes) bool {
	if len(r.Resources) == 0 {
		return true
	}
	full := a.Resource
	if a.Subresource != "" {
		full += "/" + a.Subresource
	}
	for _, want := range r.Resources {
		switch {
		case want == "*", want == full:
			return true
		case len(want) > 2 && want[len(want)-2:] == "/*" && a.Subresource != "" && want[:len(want)-2] == a.Resource:
			return true
		}
	}
	return false
}

func matchAny(list []string, v string) bool {
	if len(list) == 0 {
		return true
	}
	for _, w := range list {
		if w == "*" || w == v {
			return true
		}
	}
	return false
}

// matchPath matches non-resource URLs exactly, or by prefix for entries ending in "*".
func matchPath(list []string, p string) bool {
	if len(list) == 0 {
		return true
	}
	for _, w := range list {
		if w == "*" || w == p || (len(w) > 0 && w[len(w)-1] == '*' && len(p) >= len(w)-1 && p[:len(w)-1] == w[:len(w)-1]) {
			return true
		}
	}
	return false
}
