package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
	"github.com/kubefence/kubefence/proxy/admin"
)

// blueEtcdArgs: blue holds up to 200,000 configmaps of 2 KB and their history, and takes any
// green revision as one request while it follows green (bake, for the rollback).
var blueEtcdArgs = []string{"--quota-backend-bytes=8589934592", "--max-request-bytes", "10485760"}

// bakeFor is how long a run bakes (writes on green, blue following) before its rollback.
const bakeFor = 2 * time.Second

// template is a populated blue etcd data dir, stopped; every run starts blue on a copy of it.
type template struct {
	objects int
	dir     string // holds the member data dir, "member-data"
}

func (t *template) dataDir() string { return filepath.Join(t.dir, "member-data") }
func (t *template) remove()         { _ = os.RemoveAll(t.dir) }

// populateTemplate starts a blue etcd and apiserver, creates n configmaps of ~2 KB through the
// apiserver, stops both and keeps the data dir.
func populateTemplate(ctx context.Context, n int, out io.Writer) (*template, error) {
	env, err := framework.NewEnv("", func(string, ...any) {})
	if err != nil {
		return nil, err
	}
	t := &template{objects: n, dir: env.Dir}
	fail := func(err error) (*template, error) {
		_ = env.Close()
		t.remove()
		return nil, err
	}
	pki, err := framework.NewPKI(filepath.Join(env.Dir, "pki"))
	if err != nil {
		return fail(err)
	}
	etcd, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "blue-etcd", Version: framework.Etcd34, ExtraArgs: blueEtcdArgs, DataDirs: []string{t.dataDir()}})
	if err != nil {
		return fail(err)
	}
	api, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "blue-apiserver", EtcdEndpoints: etcd.Endpoints(), PKI: pki})
	if err != nil {
		return fail(err)
	}
	cs, err := clientset(api.Kubeconfig)
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	if err := populate(ctx, cs, n); err != nil {
		return fail(err)
	}
	fmt.Fprintf(out, "%d configmaps created in %s (through the apiserver, 16 writers); each run starts blue on a copy\n", n, time.Since(start).Round(time.Second))
	if err := env.Close(); err != nil {
		return fail(err)
	}
	return t, nil
}

// result is one cutover.
type result struct {
	objects, rate             int
	window, drain             time.Duration
	barrier                   time.Duration // the fence's wait for the writes admitted before it
	predicted                 time.Duration // the rehearsal's predicted window, 0 when not rehearsed
	rollback                  time.Duration // the rollback's window, 0 when not measured
	revisionsPerSecond        float64
	lagRevisions              int64
	lagSeconds                float64
	resent, resyncs           int64 // txns sent again, and the pipeline's resyncs, up to its stop
	leaseWaits                int64 // the pipeline's drains to grant a lease
	verified                  int
	reads, failedReads        int64
	writesOK, writesFailed    int64
	slowestWrite, writeP50    time.Duration
	snapshotMB                float64
	greenAPIServer, verifyDur time.Duration
	parts                     string // the window's steps and their durations
	watches                   int    // open through the proxy during the cutover
	watchesEnded, watchEvents int64
	quiet                     int           // quiet watches open through the proxy during the cutover
	quietEnded, pastExpiry    int64         // of them, ended; of all, resumed past green's expiry
	watchMove                 time.Duration // the proxies' drain at the switch (the switch step's detail)
	// answered: from the unfence step's start until green had answered every watch moved to it
	// (the proxy's resumesPending 0), without a rollback; 0 when not measured.
	answered time.Duration
}

func (r result) line(run int) string {
	rb := ""
	if r.predicted > 0 {
		rb = " (rehearsal predicted " + ms(r.predicted) + ")"
	}
	if r.rollback > 0 {
		rb += "; rollback window " + ms(r.rollback)
	}
	if r.watches > 0 {
		rb += fmt.Sprintf("; %d watches open, moved off blue in %s", r.watches, ms(r.watchMove))
		if r.answered > 0 {
			rb += fmt.Sprintf(", all answered by green %s after the unfence began", ms(r.answered))
		}
		rb += fmt.Sprintf(", %d ended, %d events", r.watchesEnded, r.watchEvents)
	}
	if r.quiet > 0 {
		rb += fmt.Sprintf("; %d quiet watches open, %d ended; %d watches green answered 410 went on", r.quiet, r.quietEnded, r.pastExpiry)
	}
	return fmt.Sprintf("%d configmaps: window %s%s (run %d, %s; barrier %s; %s; replication %.0f rev/s (%d txns sent again, %d resyncs, %d lease waits), lag at the fence %d revisions / %.2fs; verify of %d objects before the fence %s; writes %d ok, %d failed, p50 %s, slowest %s; lists %d, failed %d)",
		r.objects, ms(r.window), rb, run, writerName(r.rate), ms(r.barrier), r.parts, r.revisionsPerSecond, r.resent, r.resyncs, r.leaseWaits, r.lagRevisions, r.lagSeconds, r.verified, r.verifyDur.Round(time.Millisecond),
		r.writesOK, r.writesFailed, ms(r.writeP50), ms(r.slowestWrite), r.reads, r.failedReads)
}

