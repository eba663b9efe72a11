// Package proxy is kubefence's fencing reverse proxy: it stands where the API load balancer
// stood, forwards to one backend kube-apiserver, and on command refuses writes (429 +
// Retry-After + a Status body) while reads and watches keep flowing. While fenced it can be
// switched to another backend. Its admin API listens on a 0600 unix socket.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"golang.org/x/net/http2"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/kubefence/kubefence/internal/pathguard"
	"github.com/kubefence/kubefence/internal/version"
	"github.com/kubefence/kubefence/policy"
	"github.com/kubefence/kubefence/proxy/admin"
	"github.com/kubefence/kubefence/proxy/backendurl"
)

// Server is a running proxy. Build it with New, then Start (or Run).
type Server struct {
	cfg        *Config
	log        *slog.Logger
	instance   string // a random name of this process, in its status
	classifier *policy.Classifier
	policy     *policy.Policy

	gate        gate
	active      atomic.Pointer[backend]
	switchMu    sync.Mutex // serialises backend changes
	prepared    preparedSlot
	prepares    atomic.Uint64 // numbers each prepare (readWatchesAhead)
	refusals    *refusals
	holder      *holder
	bodyBudget  *bodyBudget // --max-buffered-write-bytes
	headerNames RequestHeaderNames
	authn       authenticator.Request
	clientCA    x509request.VerifyOptionFunc // the current client CA bundle; set with authn

	// unconfirmed mirrors State.Unconfirmed for the request path: the backend is not known (the
	// state file was unreadable at a start-up and no 'backend set' has named one since). Every
	// API request then gets 503.
	unconfirmed atomic.Bool

	openWatches atomic.Int64
	writes      *writeLog
	metrics     *metrics
	handler     http.Handler

	apiServer, metricsServer, adminServer, adminNetServer *http.Server
	apiLn, metricsLn, adminLn, adminNetLn                 net.Listener
	serveErr                                              chan error
	stopCerts                                             context.CancelFunc // ends the certificate file watches
}

// New builds the proxy: it restores the persisted state (or starts open on --upstream) and
// assembles the handler chain. An unreadable state file starts the proxy fenced (invariant persist-then-ack).
func New(cfg *Config, log *slog.Logger) (*Server, error) {
	s := &Server{
		cfg:         cfg,
		log:         log,
		classifier:  policy.NewClassifier(),
		policy:      cfg.policy,
		headerNames: cfg.headerNames,
		authn:       cfg.authn,
		serveErr:    make(chan error, 3),
		instance:    rand.Text()[:16],
	}
	if cfg.authn != nil {
		s.clientCA = cfg.certs.clientVerifyOptions
	}
	s.holder = newHolder(&cfg.opts, cfg.authn != nil, log)
	warnings := cfg.opts.Warnings()
	if cfg.policy != nil {
		warnings = append(warnings, cfg.policy.Warnings(cfg.authn != nil)...)
	}
	for _, w := range warnings {
		log.Warn(w)
	}
	s.bodyBudget = newBodyBudget(cfg.opts.MaxBufferedWriteBytes, cfg.opts.MaxWriteBodyBytes, cfg.authn != nil)
	s.writes = newWriteLog(writeLogSize)
	s.metrics = newMetrics(s)
	s.refusals = newRefusals(cfg.opts.RetryAfter, cfg.opts.WriteBodyTimeout, s.metrics.refusedWrites, log)
	s.gate.now = time.Now
	if cfg.opts.StateFile != "" {
		s.gate.store = &stateStore{path: cfg.opts.StateFile}
	}
	st, b, err := s.initialState()
	if err != nil {
		return nil, err
	}
	st.Backend = b.url.String() // as every switch saves it: Status reports the state's
	s.active.Store(b)
	s.unconfirmed.Store(st.Unconfirmed)
	s.gate.publish(st)
	s.refusals.setReason(st.Reason)
	s.handler = s.buildHandler()
	return s, nil
}

