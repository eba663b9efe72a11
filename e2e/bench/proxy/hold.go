package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/proxy/admin"
)

// holdResult is one run of the hold scenario: writes held while fenced in hold mode, then
// released by fence off.
type holdResult struct {
	held, answered, failed int
	// afterOff is, for each held write, the time from fence off to its answer.
	afterOff []time.Duration
	// rssPerHeld is the proxy's RSS growth while holding, per held write.
	rssPerHeld float64
	// release is what the proxy used from fence off to the last answer, releaseFaults its
	// minor page faults.
	release       procUse
	releaseFaults int64
	// benchCPU is this process's CPU time over the same interval: the clients sending the
	// writes and the backend answering them, on the same cores as the proxy.
	benchCPU time.Duration
	// reads during the hold and without it, on the same connections.
	readsHeld, readsBase []time.Duration
	// readsHeldCPU and readsBaseCPU are the CPU time of the proxy and of this process (the
	// readers, the writers' client streams, the backend) over each of those read windows: whose
	// cost a difference in their latency is.
	readsHeldCPU, readsBaseCPU cpuPair
}

// cpuPair is CPU time of the proxy process and of this one over the same interval.
type cpuPair struct{ proxy, bench time.Duration }

// readWindow runs readLoop for d and returns its latencies and the CPU both processes spent.
func readWindow(ctx context.Context, px *framework.Proxy, clients []*http.Client, url string, d time.Duration) ([]time.Duration, cpuPair) {
	p0, b0 := procCPU(px.Proc.Pid()), procCPU(os.Getpid())
	lat := readLoop(ctx, clients, url, d)
	return lat, cpuPair{proxy: procCPU(px.Proc.Pid()) - p0, bench: procCPU(os.Getpid()) - b0}
}

