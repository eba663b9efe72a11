// Command etcdlist measures what one page of a list over a big collection costs etcd, and what a
// client listing such pages does to etcd's writes: for each etcd version, one member on
// loopback holding N keys of 2 KB under one prefix (as N configmaps of a namespace), the time of
// a range with limit 50 over the prefix (what kube-apiserver sends etcd for `kubectl get cm
// --chunk-size 50` when it cannot serve the list from its cache, as with etcd older than 3.4.31
// or 3.5.13), and the median put to another prefix without and with a client making such
// ranges one after the other, 10 ms apart.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubefence/kubefence/e2e/framework"
)

const prefix = "/registry/configmaps/bench/"

// lineFormat is a line of the table: etcd version, range, put alone, put behind the lister.
const lineFormat = "%8s  %14s  %14s  %14s\n"

func main() {
	keys := flag.Int("keys", 200000, "keys of 2 KB under the listed prefix")
	versions := flag.String("versions", framework.Etcd34+","+framework.Etcd36, "etcd versions to measure (built by make e2e-deps)")
	rounds := flag.Int("rounds", 20, "ranges timed, and puts timed with and without the lister (x10)")
	flag.Parse()
	if *keys < 1 || *rounds < 1 {
		fmt.Fprintln(os.Stderr, "etcdlist: -keys and -rounds are at least 1")
		os.Exit(2)
	}
	fmt.Printf("etcdlist: %d keys of 2 KB under %s, one member on loopback; medians of %d ranges and %d puts (5 ms apart); the lister makes one range 10 ms after another ends\n", *keys, prefix, *rounds, 10**rounds)
	fmt.Printf(lineFormat, "etcd", "range limit 50", "put, no lister", "put, lister")
	err := framework.UntilInterrupted(func(ctx context.Context) error {
		for v := range strings.SplitSeq(*versions, ",") {
			if v = strings.TrimSpace(v); v == "" {
				continue
			}
			if err := measure(ctx, os.Stdout, v, *keys, *rounds); err != nil {
				return fmt.Errorf("etcd %s: %w", v, err)
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdlist:", err)
		os.Exit(1)
	}
}

// measure starts one etcd member of version, fills it and prints its line.
func measure(ctx context.Context, out io.Writer, version string, keys, rounds int) (err error) {
	env, err := framework.NewEnv("", func(string, ...any) {})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.Close(), os.RemoveAll(env.Dir)) }()
	etcd, err := env.StartEtcd(ctx, framework.EtcdConfig{Name: "etcd", Version: version, ExtraArgs: []string{"--quota-backend-bytes=8589934592"}})
	if err != nil {
		return err
	}
	cli, err := etcd.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	if err := fill(ctx, cli, keys); err != nil {
		return err
	}
	var ranges []time.Duration
	for range rounds {
		d, err := timed(func() error { return listPage(ctx, cli) })
		if err != nil {
			return err
		}
		ranges = append(ranges, d)
	}
	alone, err := puts(ctx, cli, 10*rounds)
	if err != nil {
		return err
	}
	listed, err := putsWhileListing(ctx, cli, 10*rounds)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, lineFormat, version, median(ranges), median(alone), median(listed))
	return err
}

// fill puts keys values of 2 KB under prefix from 32 clients at once; the first failed put
// stops it.
func fill(ctx context.Context, cli *clientv3.Client, keys int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	val := strings.Repeat("x", 2048)
	next := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range next {
				pctx, done := context.WithTimeout(ctx, 30*time.Second)
				_, err := cli.Put(pctx, fmt.Sprintf("%scm-%07d", prefix, i), val)
				done()
				if err != nil {
					cancel(fmt.Errorf("put %d: %w", i, err))
				}
			}
		})
	}
	for i := 0; i < keys && ctx.Err() == nil; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// listPage is one page of a list of the prefix.
func listPage(ctx context.Context, cli *clientv3.Client) error {
	_, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(50))
	return err
}

// puts times n puts of 2 KB to another prefix, 5 ms apart.
func puts(ctx context.Context, cli *clientv3.Client, n int) ([]time.Duration, error) {
	val := strings.Repeat("y", 2048)
	var took []time.Duration
	for i := range n {
		d, err := timed(func() error {
			_, err := cli.Put(ctx, fmt.Sprintf("/registry/configmaps/writer/cm-%d", i), val)
			return err
		})
		if err != nil {
			return nil, err
		}
		took = append(took, d)
		time.Sleep(5 * time.Millisecond)
	}
	return took, nil
}

// putsWhileListing is puts with a client listing a page of the prefix meanwhile, 10 ms after
// each answer.
func putsWhileListing(ctx context.Context, cli *clientv3.Client, n int) ([]time.Duration, error) {
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var listErr error
	wg.Go(func() {
		for lctx.Err() == nil {
			if err := listPage(lctx, cli); err != nil && lctx.Err() == nil {
				listErr = err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	took, err := puts(ctx, cli, n)
	stop()
	wg.Wait()
	return took, errors.Join(err, listErr)
}

func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start).Round(10 * time.Microsecond), err
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