// initialState is the state the proxy starts in: the state file's, else open on --upstream (or
// fenced with --start-fenced). A state file that cannot be read starts the proxy fenced and
// unconfirmed (invariant persist-then-ack): it serves nothing, reads included, until the operator names the
// backend with 'kubefence backend set', because the backend it was on cannot be known.
func (s *Server) initialState() (State, *backend, error) {
	cfg, log := s.cfg, s.log
	if err := s.gate.store.checkWritable(); err != nil {
		return State{}, nil, err
	}
	st, err := s.gate.store.load()
	switch {
	case err == nil:
		b, berr := newBackend(st.Backend, st.BackendCAFile, cfg.backend)
		if berr == nil {
			// The proxy forwards clients' bearer tokens: only to a backend the flags allow now
			// (narrowed since, or a file someone else wrote, it is not resumed).
			if berr = s.checkAllowed(b.url); berr == nil {
				s.logResumed(st)
				return st, b, nil
			}
		} else if cfg.opts.Upstream == "" {
			b = unusedBackend(st, cfg.backend) // its CA file is gone
		}
		if cfg.opts.Upstream == "" && b != nil {
			// Nothing to fall back to: on it, unconfirmed, it is never used.
			return unconfirmedState(st, fmt.Errorf("its backend %s cannot be used: %w", st.Backend, berr), log), b, nil
		}
		// Readable, but its backend cannot be used (a CA file removed since, not allowed): as
		// unreadable.
		err = fmt.Errorf("its backend %s cannot be used: %w", st.Backend, berr)
	case errors.Is(err, errNoState) && cfg.opts.Upstream == "":
		return State{}, nil, fmt.Errorf("there is no state file %s, and no --upstream to start on: give the path of the state file this proxy saved (a copy of it, to start it elsewhere), or --upstream with the apiserver writes must go to now", cfg.opts.StateFile)
	case errors.Is(err, errNoState):
		st = State{Version: stateVersion, Backend: cfg.opts.Upstream, BackendCAFile: cfg.opts.UpstreamCAFile, ChangedAt: time.Now().UTC()}
		if cfg.opts.StartFenced {
			st.Fenced, st.Reason, st.Unchecked = true, "started with --start-fenced", true
			log.Warn("no state file: starting FENCED on --upstream (--start-fenced), reads flow; if this proxy served a cutover, its state is lost and --upstream may be the old side: check which side writes must go to ('kubefence cutover status'), then 'kubefence fence off --expect-backend URL' (or 'kubefence backend set URL' first)",
				"stateFile", cfg.opts.StateFile, "upstream", st.Backend)
		} else if cfg.opts.StateFile != "" {
			log.Warn("no state file: starting OPEN on --upstream; if this proxy served a cutover, its state is lost and --upstream may be the old side (--start-fenced would start it fenced until an operator names the backend)",
				"stateFile", cfg.opts.StateFile, "upstream", st.Backend)
		}
		b, err := newBackend(st.Backend, st.BackendCAFile, cfg.backend)
		return st, b, err
	}
	if cfg.opts.Upstream == "" {
		return State{}, nil, fmt.Errorf("%w; and there is no --upstream to fall back to", err)
	}
	st = unconfirmedState(State{Backend: cfg.opts.Upstream, BackendCAFile: cfg.opts.UpstreamCAFile, Generation: st.Generation}, err, log)
	b, err := newBackend(st.Backend, st.BackendCAFile, cfg.backend)
	return st, b, err
}

// unusedBackend is the backend an unconfirmed proxy sits on when its state file's backend
// cannot be built with its CA file (gone, unreadable): never used (every request gets 503 until
// 'backend set' names one), it keeps the state's URL and CA file path, so that a 'backend set'
// naming no CA file reads that file again rather than trusting the system's roots. Nil when
// even the URL does not parse.
func unusedBackend(st State, topts TransportOptions) *backend {
	b, err := newBackend(st.Backend, "", topts)
	if err != nil {
		return nil
	}
	b.caFile = st.BackendCAFile
	return b
}

// logResumed says what the proxy resumes from its state file.
func (s *Server) logResumed(st State) {
	o, log := s.cfg.opts, s.log
	log.Info("resuming persisted state", "stateFile", o.StateFile, "fenced", st.Fenced, "backend", st.Backend, "generation", st.Generation, "unconfirmed", st.Unconfirmed)
	if st.Unconfirmed {
		log.Error("the state file says the backend is still unconfirmed (it was unusable at an earlier start-up): serving nothing (503) until 'kubefence backend set URL' names the backend to use")
	}
	if o.Upstream != "" && !backendurl.Same(st.Backend, o.Upstream) {
		log.Warn("state file names a different backend than --upstream; using the state file's (it was switched while running)", "stateBackend", st.Backend, "upstream", o.Upstream)
	}
}

