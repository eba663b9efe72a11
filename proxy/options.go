package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/pflag"

	"github.com/kubefence/kubefence/policy"
	"github.com/kubefence/kubefence/proxy/admin"
)

// Options are the proxy's flags.
type Options struct {
	Listen         string
	InsecureListen bool
	TLSCertFile    string
	TLSKeyFile     string

	Upstream       string
	UpstreamCAFile string

	AdminSocket   string
	StateFile     string
	PolicyFile    string
	MetricsListen string

	Profiling       bool
	RetryAfter      int
	DrainTimeout    time.Duration
	ShutdownTimeout time.Duration
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Listen:          ":6443",
		AdminSocket:     admin.DefaultSocket,
		MetricsListen:   "127.0.0.1:9445",
		RetryAfter:      5,
		DrainTimeout:    10 * time.Second,
		ShutdownTimeout: 10 * time.Second,
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
	fs.StringVar(&o.AdminSocket, "admin-socket", o.AdminSocket, "unix socket for the admin API (mode 0600)")
	fs.StringVar(&o.StateFile, "state-file", o.StateFile, "file that keeps the fence state and backend across restarts (recommended; without it a restart forgets the fence)")
	fs.StringVar(&o.PolicyFile, "policy-file", o.PolicyFile, "fence policy rules (YAML, see docs/policy.md); without it the defaults apply")
	fs.StringVar(&o.MetricsListen, "metrics-listen", o.MetricsListen, "address for /metrics, /healthz and /readyz of the proxy itself; empty disables")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "serve Go pprof profiles under /debug/pprof/ on --metrics-listen")
	fs.IntVar(&o.RetryAfter, "retry-after", o.RetryAfter, "seconds refused clients are told to wait (Retry-After)")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "how long a backend switch waits for watches on the old backend to end cleanly before cutting them")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long SIGTERM waits for requests to finish")
}

// Validate reports every problem with the options at once.
func (o *Options) Validate() []error {
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
		if _, err := parseBackendURL(o.Upstream); err != nil {
			errs = append(errs, fmt.Errorf("--upstream: %v", err))
		}
	}
	if o.AdminSocket == "" {
		errs = append(errs, errors.New("--admin-socket must not be empty: the fence is driven through it"))
	}
	if o.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(o.MetricsListen); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-listen %q: %v", o.MetricsListen, err))
		}
	}
	if o.RetryAfter < 1 || o.RetryAfter > 3600 {
		errs = append(errs, fmt.Errorf("--retry-after %d: must be 1..3600 seconds (client-go retries only on a whole number of seconds)", o.RetryAfter))
	}
	if o.DrainTimeout <= 0 {
		errs = append(errs, errors.New("--drain-timeout must be positive"))
	}
	return errs
}

// Config is the proxy's completed configuration; only Complete builds one.
type Config struct {
	opts      Options
	cert      *tls.Certificate
	policy    *policy.Policy
	backend   TransportOptions
	identHdrs []string
}

// Complete loads the files the options name. Call Validate first.
func (o *Options) Complete() (*Config, error) {
	c := &Config{opts: *o, policy: &policy.Policy{}, identHdrs: defaultIdentityHeaders}
	var errs []error
	if !o.InsecureListen {
		cert, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("load serving certificate: %w", err))
		} else {
			c.cert = &cert
		}
	}
	if o.PolicyFile != "" {
		p, err := policy.LoadFile(o.PolicyFile)
		if err != nil {
			errs = append(errs, err)
		} else {
			c.policy = p
		}
	}
	if o.UpstreamCAFile != "" {
		if _, err := newBackend("https://check.invalid", o.UpstreamCAFile, c.backend); err != nil {
			errs = append(errs, fmt.Errorf("--upstream-ca-file: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}
