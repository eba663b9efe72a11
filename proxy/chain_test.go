package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"testing"
)

type nopHandler struct{}

func (*nopHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// TestSwitchedOffFilterIsNext: a filter with nothing to do is not in the request path at all.
func TestSwitchedOffFilterIsNext(t *testing.T) {
	next := &nopHandler{}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if h := withAuthentication(next, nil, nil, log); h != http.Handler(next) {
		t.Errorf("withAuthentication without --client-ca-file = %T, want next itself", h)
	}
}
