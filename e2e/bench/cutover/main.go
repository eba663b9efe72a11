// Command cutover measures `kubefence cutover` (`make bench-cutover`): for clusters of N
// configmaps of ~2 KB (plus the defaults), the write-unavailability window (fence on → fence off)
// and each step's duration, with a reader listing through the proxy the whole time.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/migrator/cutover"
)

func main() {
	kubefence := flag.String("kubefence", "", "kubefence binary (default: build one)")
	sizes := flag.String("objects", "1000,10000,50000", "cluster sizes (configmaps) to measure")
	flag.Parse()
	var ns []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench-cutover: -objects:", err)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	if err := run(context.Background(), *kubefence, ns, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-cutover:", err)
		os.Exit(1)
	}
}

type result struct {
	objects       int
	snapshotMB    float64
	window        time.Duration
	steps         map[string]time.Duration
	verified      int
	reads, failed int64
}

func run(ctx context.Context, bin string, sizes []int, out io.Writer) error {
	if bin == "" {
		dir, err := os.MkdirTemp("", "kubefence-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if bin, err = framework.Kubefence(dir); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "bench-cutover: blue etcd %s + kube-apiserver %s -> green etcd %s + kube-apiserver %s, 1 member each, loopback\n\n",
		framework.Etcd34, framework.Kube136, framework.Etcd36, framework.Kube136)
	var results []result
	for _, n := range sizes {
		r, err := measure(ctx, bin, n, out)
		if err != nil {
			return fmt.Errorf("%d objects: %w", n, err)
		}
		results = append(results, r)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "configmaps\tsnapshot\twindow\t")
	for _, s := range cutover.Steps[1:len(cutover.Steps)] {
		fmt.Fprintf(tw, "%s\t", s)
	}
	fmt.Fprintln(tw, "verified\tlists (failed)\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%d\t%.1f MB\t%s\t", r.objects, r.snapshotMB, r.window.Round(10*time.Millisecond))
		for _, s := range cutover.Steps[1:] {
			fmt.Fprintf(tw, "%s\t", r.steps[s].Round(time.Millisecond))
		}
		fmt.Fprintf(tw, "%d\t%d (%d)\t\n", r.verified, r.reads, r.failed)
	}
	tw.Flush()
	if len(results) > 1 {
		a, b := results[0], results[len(results)-1]
		fmt.Fprintf(out, "\nwindow growth %d -> %d objects: %.2fx for %.0fx the data (linear or better: <= %.0fx)\n",
			a.objects, b.objects, float64(b.window)/float64(a.window), float64(b.objects)/float64(a.objects), float64(b.objects)/float64(a.objects))
	}
	return nil
}

func measure(ctx context.Context, bin string, n int, out io.Writer) (result, error) {
	r := result{objects: n, steps: map[string]time.Duration{}}
	env, err := framework.NewEnv("", func(string, ...any) {})
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(env.Dir)
	defer env.Close()
	pki, err := framework.NewPKI(env.Dir + "/pki")
	if err != nil {
		return r, err
	}
	etcd, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "blue-etcd", Version: framework.Etcd34, ExtraArgs: []string{"--quota-backend-bytes=8589934592"}})
	if err != nil {
		return r, err
	}
	api, err := env.StartAPIServer(ctx, framework.APIServerConfig{Name: "blue-apiserver", EtcdEndpoints: etcd.Endpoints(), PKI: pki})
	if err != nil {
		return r, err
	}
	px, err := env.StartProxy(ctx, framework.ProxyConfig{Binary: bin, Upstream: api.URL, PKI: pki, RetryAfter: 1})
	if err != nil {
		return r, err
	}
	green, err := env.WriteCutoverPlan("green", pki, px, api, etcd, framework.Etcd36, 1)
	if err != nil {
		return r, err
	}
	defer framework.StopCutoverProcesses(green.Plan.StateDir)
	cs, err := clientset(api.Kubeconfig)
	if err != nil {
		return r, err
	}
	start := time.Now()
	if err := populate(ctx, cs, n); err != nil {
		return r, err
	}
	fmt.Fprintf(out, "%d configmaps created in %s\n", n, time.Since(start).Round(time.Second))

	pcs, err := clientset(px.Kubeconfig)
	if err != nil {
		return r, err
	}
	rctx, stopReader := context.WithCancel(ctx)
	defer stopReader()
	var reads, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rctx.Err() == nil {
			if _, err := pcs.CoreV1().ConfigMaps("bench").List(rctx, metav1.ListOptions{Limit: 50}); err != nil && rctx.Err() == nil {
				failed.Add(1)
			}
			reads.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	cmd := exec.CommandContext(ctx, bin, "cutover", "--plan", green.PlanPath, "-o", "json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return r, err
	}
	if err := cmd.Start(); err != nil {
		return r, err
	}
	var rep *cutover.Report
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e cutover.Event
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Type == "report" {
			rep = e.Report
		}
	}
	err = cmd.Wait()
	stopReader()
	wg.Wait()
	if err != nil || rep == nil || rep.Result != "done" {
		return r, fmt.Errorf("cutover: %v %s", err, stderr.String())
	}
	r.window = rep.WriteUnavailability
	r.snapshotMB = float64(rep.SnapshotBytes) / 1e6
	for _, s := range rep.Steps {
		r.steps[s.Step] = s.Duration
	}
	if rep.Verified != nil {
		r.verified = rep.Verified.Objects
	}
	r.reads, r.failed = reads.Load(), failed.Load()
	fmt.Fprintf(out, "%d configmaps: window %s\n", n, r.window.Round(10*time.Millisecond))
	return r, nil
}

func clientset(kubeconfig string) (*kubernetes.Clientset, error) {
	_, cfg, err := framework.ClientsetFor(kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 5000, 5000
	return kubernetes.NewForConfig(cfg)
}

// populate creates n configmaps of ~2 KB in namespace bench with 16 concurrent writers.
func populate(ctx context.Context, cs *kubernetes.Clientset, n int) error {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	payload := strings.Repeat("x", 2000)
	var next atomic.Int64
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%06d", i)}, Data: map[string]string{"payload": payload}}
				if _, err := cs.CoreV1().ConfigMaps("bench").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
