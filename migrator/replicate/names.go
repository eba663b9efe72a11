package replicate

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
)

// The replicator's errors and logs call its source "blue" and its destination "green", as in a
// cutover. When it runs the other way (a rollback's bake: green into blue), Config's SourceName
// and DestName rename them in everything it returns and logs, so that an operator reads the
// sides as they are.

// renamer rewrites "blue" and "green" to the configured names at once (a swap stays a swap);
// nil renames nothing.
func renamer(source, dest string) *sideNames {
	if (source == "" || source == "blue") && (dest == "" || dest == "green") {
		return nil
	}
	if source == "" {
		source = "blue"
	}
	if dest == "" {
		dest = "green"
	}
	return &sideNames{strings.NewReplacer("blue", source, "green", dest)}
}

// sideNames renames the sides in a message, but not inside double-quoted text: the replicator
// quotes keys and values (%q), and those are data, not sides ("/registry/…/blue-team" stays).
// Text after a quote that does not close is left as it is.
type sideNames struct{ rp *strings.Replacer }

func (n *sideNames) Replace(s string) string {
	var b strings.Builder
	for s != "" {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			b.WriteString(n.rp.Replace(s))
			break
		}
		b.WriteString(n.rp.Replace(s[:i]))
		q, err := strconv.QuotedPrefix(s[i:])
		if err != nil {
			b.WriteString(s[i:])
			break
		}
		b.WriteString(q)
		s = s[i+len(q):]
	}
	return b.String()
}

// names renames s (a message of the replicator's own, not yet renamed).
func (r *Replicator) names(s string) string {
	if r.rename == nil {
		return s
	}
	return r.rename.Replace(s)
}

// renamedError is an error with its text renamed; errors.Is and As still see the original.
type renamedError struct {
	err error
	msg string
}

func (e *renamedError) Error() string { return e.msg }
func (e *renamedError) Unwrap() error { return e.err }

func renameErr(rp *sideNames, err error) error {
	var done *renamedError
	if rp == nil || err == nil || errors.As(err, &done) {
		return err
	}
	return &renamedError{err: err, msg: rp.Replace(err.Error())}
}

// Rename is err with "blue" and "green" in its text renamed to source and dest (for Tip's
// errors when it checks a replication that runs from green into blue).
func Rename(err error, source, dest string) error { return renameErr(renamer(source, dest), err) }

// renamingHandler renames the message and the string and error attributes of every record.
type renamingHandler struct {
	h  slog.Handler
	rp *sideNames
}

func (h *renamingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.h.Enabled(ctx, l)
}

func (h *renamingHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.rp.Replace(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h *renamingHandler) attr(a slog.Attr) slog.Attr {
	switch v := a.Value.Any().(type) {
	case string:
		return slog.String(a.Key, h.rp.Replace(v))
	case error:
		return slog.String(a.Key, h.rp.Replace(v.Error()))
	}
	return a
}

func (h *renamingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	renamed := make([]slog.Attr, len(as))
	for i, a := range as {
		renamed[i] = h.attr(a)
	}
	return &renamingHandler{h: h.h.WithAttrs(renamed), rp: h.rp}
}

func (h *renamingHandler) WithGroup(name string) slog.Handler {
	return &renamingHandler{h: h.h.WithGroup(name), rp: h.rp}
}
