package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
)

// Target is one proxy's admin API (a *Client, or anything with its methods) and the name it is
// reported under (its socket or address).
type Target[C any] struct {
	Name   string
	Client C
}

// Proxy is one proxy's admin client and its name.
type Proxy = Target[*Client]

// Group is every proxy in front of the cluster: a fence, a switch or an unfence counts only when
// all of them acknowledged it (invariant all-proxies-agree).
type Group = []Proxy

// Result is one proxy's answer, or its error.
type Result[T any] struct {
	Proxy string `json:"proxy"`
	Value T      `json:"result"`
	Err   error  `json:"-"`
	Error string `json:"error,omitempty"`
}

// MarshalJSON writes a proxy that did not answer with a null result: its zero value
// ("fenced": false, ...) would read as an answer.
func (r Result[T]) MarshalJSON() ([]byte, error) {
	out := struct {
		Proxy string `json:"proxy"`
		Value *T     `json:"result"`
		Error string `json:"error,omitempty"`
	}{Proxy: r.Proxy, Error: r.Error}
	if r.Err == nil && r.Error == "" {
		out.Value = &r.Value
	}
	return json.Marshal(out)
}

// Each runs f on every proxy of g at once and returns their results in g's order. The error
// names every proxy that did not acknowledge, or is nil when all did.
func Each[C, T any](ctx context.Context, g []Target[C], f func(context.Context, C) (T, error)) ([]Result[T], error) {
	out := make([]Result[T], len(g))
	var wg sync.WaitGroup
	for i, p := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := f(ctx, p.Client)
			out[i] = Result[T]{Proxy: p.Name, Value: v, Err: err}
			if err != nil {
				out[i].Error = err.Error()
			}
		}()
	}
	wg.Wait()
	var errs []error
	for _, r := range out {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("proxy %s: %w", r.Proxy, r.Err))
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%d of %d proxies did not acknowledge: %w", len(errs), len(g), errors.Join(errs...))
	}
	return out, nil
}

// ProxyKey names one proxy's admin API however it is written: an address (admin set) in lower
// case without a trailing slash, a socket by the file its path resolves to. Two names with one
// key are one proxy: fenced twice at once, its generation is never what a switch expects.
func ProxyKey(socket, address string) string {
	if address != "" {
		return "address " + strings.TrimSuffix(strings.ToLower(address), "/")
	}
	if real, err := filepath.EvalSymlinks(socket); err == nil {
		return "socket " + real
	}
	return "socket " + filepath.Clean(socket)
}
