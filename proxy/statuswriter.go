package proxy

import (
	"bufio"
	"net"
	"net/http"
)

// statusWriter records the status code; Unwrap lets http.ResponseController reach Flush and
// Hijack on the underlying writer (watches and upgrades need both).
type statusWriter struct {
	http.ResponseWriter
	code int
	// buffered responses skip ReverseProxy's per-write flushes (it flushes every write of a
	// response without Content-Length, which is most apiserver lists): the server's buffer is
	// written when full and at the end, saving a syscall and a TLS record per 4 KB.
	buffered bool
}

// WriteHeader records the first final status: an informational one the backend relays (100
// Continue, 103 Early Hints) comes before the answer; 101 is an upgrade's answer.
func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack takes the connection over for a protocol switch: the reverse proxy writes the
// backend's 101 on the raw connection, past WriteHeader, so it is recorded here.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

// FlushError flushes streaming responses (watches, logs, upgrades) at once and defers the
// flushes of buffered ones to the end of the response.
func (w *statusWriter) FlushError() error {
	if w.buffered {
		return nil
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for callers that look for http.Flusher.
func (w *statusWriter) Flush() { _ = w.FlushError() }