// unconfirmedState is the state a proxy whose state file it cannot use (why) starts in, on
// st's backend and generation: fenced, serving nothing, until 'backend set' names the backend.
func unconfirmedState(st State, why error, log *slog.Logger) State {
	log.Error("cannot use the state file: starting FENCED and serving nothing (503) until 'kubefence backend set URL' names the backend to use; then 'kubefence fence off' when it is safe",
		"err", why)
	return State{Version: stateVersion, Fenced: true, Unconfirmed: true, Reason: "state file unusable at start-up: " + why.Error(),
		Backend: st.Backend, BackendCAFile: st.BackendCAFile, Generation: st.Generation, ChangedAt: time.Now().UTC()}
}

// Handler is the proxy's request path (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.handler }

// Status returns the acknowledged state, all of it from one published state (fence, backend,
// generation), and live counters.
func (s *Server) Status() admin.Status {
	st := s.gate.current()
	b := s.active.Load() // its counters only: a switch stores it before it publishes the state
	listen := ""
	if s.apiLn != nil {
		listen = s.apiLn.Addr().String()
	}
	return admin.Status{
		APILevel: admin.APILevel, Version: version.Version, Instance: s.instance,
		Listen: listen, Fenced: st.Fenced, Reason: st.Reason, Unconfirmed: st.Unconfirmed, Unchecked: st.Unchecked, Backend: st.Backend,
		Switchable: &admin.Switchable{Upstream: s.cfg.opts.Upstream, AllowedBackends: s.cfg.opts.AllowedBackends}, DrainTimeout: admin.Duration(s.cfg.opts.DrainTimeout),
		Generation: st.Generation, ChangedAt: st.ChangedAt,
		InflightWrites: s.gate.inflight.len(), OpenWatches: s.openWatches.Load(), OpenStreams: b.openStreams(), ResumedThenEnded: b.resumedThenEnded.Load(), ResumedPastExpiry: b.resumedPastExpiry.Load(), ResumesPending: b.resumesPending.Load(),
		RefusedWrites: s.refusals.total.Load(), RetryAfterSeconds: s.cfg.opts.RetryAfter,
		Mode: st.Mode, Hold: s.holder.status(), Now: time.Now().UTC(),
	}
}

// FenceOn refuses writes from now on, then waits up to waitTimeout for the writes admitted
// before to finish (invariant barrier). The fence stays on whatever the barrier's outcome.
func (s *Server) FenceOn(ctx context.Context, reason, mode string, waitTimeout time.Duration) (admin.FenceResponse, error) {
	switch mode {
	case "":
		mode = admin.ModeRefuse
	case admin.ModeRefuse, admin.ModeHold:
	default:
		return admin.FenceResponse{Status: s.Status()}, fmt.Errorf("%w: fence mode %q: want %s or %s", ErrBadRequest, mode, admin.ModeRefuse, admin.ModeHold)
	}
	start := time.Now()
	mine, err := s.gate.updateThen(func(st *State) error {
		st.Fenced = true
		st.Reason = reason
		st.Mode = mode
		return nil
	}, func() { s.refusals.setReason(reason) }) // once saved: a failed save changes nothing
	if err != nil {
		return admin.FenceResponse{Status: s.Status()}, err
	}
	flip := time.Since(start)
	s.metrics.fenceChanges.Inc()
	if mode == admin.ModeHold && !s.unconfirmed.Load() { // an unconfirmed backend is never used: not even warmed
		go s.active.Load().warm(context.WithoutCancel(ctx), s.cfg.opts.HoldReleaseConcurrency, false, s.log)
	}
	barrier := s.gate.waitWrites(ctx, waitTimeout)
	s.log.Info("fence on", "reason", reason, "mode", mode, "flip", flip, "barrierComplete", barrier.Complete, "waited", time.Duration(barrier.Waited), "stillRunning", len(barrier.Remaining))
	resp := admin.FenceResponse{Status: s.Status(), Flip: admin.Duration(flip), Barrier: &barrier}
	if now := resp.Status.Generation; now != mine.Generation {
		// Someone changed the fence while this barrier waited: what it waited for is not the
		// fence now on (writes may have been admitted in between).
		return resp, fmt.Errorf("%w: the fence changed while its barrier waited (generation %d, now %d, reason %q): check 'kubefence fence status' and fence again", ErrConcurrentChange, mine.Generation, now, resp.Status.Reason)
	}
	return resp, nil
}

