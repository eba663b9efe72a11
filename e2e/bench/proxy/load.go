package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

// The closed-loop load generator, the clients it uses, and what it measures: latencies, codes,
// and the CPU time the proxy process alone spent over the measured interval.

// newClient is one HTTP/1.1 client keeping up to conc connections alive.
func newClient(caFile string, conc int, cert *tls.Certificate) (*http.Client, error) {
	pool, err := tlsutil.LoadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	tc := &tls.Config{RootCAs: pool}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     tc,
		MaxIdleConnsPerHost: conc,
		MaxConnsPerHost:     conc,
		ForceAttemptHTTP2:   false,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableCompression:  true,
	}}, nil
}

// h2Clients returns n HTTP/2 clients, each with a connection of its own (as n client-go
// processes would have).
func h2Clients(caFile string, n int) ([]*http.Client, error) {
	pool, err := tlsutil.LoadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	out := make([]*http.Client, n)
	for i := range out {
		out[i] = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, DisableCompression: true}}
	}
	return out, nil
}

func closeIdle(clients []*http.Client) {
	for _, c := range clients {
		c.CloseIdleConnections()
	}
}

// result is one load run.
type result struct {
	n, errors int
	codes     map[int]int
	lat       []time.Duration
	elapsed   time.Duration
	// procUse is what the measured process used over the measured interval (cpu -1 when no
	// process was measured).
	procUse
	// roundRPS is the throughput of every round, when the result is a median of rounds.
	roundRPS []float64
}

func (r result) rps() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r result) p(q float64) time.Duration { return pct(r.lat, q) }

// cpuPerReq is the measured process's CPU time per request, or 0 when not measured.
func (r result) cpuPerReq() time.Duration {
	if r.cpu < 0 || r.n == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.n)
}

// callsPerReq prints the measured process's read and write system calls per request, or "-".
func (r result) callsPerReq() string {
	if r.cpu < 0 || r.n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f+%.1f", float64(r.reads)/float64(r.n), float64(r.writes)/float64(r.n))
}

// spread prints the rounds' throughput range as a percentage around the median.
func (r result) spread() string {
	if len(r.roundRPS) < 2 {
		return "-"
	}
	lo, hi := slices.Min(r.roundRPS), slices.Max(r.roundRPS)
	return fmt.Sprintf("%.0f-%.0f", lo, hi)
}

func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	s := slices.Clone(sorted)
	slices.Sort(s)
	i := int(float64(len(s)-1) * q / 100)
	return s[i]
}

// median runs f rounds times and returns the run with the median throughput, with every
// round's throughput.
func median(rounds int, f func() result) result {
	var rs []result
	for range rounds {
		rs = append(rs, f())
	}
	slices.SortFunc(rs, func(a, b result) int {
		switch {
		case a.rps() < b.rps():
			return -1
		case a.rps() > b.rps():
			return 1
		}
		return 0
	})
	m := rs[len(rs)/2]
	for _, r := range rs {
		m.roundRPS = append(m.roundRPS, r.rps())
	}
	return m
}

// loadSpec is one closed-loop run: conc workers, worker w using clients[w%len(clients)], for
// warmup then d; pid is the process whose CPU time is measured over d (0: none).
type loadSpec struct {
	clients   []*http.Client
	next      func(i int) (method, url string, body []byte)
	conc      int
	warmup, d time.Duration
	pid       int
}

// load runs a closed loop of c.concurrency workers for warm-up then c.duration.
func load(ctx context.Context, clients []*http.Client, method, url string, body []byte, c config, pid int) result {
	return loadMix(ctx, loadSpec{clients: clients, next: func(int) (string, string, []byte) { return method, url, body },
		conc: c.concurrency, warmup: c.warmup, d: c.duration, pid: pid})
}

func loadMix(ctx context.Context, ls loadSpec) result {
	var wg sync.WaitGroup
	var mu sync.Mutex
	res := result{codes: map[int]int{}, procUse: procUse{cpu: -1}}
	start := time.Now()
	measureFrom := start.Add(ls.warmup)
	end := measureFrom.Add(ls.d)
	used := measureProc(ls.pid, measureFrom, end)
	for w := range ls.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, codes, errs := worker(ctx, ls.clients[w%len(ls.clients)], ls.next, w, ls.conc, measureFrom, end)
			mu.Lock()
			res.lat = append(res.lat, lat...)
			res.errors += errs
			for k, v := range codes {
				res.codes[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.procUse = <-used
	res.n = len(res.lat)
	res.elapsed = ls.d
	slices.Sort(res.lat)
	return res
}

func worker(ctx context.Context, client *http.Client, next func(int) (string, string, []byte), w, conc int, measureFrom, end time.Time) ([]time.Duration, map[int]int, int) {
	lat := make([]time.Duration, 0, 1<<16)
	codes := map[int]int{}
	errs := 0
	for i := w; ; i += conc {
		t0 := time.Now()
		if t0.After(end) {
			break
		}
		method, url, body := next(i)
		req, _ := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if t0.Before(measureFrom) {
			continue
		}
		lat = append(lat, time.Since(t0))
		if err != nil {
			errs++
			continue
		}
		codes[resp.StatusCode]++
	}
	return lat, codes, errs
}

// procUse is what a process used: user+system CPU time (-1: no process measured), and read and
// write system calls; so far (procUsed) or over an interval (since).
type procUse struct {
	cpu           time.Duration
	reads, writes int64
}

// procUsed is what process pid used so far.
func procUsed(pid int) procUse {
	r, w := procSyscalls(pid)
	return procUse{cpu: procCPU(pid), reads: r, writes: w}
}

// since is what was used between before and u.
func (u procUse) since(before procUse) procUse {
	return procUse{cpu: u.cpu - before.cpu, reads: u.reads - before.reads, writes: u.writes - before.writes}
}

// measureProc samples what pid uses from from to to and sends it (cpu -1 for pid 0).
func measureProc(pid int, from, to time.Time) <-chan procUse {
	ch := make(chan procUse, 1)
	if pid == 0 {
		ch <- procUse{cpu: -1}
		return ch
	}
	go func() {
		time.Sleep(time.Until(from))
		u0 := procUsed(pid)
		time.Sleep(time.Until(to))
		ch <- procUsed(pid).since(u0)
	}()
	return ch
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux this runs on.
const clockTick = 10 * time.Millisecond

// procCPU is a process's user+system CPU time so far (all its threads), from /proc/PID/stat.
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) start at state, field 3; utime and
	// stime are fields 14 and 15.
	rest := string(data[bytes.LastIndexByte(data, ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * clockTick
}

// procMinorFaults is a process's minor page faults so far (all its threads: a first touch of
// memory the kernel has to map), field 10 of /proc/PID/stat.
func procMinorFaults(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	if len(f) < 8 {
		return 0
	}
	n, _ := strconv.ParseInt(f[7], 10, 64)
	return n
}

// procSyscalls is a process's read and write system calls so far (syscr and syscw of
// /proc/PID/io: the read and write families, readv and writev included; Go's TCP connections
// use read and write).
func procSyscalls(pid int) (reads, writes int64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// procRSS is a process's resident set in bytes, from /proc.
func procRSS(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
