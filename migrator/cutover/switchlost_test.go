package cutover

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/replicate"
	"github.com/kubefence/kubefence/proxy/admin"
)

// switchWorld is a replicating cutover (no bake) journaled through its drain, over two real etcds
// at the same revision (bothSidesPlan) with replication running in this process and the delta
// check started from there, and one proxy in memory fenced on blue at the journaled generation.
// switchHook, when set, is that proxy's switch (inner is the proxy's own).
func switchWorld(t *testing.T, switchHook func(inner funcProxy, ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error)) (*runner, *admin.Status) {
	t.Helper()
	p, blue := bothSidesPlan(t, false)
	p.Bake.Enabled = false
	rev, err := replicate.Revision(t.Context(), blue)
	if err != nil {
		t.Fatal(err)
	}
	j := journalThrough(p, replicateSteps, StepDrain, time.Now().UTC())
	j.FenceGeneration, j.Verified, j.SnapshotRevision = 2, &VerifyReport{Revision: rev}, rev
	st := &admin.Status{Backend: p.Blue.APIServer.URL, Fenced: true, Generation: 2}
	var calls []string
	px := memProxy(st, &calls)
	if switchHook != nil {
		inner := px
		px.setBackend = func(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
			return switchHook(inner, ctx, req)
		}
	}
	r := (&runner{o: Options{Plan: p}, p: p, j: j, adm: px, procs: fakeProcesses(map[int]bool{}, new([]int)), steps: replicateSteps}).forward()
	if _, err := r.ensureReplication(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.stopReplication() })
	return r, st
}