// FenceOff reopens writes; with expect (a backend URL), only if the proxy is on that backend,
// checked under the gate's lock, so that no switch slips in between.
func (s *Server) FenceOff(expect string) (admin.FenceResponse, error) {
	start := time.Now()
	_, err := s.gate.update(func(st *State) error {
		if s.unconfirmed.Load() {
			return ErrUnconfirmed
		}
		if expect != "" && !backendurl.Same(expect, st.Backend) {
			return fmt.Errorf("%w: it is on %s, not %s; writes stay fenced", ErrWrongBackend, st.Backend, expect)
		}
		if st.Unchecked && expect == "" {
			return fmt.Errorf("%w: the proxy started fenced with no state file, so its backend %s is --upstream, which after a cutover may be the old side; writes stay fenced. Check which side writes must go to ('kubefence cutover status'), then run 'kubefence fence off --expect-backend %s', or 'kubefence backend set URL' first",
				ErrUnchecked, st.Backend, st.Backend)
		}
		st.Fenced = false
		st.Unchecked = false
		st.Reason = ""
		st.Mode = ""
		return nil
	})
	if err != nil {
		return admin.FenceResponse{Status: s.Status()}, err
	}
	flip := time.Since(start)
	s.metrics.fenceChanges.Inc()
	s.log.Info("fence off: writes reopened", "flip", flip)
	return admin.FenceResponse{Status: s.Status(), Flip: admin.Duration(flip)}, nil
}

// SetBackend switches to another apiserver; only while fenced (invariant switch-only-fenced, docs/invariants.md). New requests go
// to it at once; upgraded streams on the old one are ended, and watches too unless
// req.ResumeWatches moves them to the new one (see backend.drain).
func (s *Server) SetBackend(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
	s.switchMu.Lock()
	defer s.switchMu.Unlock()
	if !s.gate.fenced() { // checked again, under the gate's lock, when the switch is made
		return admin.BackendResponse{Status: s.Status()}, ErrNotFenced
	}
	old := s.active.Load()
	nb, prepared, err := s.backendFor(ctx, req.URL, req.CAFile)
	if err != nil {
		return admin.BackendResponse{Status: s.Status()}, err
	}
	_, err = s.gate.updateThen(func(st *State) error {
		if !st.Fenced {
			return ErrNotFenced
		}
		if req.ExpectGeneration != 0 && st.Generation != req.ExpectGeneration {
			return fmt.Errorf("%w: the state is at generation %d, not %d as expected (last change %s, reason %q): someone changed the fence or the backend since; check 'kubefence fence status'", ErrConcurrentChange, st.Generation, req.ExpectGeneration, st.ChangedAt.Format(time.RFC3339), st.Reason)
		}
		// Under the gate's lock no write is admitted; one admitted before the fence and still
		// running could be acknowledged by the old backend after the switch.
		if n := s.gate.inflight.len(); n > 0 {
			return fmt.Errorf("%w: %d write(s) admitted before the fence are still running on %s", ErrWritesInFlight, n, old.url)
		}
		st.Backend = nb.url.String()
		st.BackendCAFile = nb.caFile
		st.Unconfirmed, st.Unchecked = false, false
		return nil
	}, func() { // once saved, under the gate's lock: a failed save changes nothing
		s.active.Store(nb)
		s.unconfirmed.Store(false)
	})
	if err != nil {
		nb.closeIdle()
		return admin.BackendResponse{Status: s.Status()}, err
	}
	s.metrics.backendSwitches.Inc()
	if !prepared && s.gate.current().Mode == admin.ModeHold { // the held writes will go to nb
		go nb.warm(context.WithoutCancel(ctx), s.cfg.opts.HoldReleaseConcurrency, false, s.log)
	}
	var resumeOn *backend
	if req.ResumeWatches {
		resumeOn = nb
	}
	drain := old.drain(s.cfg.opts.DrainTimeout, resumeOn, s.gate.openCh())
	s.metrics.drainForced.Add(float64(drain.Forced))
	s.log.Info("backend switched", "from", old.url.String(), "to", nb.url.String(), "resumeWatches", req.ResumeWatches, "prepared", prepared,
		"streams", drain.Streams, "resumed", drain.Resumed, "ended", drain.Ended, "forced", drain.Forced,
		"writesAwaited", drain.Writes, "writesUnanswered", drain.UnansweredWrites, "drainTook", time.Duration(drain.Duration))
	return admin.BackendResponse{Status: s.Status(), Previous: old.url.String(), Drain: drain, Prepared: prepared}, nil
}

