package proxy

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the proxy's Prometheus metrics, on a registry of its own (no globals).
type metrics struct {
	registry *prometheus.Registry

	requests         *prometheus.CounterVec // class, decision, code
	refusedWrites    prometheus.Counter
	upstreamDuration prometheus.Histogram
	fenceChanges     prometheus.Counter
	backendSwitches  prometheus.Counter
	drainForced      prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{registry: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubefence_requests_total",
		Help: "Requests handled, by class (read, write), decision (forwarded, refused) and HTTP status code.",
	}, []string{"class", "decision", "code"})
	m.refusedWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kubefence_refused_writes_total",
		Help: "Requests refused with 429 because the fence is on.",
	})
	m.upstreamDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kubefence_upstream_duration_seconds",
		Help:    "Time from sending a request to the backend to receiving its response headers.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	m.fenceChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kubefence_fence_changes_total",
		Help: "Acknowledged fence on/off changes.",
	})
	m.backendSwitches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kubefence_backend_switches_total",
		Help: "Acknowledged backend changes.",
	})
	m.drainForced = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kubefence_drain_forced_total",
		Help: "Long-running requests cut (not ended cleanly) when switching away from a backend.",
	})
	m.registry.MustRegister(m.requests, m.refusedWrites, m.upstreamDuration, m.fenceChanges, m.backendSwitches, m.drainForced,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubefence_inflight_writes",
			Help: "Writes forwarded and not yet answered (what 'fence on' waits for).",
		}, func() float64 { return float64(s.gate.inflight.len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubefence_open_watches",
			Help: "Watch requests open through the proxy.",
		}, func() float64 { return float64(s.openWatches.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubefence_fenced",
			Help: "1 while the fence is on (writes refused, or held in hold mode), 0 while open.",
		}, func() float64 {
			if s.gate.fenced() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubefence_fence_generation",
			Help: "Generation of the acknowledged proxy state; grows with every change.",
		}, func() float64 { return float64(s.gate.current().Generation) }),
		backendInfo{s},
	)
	m.registry.MustRegister(holdMetrics(s.holder)...)
	m.registry.MustRegister(bodyBudgetMetrics(s.bodyBudget)...)
	return m
}

// bodyBudgetMetrics are --max-buffered-write-bytes's: the write-body bytes reserved now, and the
// writes refused because the budget was full.
func bodyBudgetMetrics(b *bodyBudget) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubefence_buffered_write_bytes",
			Help: "Write body bytes being read or kept now (reserved against --max-buffered-write-bytes; held writes' bodies count in kubefence_held_bytes instead).",
		}, func() float64 { return float64(b.used.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubefence_buffered_unverified_write_bytes",
			Help: "Of kubefence_buffered_write_bytes, those of writes from clients without a certificate the proxy verified (at most three quarters of --max-buffered-write-bytes; 0 when it verifies no certificates: without --client-ca-file nothing is kept aside).",
		}, func() float64 { return float64(b.unverified.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kubefence_buffered_write_full_total",
			Help: "Writes refused with 429 at once because --max-buffered-write-bytes, or their connection's or unverified clients' share of it, was full (never forwarded).",
		}, func() float64 { return float64(b.full.Load()) }),
	}
}

// holdMetrics are hold mode's: the waiting room now, and how holds ended.
func holdMetrics(hd *holder) []prometheus.Collector {
	q := hd.q
	count := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		hd.seconds,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kubefence_held_writes", Help: "Writes held now (hold mode)."},
			func() float64 { return float64(q.stats().count) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kubefence_held_bytes", Help: "Body bytes of the writes held now, and of released ones until the backend answers them (hold mode; counted against --max-held-bytes, not --max-buffered-write-bytes)."},
			func() float64 { return float64(q.stats().bytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kubefence_held_unverified_writes", Help: "Of kubefence_held_writes, those from clients without a certificate the proxy verified (0 without --client-ca-file: nothing is kept aside)."},
			func() float64 { return float64(q.stats().unverified) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kubefence_held_unverified_bytes", Help: "Of kubefence_held_bytes, those of writes from clients without a certificate the proxy verified (0 without --client-ca-file)."},
			func() float64 { return float64(q.stats().unverifiedBytes) }),
		count("kubefence_hold_released_total", "Held writes forwarded after the fence lifted.", &q.released),
		count("kubefence_hold_timed_out_total", "Held writes refused with 429 at --hold-timeout (never forwarded).", &q.timedOut),
		count("kubefence_hold_abandoned_total", "Held writes whose client went away (never forwarded).", &q.abandoned),
		count("kubefence_hold_full_total", "Writes refused at once because the waiting room (or the connection's share, or unverified clients' share) was full.", &q.full),
	}
}

// backendInfo exports kubefence_backend_info{url} = 1 for the active backend.
type backendInfo struct{ s *Server }

var backendInfoDesc = prometheus.NewDesc("kubefence_backend_info", "The active backend apiserver (value 1).", []string{"url"}, nil)

func (b backendInfo) Describe(ch chan<- *prometheus.Desc) { ch <- backendInfoDesc }
func (b backendInfo) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(backendInfoDesc, prometheus.GaugeValue, 1, b.s.active.Load().url.String())
}