// measure starts blue on a copy of tmpl behind a proxy, writes through the proxy at rate (0:
// none) and lists through it, runs the default cutover and returns what it reported. With
// rollback, the cutover bakes (blue etcd serves TLS for it) for bakeFor and is rolled back.
func measure(ctx context.Context, c config, tmpl *template, rate int) (result, error) {
	bin, rollback := c.bin, c.rollback
	r := result{objects: tmpl.objects, rate: rate}
	env, err := framework.NewEnv("", func(string, ...any) {})
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(env.Dir)
	defer env.Close()
	data := filepath.Join(env.Dir, "blue-data")
	if out, err := exec.CommandContext(ctx, "cp", "-a", tmpl.dataDir(), data).CombinedOutput(); err != nil {
		return r, fmt.Errorf("copy blue's data dir: %v: %s", err, out)
	}
	pki, err := framework.NewPKI(filepath.Join(env.Dir, "pki"))
	if err != nil {
		return r, err
	}
	etcd, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "blue-etcd", Version: framework.Etcd34, ExtraArgs: blueEtcdArgs, DataDirs: []string{data}, TLS: rollback, PKI: pki})
	if err != nil {
		return r, err
	}
	api, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "blue-apiserver", EtcdEndpoints: etcd.Endpoints(), PKI: pki, EtcdTLS: rollback})
	if err != nil {
		return r, err
	}
	px, err := env.StartProxy(ctx, framework.ProxyConfig{Binary: bin, Upstream: api.URL, PKI: pki, RetryAfter: 1})
	if err != nil {
		return r, err
	}
	green, err := env.WriteCutoverPlan("green", pki, px, api, etcd, framework.Etcd36, c.greenMembers)
	if err != nil {
		return r, err
	}
	defer framework.StopCutoverProcesses(green.Plan.StateDir)
	green.Plan.Migration.Mode, green.Plan.Proxy.FenceMode = "", "" // the defaults: auto (replicate here), hold
	green.Plan.Bake.Enabled = rollback
	green.Plan.Blue.APIServer.EtcdUser = "kube-apiserver-etcd-client" // the PKI's apiserver-etcd-client
	green.Plan.Green.Etcd.ExtraArgs = blueEtcdArgs[:1]                // blue's quota: green holds blue's data
	if err := green.Save(); err != nil {
		return r, err
	}
	pcs, err := clientset(px.Kubeconfig)
	if err != nil {
		return r, err
	}
	ws, err := startWatchers(ctx, px.Kubeconfig, c.watches, c.quiet)
	if err != nil {
		return r, err
	}
	load := startLoad(ctx, pcs, c.readerNamespace, rate)
	if c.rehearse {
		if r.predicted, err = rehearse(ctx, bin, green.PlanPath); err != nil {
			load.stop()
			ws.stop()
			return r, err
		}
	}
	rep, rb, err := cutoverAndBack(ctx, bin, green.PlanPath, rollback)
	if err == nil && !rollback && c.watches+c.quiet > 0 {
		r.answered, err = awaitAnswered(ctx, px.Admin, rep)
	}
	load.stop()
	ws.stop()
	if err != nil {
		return r, err
	}
	r.watches, r.watchesEnded, r.watchEvents = c.watches, ws.ended.Load(), ws.events.Load()
	r.quiet, r.quietEnded = c.quiet, ws.quietEnded.Load()
	r.fill(rep)
	if rb != nil {
		r.rollback = rb.WriteUnavailability
	}
	r.reads, r.failedReads = load.reads.Load(), load.failedReads.Load()
	r.writesOK, r.writesFailed = load.ok.Load(), load.failed.Load()
	r.writeP50, r.slowestWrite = load.latencies()
	if r.writesFailed > 0 || r.failedReads > 0 || ws.failedTicks.Load() > 0 {
		return r, fmt.Errorf("%d writes, %d changes of the watched configmap and %d lists through the proxy failed: %v", r.writesFailed, ws.failedTicks.Load(), r.failedReads, errors.Join(load.firstError(), ws.firstError()))
	}
	return r, nil
}

