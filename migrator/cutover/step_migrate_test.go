package cutover

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubefence/kubefence/internal/steprun"
	"github.com/kubefence/kubefence/proxy/admin"
)

// TestBuildGreenDirsHonoursItsTimeout: a build that cannot be stopped (etcd's restore takes no
// context) does not hold the migrate step past its timeout: the step fails at it, and the build,
// abandoned, leaves neither a data dir a later step could take nor its partial output once it
// ends.
func TestBuildGreenDirsHonoursItsTimeout(t *testing.T) {
	p, _ := validPlan(t)
	ended := make(chan struct{})
	build := func(m GreenMember, tmp string) error {
		defer close(ended)
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return err
		}
		time.Sleep(time.Second) // deaf to the context, as etcd's restore is
		return os.WriteFile(tmp+"/db", []byte("half"), 0o600)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := buildGreenDirs(ctx, p, "x", build)
	if took := time.Since(start); err == nil || !errors.Is(err, context.DeadlineExceeded) || took > 500*time.Millisecond {
		t.Fatalf("build past a 50ms timeout: %v after %s; want the deadline's error at once", err, took)
	}
	<-ended
	dir := p.Green.Etcd.Members[0].DataDir
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(dir + ".kubefence-part")
		return os.IsNotExist(err), nil
	}); err != nil {
		t.Fatalf("the abandoned build's partial output %s.kubefence-part is left", dir)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the abandoned build put %s in place (%v)", dir, err)
	}
}

// TestStoppedWalkStartsNoGreenProcess: a walk whose context ended (a Ctrl-C, or the migrate
// step's timeout) before start-green-etcd does not begin it: no green process is started only
// for the abort to stop it; a start asked on an ended context refuses too.
func TestStoppedWalkStartsNoGreenProcess(t *testing.T) {
	p, _ := validPlan(t)
	p.hash = "plan-hash"
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Generation: 1, Fenced: true}
	var calls []string
	var stopped []int
	r := (&runner{o: Options{Plan: p}, p: p, adm: memProxy(st, &calls), procs: fakeProcesses(map[int]bool{}, &stopped), steps: steps}).forward()
	started := 0
	r.procs.start = func([]string, string) (int, error) { started++; return 0, errors.New("fake: no processes started") }
	r.j = &Journal{ID: "x", State: StateRunning, PlanHash: "plan-hash", GreenPIDs: map[string]int{}, FencedAt: time.Now().UTC()}
	for _, s := range []string{StepPreflight, StepFence, StepCopy, StepMigrate} {
		r.j.Done = append(r.j.Done, StepRecord{Step: s})
	}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := r.walk(ctx)
	var serr *steprun.Error
	if !errors.As(err, &serr) || serr.Step != StepGreenEtcd || !errors.Is(err, context.Canceled) {
		t.Fatalf("walk on a cancelled context: %v; want start-green-etcd not begun", err)
	}
	if err := r.startGreenProcess(ctx, greenEtcdProcess(p, p.Green.Etcd.Members[0])); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Errorf("start on a cancelled context: %v", err)
	}
	if started != 0 {
		t.Errorf("procs.start called %d time(s) on a cancelled context", started)
	}
}
