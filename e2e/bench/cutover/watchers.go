package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/e2e/framework"
)

// watchersPerConn is how many watches share a client connection to the proxy, as the informers
// of one client-go process (a kubelet, a controller) do.
const watchersPerConn = 10

// watchers are n watches open through the proxy for the whole cutover, on namespace watched,
// where a ticker changes one configmap every second: every watch's resourceVersion stays newer
// than green's apiserver start, so the switch resumes each on green (inside the window they
// leave blue; after it they ask green); and quiet ones, on namespace quiet, which nothing
// changes after they open: their resourceVersion is older than green's watch cache, which
// answers them 410, and the proxy lists the namespace to resume them. ended and quietEnded
// count the watches that ended before the bench stopped them (a watch the switch could not
// move, or one green ended).
type watchers struct {
	cancel        context.CancelFunc
	wg            sync.WaitGroup
	ended, events atomic.Int64
	quietEnded    atomic.Int64
	failedTicks   atomic.Int64
	mu            sync.Mutex
	firstTickErr  error
}

func (w *watchers) firstError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.firstTickErr
}

func startWatchers(ctx context.Context, kubeconfig string, n, quiet int) (*watchers, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &watchers{cancel: cancel}
	if n+quiet == 0 {
		return w, nil
	}
	shards, err := watchClients(kubeconfig, (n+watchersPerConn-1)/watchersPerConn+(quiet+watchersPerConn-1)/watchersPerConn)
	if err != nil {
		cancel()
		return nil, err
	}
	opened := make(chan error, n+quiet)
	// Thousands opened at once would each need a TLS connection to the proxy and a watch
	// request answered within the proxy's read timeout, on cores busy handshaking.
	opening := make(chan struct{}, openAtOnce)
	for _, ns := range []struct {
		name   string
		n      int
		ended  *atomic.Int64
		shards []*kubernetes.Clientset
	}{{"watched", n, &w.ended, shards}, {"quiet", quiet, &w.quietEnded, shards[(n+watchersPerConn-1)/watchersPerConn:]}} {
		if ns.n == 0 {
			continue
		}
		rv, err := namespaceWithConfigMap(ctx, ns.shards[0], ns.name)
		if err != nil {
			cancel()
			return nil, err
		}
		for i := range ns.n {
			w.wg.Go(func() { w.watch(ctx, ns.shards[i/watchersPerConn], ns.name, rv, opening, opened, ns.ended) })
		}
	}
	for range n + quiet {
		if err := <-opened; err != nil {
			w.stop()
			return nil, fmt.Errorf("open a watch through the proxy: %w", err)
		}
	}
	if n > 0 {
		w.wg.Go(func() { w.tick(ctx, shards[0]) })
	}
	return w, nil
}

// namespaceWithConfigMap creates namespace ns with one configmap, tick, and returns its
// resourceVersion.
func namespaceWithConfigMap(ctx context.Context, cs *kubernetes.Clientset, ns string) (string, error) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tick"}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return cm.ResourceVersion, nil
}

// openAtOnce bounds the watches being opened at once.
const openAtOnce = 100

// watch holds one watch open until ctx ends, counting its events, and its end if it comes first;
// it opens it with a slot of opening.
func (w *watchers) watch(ctx context.Context, cs *kubernetes.Clientset, ns, rv string, opening chan struct{}, opened chan<- error, ended *atomic.Int64) {
	opening <- struct{}{}
	wi, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
	<-opening
	opened <- err
	if err != nil {
		return
	}
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-wi.ResultChan():
			if !ok || ev.Type == watch.Error {
				if ctx.Err() == nil {
					ended.Add(1)
				}
				return
			}
			w.events.Add(1)
		}
	}
}

// tick changes configmap tick once a second.
func (w *watchers) tick(ctx context.Context, cs *kubernetes.Clientset) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		patch := []byte(`{"data":{"tick":"` + strconv.Itoa(i) + `"}}`)
		_, err := cs.CoreV1().ConfigMaps("watched").Patch(ctx, "tick", "application/merge-patch+json", patch, metav1.PatchOptions{})
		if err != nil && !errors.Is(ctx.Err(), context.Canceled) {
			w.failedTicks.Add(1)
			w.mu.Lock()
			if w.firstTickErr == nil {
				w.firstTickErr = err
			}
			w.mu.Unlock()
		}
	}
}

func (w *watchers) stop() {
	w.cancel()
	w.wg.Wait()
}

// watchClients are n clientsets through kubeconfig, each on a connection of its own (client-go
// shares one transport between equal configs; a dialer of its own keeps each apart), with no
// client-side rate limit: opening the watches is not what is measured.
func watchClients(kubeconfig string, n int) ([]*kubernetes.Clientset, error) {
	out := make([]*kubernetes.Clientset, n)
	for i := range out {
		_, cfg, err := framework.ClientsetFor(kubeconfig)
		if err != nil {
			return nil, err
		}
		cfg.QPS = -1
		cfg.Dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
		if out[i], err = kubernetes.NewForConfig(cfg); err != nil {
			return nil, err
		}
	}
	return out, nil
}