// Start binds every listener, then serves on each in the background. A start that fails closes
// the listeners it had bound (the admin socket file goes with its listener) and serves nothing,
// as etcd's embed.StartEtcd cleans up a partial start: the addresses can be bound again.
func (s *Server) Start() (err error) {
	o := s.cfg.opts
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()
	if s.apiLn, err = net.Listen("tcp", o.Listen); err != nil {
		return fmt.Errorf("listen on %s: %w", o.Listen, err)
	}
	if s.adminLn, err = listenAdminSocket(o.AdminSocket); err != nil {
		return err
	}
	if o.MetricsListen != "" {
		if s.metricsLn, err = net.Listen("tcp", o.MetricsListen); err != nil {
			return fmt.Errorf("listen for metrics on %s: %w", o.MetricsListen, err)
		}
	}
	if o.AdminListen != "" {
		if s.adminNetLn, err = net.Listen("tcp", o.AdminListen); err != nil {
			return fmt.Errorf("listen for the admin API on %s: %w", o.AdminListen, err)
		}
	}
	s.serveAll()
	st := s.Status()
	s.log.Info("kubefence proxy serving", "listen", s.apiLn.Addr().String(), "tls", !o.InsecureListen, "backend", st.Backend,
		"fenced", st.Fenced, "adminSocket", o.AdminSocket, "metrics", o.MetricsListen)
	return nil
}

// serveHTTP2 serves HTTP/2 on srv with golang.org/x/net/http2's server (as kube-apiserver does)
// and a write scheduler that visits only the streams with frames to send. net/http's own walks
// every open stream of the connection for each frame it writes: with 313 held writes open on a
// connection, reads on it cost the proxy a fifth more CPU and their p50 latency rose by a third
// (docs/benchmarks.md). The settings are srv.HTTP2's.
func serveHTTP2(srv *http.Server) {
	conf := &http2.Server{
		NewWriteScheduler: func() http2.WriteScheduler { return http2.NewRandomWriteScheduler() },
		// Read from srv.HTTP2 by this x/net on Go 1.26; given here too for an x/net that takes
		// it from this struct only.
		MaxConcurrentStreams: uint32(srv.HTTP2.MaxConcurrentStreams),
	}
	if err := http2.ConfigureServer(srv, conf); err != nil {
		// It fails only on a TLS config that forbids HTTP/2's ciphers, which serverTLS never builds.
		panic(fmt.Sprintf("kubefence: configuring HTTP/2: %v", err))
	}
}

