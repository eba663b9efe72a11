package cli

import (
	"bytes"
	"io"
	"path/filepath"
	"regexp"
	"strings"
)

// planToken is how kubefence's advice names the plan file in a command to run.
const planToken = "--plan PLAN"

// pasteable matches a path that needs no quoting in a shell, inside single quotes or out, nor
// escaping in JSON.
var pasteable = regexp.MustCompile(`^[A-Za-z0-9_./+=:@%,-]+$`)

// planArg is the --plan argument a printed command should carry: the plan's absolute path, or
// "" when it cannot be pasted as it is (the advice then keeps PLAN).
func planArg(planFile string) string {
	abs, err := filepath.Abs(planFile)
	if err != nil || !pasteable.MatchString(abs) {
		return ""
	}
	return "--plan " + abs
}

// planHints writes to w with the plan's path in place of PLAN in the commands kubefence
// advises, so that the operator can paste them. Each Write is one printed line, report or
// JSON object, which holds the advice whole.
type planHints struct {
	w    io.Writer
	with []byte
}

func (h planHints) Write(p []byte) (int, error) {
	if !bytes.Contains(p, []byte(planToken)) {
		return h.w.Write(p)
	}
	if _, err := h.w.Write(bytes.ReplaceAll(p, []byte(planToken), h.with)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// withPlanHints wraps the streams of a command run with planFile.
func withPlanHints(s *Streams, planFile string) {
	arg := planArg(planFile)
	if arg == "" {
		return
	}
	s.Out = planHints{w: s.Out, with: []byte(arg)}
	s.ErrOut = planHints{w: s.ErrOut, with: []byte(arg)}
}

// planHinted is an error whose advice names the plan's path; its cause stays what it wraps
// (exit codes look at it).
type planHinted struct {
	err error
	arg string
}

func (e planHinted) Error() string { return strings.ReplaceAll(e.err.Error(), planToken, e.arg) }
func (e planHinted) Unwrap() error { return e.err }

// hint gives err the plan's path in its advice.
func (o *cutoverOptions) hint(err error) error {
	if arg := planArg(o.planFile); err != nil && arg != "" && strings.Contains(err.Error(), planToken) {
		return planHinted{err: err, arg: arg}
	}
	return err
}
