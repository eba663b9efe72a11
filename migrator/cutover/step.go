package cutover

import (
	"context"
	"time"
)

// step is one step of a cutover. It is an interface so that a step cannot leave anything out:
// a type without a description, a timeout or an answer to "past the point of no return?" does
// not compile into the table.
type step interface {
	// name is the step's name in the journal and in events; it never changes (a journal of an
	// older kubefence resumes by it).
	name() string
	// describe says what the step will do; verbose gives the exact commands (--dry-run).
	describe(r *runner, verbose bool) string
	// timeout bounds the step's run.
	timeout(p *Plan) time.Duration
	// run does the step and says what it did.
	run(ctx context.Context, r *runner) (string, error)
	// pastNoReturn is true for the switch and every step after it: once such a step has begun,
	// the proxy may already send requests to green, so its failure does not abort to blue when
	// it does (the run stops with --resume advice instead).
	pastNoReturn() bool
}

// steps is a cutover, in order; each type lives in its step_*.go file.
var steps = []step{
	preflightStep{},
	fenceStep{},
	copyStep{},
	migrateStep{},
	greenEtcdStep{},
	greenAPIServerStep{},
	verifyStep{},
	switchStep{},
	unfenceStep{},
}

// Step names, in order (the journal's).
const (
	StepPreflight      = "preflight"
	StepFence          = "fence"
	StepCopy           = "copy"
	StepMigrate        = "migrate"
	StepGreenEtcd      = "start-green-etcd"
	StepGreenAPIServer = "start-green-apiserver"
	StepVerify         = "verify"
	StepSwitch         = "switch"
	StepUnfence        = "unfence"
)

// Steps is the order of a cutover, by name.
var Steps = func() []string {
	var names []string
	for _, s := range steps {
		names = append(names, s.name())
	}
	return names
}()
