package proxy

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apiserver/pkg/authentication/authenticator"

	"github.com/kubefence/kubefence/policy"
	"github.com/kubefence/kubefence/proxy/admin"

	"github.com/kubefence/kubefence/internal/tlsutil"
	"github.com/kubefence/kubefence/proxy/backendurl"
)

// Options are the proxy's flags.
type Options struct {
	Listen         string
	InsecureListen bool
	TLSCertFile    string
	TLSKeyFile     string

	Upstream       string
	UpstreamCAFile string
	// UpstreamHTTP2 sends writes and watches over HTTP/2 to backends that offer it (other reads
	// and upgrades stay on HTTP/1.1).
	UpstreamHTTP2 bool

	// ClientCAFile turns on client-certificate authentication; the identity is forwarded with
	// the front-proxy certificate UpstreamClientCertFile/KeyFile in RequestHeaders.
	ClientCAFile             string
	UpstreamClientCertFile   string
	UpstreamClientKeyFile    string
	RequestHeaderUsername    []string
	RequestHeaderGroup       []string
	RequestHeaderExtraPrefix []string
	RequestHeaderUID         []string

	MaxHeaderBytes    int
	ReadHeaderTimeout time.Duration

	AdminSocket string
	// AdminListen serves the admin API over the network too, with mutual TLS only.
	AdminListen       string
	AdminClientCAFile string
	StateFile         string
	PolicyFile        string
	MetricsListen     string

	Profiling       bool
	RetryAfter      int
	DrainTimeout    time.Duration
	ShutdownTimeout time.Duration

	// StartFenced starts the proxy fenced when there is no state file yet.
	StartFenced bool
	// AllowedBackends are the URLs 'backend set' may switch to (besides --upstream); a URL's
	// port may be "*".
	AllowedBackends []string
	// MaxWriteBodyBytes and WriteBodyTimeout bound the body of a write, which the proxy reads
	// whole before the fence admits the write.
	MaxWriteBodyBytes int64
	WriteBodyTimeout  time.Duration
	// MaxBufferedWriteBytes bounds the write bodies being read or kept at once, over all clients
	// (one connection at most a quarter of it): bodies are read before any authentication. A held
	// write's body counts against MaxHeldBytes instead.
	MaxBufferedWriteBytes int64

	// Hold mode bounds: how long a write may be held, and how many writes and body bytes may be
	// held at once (per proxy, of which clients the proxy did not verify may take three quarters
	// when it verifies client certificates, and per HTTP/2 connection as a share of its streams).
	HoldTimeout          time.Duration
	MaxHeldRequests      int
	MaxHeldBytes         int64
	MaxConcurrentStreams uint32
	// HoldReleaseConcurrency bounds the held writes forwarded at once after the fence lifts.
	HoldReleaseConcurrency int
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Listen:                   ":6443",
		AdminSocket:              admin.DefaultSocket,
		MetricsListen:            "127.0.0.1:9445",
		RetryAfter:               1,
		UpstreamHTTP2:            true,
		MaxWriteBodyBytes:        3 << 20,
		WriteBodyTimeout:         30 * time.Second,
		MaxBufferedWriteBytes:    256 << 20,
		HoldTimeout:              4 * time.Second,
		MaxHeldRequests:          20000,
		MaxHeldBytes:             256 << 20,
		MaxConcurrentStreams:     1000,
		HoldReleaseConcurrency:   128,
		MaxHeaderBytes:           256 << 10,
		ReadHeaderTimeout:        10 * time.Second,
		RequestHeaderUsername:    []string{"X-Remote-User"},
		RequestHeaderGroup:       []string{"X-Remote-Group"},
		RequestHeaderExtraPrefix: []string{"X-Remote-Extra-"},
		DrainTimeout:             10 * time.Second,
		ShutdownTimeout:          10 * time.Second,
	}
}

