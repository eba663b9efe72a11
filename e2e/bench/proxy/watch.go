package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
)

// The watch fan-out scenario: many watchers open through a peer, the backend sends events at
// a steady rate to all of them, each event carrying the time the backend wrote it to that
// watch; every watcher measures the delay to its arrival.

const watchersPerConn = 10 // watches multiplexed on one HTTP/2 connection, as a client-go process does

type watchResult struct {
	watchers, events, delivered int
	delays                      []time.Duration
	cpu                         time.Duration // the peer process's CPU time while events were sent, or -1
	dropped                     int64
}

// watchRun opens watchers watches through url, waits until the backend sees them all, then
// sends events for warmup+d at rate per second; events sent after warmup are measured.
func watchRun(ctx context.Context, bc *broadcaster, caFile, url string, pid, watchers, rate int, warmup, d time.Duration) (watchResult, error) {
	res := watchResult{watchers: watchers, cpu: -1}
	clients, err := h2Clients(caFile, (watchers+watchersPerConn-1)/watchersPerConn)
	if err != nil {
		return res, err
	}
	defer closeIdle(clients)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var firstRV atomic.Int64 // the first event measured
	firstRV.Store(1 << 62)
	var arrived atomic.Int64 // measured events delivered so far, all watches together
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range watchers {
		wg.Go(func() {
			lat := watch(wctx, clients[i/watchersPerConn], url, &firstRV, &arrived)
			mu.Lock()
			res.delays = append(res.delays, lat...)
			mu.Unlock()
		})
	}
	if err := waitWatchers(ctx, bc, watchers); err != nil {
		return res, err
	}
	dropped0 := bc.dropped.Load()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	start := time.Now()
	var cpu0 time.Duration
	for rv := 1; time.Since(start) < warmup+d; rv++ {
		if firstRV.Load() == 1<<62 && time.Since(start) >= warmup {
			cpu0 = procCPU(pid)
			firstRV.Store(int64(rv))
		}
		bc.send(rv)
		if firstRV.Load() != 1<<62 {
			res.events++
		}
		<-tick.C
	}
	// The last events arrive (on saturated cores, later than one would think).
	for deadline := time.Now().Add(10 * time.Second); arrived.Load() < int64(res.events*watchers) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if pid != 0 {
		res.cpu = procCPU(pid) - cpu0
	}
	res.dropped = bc.dropped.Load() - dropped0
	cancel()
	wg.Wait()
	closeIdle(clients)
	res.delivered = len(res.delays)
	slices.Sort(res.delays)
	// A proxy may notice that a client left only when the next event comes (HAProxy does):
	// keep sending until the backend's watches are gone.
	stop := make(chan struct{})
	go func() {
		for rv := 0; ; rv++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				bc.send(-rv)
			}
		}
	}()
	defer close(stop)
	if err := waitWatchers(ctx, bc, 0); err != nil {
		return res, fmt.Errorf("after the watchers left, %d watches still open on the backend: %w", bc.watchers(), err)
	}
	return res, nil
}

// waitWatchers waits until the backend has n watches open.
func waitWatchers(ctx context.Context, bc *broadcaster, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return framework.WaitUntil(ctx, 20*time.Millisecond, fmt.Sprintf("%d watches open on the backend", n), func(context.Context) (bool, error) {
		return bc.watchers() == n, nil
	})
}

var sentField, rvField = []byte(`"sent":"`), []byte(`"resourceVersion":"`)

// field is the value of the quoted field that starts after key in line, as an integer.
func field(line, key []byte) (int64, bool) {
	i := bytes.Index(line, key)
	if i < 0 {
		return 0, false
	}
	rest := line[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return v, err == nil
}

// watch reads one watch stream until ctx ends and returns the delay of every event from
// firstRV on.
func watch(ctx context.Context, c *http.Client, url string, firstRV, arrived *atomic.Int64) []time.Duration {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var lat []time.Duration
	br := bufio.NewReaderSize(resp.Body, 4096)
	for {
		line, err := br.ReadSlice('\n')
		now := time.Now().UnixNano()
		rv, ok := field(line, rvField)
		if sent, ok2 := field(line, sentField); ok && ok2 && rv >= firstRV.Load() {
			lat = append(lat, time.Duration(now-sent))
			arrived.Add(1)
		}
		if err != nil && err != bufio.ErrBufferFull {
			return lat
		}
	}
}

// watches runs the fan-out through direct, kubefence and HAProxy, rounds times each, and prints
// the median round (by p99 delay) of each.
func (b *bench) watches(ctx context.Context, out io.Writer) error {
	var rows []watchResult
	var names, spreads []string
	for _, p := range b.peers("direct", "kubefence", "haproxy") {
		var rounds []watchResult
		for range b.c.rounds {
			prof := b.startProfile(p.name)
			r, err := watchRun(ctx, b.bc, b.caFile, p.url+watchPath, p.pid, b.c.watchers, b.c.watchRate, b.c.warmup, b.c.duration)
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			if prof != nil {
				if err := <-prof; err != nil {
					return err
				}
			}
			if r.dropped > 0 || r.delivered != r.events*r.watchers {
				return fmt.Errorf("%s: %d events x %d watchers sent, %d delivered, %d dropped by the backend", p.name, r.events, r.watchers, r.delivered, r.dropped)
			}
			rounds = append(rounds, r)
		}
		slices.SortFunc(rounds, func(a, b watchResult) int { return cmp.Compare(pct(a.delays, 99), pct(b.delays, 99)) })
		rows = append(rows, rounds[len(rounds)/2])
		spreads = append(spreads, fmt.Sprintf("%.1f-%.1fms", float64(pct(rounds[0].delays, 99))/1e6, float64(pct(rounds[len(rounds)-1].delays, 99))/1e6))
		names = append(names, p.name)
	}
	fmt.Fprintf(out, "Watch fan-out (%d watches, %d per HTTP/2 connection, %d events/s to each for %s; median round of %d by p99):\n",
		b.c.watchers, watchersPerConn, b.c.watchRate, b.c.duration, b.c.rounds)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "peer\tdelivered\tdelay p50\tp99\tp99 of rounds\tmax\tadded p99\tCPU/event\tCPU\t")
	direct := rows[0]
	for i, r := range rows {
		cpuEv, cpuPct := "-", "-"
		if r.cpu >= 0 {
			cpuEv = fmt.Sprintf("%.1fµs", float64(r.cpu)/float64(r.delivered)/1e3)
			cpuPct = fmt.Sprintf("%.0f%%", 100*r.cpu.Seconds()/b.c.duration.Seconds())
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", names[i], r.delivered, ms(pct(r.delays, 50)), ms(pct(r.delays, 99)),
			spreads[i], ms(r.delays[len(r.delays)-1]), ms(pct(r.delays, 99)-pct(direct.delays, 99)), cpuEv, cpuPct)
	}
	tw.Flush()
	fmt.Fprintf(out, "kubefence added delay p99: %s (target <= 5ms)\n\n", ms(pct(rows[1].delays, 99)-pct(direct.delays, 99)))
	return nil
}
