package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
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

// LoadFile reads a policy file (see docs/policy.md).
func LoadFile(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy file: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return p, nil
}

// Parse parses a policy document. Every problem is reported, each with its line.
func Parse(data []byte) (*Policy, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty document: want apiVersion " + FileAPIVersion + ", kind " + FileKind + " and rules")
		}
		return nil, cleanYAMLError(err)
	}
	// A second pass over the node tree gives each rule its line.
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, cleanYAMLError(err)
	}
	lines := ruleLines(&root)
	var errs []error
	if f.APIVersion != FileAPIVersion {
		errs = append(errs, fmt.Errorf("line %d: apiVersion %q: want %q", keyLine(&root, "apiVersion"), f.APIVersion, FileAPIVersion))
	}
	if f.Kind != FileKind {
		errs = append(errs, fmt.Errorf("line %d: kind %q: want %q", keyLine(&root, "kind"), f.Kind, FileKind))
	}
	for i := range f.Rules {
		r := &f.Rules[i]
		if i < len(lines) {
			r.line = lines[i]
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

// ruleLines returns the line of each item of the top-level rules sequence.
func ruleLines(root *yaml.Node) []int {
	doc := root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		doc = doc.Content[0]
	}
	if doc.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value == "rules" {
			var lines []int
			for _, item := range doc.Content[i+1].Content {
				lines = append(lines, item.Line)
			}
			return lines
		}
	}
	return nil
}

func keyLine(root *yaml.Node, key string) int {
	doc := root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		doc = doc.Content[0]
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value == key {
			return doc.Content[i].Line
		}
	}
	return 1
}

// cleanYAMLError drops the "yaml: " prefixes so that messages read "line 3: ...".
func cleanYAMLError(err error) error {
	msg := err.Error()
	msg = strings.ReplaceAll(msg, "yaml: unmarshal errors:\n  ", "")
	msg = strings.TrimPrefix(msg, "yaml: ")
	return errors.New(msg)
}
