package cutover

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

// argvProcesses are processes known, as package proc knows them, by their exact command line:
// running maps a live pid to its argv; stop ends one only if it runs argv, and records it.
func argvProcesses(running map[int][]string, stopped *[]int) processes {
	alive := func(pid int, argv []string) bool { a, ok := running[pid]; return ok && slices.Equal(a, argv) }
	return processes{
		start: func(argv []string, _ string) (int, error) {
			pid := 200 + len(running)
			running[pid] = argv
			return pid, nil
		},
		alive: alive,
		find: func(argv []string) int {
			for pid := range running {
				if alive(pid, argv) {
					return pid
				}
			}
			return 0
		},
		stop: func(pid int, argv []string, _ time.Duration) {
			if alive(pid, argv) {
				*stopped = append(*stopped, pid)
				delete(running, pid)
			}
		},
	}
}

// TestGreenKnownByTheCommandLineItStartedWith: green's processes are known by their command
// line. One started by the kubefence before an upgrade, whose etcdCommand gave other flags, still
// runs with its own: an abort by the new kubefence stops it (by the command line journaled
// with its pid), rather than taking it for gone and reporting the abort complete while green
// etcd runs on; a resume keeps it rather than starting a second one on its ports.
func TestGreenKnownByTheCommandLineItStartedWith(t *testing.T) {
	// world is a cutover fenced on blue whose green etcd g0 (pid 101) was started by the
	// kubefence before with the command line before, and its apiserver (102) with the plan's;
	// today is the command line g0 would start with now.
	type world struct {
		r             *runner
		m             GreenMember
		today, before []string
		running       map[int][]string
		stopped       []int
	}
	newWorld := func(t *testing.T, running ...int) *world {
		t.Helper()
		p, _ := validPlan(t)
		w := &world{m: p.Green.Etcd.Members[0], running: map[int][]string{}}
		w.today = etcdCommand(p, w.m)
		w.before = append(slices.Clone(w.today[:len(w.today)-2]), "--flag-of-the-kubefence-before", "1")
		api := p.Green.APIServer.Command
		for _, pid := range running {
			w.running[pid] = map[int][]string{101: w.before, 102: api}[pid]
		}
		st := &admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 2}
		var calls []string
		j := &Journal{Version: 1, ID: "x", State: StateRunning, PlanHash: p.hash, PIDsWriteAhead: true, FencedAt: time.Now().UTC(),
			GreenPIDs: map[string]int{w.m.Name: 101, "apiserver": 102},
			GreenArgv: map[string][]string{w.m.Name: w.before, "apiserver": api}}
		w.r = (&runner{o: Options{Plan: p}, p: p, j: j, adm: memProxy(st, &calls), procs: argvProcesses(w.running, &w.stopped)}).forward()
		if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := w.r.saveJournal(); err != nil {
			t.Fatal(err)
		}
		return w
	}

	t.Run("abort", func(t *testing.T) {
		w := newWorld(t, 101, 102)
		if err := w.r.abort(t.Context(), "test", nil); err != nil {
			t.Fatal(err)
		}
		slices.Sort(w.stopped)
		if !slices.Equal(w.stopped, []int{101, 102}) || len(w.running) > 0 {
			t.Errorf("stopped %v, still running %v; want green etcd (101) and apiserver (102) stopped", w.stopped, w.running)
		}
	})
	t.Run("abort, a journal of a kubefence before: by today's command line", func(t *testing.T) {
		w := newWorld(t, 102)
		w.running[101] = w.today
		w.r.j.GreenArgv = nil
		if err := w.r.abort(t.Context(), "test", nil); err != nil {
			t.Fatal(err)
		}
		slices.Sort(w.stopped)
		if !slices.Equal(w.stopped, []int{101, 102}) || len(w.running) > 0 {
			t.Errorf("stopped %v, still running %v; want green etcd (101) and apiserver (102) stopped", w.stopped, w.running)
		}
	})
	t.Run("resume", func(t *testing.T) {
		w := newWorld(t, 101)
		if err := w.r.startGreenProcess(t.Context(), greenEtcdProcess(w.r.p, w.m)); err != nil {
			t.Fatal(err)
		}
		if len(w.running) != 1 || w.r.j.GreenPIDs[w.m.Name] != 101 {
			t.Errorf("running %v, journaled pid %d: want green etcd 101 kept, no second one", w.running, w.r.j.GreenPIDs[w.m.Name])
		}
	})
	t.Run("started again after the upgrade", func(t *testing.T) {
		// The process before is gone: the one started now is journaled with today's command line.
		w := newWorld(t)
		if err := w.r.startGreenProcess(t.Context(), greenEtcdProcess(w.r.p, w.m)); err != nil {
			t.Fatal(err)
		}
		j, err := LoadJournal(w.r.p.StateDir)
		if err != nil {
			t.Fatal(err)
		}
		pid := j.GreenPIDs[w.m.Name]
		if !slices.Equal(w.running[pid], w.today) || !slices.Equal(j.GreenArgv[w.m.Name], w.today) {
			t.Errorf("started %v as %d, journaled %v; want today's command line", w.running[pid], pid, j.GreenArgv[w.m.Name])
		}
	})
}
