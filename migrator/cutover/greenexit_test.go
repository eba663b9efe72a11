package cutover

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGreenExitSaysWhy: a green process that exits while its step waits for it fails the step
// with the end of its log (etcd's or the apiserver's own words: a flag, a port taken, a file
// missing), not only the log's path, so that the report and -o json say why; and green etcd
// exiting while start-green-apiserver waits fails that step at once, naming green etcd, rather
// than after its timeout with "green apiserver not ready".
func TestGreenExitSaysWhy(t *testing.T) {
	const why = `{"level":"fatal","msg":"listen tcp 127.0.0.1:2479: bind: address already in use"}`
	for _, tc := range []struct {
		name string
		s    step
		done []string
		pids map[string]int
		want string
	}{
		{name: "etcd at its start", s: greenEtcdStep{}, done: []string{StepPreflight, StepFence, StepCopy, StepMigrate}, want: "green etcd g0 exited"},
		{name: "etcd while the apiserver starts", s: greenAPIServerStep{}, done: []string{StepPreflight, StepFence, StepCopy, StepMigrate, StepGreenEtcd},
			pids: map[string]int{"g0": 101, "apiserver": 102}, want: "green etcd g0 exited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validPlan(t)
			if err := os.MkdirAll(filepath.Join(p.StateDir, "logs"), 0o700); err != nil {
				t.Fatal(err)
			}
			r := (&runner{o: Options{Plan: p}, p: p, procs: fakeProcesses(map[int]bool{102: true}, new([]int))}).forward()
			r.procs.start = func([]string, string) (int, error) { return 101, nil }
			r.j = &Journal{ID: "x", State: StateRunning, GreenPIDs: map[string]int{}}
			for k, v := range tc.pids {
				r.j.GreenPIDs[k] = v
			}
			log := "### kubefence cutover starts etcd\nsome line\n" + why + "\n"
			if err := os.WriteFile(r.logPath("g0"), []byte(log), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			_, err := tc.s.run(ctx, r)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bind: address already in use") || ctx.Err() != nil {
				t.Fatalf("%s: %v; want %q with its log's last line, before the step's timeout", tc.s.name(), err, tc.want)
			}
		})
	}
}