// AddFlags adds the options to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "address to serve the Kubernetes API on (host:port)")
	fs.BoolVar(&o.InsecureListen, "insecure-listen", o.InsecureListen, "serve plain HTTP instead of TLS (tests only: clients' credentials cross the wire in clear)")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", o.TLSCertFile, "serving certificate (PEM); its SANs must cover the name clients use")
	fs.StringVar(&o.TLSKeyFile, "tls-key-file", o.TLSKeyFile, "private key of --tls-cert-file")
	fs.StringVar(&o.Upstream, "upstream", o.Upstream, "URL of the backend kube-apiserver, e.g. https://10.0.0.10:6443 (a state file's backend takes precedence)")
	fs.StringVar(&o.UpstreamCAFile, "upstream-ca-file", o.UpstreamCAFile, "CA bundle that verifies the backend's serving certificate (default: system roots)")
	fs.BoolVar(&o.UpstreamHTTP2, "upstream-http2", o.UpstreamHTTP2, "send writes and watches to the backend over HTTP/2 when it offers it (writes share a warm connection when held writes are released at fence off; watch events cost less CPU multiplexed); other reads and upgrades always use HTTP/1.1 connections, one per concurrent request")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", o.ClientCAFile, "verify client certificates against this CA and forward their identity (CN user, O groups) to the backend with front-proxy headers")
	fs.StringVar(&o.UpstreamClientCertFile, "upstream-client-cert-file", o.UpstreamClientCertFile, "front-proxy client certificate presented to the backend when forwarding an identity (signed by its --requestheader-client-ca-file, CN in its --requestheader-allowed-names)")
	fs.StringVar(&o.UpstreamClientKeyFile, "upstream-client-key-file", o.UpstreamClientKeyFile, "private key of --upstream-client-cert-file")
	fs.StringSliceVar(&o.RequestHeaderUsername, "requestheader-username-headers", o.RequestHeaderUsername, "as the backend's flag: the first is set, all are stripped from clients")
	fs.StringSliceVar(&o.RequestHeaderGroup, "requestheader-group-headers", o.RequestHeaderGroup, "as the backend's flag: the first is set, all are stripped from clients")
	fs.StringSliceVar(&o.RequestHeaderExtraPrefix, "requestheader-extra-headers-prefix", o.RequestHeaderExtraPrefix, "as the backend's flag: the first is used, all are stripped from clients")
	fs.StringSliceVar(&o.RequestHeaderUID, "requestheader-uid-headers", o.RequestHeaderUID, "as the backend's flag (RemoteRequestHeaderUID): the first is set when the certificate carries a UID")
	fs.IntVar(&o.MaxHeaderBytes, "max-header-bytes", o.MaxHeaderBytes, "largest request line plus headers accepted (431 beyond)")
	fs.DurationVar(&o.ReadHeaderTimeout, "read-header-timeout", o.ReadHeaderTimeout, "time a client has to send its request headers (slow clients are disconnected)")
	fs.StringVar(&o.AdminSocket, "admin-socket", o.AdminSocket, "unix socket for the admin API (mode 0600)")
	fs.StringVar(&o.AdminListen, "admin-listen", o.AdminListen, "also serve the admin API on this address, mutual TLS only (needs --admin-client-ca-file; the serving certificate is --tls-cert-file)")
	fs.StringVar(&o.AdminClientCAFile, "admin-client-ca-file", o.AdminClientCAFile, "CA that signs the client certificates allowed to use --admin-listen")
	fs.StringVar(&o.StateFile, "state-file", o.StateFile, "file that keeps the fence state and backend across restarts (recommended; without it a restart forgets the fence)")
	fs.StringVar(&o.PolicyFile, "policy-file", o.PolicyFile, "fence policy rules (YAML, see docs/policy.md); without it the defaults apply")
	fs.StringVar(&o.MetricsListen, "metrics-listen", o.MetricsListen, "address for /metrics, /healthz and /readyz of the proxy itself; empty disables")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "serve Go pprof profiles under /debug/pprof/ on --metrics-listen")
	fs.IntVar(&o.RetryAfter, "retry-after", o.RetryAfter, "seconds refused clients are told to wait (Retry-After); keep it at 1: client-go's leader election gives each request 5 s, so a longer wait cannot be retried inside it")
	fs.BoolVar(&o.StartFenced, "start-fenced", o.StartFenced, "start fenced when --state-file does not exist yet (a state file, once written, says how to start)")
	fs.StringSliceVar(&o.AllowedBackends, "allowed-backends", o.AllowedBackends, "backend URLs 'kubefence backend set' may switch to, besides --upstream, e.g. https://10.0.0.20:6443 or https://127.0.0.1:* (any port); empty allows none")
	fs.Int64Var(&o.MaxWriteBodyBytes, "max-write-body-bytes", o.MaxWriteBodyBytes, "largest write body accepted (413 beyond), as kube-apiserver's own limit; the proxy reads a write's body whole before admitting it")
	fs.Int64Var(&o.MaxBufferedWriteBytes, "max-buffered-write-bytes", o.MaxBufferedWriteBytes, "write body bytes being read or kept at once, over all clients and connections (reserved as they arrive, never ahead from a Content-Length, and released when the write ends, or when hold mode holds it: held bodies count against --max-held-bytes; one client connection may hold a quarter of it, or one write of --max-write-body-bytes if more; with --client-ca-file, writes from clients without a certificate the proxy verified, bearer tokens and anonymous, may hold three quarters of it, or one write of --max-write-body-bytes if more, so that the rest is always there for certificate clients such as kubelets, kube-controller-manager and kube-scheduler); beyond, new writes get 429 + Retry-After at once, never forwarded")
	fs.DurationVar(&o.HoldTimeout, "hold-timeout", o.HoldTimeout, "in hold mode, how long a write is held before it is refused with 429 (never forwarded); keep it under 5 s, the request timeout of client-go's leader election")
	fs.IntVar(&o.MaxHeldRequests, "max-held-requests", o.MaxHeldRequests, "in hold mode, writes held at once; beyond, new writes get 429 at once (with --client-ca-file, writes from clients without a certificate the proxy verified may take three quarters of them, so that the rest is always there for certificate clients such as kubelets)")
	fs.Int64Var(&o.MaxHeldBytes, "max-held-bytes", o.MaxHeldBytes, "in hold mode, body bytes of the writes held at once, counted from the moment a write is held until the backend answers it after the release, instead of in --max-buffered-write-bytes; beyond, new writes get 429 at once (with --client-ca-file, writes from clients without a certificate the proxy verified may take three quarters of them, or one write of --max-write-body-bytes if more)")
	fs.IntVar(&o.HoldReleaseConcurrency, "hold-release-concurrency", o.HoldReleaseConcurrency, "in hold mode, held writes forwarded at once when the fence lifts (the rest wait their turn, in arrival order), so that the backend sees a pool of connections, not a storm")
	fs.Uint32Var(&o.MaxConcurrentStreams, "http2-max-streams-per-connection", o.MaxConcurrentStreams, "HTTP/2 streams a client connection may open at once (kube-apiserver allows 100 unless set); in hold mode at most half of them may be held writes, so reads on the connection go on")
	fs.DurationVar(&o.WriteBodyTimeout, "write-body-timeout", o.WriteBodyTimeout, "time a client has to send a write's body (408 beyond); a write is admitted, and counted by the fence's barrier, only once its body is in")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "how long a backend switch waits for watches on the old backend to end cleanly before cutting them")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long SIGTERM waits for requests to finish")
}

