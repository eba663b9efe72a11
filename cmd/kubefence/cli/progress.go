package cli

import (
	"fmt"
	"io"
	"os"
	"time"
)

// terminalProgress draws a one-line progress view (phase, done of total, rate) on w when w is
// a terminal, at most four times a second; elsewhere it is nil and nothing is drawn. done
// clears the line.
func terminalProgress(w io.Writer) (progress func(phase string, done, total int64), done func()) {
	f := terminal(w)
	if f == nil {
		return nil, func() {}
	}
	var phase string
	var start, last time.Time
	progress = func(ph string, n, total int64) {
		now := time.Now()
		if ph != phase {
			phase, start = ph, now
		}
		if now.Sub(last) < 250*time.Millisecond {
			return
		}
		last = now
		unit, scale := "keys", 1.0
		if ph == "read snapshot" {
			unit, scale = "MB", 1e6
		}
		rate := float64(n) / scale / max(now.Sub(start).Seconds(), 1e-3)
		fmt.Fprintf(f, "\r\033[K%s: %.0f of %.0f %s (%.0f %s/s)", ph, float64(n)/scale, float64(total)/scale, unit, rate, unit)
	}
	return progress, func() {
		if !last.IsZero() {
			fmt.Fprint(f, "\r\033[K")
		}
	}
}

// terminal returns w as a file when it is a terminal, else nil.
func terminal(w io.Writer) *os.File {
	if h, ok := w.(planHints); ok { // the advice's plan path put in: the stream underneath
		w = h.w
	}
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return f
}
