package logging

import (
	"bytes"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestKlogThroughSlog: what the Kubernetes libraries log with klog goes through kubefence's
// logger, in its format, each value cut: kube-apiserver's request info logs a request's whole
// query, which a client chooses (up to --max-header-bytes), before any authentication, and klog
// wrote it to stderr whole.
func TestKlogThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	RouteKlog(New(&buf, slog.LevelInfo))
	defer klog.ClearLogger()
	klog.ErrorS(errors.New("bad limit"), "Couldn't parse request", "request", url.Values{"limit": {"x"}, "pad": {strings.Repeat("a", 100<<10)}})
	klog.Flush()
	out := buf.String()
	if !strings.Contains(out, `msg="Couldn't parse request"`) || !strings.Contains(out, "level=ERROR") || len(out) > 2048 {
		t.Fatalf("klog's line through slog (%d bytes): %.600q; want kubefence's format, its values cut", len(out), out)
	}
}