// closeListeners closes the listeners a failed Start had bound.
func (s *Server) closeListeners() {
	for _, ln := range []net.Listener{s.apiLn, s.adminLn, s.metricsLn, s.adminNetLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// serveAll serves on every listener Start bound, each in its own goroutine; a listener that
// fails ends Run through serveErr.
func (s *Server) serveAll() {
	o := s.cfg.opts
	s.apiServer = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    o.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnContext:       connContext,
		// As kube-apiserver (--http2-max-streams-per-connection): room for reads beside held writes.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: int(o.MaxConcurrentStreams)},
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopCerts = cancel // the certificate files' watches
	if !o.InsecureListen {
		s.apiServer.TLSConfig = s.cfg.certs.serverTLS()
		s.cfg.certs.run(ctx)
		serveHTTP2(s.apiServer)
	}
	if fp := s.cfg.backend.FrontProxyCert; fp != nil {
		fp.run(ctx)
	}
	s.adminServer = &http.Server{Handler: s.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
	if s.metricsLn != nil {
		s.metricsServer = &http.Server{Handler: s.metricsHandler(), ReadHeaderTimeout: 10 * time.Second}
		go s.serve("metrics", func() error { return s.metricsServer.Serve(s.metricsLn) })
	}
	go s.serve("admin", func() error { return s.adminServer.Serve(s.adminLn) })
	if s.adminNetLn != nil {
		s.adminNetServer = &http.Server{
			Handler:           verifyAdminClient(s.cfg.adminCAs, s.adminServer.Handler),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       time.Minute,
			TLSConfig: &tls.Config{
				MinVersion:     tls.VersionTLS12,
				GetCertificate: s.cfg.certs.getCertificate,
				ClientAuth:     tls.RequireAndVerifyClientCert,
				ClientCAs:      s.cfg.adminCAs,
			},
		}
		go s.serve("admin-tls", func() error { return s.adminNetServer.ServeTLS(s.adminNetLn, "", "") })
	}
	go s.serve("api", func() error {
		if o.InsecureListen {
			return s.apiServer.Serve(s.apiLn)
		}
		return s.apiServer.ServeTLS(coalescingListener{s.apiLn}, "", "")
	})
}

// verifyAdminClient checks the admin client's certificate chain against cas on every request,
// with the same x509 authenticator as the API listener's clients: the handshake checked it
// once, and a keep-alive connection may outlive the certificate. Any certificate cas signs may
// use the admin API: unlike an API client's, its common name is not asked for (one with SANs
// only, as cert-manager issues without a commonName, is as good).
func verifyAdminClient(cas *x509.CertPool, next http.Handler) http.Handler {
	authn := x509request.NewDynamic(func() (x509.VerifyOptions, bool) {
		// No Intermediates: the authenticator then takes those the client sent, as the
		// handshake did (an empty pool made it refuse every chain through one).
		return x509.VerifyOptions{Roots: cas, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, true
	}, x509request.UserConversionFunc(func(chain []*x509.Certificate) (*authenticator.Response, bool, error) {
		return &authenticator.Response{User: &user.DefaultInfo{Name: chain[0].Subject.String()}}, true, nil
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok, err := authn.AuthenticateRequest(r)
		if !ok || err != nil {
			why := "no client certificate"
			if err != nil {
				why = err.Error()
			}
			writeJSON(w, http.StatusUnauthorized, admin.Error{Error: "admin client certificate: " + why})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// metricsHandler serves /metrics, the health endpoints and, with --profiling, pprof.
func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", s.readyz)
	if s.cfg.opts.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func (s *Server) serve(name string, f func() error) {
	if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.serveErr <- fmt.Errorf("%s listener: %w", name, err)
	}
}

// Addr is the address the API listener is bound to.
func (s *Server) Addr() net.Addr { return s.apiLn.Addr() }

// AdminSocket is the path of the admin unix socket.
func (s *Server) AdminSocket() string { return s.cfg.opts.AdminSocket }

// AdminAddr is the address of the mutual-TLS admin listener, or nil.
func (s *Server) AdminAddr() net.Addr {
	if s.adminNetLn == nil {
		return nil
	}
	return s.adminNetLn.Addr()
}

// MetricsAddr is the address of the metrics listener, or nil.
func (s *Server) MetricsAddr() net.Addr {
	if s.metricsLn == nil {
		return nil
	}
	return s.metricsLn.Addr()
}

// Run starts the proxy and serves until ctx ends, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		s.log.Info("shutting down")
		return s.Shutdown(s.cfg.opts.ShutdownTimeout)
	case err := <-s.serveErr:
		_ = s.Shutdown(s.cfg.opts.ShutdownTimeout)
		return err
	}
}

// Shutdown stops accepting, waits up to timeout for requests to finish, then closes the rest.
func (s *Server) Shutdown(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var errs []error
	for _, srv := range []*http.Server{s.apiServer, s.adminServer, s.adminNetServer, s.metricsServer} {
		if srv == nil {
			continue
		}
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
			if !errors.Is(err, context.DeadlineExceeded) {
				errs = append(errs, err)
			}
		}
	}
	_ = os.Remove(s.cfg.opts.AdminSocket)
	if s.stopCerts != nil {
		s.stopCerts()
	}
	return errors.Join(errs...)
}

// sharedDirs are directories other programs use: tightening one to 0700 would break them.
var sharedDirs = map[string]bool{"/": true, "/run": true, "/var/run": true, "/tmp": true, "/var/tmp": true, "/dev/shm": true, "/var/lib": true, "/etc": true}

// privateDir creates dir with mode 0700, or tightens an existing one to 0700, so that nobody but
// the proxy's user can reach the admin socket. A shared directory (sticky, like /tmp, or a
// system one like /run) is refused, not tightened, and so is a symbolic link: the proxy, often
// root, must not tighten whatever a link (a local user's /tmp/kf -> /usr) points to.
func privateDir(dir string) error { return privateDirOf(dir, os.Geteuid(), sharedDirs) }

// privateDirOf is privateDir for the user uid, shared being the directories never to tighten: a
// directory another user owns is refused, since its owner could replace the socket in it, and
// so is one below a directory another user owns or may write to (pathguard.CheckTrustedAbove).
func privateDirOf(dir string, uid int, shared map[string]bool) error {
	dir, err := filepath.Abs(dir) // a relative path is judged as the directory it names
	if err != nil {
		return err
	}
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return errLinkedDir(dir)
	}
	// Before anything is made or tightened: whoever can rename an entry above dir could put a
	// directory of theirs, holding a socket of theirs, in its place (or a link to /usr in a
	// parent's place, which the chmod below would then tighten).
	if err := pathguard.CheckTrustedAbove("--admin-socket's directory", dir, "/run/kubefence"); err != nil {
		return err
	}
	if err = os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Checked and tightened through a descriptor opened without following a link: the directory
	// cannot be swapped for a link between the check and the chmod.
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	switch {
	case errors.Is(err, syscall.ELOOP):
		return errLinkedDir(dir)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%s is not a directory: give --admin-socket a path in a directory", dir)
	case err != nil:
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
		return fmt.Errorf("%s is owned by uid %d, not by the proxy's user (uid %d): its owner could replace the admin socket; give --admin-socket a path in a directory the proxy's user owns", dir, st.Uid, uid)
	}
	if fi.Mode().Perm() == 0o700 {
		return nil
	}
	real, err := filepath.EvalSymlinks(dir) // the directory used, when a parent is a link
	if err != nil {
		return err
	}
	if shared[dir] || shared[real] || fi.Mode()&os.ModeSticky != 0 {
		if real != dir {
			dir += " (really " + real + ")"
		}
		return fmt.Errorf("%s is shared with other programs (mode %v): give --admin-socket a path in a directory of its own, e.g. /run/kubefence/admin.sock", dir, fi.Mode())
	}
	if err := f.Chmod(0o700); err != nil {
		return fmt.Errorf("tighten %s to 0700: %w", dir, err)
	}
	return nil
}

func errLinkedDir(dir string) error {
	return fmt.Errorf("%s is a symbolic link: give --admin-socket a path in a real directory (the proxy tightens it to 0700 and does not follow links)", dir)
}

// readyz is ready while the active backend answers its own /readyz, and never while the proxy
// serves nothing because its backend is unconfirmed.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	b := s.active.Load()
	if s.unconfirmed.Load() {
		http.Error(w, "not ready: the backend is unconfirmed (the state file was unusable at start-up) and every request gets 503 until 'kubefence backend set URL' names it", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.url.String()+"/readyz", nil)
	resp, err := b.plain.h1.RoundTrip(req)
	if err != nil {
		http.Error(w, "backend "+b.url.String()+" does not answer: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		_, _ = fmt.Fprintf(w, "ok: backend %s ready\n", b.url)
	case http.StatusUnauthorized, http.StatusForbidden:
		// Reachable, but anonymous /readyz is not allowed there: it answers, which is what we can know.
		_, _ = fmt.Fprintf(w, "ok: backend %s answers (readyz needs credentials: %s)\n", b.url, resp.Status)
	default:
		http.Error(w, "backend "+b.url.String()+" /readyz: "+resp.Status, http.StatusServiceUnavailable)
	}
}

// listenAdminSocket listens on the admin unix socket with mode 0600 from its creation, in a
// directory of mode 0700 (created or tightened before the socket exists), replacing a stale
// socket file.
func listenAdminSocket(path string) (net.Listener, error) {
	if err := privateDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("admin socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--admin-socket %s exists and is not a socket: refusing to replace it", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--admin-socket %s is in use by another running proxy", path)
		}
		_ = os.Remove(path)
	}
	ln, err := bindUnixSocket(path)
	if err != nil {
		return nil, fmt.Errorf("listen on admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod admin socket: %w", err)
	}
	return ln, nil
}

// umaskMu serialises the umask changes of bindUnixSocket.
var umaskMu sync.Mutex

// bindUnixSocket listens on a new unix socket at path, created with mode 0600 (under umask 0177),
// so that it is never wider, not even before a chmod. The umask is the process's: what other
// goroutines create meanwhile is at most 0600 too (narrower, never wider).
func bindUnixSocket(path string) (net.Listener, error) {
	umaskMu.Lock()
	defer umaskMu.Unlock()
	old := syscall.Umask(0o177)
	defer syscall.Umask(old)
	return net.Listen("unix", path)
}
