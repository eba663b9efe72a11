// Package strictyaml decodes the YAML files an operator writes (the fence policy, the cutover
// plan) strictly: a field the target type does not have is an error, not silently dropped, and
// every error reads "line N: ..." without the yaml library's prefixes.
//
// Decode takes one document: a second one (files joined with cat) is an error, not dropped.
// Lines gives the line of a top-level key or of each item of a top-level sequence, for errors
// found after decoding.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ErrEmpty is returned by Decode for a document with no content.
var ErrEmpty = errors.New("empty document")

// Decode decodes the one YAML document of data into v, refusing fields v does not have and a
// second document.
func Decode(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return ErrEmpty
		}
		return clean(err)
	}
	for {
		var next yaml.Node
		switch err := dec.Decode(&next); {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return clean(err)
		case !emptyDocument(&next):
			return fmt.Errorf("line %d: a second YAML document: give one document (the files were joined?)", next.Line)
		}
	}
}

// emptyDocument says whether n holds nothing: what a trailing "---" (or one before a comment)
// decodes to.
func emptyDocument(n *yaml.Node) bool {
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	switch {
	case n.Kind == 0, n.Kind == yaml.DocumentNode && len(n.Content) == 0:
		return true
	}
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// Lines locates the top-level keys of a document, and the items of its top-level sequences.
type Lines struct {
	top *yaml.Node // the document's top-level mapping; nil if it is not a mapping
}

// LinesOf parses data for Lines. Call it after Decode succeeded: its errors are Decode's.
func LinesOf(data []byte) (Lines, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Lines{}, clean(err)
	}
	top := &root
	if top.Kind == yaml.DocumentNode && len(top.Content) > 0 {
		top = top.Content[0]
	}
	if top.Kind != yaml.MappingNode {
		return Lines{}, nil
	}
	return Lines{top: top}, nil
}

func (l Lines) value(key string) (k, v *yaml.Node) {
	if l.top == nil {
		return nil, nil
	}
	for i := 0; i+1 < len(l.top.Content); i += 2 {
		if l.top.Content[i].Value == key {
			return l.top.Content[i], l.top.Content[i+1]
		}
	}
	return nil, nil
}

// Key returns the line of a top-level key, or 1 when the document has no such key: an error
// about a missing key points at the top of the document.
func (l Lines) Key(key string) int {
	if k, _ := l.value(key); k != nil {
		return k.Line
	}
	return 1
}

// Items returns the line of each item of the top-level sequence under key, in order; nil if
// there is no such key or it is not a sequence.
func (l Lines) Items(key string) []int {
	_, v := l.value(key)
	if v == nil || v.Kind != yaml.SequenceNode {
		return nil
	}
	lines := make([]int, len(v.Content))
	for i, item := range v.Content {
		lines[i] = item.Line
	}
	return lines
}

// clean drops the yaml library's prefixes so that a message reads "line 3: ...". The original
// error stays reachable with errors.As (a *yaml.TypeError lists every field error).
func clean(err error) error {
	msg := err.Error()
	msg = strings.ReplaceAll(msg, "yaml: unmarshal errors:\n  ", "")
	msg = strings.TrimPrefix(msg, "yaml: ")
	return &cleanError{msg: msg, err: err}
}

type cleanError struct {
	msg string
	err error
}

func (e *cleanError) Error() string { return e.msg }
func (e *cleanError) Unwrap() error { return e.err }