// TestSwitchAnswerLostFinishesTheWindow: a switch that reached the proxy but whose answer this
// process did not get (a signal while the proxy drained the watches it moved, or the answer
// lost) does not stop the run with every proxy fenced on green, green's apiserver gated and
// replication stopped until someone runs --resume: the switch call is not cut short by the
// signal, and a switch whose answer is lost all the same is looked at again and the window
// finished (stop-replication, ungate-green, unfence).
func TestSwitchAnswerLostFinishesTheWindow(t *testing.T) {
	for _, tc := range []struct {
		name        string
		proxySwitch func(cancel context.CancelFunc, inner funcProxy, ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error)
		short       bool // the switch step's timeout is short: the proxy never answers
	}{
		{"a signal while the proxy drains", func(cancel context.CancelFunc, inner funcProxy, ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
			resp, err := inner.setBackend(ctx, req)
			cancel() // Ctrl-C, SIGTERM, SIGHUP
			select { // the proxy drains the watches it moved, then answers
			case <-ctx.Done():
				return admin.BackendResponse{}, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
			return resp, err
		}, false},
		{"a signal, and the proxy never answers", func(cancel context.CancelFunc, inner funcProxy, ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
			if _, err := inner.setBackend(ctx, req); err != nil {
				return admin.BackendResponse{}, err
			}
			cancel()
			<-ctx.Done()
			return admin.BackendResponse{}, ctx.Err()
		}, true},
		{"the answer lost without a signal", func(_ context.CancelFunc, inner funcProxy, ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
			if _, err := inner.setBackend(ctx, req); err != nil {
				return admin.BackendResponse{}, err
			}
			return admin.BackendResponse{}, errors.New("read: connection reset by peer")
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			r, st := switchWorld(t, func(inner funcProxy, sctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
				return tc.proxySwitch(cancel, inner, sctx, req)
			})
			if tc.short {
				r.p.Timeouts.Switch = Duration(time.Second)
			}
			start := time.Now()
			rep, err := r.run(ctx)
			if st.Fenced {
				t.Fatalf("run: %s (%v); proxy %+v: writes left fenced", rep.Result, err, *st)
			}
			if st.Backend != r.p.Green.APIServer.URL {
				t.Fatalf("proxy %+v: want open on green (the switch reached it)", *st)
			}
			j, jerr := LoadJournal(r.p.StateDir)
			if jerr != nil || !j.done(StepUnfence) || j.SwitchRevision == 0 {
				t.Errorf("journal %+v, %v: want the window journaled to its unfence, with the switch's revision", j, jerr)
			}
			if err != nil || rep.Result != ResultDone {
				t.Errorf("report %s, next %q, %v; want done", rep.Result, rep.Next, err)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("the window took %s", took)
			}
		})
	}
}

// TestRefusedSwitchHasNoSwitchRevision: a switch the proxy refuses (409: its state changed since
// the fence) aborts to blue, and neither the report nor the journal gives a switchRevision,
// "green's revision when the proxy was switched": it never was.
func TestRefusedSwitchHasNoSwitchRevision(t *testing.T) {
	r, st := switchWorld(t, func(funcProxy, context.Context, admin.BackendRequest) (admin.BackendResponse, error) {
		return admin.BackendResponse{}, &admin.APIError{Code: 409, Message: "state generation 3, not 2"}
	})
	rep, err := r.run(t.Context())
	if err == nil || rep.Result != ResultAborted || st.Fenced || st.Backend != r.p.Blue.APIServer.URL {
		t.Fatalf("report %s (%v), proxy %+v: want aborted, open on blue", rep.Result, err, *st)
	}
	if rep.SwitchRevision != 0 {
		t.Errorf("report's switchRevision %d: the switch never happened", rep.SwitchRevision)
	}
	if j, err := LoadJournal(r.p.StateDir); err != nil || j.SwitchRevision != 0 {
		t.Errorf("journal %+v, %v: want no switchRevision", j, err)
	}
}

// TestJournalLostPastTheSwitchFinishesTheWindow: a journal that cannot be written from the
// switch on (a full disk, EIO; here the state dir replaced by a file: ENOTDIR, as root too) does
// not stop the run with writes fenced on green: the steps left are safe to repeat and have what
// they need in memory, so the window is finished, and the report says loudly that the journal
// was not written, what to do, and that writes are open (not fenced), also when the unfence's
// own record is what could not be written.
func TestJournalLostPastTheSwitchFinishesTheWindow(t *testing.T) {
	for _, at := range []string{StepSwitch, StepUnfence} {
		t.Run("from "+at, func(t *testing.T) {
			var stateDir string
			var broken bool
			breakDir := func() { // once: the resume finds it writable
				if broken {
					return
				}
				broken = true
				if err := os.RemoveAll(stateDir); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(stateDir, []byte("not a dir"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			r, st := switchWorld(t, func(inner funcProxy, ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
				if at == StepSwitch {
					breakDir()
				}
				return inner.setBackend(ctx, req)
			})
			stateDir = r.p.StateDir
			px := r.adm.(funcProxy)
			fence := px.fence
			px.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
				if at == StepUnfence && !req.Fenced {
					breakDir()
				}
				return fence(ctx, req)
			}
			r.adm = px
			rep, err := r.run(t.Context())
			if st.Fenced || st.Backend != r.p.Green.APIServer.URL {
				t.Fatalf("run: %v; proxy %+v: want open on green", err, *st)
			}
			if rep == nil || err == nil {
				t.Fatalf("report %+v, %v: want a report, and an error saying the journal was not written", rep, err)
			}
			said := rep.Error + " " + rep.Next
			for _, want := range []string{"journal", "not a directory", "writes are open on green", "--resume"} {
				if !strings.Contains(said, want) {
					t.Errorf("report %s: %q; want %q", rep.Result, said, want)
				}
			}
			if strings.Contains(said, "fenced until") || rep.WriteUnavailability == 0 {
				t.Errorf("report %s, window %s: %q; writes are open", rep.Result, rep.WriteUnavailability, said)
			}
			last := StepDrain // the switch's own record was not written
			if at == StepUnfence {
				last = StepUngateGreen
			}
			resumeOnceWritable(t, r, last)
		})
	}
}

// resumeOnceWritable does what the report of a run whose journal could not be written says:
// the state dir fixed, its journal as the run had last written it (through step last), a
// --resume finishes the journal, the proxy left open on green.
func resumeOnceWritable(t *testing.T, r *runner, last string) {
	t.Helper()
	resumeOnceWritableAt(t, r, last, r.j.FencedAt)
}

// resumeOnceWritableAt is resumeOnceWritable with the journal's fence at fencedAt, and returns
// the resume's report.
func resumeOnceWritableAt(t *testing.T, r *runner, last string, fencedAt time.Time) *Report {
	t.Helper()
	p := r.p
	if err := os.Remove(p.StateDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	j := journalThrough(p, replicateSteps, last, fencedAt)
	j.FenceGeneration, j.Verified, j.SnapshotRevision = r.j.FenceGeneration, r.j.Verified, r.j.SnapshotRevision
	if err := j.save(p.StateDir); err != nil {
		t.Fatal(err)
	}
	again := (&runner{o: Options{Plan: p, Resume: true}, p: p, adm: r.adm, procs: r.procs, steps: replicateSteps}).forward()
	if err := again.openJournal(); err != nil {
		t.Fatal(err)
	}
	rep, err := again.run(t.Context())
	if err != nil || rep.Result != ResultDone {
		t.Fatalf("--resume once the state dir is writable: %s, %v (next %q)", rep.Result, err, rep.Next)
	}
	st, err := again.adm.Status(t.Context())
	if err != nil || st.Fenced || sameURL(st.Backend) != sameURL(p.Green.APIServer.URL) {
		t.Errorf("proxy after the resume %+v, %v: want open on green", st, err)
	}
	return rep
}

// TestResumeAfterALostJournalCountsNoNewWindow: a --resume an hour after the fence of a run
// whose journal lacks its unfence (it could not be written) finds the proxies open on green
// already: the window ended in the run that stopped, so the resume does not report writes
// unavailable for the hour since the fence. It reports when the proxies say they opened, or
// that the window is not known here (the first run's report gave it).
func TestResumeAfterALostJournalCountsNoNewWindow(t *testing.T) {
	for _, known := range []bool{false, true} {
		t.Run(map[bool]string{false: "proxies do not say when", true: "proxies say when"}[known], func(t *testing.T) {
			r, st := switchWorld(t, nil)
			stateDir := r.p.StateDir
			px := r.adm.(funcProxy)
			fence := px.fence
			broken := false
			px.fence = func(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
				if !req.Fenced && !broken { // once: the resume finds it writable
					broken = true
					_ = os.RemoveAll(stateDir)
					if err := os.WriteFile(stateDir, []byte("not a dir"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				return fence(ctx, req)
			}
			r.adm = px
			if _, err := r.run(t.Context()); err == nil || st.Fenced {
				t.Fatalf("run: %v, proxy %+v: want writes open, the journal's error", err, *st)
			}
			fencedAt := r.j.FencedAt.Add(-time.Hour)
			if known {
				st.ChangedAt = fencedAt.Add(300 * time.Millisecond)
			}
			rep := resumeOnceWritableAt(t, r, StepUngateGreen, fencedAt)
			if rep.WriteUnavailability > time.Minute {
				t.Errorf("the resume reported writes unavailable for %s", rep.WriteUnavailability)
			}
			if known && rep.WriteUnavailability != 300*time.Millisecond {
				t.Errorf("the resume reported a window of %s; the proxies opened 300ms after the fence", rep.WriteUnavailability)
			}
			rec, _ := r.j.record(StepUnfence)
			if j, err := LoadJournal(r.p.StateDir); err == nil {
				rec, _ = j.record(StepUnfence)
			}
			if strings.Contains(rec.Detail, "window 1h") || !strings.Contains(rec.Detail, "already open") {
				t.Errorf("resumed unfence %q: want writes found already open, no hour-long window", rec.Detail)
			}
		})
	}
}
