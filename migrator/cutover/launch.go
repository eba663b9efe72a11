package cutover

import (
	"time"

	"github.com/kubefence/kubefence/internal/proc"
)

// processes is how a cutover starts, finds and stops green's processes: package proc, or
// fakes in tests.
type processes struct {
	// start starts argv, outliving kubefence, its output appended to logPath; it returns the pid.
	start func(argv []string, logPath string) (int, error)
	// alive reports whether pid runs exactly argv.
	alive func(pid int, argv []string) bool
	// find returns a live process running exactly argv, or 0.
	find func(argv []string) int
	// stop ends pid (if it still runs argv): SIGTERM, SIGKILL after grace.
	stop func(pid int, argv []string, grace time.Duration)
}

var osProcesses = processes{
	start: func(argv []string, logPath string) (int, error) { return proc.Daemon(argv, logPath, "cutover") },
	alive: proc.Alive,
	find:  proc.Find,
	stop:  proc.Stop,
}

// greenPID is the pid of green process name (argv is the command line it starts with today;
// startedArgv): the journaled one if it runs, else an orphan found by its command line, else 0. A cutover killed between starting a
// green process and journaling its pid leaves one behind; the resume or abort adopts it and
// journals it from now on. Only a process this cutover journaled it was starting, and whose pid
// it did not journal yet, is looked for (Journal.PIDsWriteAhead; a journal from before it is
// searched as then): a process with the same command line is otherwise someone else's (another
// run of the same plan from another state dir, whose green may serve), also once the one
// journaled has ended.
func (r *runner) greenPID(name string, argv []string) int {
	argv = r.startedArgv(name, argv)
	pid, starting := r.j.GreenPIDs[name]
	if !starting && r.j.PIDsWriteAhead {
		return 0
	}
	if pid > 0 {
		if r.procs.alive(pid, argv) {
			return pid
		}
		if r.j.PIDsWriteAhead {
			return 0
		}
	}
	pid = r.procs.find(argv)
	if pid > 0 {
		r.j.GreenPIDs[name] = pid
		if err := r.saveJournal(); err != nil && r.o.Log != nil {
			r.o.Log.Warn("journal the adopted green process", "name", name, "err", err)
		}
	}
	return pid
}

// startedArgv is the command line green process name was started with, as journaled with its
// pid, else (a journal of a kubefence before it journaled them) argv, the one it starts with
// today. A kubefence upgraded mid-cutover may build another (flags added to etcdCommand), by
// which the process it did not start would look gone: an abort would stop nothing.
func (r *runner) startedArgv(name string, argv []string) []string {
	if a := r.j.GreenArgv[name]; len(a) > 0 {
		return a
	}
	return argv
}