// benchHold fences px in hold mode, sends writers per connection on each client, lets them be
// held for hold, then lifts the fence and times the answers; readers on the same connections
// measure read latency before and during the hold.
func benchHold(ctx context.Context, px *framework.Proxy, clients []*http.Client, writers int, hold time.Duration, profile string) (holdResult, error) {
	var res holdResult
	url := px.URL + "/api/v1/namespaces/default/configmaps"
	res.readsBase, res.readsBaseCPU = readWindow(ctx, px, clients, url, 300*time.Millisecond)
	rss0 := procRSS(px.Proc.Pid())
	if _, err := px.Admin.Fence(ctx, admin.FenceRequest{Fenced: true, Mode: admin.ModeHold, Reason: "bench-hold"}); err != nil {
		return res, err
	}
	var offAt atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	body := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"held"},"data":{"k":"` + strings.Repeat("v", 512) + `"}}`)
	for _, c := range clients {
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, err := post(ctx, c, url, body)
				done := time.Now().UnixNano()
				mu.Lock()
				defer mu.Unlock()
				if err != nil || code != http.StatusCreated {
					res.failed++
					return
				}
				res.answered++
				if off := offAt.Load(); off > 0 {
					res.afterOff = append(res.afterOff, time.Duration(done-off))
				}
			}()
		}
	}
	// Reads are measured once every write is held (the steady state of a fence), not while
	// 10,000 writes are still arriving.
	deadline := time.Now().Add(hold)
	want := len(clients) * writers
	for time.Now().Before(deadline) {
		if st, err := px.Admin.Status(ctx); err == nil && st.Hold.Held >= want {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	res.readsHeld, res.readsHeldCPU = readWindow(ctx, px, clients, url, 300*time.Millisecond)
	time.Sleep(time.Until(deadline))
	st, err := px.Admin.Status(ctx)
	if err != nil {
		return res, err
	}
	res.held = st.Hold.Held
	if rss := procRSS(px.Proc.Pid()); res.held > 0 && rss > rss0 {
		res.rssPerHeld = float64(rss-rss0) / float64(res.held)
	}
	var prof chan error
	if profile != "" {
		prof = make(chan error, 1)
		go func() { prof <- fetchProfile(px.MetricsURL, profile, 0, 2) }()
		time.Sleep(50 * time.Millisecond) // the profile is running before the fence lifts
	}
	used0, faults0, bench0 := procUsed(px.Proc.Pid()), procMinorFaults(px.Proc.Pid()), procCPU(os.Getpid())
	offAt.Store(time.Now().UnixNano())
	if _, err := px.Admin.Fence(ctx, admin.FenceRequest{Fenced: false}); err != nil {
		return res, err
	}
	wg.Wait()
	res.release = procUsed(px.Proc.Pid()).since(used0)
	res.releaseFaults = procMinorFaults(px.Proc.Pid()) - faults0
	res.benchCPU = procCPU(os.Getpid()) - bench0
	if prof != nil {
		if err := <-prof; err != nil {
			return res, err
		}
	}
	slices.Sort(res.afterOff)
	slices.Sort(res.readsHeld)
	slices.Sort(res.readsBase)
	return res, nil
}

func post(ctx context.Context, c *http.Client, url string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// readLoop sends GETs on every client, one at a time per client, for d; it returns latencies.
func readLoop(ctx context.Context, clients []*http.Client, url string, d time.Duration) []time.Duration {
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				start := time.Now()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := c.Do(req)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				lat = append(lat, time.Since(start))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lat
}

// holdWriters per connection: 32 x 313 = 10,016 held writes.
const holdWriters = 313

// hold runs the hold scenario rounds times on fresh HTTP/2 connections and prints every round
// and the one whose last answer is the median.
func (b *bench) hold(ctx context.Context, out io.Writer) error {
	var rounds []holdResult
	for i := range b.c.rounds {
		h2, err := h2Clients(b.caFile, b.c.concurrency)
		if err != nil {
			return err
		}
		profile := ""
		if i == 0 {
			profile = b.c.holdProfile
		}
		r, err := benchHold(ctx, b.px, h2, holdWriters, time.Second, profile)
		for _, c := range h2 {
			c.CloseIdleConnections()
		}
		if err != nil {
			return err
		}
		if len(r.afterOff) == 0 {
			return fmt.Errorf("round %d: no held write was answered after fence off (held %d, failed %d)", i+1, r.held, r.failed)
		}
		rounds = append(rounds, r)
	}
	fmt.Fprintf(out, "Hold mode (%d HTTP/2 connections x %d writers, fence off after 1s; %d rounds, last answer after fence off (proxy CPU per released write) per round:",
		b.c.concurrency, holdWriters, len(rounds))
	for _, r := range rounds {
		fmt.Fprintf(out, " %s (%s)", ms(r.afterOff[len(r.afterOff)-1]), us(r.release.cpu/time.Duration(max(r.answered, 1))))
	}
	fmt.Fprintln(out, "; the median round):")
	slices.SortFunc(rounds, func(a, b holdResult) int {
		return cmp.Compare(a.afterOff[len(a.afterOff)-1], b.afterOff[len(b.afterOff)-1])
	})
	printHold(out, rounds[len(rounds)/2])
	fmt.Fprintln(out)
	return nil
}

func printHold(out io.Writer, r holdResult) {
	fmt.Fprintf(out, "  writes held at fence off: %d; answered 201 after it: %d; failed: %d\n", r.held, r.answered, r.failed)
	if len(r.afterOff) > 0 {
		fmt.Fprintf(out, "  fence off -> held write answered: first %s, p50 %s, p99 %s, max %s (target: all <= 500ms)\n", ms(r.afterOff[0]),
			ms(pct(r.afterOff, 50)), ms(pct(r.afterOff, 99)), ms(r.afterOff[len(r.afterOff)-1]))
	}
	fmt.Fprintf(out, "  proxy RSS per held write: %.0f bytes; proxy CPU from fence off to the last answer: %s, %s per released write; %.1f minor page faults per released write\n",
		r.rssPerHeld, r.release.cpu.Round(time.Millisecond), us(r.release.cpu/time.Duration(max(r.answered, 1))), float64(r.releaseFaults)/float64(max(r.answered, 1)))
	n := float64(max(r.answered, 1))
	fmt.Fprintf(out, "  proxy system calls per released write: %.2f reads, %.2f writes\n", float64(r.release.reads)/n, float64(r.release.writes)/n)
	fmt.Fprintf(out, "  the bench process (the clients and the backend, on the same cores) meanwhile: %s CPU\n", r.benchCPU.Round(time.Millisecond))
	if len(r.readsBase) > 0 && len(r.readsHeld) > 0 {
		fmt.Fprintf(out, "  reads on the same connections: %d during the hold (p50 %s, p99 %s), %d without (p50 %s, p99 %s)\n",
			len(r.readsHeld), ms(pct(r.readsHeld, 50)), ms(pct(r.readsHeld, 99)), len(r.readsBase), ms(pct(r.readsBase, 50)), ms(pct(r.readsBase, 99)))
		per := func(c time.Duration, reads []time.Duration) string { return us(c / time.Duration(len(reads))) }
		fmt.Fprintf(out, "  CPU per read during the hold / without: proxy %s / %s, the bench process (readers, the held writes' client streams, the backend) %s / %s\n",
			per(r.readsHeldCPU.proxy, r.readsHeld), per(r.readsBaseCPU.proxy, r.readsBase), per(r.readsHeldCPU.bench, r.readsHeld), per(r.readsBaseCPU.bench, r.readsBase))
	}
}