// awaitAnswered waits until no watch moved by the cutover waits for green's answer and returns
// how long after the unfence step began that was: green answers them once writes reopen, and
// the unfence step waits for that 10 s at most.
func awaitAnswered(ctx context.Context, px *admin.Client, rep *cutover.Report) (time.Duration, error) {
	var began time.Time
	for _, s := range rep.Steps {
		if s.Step == cutover.StepUnfence {
			began = s.Started
		}
	}
	if began.IsZero() {
		return 0, errors.New("the report has no unfence step")
	}
	var last error // of the proxy's status, kept for the message
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		st, err := px.Status(ctx)
		last = err
		return err == nil && st.ResumesPending == 0, nil
	})
	if err != nil {
		return 0, fmt.Errorf("watches moved to green still wait for its answer: %w (the proxy's status: %v)", err, last)
	}
	return time.Since(began), nil
}

// watchMoveRE finds the proxies' drain in the switch step's detail; pastExpiryRE, in the
// unfence step's, the watches green answered 410 that went on.
var (
	watchMoveRE  = regexp.MustCompile(`, off \w+ in ([0-9.hmsµn]+)`)
	pastExpiryRE = regexp.MustCompile(`(\d+) watch\(es\) \w+ answered 410`)
)

// fill takes the report's figures.
func (r *result) fill(rep *cutover.Report) {
	r.window, r.barrier = rep.WriteUnavailability, rep.FenceBarrier
	r.snapshotMB = float64(rep.SnapshotBytes) / 1e6
	var parts []string
	var between time.Duration // from the fence step's end to the unfence step's start, outside any step
	var prevEnd time.Time
	for _, s := range rep.Steps {
		switch s.Step {
		case cutover.StepFence, cutover.StepDrain, cutover.StepSwitch, cutover.StepGateBlue, cutover.StepHandOver, cutover.StepStopReplication, cutover.StepUngateGreen, cutover.StepUnfence:
			parts = append(parts, s.Step+" "+ms(s.Duration))
			if !prevEnd.IsZero() {
				between += s.Started.Sub(prevEnd)
			}
			prevEnd = s.Started.Add(s.Duration)
		}
		switch s.Step {
		case cutover.StepDrain:
			r.drain = s.Duration
		case cutover.StepGreenAPIServer:
			r.greenAPIServer = s.Duration
		case cutover.StepVerify:
			r.verifyDur = s.Duration
		case cutover.StepSwitch:
			if m := watchMoveRE.FindStringSubmatch(s.Detail); m != nil {
				r.watchMove, _ = time.ParseDuration(m[1])
			}
		case cutover.StepUnfence:
			if m := pastExpiryRE.FindStringSubmatch(s.Detail); m != nil {
				r.pastExpiry, _ = strconv.ParseInt(m[1], 10, 64)
			}
		}
	}
	r.parts = strings.Join(append(parts, "between the steps (journal) "+ms(between)), ", ")
	if rep.Verified != nil {
		r.verified = rep.Verified.Objects
	}
	if rp := rep.Replication; rp != nil && rp.AtFence != nil {
		r.lagRevisions, r.lagSeconds = rp.AtFence.LagRevisions, rp.AtFence.LagSeconds
		r.revisionsPerSecond = rp.AtFence.RevisionsPerSecond
		r.resent, r.resyncs, r.leaseWaits = rp.AtFence.Resent, rp.AtFence.Resyncs, rp.AtFence.LeaseWaits
	}
	if rp := rep.Replication; rp != nil && rp.AtStop != nil {
		r.resent, r.resyncs, r.leaseWaits = rp.AtStop.Resent, rp.AtStop.Resyncs, rp.AtStop.LeaseWaits
	}
}

// rehearse runs the plan's rehearsal and returns the window it predicted.
func rehearse(ctx context.Context, bin, plan string) (time.Duration, error) {
	rep, p, err := runReport(ctx, cutover.ResultRehearsed, bin, "cutover", "--plan", plan, "--rehearse")
	if err = errors.Join(err, p.wait()); err != nil {
		return 0, err
	}
	if rep.Rehearsal == nil {
		return 0, errors.New("cutover --rehearse: the report has no rehearsal")
	}
	return rep.Rehearsal.PredictedWindow, nil
}

// cutoverAndBack runs the cutover and, with rollback, lets it bake for bakeFor and rolls it
// back; it returns both reports.
func cutoverAndBack(ctx context.Context, bin, plan string, rollback bool) (fwd, back *cutover.Report, err error) {
	want := cutover.ResultDone
	if rollback {
		want = cutover.ResultBaking
	}
	fwd, baker, err := runReport(ctx, want, bin, "cutover", "--plan", plan)
	if err != nil || !rollback {
		return fwd, nil, errors.Join(err, baker.wait())
	}
	time.Sleep(bakeFor)
	back, rb, err := runReport(ctx, cutover.ResultRolledBack, bin, "cutover", "rollback", "--plan", plan)
	if err != nil {
		_ = baker.cmd.Process.Signal(syscall.SIGTERM) // the rollback did not stop it
	}
	return fwd, back, errors.Join(err, rb.wait(), baker.wait())
}