// Validate reports every problem with the options at once.
func (o *Options) Validate() []error {
	return slices.Concat(o.validateListeners(), o.validateIdentity(), o.validateLimits())
}

// Warnings are what the options allow but an operator should hear about at start: settings
// meant for tests that leave clients' credentials in clear beyond this host, and a hold
// timeout that outlasts the clients it holds for.
func (o *Options) Warnings() []string {
	var out []string
	if host, _, err := net.SplitHostPort(o.Listen); err == nil && o.InsecureListen && !loopback(host) {
		out = append(out, fmt.Sprintf("--insecure-listen on %s, not a loopback address: clients' bearer tokens cross the network in clear (meant for tests only)", o.Listen))
	}
	for _, u := range append([]string{o.Upstream}, o.AllowedBackends...) {
		if p, err := url.Parse(strings.TrimSuffix(u, ":*")); err == nil && p.Scheme == "http" && !loopback(p.Hostname()) {
			out = append(out, fmt.Sprintf("backend %s is plain http, not on this host: the clients' bearer tokens the proxy forwards cross the network in clear (meant for tests only)", backendurl.Redact(u)))
		}
	}
	if o.HoldTimeout >= leaderElectionRequestTimeout {
		out = append(out, fmt.Sprintf("--hold-timeout %s is not under 5s, the request timeout of client-go's leader election: a lease renewal held that long has failed at its client before it is answered (controllers may lose their leases)", o.HoldTimeout))
	}
	if o.AdminClientCAFile != "" && o.ClientCAFile != "" && sameContent(o.AdminClientCAFile, o.ClientCAFile) {
		out = append(out, fmt.Sprintf("--admin-client-ca-file is --client-ca-file (%s): every certificate the cluster's CA signs (each kubelet's, any the CSR API issues) may fence, unfence and switch the proxy; give the admin API a CA of its own", o.AdminClientCAFile))
	}
	return out
}

