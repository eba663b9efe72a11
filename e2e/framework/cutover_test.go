package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// TestStopCutoverProcessesOnlyTheirs: a pid in a journal whose process has gone may since name
// another process; stopping it would kill a stranger. One did: a test's cleanup SIGTERMed the
// green etcd another test had just started with the recycled pid, which died before writing a
// line, and that cutover aborted ("green etcd green-etcd-0 exited"). Only a process started
// for this state dir's environment (its command line names that dir) is stopped.
func TestStopCutoverProcessesOnlyTheirs(t *testing.T) {
	env := t.TempDir()
	stateDir := filepath.Join(env, "green-cutover")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(env, "green-etcd-0.log")
	if err := os.WriteFile(log, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stranger := exec.Command("sleep", "30") // not started for env
	ours := exec.Command("tail", "-f", log) // names env
	for _, c := range []*exec.Cmd{stranger, ours} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = stranger.Process.Kill(), ours.Process.Kill()
		_ = stranger.Wait() // ours is waited for below
	})
	// Start returns once exec is under way (the close-on-exec pipe closed): until the kernel has
	// set up the new program's arguments, /proc/PID/cmdline can read empty, and the process
	// would not look like ours. A CI run failed so, most likely from this: nothing stopped,
	// "tail" still running.
	for _, c := range []struct {
		cmd  *exec.Cmd
		want string
	}{{stranger, "sleep"}, {ours, log}} {
		cmdline := func(context.Context) (bool, error) {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.cmd.Process.Pid))
			return err == nil && bytes.Contains(b, []byte(c.want)), nil
		}
		if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 5*time.Second, true, cmdline); err != nil {
			t.Fatalf("%s: its command line never showed: %v", c.want, err)
		}
	}
	data, _ := json.Marshal(map[string]any{"version": 1, "state": "running", "greenPIDs": map[string]int{"recycled": stranger.Process.Pid, "green-etcd-0": ours.Process.Pid}})
	if err := os.WriteFile(filepath.Join(stateDir, "journal.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	stopped, err := StopCutoverProcesses(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(stopped) != 1 {
		t.Errorf("stopped %v, want green-etcd-0 only", stopped)
	}
	exited := make(chan error, 1)
	go func() { exited <- ours.Wait() }()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("the process started for the state dir's environment is still running")
	}
	if !Running(stranger.Process.Pid) {
		t.Error("a process that was not the journal's (a recycled pid) was stopped")
	}
}