// proc is a kubefence process runReport started.
type proc struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	what   string
	waited bool
}

// wait waits for the process's end (once).
func (p *proc) wait() error {
	if p.waited {
		return nil
	}
	p.waited = true
	if err := p.cmd.Wait(); err != nil {
		return fmt.Errorf("%s: %v %s", p.what, err, p.stderr.String())
	}
	return nil
}

// runReport runs kubefence args… -o json until it reports the result want (the process may go
// on: a baking cutover does), and returns that report and the process.
func runReport(ctx context.Context, want, bin string, args ...string) (*cutover.Report, *proc, error) {
	p := &proc{cmd: exec.CommandContext(ctx, bin, append(args, "-o", "json")...), what: strings.Join(args[:2], " ")}
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err == nil {
		err = p.cmd.Start()
	}
	if err != nil {
		p.waited = true
		return nil, p, err
	}
	reports := make(chan *cutover.Report, 1)
	go func() {
		defer close(reports)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		sent := false
		for sc.Scan() {
			var e cutover.Event
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.Type == cutover.EventReport && !sent {
				reports <- e.Report
				sent = true
			}
		}
	}()
	rep := <-reports
	if rep == nil || rep.Result != want {
		err := fmt.Errorf("%s: no %s report", p.what, want)
		if rep != nil {
			err = fmt.Errorf("%s: %s: %s", p.what, rep.Result, rep.Error)
		}
		return nil, p, errors.Join(err, p.wait())
	}
	return rep, p, nil
}

// load is the traffic through the proxy during a cutover: a lister (10 ms between its lists)
// and, at rate writes/s, a client-go writer updating configmaps of its own.
//
// The lister reads a namespace of its own size (kube-system's configmaps by default), not the N
// configmaps. Blue's etcd 3.4.23 is older than 3.4.31, so kube-apiserver sends every consistent
// list to etcd, and etcd answers a limited range (and the total count it reports) by walking the
// index of the whole prefix: 74-95 ms per list at 200,000 keys on the reference machine, and a
// put waits behind it (go run ./e2e/bench/etcdlist). Listing the N configmaps made blue's writes
// several times slower at 200,000 than at 1,000 (37-62 ms at the median against 4-8 ms), and
// the fence's barrier (the writes blue is still answering) with them: it measured blue under
// that reader, not the cutover.
type load struct {
	cancel             context.CancelFunc
	wg                 sync.WaitGroup
	reads, failedReads atomic.Int64
	ok, failed         atomic.Int64
	mu                 sync.Mutex
	firstErr           error
	took               []time.Duration // each acknowledged write's latency
}

func startLoad(ctx context.Context, cs *kubernetes.Clientset, namespace string, rate int) *load {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{cancel: cancel}
	l.wg.Go(func() {
		for ctx.Err() == nil {
			if _, err := cs.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{Limit: 50}); err != nil && ctx.Err() == nil {
				l.failedReads.Add(1)
				l.note(err)
			}
			l.reads.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
	})
	if rate > 0 {
		l.wg.Go(func() { l.write(ctx, cs, rate) })
	}
	return l
}

// write creates configmaps in namespace writer at rate per second, each write timed.
func (l *load) write(ctx context.Context, cs *kubernetes.Clientset, rate int) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "writer"}}, metav1.CreateOptions{}); err != nil {
		l.failed.Add(1)
		l.note(err)
		return
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var sem = make(chan struct{}, 64)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			start := time.Now()
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w-%07d", i)}, Data: map[string]string{"v": strings.Repeat("w", 200)}}
			_, err := cs.CoreV1().ConfigMaps("writer").Create(context.WithoutCancel(ctx), cm, metav1.CreateOptions{})
			if err != nil {
				l.failed.Add(1)
				l.note(err)
				return
			}
			l.ok.Add(1)
			l.mu.Lock()
			l.took = append(l.took, time.Since(start))
			l.mu.Unlock()
		})
	}
}

func (l *load) note(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.firstErr == nil {
		l.firstErr = err
	}
}

// latencies are the median and the slowest acknowledged write's latency.
func (l *load) latencies() (p50, slowest time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.took) == 0 {
		return 0, 0
	}
	v := slices.Sorted(slices.Values(l.took))
	return v[len(v)/2], v[len(v)-1]
}

func (l *load) firstError() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstErr
}

func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

func clientset(kubeconfig string) (*kubernetes.Clientset, error) {
	_, cfg, err := framework.ClientsetFor(kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 5000, 5000
	return kubernetes.NewForConfig(cfg)
}

// populate creates n configmaps of ~2 KB in namespace bench, 16 at a time.
func populate(ctx context.Context, cs *kubernetes.Clientset, n int) error {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	return framework.CreateConfigMaps(ctx, cs, "bench", "cm", n, 2000)
}