// sameContent says whether two paths name one file, or files with the same bytes.
func sameContent(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	x, errA := os.ReadFile(a)
	y, errB := os.ReadFile(b)
	return errA == nil && errB == nil && bytes.Equal(x, y)
}

// loopback says whether host (a name or an address) is this host's loopback.
func loopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// validateListeners checks where the proxy listens and what it forwards to.
func (o *Options) validateListeners() []error {
	var errs []error
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: %v", o.Listen, err))
	}
	if o.InsecureListen {
		if o.TLSCertFile != "" || o.TLSKeyFile != "" {
			errs = append(errs, errors.New("--insecure-listen and --tls-cert-file/--tls-key-file exclude each other"))
		}
	} else if o.TLSCertFile == "" || o.TLSKeyFile == "" {
		errs = append(errs, errors.New("--tls-cert-file and --tls-key-file are required (or --insecure-listen, for tests only)"))
	}
	if o.Upstream == "" && o.StateFile == "" {
		errs = append(errs, errors.New("--upstream is required (the kube-apiserver URL to proxy to)"))
	}
	if o.Upstream != "" {
		if _, err := backendurl.Parse(o.Upstream); err != nil {
			errs = append(errs, fmt.Errorf("--upstream: %v", err))
		}
	}
	if o.AdminSocket == "" {
		errs = append(errs, errors.New("--admin-socket must not be empty: the fence is driven through it"))
	}
	if o.AdminListen != "" {
		if _, _, err := net.SplitHostPort(o.AdminListen); err != nil {
			errs = append(errs, fmt.Errorf("--admin-listen %q: %v", o.AdminListen, err))
		}
		if o.AdminClientCAFile == "" {
			errs = append(errs, errAdminListenNeedsCA)
		}
		if o.InsecureListen {
			errs = append(errs, errors.New("--admin-listen needs --tls-cert-file/--tls-key-file for its serving certificate"))
		}
	}
	if o.MetricsListen != "" {
		host, _, err := net.SplitHostPort(o.MetricsListen)
		if err != nil {
			errs = append(errs, fmt.Errorf("--metrics-listen %q: %v", o.MetricsListen, err))
		} else if o.Profiling && !loopback(host) {
			errs = append(errs, fmt.Errorf("--profiling serves /debug/pprof/ on --metrics-listen %s, which is not a loopback address: profiles let whoever reaches them load the proxy; listen on 127.0.0.1 (or ::1), or leave --profiling off", o.MetricsListen))
		}
	}
	return errs
}

// validateIdentity checks client-certificate authentication and identity forwarding.
func (o *Options) validateIdentity() []error {
	var errs []error
	if o.ClientCAFile != "" {
		if o.InsecureListen {
			errs = append(errs, errors.New("--client-ca-file needs TLS: it cannot be used with --insecure-listen"))
		}
		if o.UpstreamClientCertFile == "" || o.UpstreamClientKeyFile == "" {
			errs = append(errs, errNoFrontProxyCert)
		}
		if len(o.RequestHeaderUsername) == 0 {
			errs = append(errs, errors.New("--requestheader-username-headers must name at least one header when --client-ca-file is set"))
		}
	}
	if (o.UpstreamClientCertFile == "") != (o.UpstreamClientKeyFile == "") {
		errs = append(errs, errors.New("--upstream-client-cert-file and --upstream-client-key-file go together"))
	}
	return errs
}

// validateLimits checks the bounds, timeouts and the fence's own flags.
func (o *Options) validateLimits() []error {
	var errs []error
	if o.MaxHeaderBytes < 4<<10 {
		errs = append(errs, fmt.Errorf("--max-header-bytes %d: at least 4096", o.MaxHeaderBytes))
	}
	if o.ReadHeaderTimeout <= 0 {
		errs = append(errs, errors.New("--read-header-timeout must be positive"))
	}
	if o.RetryAfter < 1 || o.RetryAfter > 3600 {
		errs = append(errs, fmt.Errorf("--retry-after %d: must be 1..3600 seconds (client-go retries only on a whole number of seconds)", o.RetryAfter))
	}
	if o.DrainTimeout <= 0 {
		errs = append(errs, errors.New("--drain-timeout must be positive"))
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("--shutdown-timeout must be positive (0 would cut every request in flight at SIGTERM)"))
	}
	if o.MaxWriteBodyBytes <= 0 {
		errs = append(errs, errors.New("--max-write-body-bytes must be positive"))
	}
	if o.MaxBufferedWriteBytes < o.MaxWriteBodyBytes {
		errs = append(errs, fmt.Errorf("--max-buffered-write-bytes %d must be at least --max-write-body-bytes %d, or no write of the largest size could ever be accepted", o.MaxBufferedWriteBytes, o.MaxWriteBodyBytes))
	}
	if o.WriteBodyTimeout <= 0 {
		errs = append(errs, errors.New("--write-body-timeout must be positive"))
	}
	if o.HoldTimeout <= 0 || o.MaxHeldRequests <= 0 || o.MaxHeldBytes <= 0 || o.HoldReleaseConcurrency <= 0 {
		errs = append(errs, errors.New("--hold-timeout, --max-held-requests, --max-held-bytes and --hold-release-concurrency must be positive"))
	}
	if o.MaxConcurrentStreams < 2 {
		errs = append(errs, errors.New("--http2-max-streams-per-connection must be at least 2"))
	}
	if o.StartFenced && o.StateFile == "" {
		errs = append(errs, errors.New("--start-fenced needs --state-file: without it a restart would forget the fence"))
	}
	for _, u := range o.AllowedBackends {
		if _, err := backendurl.ParsePattern(u); err != nil {
			errs = append(errs, fmt.Errorf("--allowed-backends: %v", err))
		}
	}
	return errs
}

// Config is the proxy's completed configuration; only Complete builds one.
type Config struct {
	opts        Options
	certs       *certFiles // nil with --insecure-listen
	policy      *policy.Policy
	backend     TransportOptions
	headerNames RequestHeaderNames
	authn       authenticator.Request
	adminCAs    *x509.CertPool
}

// errAdminListenNeedsCA: the network admin API is mutual TLS only.
var errAdminListenNeedsCA = errors.New("--admin-listen needs --admin-client-ca-file: the admin API is served over the network with mutual TLS only")

// Complete loads the files the options name. Call Validate first.
func (o *Options) Complete() (*Config, error) {
	c := &Config{opts: *o, policy: &policy.Policy{}, headerNames: RequestHeaderNames{
		Username: o.RequestHeaderUsername, Group: o.RequestHeaderGroup, ExtraPrefix: o.RequestHeaderExtraPrefix, UID: o.RequestHeaderUID,
	}}
	c.backend.HTTP1Only = !o.UpstreamHTTP2
	var errs []error
	if !o.InsecureListen {
		certs, err := loadCertFiles(o.TLSCertFile, o.TLSKeyFile, o.ClientCAFile)
		if err != nil {
			errs = append(errs, err)
		} else {
			c.certs = certs
		}
	}
	if o.PolicyFile != "" {
		p, err := loadPolicyFile(o.PolicyFile)
		if err != nil {
			errs = append(errs, err)
		} else {
			c.policy = p
		}
	}
	if o.ClientCAFile != "" && c.certs != nil {
		c.authn = newClientAuthenticator(c.certs.clientVerifyOptions)
	}
	if o.AdminClientCAFile != "" {
		var err error
		if c.adminCAs, err = tlsutil.LoadCAPool(o.AdminClientCAFile); err != nil {
			errs = append(errs, fmt.Errorf("--admin-client-ca-file: %w", err))
		}
	} else if o.AdminListen != "" {
		// Validate says so too; a program that skips it must not serve the admin API with a
		// nil pool, which crypto/tls reads as the system's roots.
		errs = append(errs, errAdminListenNeedsCA)
	}
	if o.UpstreamClientCertFile != "" {
		cert, err := loadKeyPairFile("front-proxy client certificate", o.UpstreamClientCertFile, o.UpstreamClientKeyFile)
		if err != nil {
			errs = append(errs, err)
		} else {
			c.backend.FrontProxyCert = cert
		}
	}
	if o.UpstreamCAFile != "" {
		if _, err := tlsutil.LoadCAPool(o.UpstreamCAFile); err != nil {
			errs = append(errs, fmt.Errorf("--upstream-ca-file: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// loadPolicyFile reads and parses --policy-file; policy itself does no I/O.
func loadPolicyFile(path string) (*policy.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy file: %w", err)
	}
	p, err := policy.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return p, nil
}
