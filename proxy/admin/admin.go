// Package admin is the kubefence proxy's admin API: the JSON types on the wire and a client for
// the unix socket. The CLI (fence, backend) and the cutover use the client; the proxy serves it.
//
// The API (all JSON; errors are {"error": "..."} with a 4xx/5xx status):
//
//	GET  /v1/status                         → Status
//	POST /v1/fence    FenceRequest          → FenceResponse
//	POST /v1/backend  BackendRequest        → BackendResponse   (409 unless fenced)
//	POST /v1/backend/prepare PrepareRequest → PrepareResponse   (fenced or not)
package admin

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

// DefaultSocket is where the proxy listens for admin requests unless --admin-socket says otherwise.
const DefaultSocket = "/run/kubefence/admin.sock"

// APILevel is the admin API this build speaks. It grows whenever a request gains a field an
// older proxy would refuse (the proxy refuses unknown fields): 1 added fence off's
// expectBackend, 2 backend set's expectGeneration. A cutover refuses proxies below its own level before it fences anything, so a
// newer kubefence never finds out at the unfence that a proxy cannot understand it.
const APILevel = 2

// Status is the proxy's acknowledged state and live counters.
type Status struct {
	// APILevel is the admin API the proxy speaks (0: a proxy from before levels existed);
	// Version is its kubefence build.
	APILevel int    `json:"apiLevel"`
	Version  string `json:"version,omitempty"`
	// Instance is a random name the proxy process took when it started: two admin addresses
	// answering with one instance are one proxy (a cutover refuses a plan naming it twice).
	Instance string `json:"instance,omitempty"`
	Fenced   bool   `json:"fenced"`
	Reason   string `json:"reason,omitempty"`
	// Unconfirmed is set while the proxy serves nothing (503) because its state file was
	// unusable at start-up; 'backend set' confirms a backend.
	Unconfirmed bool `json:"unconfirmed,omitempty"`
	// Unchecked is set while the backend is --upstream only because the proxy started fenced
	// with no state file (--start-fenced): nothing says it is still the side writes must go to.
	// A fence off must name it (expectBackend) or a 'backend set' confirm one.
	Unchecked bool   `json:"unchecked,omitempty"`
	Backend   string `json:"backend"`
	// Switchable is what 'backend set' may switch to (nil from a proxy too old to say).
	Switchable *Switchable `json:"switchable,omitempty"`
	// DrainTimeout is the longest a switch on this proxy waits for its watches to leave the old
	// backend (--drain-timeout); 0 from a proxy too old to say.
	DrainTimeout Duration  `json:"drainTimeout,omitempty"`
	Generation   uint64    `json:"generation"`
	ChangedAt    time.Time `json:"changedAt"`
	// InflightWrites are writes forwarded and not yet answered.
	InflightWrites int `json:"inflightWrites"`
	// OpenWatches are watches open through the proxy; OpenStreams counts watches and upgraded
	// connections open on the active backend.
	OpenWatches int64 `json:"openWatches"`
	OpenStreams int   `json:"openStreams"`
	// ResumesPending are watches a switch moved to the active backend that wait for its answer
	// (the switch returns once they left the old backend, before that), or, answered 410, for
	// the lists that tell whether they can go on from where its watch cache begins.
	ResumesPending int64 `json:"resumesPending,omitempty"`
	// ResumedThenEnded counts the watches a switch moved to the active backend that it then
	// ended at once: it refused the re-issued watch, or answered with an ERROR event (their
	// resourceVersion older than its watch cache, 410 Expired). Their clients relist, as after a
	// switch without resumption.
	ResumedThenEnded int64 `json:"resumedThenEnded,omitempty"`
	// ResumedPastExpiry counts the watches it answered 410 Expired that the proxy resumed from
	// the revision its watch cache begins at, after listing their collection there and at their
	// resourceVersion and finding it the same: those clients did not relist.
	ResumedPastExpiry int64 `json:"resumedPastExpiry,omitempty"`
	// RefusedWrites counts 429s since the proxy started.
	RefusedWrites uint64 `json:"refusedWrites"`
	// RetryAfterSeconds is what refused clients are told.
	RetryAfterSeconds int `json:"retryAfterSeconds"`
	// Mode is what the fence does with a write: "refuse" (429) or "hold" (keep it until the fence
	// lifts, then forward it). Empty means refuse.
	Mode string `json:"mode,omitempty"`
	// Hold is hold mode's waiting room.
	Hold HoldStatus `json:"hold"`
	// Listen is the address the proxy serves the API on (host:port).
	Listen string `json:"listen,omitempty"`
	// Now is the proxy's clock when it answered: the cutover measures a proxy's clock against
	// its own with it before comparing the proxy's forwarded writes (their times are the
	// proxy's) with what blue etcd saw.
	Now time.Time `json:"now,omitzero"`
}

// BuildVersion is the proxy's kubefence version, or what is known of it when its status has none.
func (s Status) BuildVersion() string {
	if s.Version == "" {
		return "from before admin API levels"
	}
	return s.Version
}

// ForwardedWrite is a write the proxy forwarded to its backend (GET /v1/writes).
type ForwardedWrite struct {
	At          time.Time `json:"at"`
	Verb        string    `json:"verb"`
	Group       string    `json:"group,omitempty"`
	Resource    string    `json:"resource"`
	Subresource string    `json:"subresource,omitempty"`
	Namespace   string    `json:"namespace,omitempty"`
	Name        string    `json:"name,omitempty"`
	// Took is how long the backend took to answer it (the hold before excluded).
	Took Duration `json:"took,omitempty"`
}

// WritesResponse is the writes forwarded since a time, oldest first. Complete is false when the
// proxy's log (the last 65,536 writes) no longer reaches back that far.
type WritesResponse struct {
	Writes   []ForwardedWrite `json:"writes"`
	Complete bool             `json:"complete"`
}

// Fence modes.
const (
	ModeRefuse = "refuse"
	ModeHold   = "hold"
)

// HoldStatus counts held writes since the proxy started.
type HoldStatus struct {
	// Held and HeldBytes are the writes (and their body bytes) waiting now.
	Held      int   `json:"held"`
	HeldBytes int64 `json:"heldBytes"`
	// HeldUnverified and HeldUnverifiedBytes are those of them from clients without a
	// certificate the proxy verified (always 0 without --client-ca-file): they may fill only
	// their share of the waiting room.
	HeldUnverified      int   `json:"heldUnverified,omitempty"`
	HeldUnverifiedBytes int64 `json:"heldUnverifiedBytes,omitempty"`
	// Released were forwarded after the fence lifted; TimedOut were refused at --hold-timeout;
	// Abandoned left (their client went away) while held; Full were refused at once because the
	// waiting room was full.
	Released  uint64 `json:"released"`
	TimedOut  uint64 `json:"timedOut"`
	Abandoned uint64 `json:"abandoned"`
	Full      uint64 `json:"full"`
}

// FenceRequest turns the fence on or off.
type FenceRequest struct {
	Fenced bool   `json:"fenced"`
	Reason string `json:"reason,omitempty"`
	// WaitTimeout bounds the barrier: how long fence on waits for writes admitted before it
	// (DefaultWaitTimeout if 0).
	WaitTimeout Duration `json:"waitTimeout,omitempty"`
	// Mode is ModeRefuse (the default) or ModeHold; only for fence on.
	Mode string `json:"mode,omitempty"`
	// ExpectBackend, only for fence off: writes open only if the proxy's backend is this URL (a
	// trailing slash aside); on another the request is refused (409) and the fence stays on.
	ExpectBackend string `json:"expectBackend,omitempty"`
}

// InflightWrite describes a write still running when the barrier timed out.
type InflightWrite struct {
	Verb      string   `json:"verb"`
	Resource  string   `json:"resource,omitempty"`
	Namespace string   `json:"namespace,omitempty"`
	Name      string   `json:"name,omitempty"`
	User      string   `json:"user,omitempty"`
	UserAgent string   `json:"userAgent,omitempty"`
	Running   Duration `json:"running"`
	// Proxy is the proxy it runs through, where several proxies' barriers are merged (the
	// cutover's); a proxy leaves it empty.
	Proxy string `json:"proxy,omitempty"`
}

// Describe is the write for a message: "[proxy P: ]VERB RESOURCE[ -n NS][ NAME][ by USER][ (AGENT)], running D".
func (r InflightWrite) Describe() string {
	s := r.Verb + " " + r.Resource
	if r.Proxy != "" {
		s = "proxy " + r.Proxy + ": " + s
	}
	if r.Namespace != "" {
		s += " -n " + r.Namespace
	}
	if r.Name != "" {
		s += " " + r.Name
	}
	if r.User != "" {
		s += " by " + r.User
	}
	if r.UserAgent != "" {
		s += " (" + r.UserAgent + ")"
	}
	return fmt.Sprintf("%s, running %s", s, time.Duration(r.Running).Round(time.Millisecond))
}

// Barrier says how fence on's wait for in-flight writes ended.
type Barrier struct {
	// Complete is true when every write admitted before the fence had finished.
	Complete  bool            `json:"complete"`
	Waited    Duration        `json:"waited"`
	Remaining []InflightWrite `json:"remaining,omitempty"`
}

// FenceResponse is the state after the change, and for fence on the barrier's outcome.
type FenceResponse struct {
	Status Status `json:"status"`
	// Flip is how long the change took inside the proxy: state persisted (fsync) and published.
	Flip    Duration `json:"flip"`
	Barrier *Barrier `json:"barrier,omitempty"`
}

// DefaultWaitTimeout bounds the barrier when a fence request gives no WaitTimeout.
const DefaultWaitTimeout = 30 * time.Second

// BackendRequest switches the proxy to another apiserver.
type BackendRequest struct {
	URL string `json:"url"`
	// CAFile verifies the new backend's serving certificate; empty keeps the current one.
	CAFile string `json:"caFile,omitempty"`
	// ResumeWatches moves each open watch to the new backend, from the last resourceVersion it
	// delivered, on the same client response, instead of ending it. Only when the new backend
	// serves the same etcd revisions as the old (a replication cutover, or another apiserver on
	// the same etcd): otherwise resourceVersions mean different things there.
	ResumeWatches bool `json:"resumeWatches,omitempty"`
	// ExpectGeneration, when not 0, switches only if the proxy's state is still at this
	// generation (409 otherwise): a caller that checked the fence first learns that someone
	// turned it off and on again since, and writes may have reached the old backend.
	ExpectGeneration uint64 `json:"expectGeneration,omitempty"`
}

// PrepareRequest makes a backend ready for a switch to come: the proxy checks it as 'backend
// set' would (allowed, its TLS verified), opens the connections watches and writes will use
// there, and keeps them. A switch to the same URL and CA file within PreparedFor uses them, so
// the watches it moves and the writes it releases find connections open instead of each paying
// a dial and a TLS handshake inside the write window. Nothing is switched; a newer prepare
// replaces an older one. A proxy from before this request answers 404: it switches as before.
type PrepareRequest struct {
	URL string `json:"url"`
	// CAFile verifies the backend's serving certificate; empty means the current backend's.
	CAFile string `json:"caFile,omitempty"`
}

// PreparedFor is how long a prepared backend stays usable: well inside the 90 s after which
// idle connections close (the proxy's, and kube-apiserver's for HTTP/2).
const PreparedFor = 60 * time.Second

// PrepareResponse says what was made ready.
type PrepareResponse struct {
	Backend string `json:"backend"`
	// Connections opened to it (kept for the switch), and how long checking and opening took.
	Connections int      `json:"connections"`
	Took        Duration `json:"took"`
}

// Switchable is what a proxy allows 'backend set' to switch to: its --upstream and its
// --allowed-backends patterns (backendurl.Allowed decides).
type Switchable struct {
	Upstream        string   `json:"upstream,omitempty"`
	AllowedBackends []string `json:"allowedBackends,omitempty"`
}

// Drain says how the long-running requests on the previous backend ended.
type Drain struct {
	// Streams were open on the previous backend: Resumed of them are watches that left it for
	// the new backend (resumeWatches; they ask it once the fence lifts, and Status counts those
	// it then ends), Ended were ended, Forced of those cut at the drain timeout.
	Streams int `json:"streams"`
	Resumed int `json:"resumed"`
	Ended   int `json:"ended"`
	Forced  int `json:"forced"`
	// Writes a fence policy let through (leader election, heartbeats) were running on the
	// previous backend: the switch waited for its answers, up to the drain timeout, which
	// UnansweredWrites of them outlasted (the previous backend may still commit those).
	Writes           int      `json:"writes"`
	UnansweredWrites int      `json:"unansweredWrites"`
	Duration         Duration `json:"duration"`
}

// BackendResponse is the state after a backend change.
type BackendResponse struct {
	Status   Status `json:"status"`
	Previous string `json:"previous"`
	Drain    Drain  `json:"drain"`
	// Prepared is true when the switch used a backend made ready before (PrepareRequest).
	Prepared bool `json:"prepared,omitempty"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
}

// Duration is a time.Duration that reads and writes as a Go duration string ("1.5s").
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Client talks to a proxy's admin API.
type Client struct {
	hc   *http.Client
	base string
}

// NewClient returns a client for the admin API on a unix socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	return &Client{hc: &http.Client{Transport: tr}, base: "http://kubefence"}
}

// NewTLSClient returns a client for the admin API served with --admin-listen: address is
// https://host:port, tlsConfig carries the client certificate and the CA of the proxy's serving
// certificate.
func NewTLSClient(address string, tlsConfig *tls.Config) *Client {
	var d net.Dialer
	tr := &http.Transport{
		TLSClientConfig:   tlsConfig,
		DisableKeepAlives: true,
		// The handshake bounded, as a dial: a proxy host that takes the connection and never
		// answers is unreachable, not a request that may have been acted on.
		DialTLSContext: tlsutil.HandshakeDialer(d.DialContext, func() *tls.Config { return tlsConfig }, handshakeTimeout),
	}
	return &Client{hc: &http.Client{Transport: tr}, base: strings.TrimSuffix(address, "/")}
}

// handshakeTimeout bounds an admin client's TLS handshake. A variable for the tests.
var handshakeTimeout = 10 * time.Second

// Status returns the proxy's state.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
	return st, err
}

// Fence turns the fence on or off. For fence on the answer arrives after the barrier.
func (c *Client) Fence(ctx context.Context, req FenceRequest) (FenceResponse, error) {
	var resp FenceResponse
	err := c.do(ctx, http.MethodPost, "/v1/fence", req, &resp)
	return resp, err
}

// Writes returns the writes the proxy forwarded since since.
func (c *Client) Writes(ctx context.Context, since time.Time) (WritesResponse, error) {
	var resp WritesResponse
	err := c.do(ctx, http.MethodGet, "/v1/writes?since="+url.QueryEscape(since.UTC().Format(time.RFC3339Nano)), nil, &resp)
	return resp, err
}

// SetBackend switches the proxy to another apiserver; the proxy must be fenced.
func (c *Client) SetBackend(ctx context.Context, req BackendRequest) (BackendResponse, error) {
	var resp BackendResponse
	err := c.do(ctx, http.MethodPost, "/v1/backend", req, &resp)
	return resp, err
}

// PrepareBackend makes a backend ready for a coming switch (PrepareRequest).
func (c *Client) PrepareBackend(ctx context.Context, req PrepareRequest) (PrepareResponse, error) {
	var resp PrepareResponse
	err := c.do(ctx, http.MethodPost, "/v1/backend/prepare", req, &resp)
	return resp, err
}

// APIError is an error answered by the proxy.
type APIError struct {
	Code    int
	Message string
}

func (e *APIError) Error() string { return e.Message }

// ErrUnreachable wraps a failure to reach the admin socket at all.
var ErrUnreachable = errors.New("cannot reach the kubefence admin API")

// ErrNoAnswer wraps a failure after the connection was made: the request may have reached the
// proxy, which may have acted on it (saved a fence or a backend) before the connection closed.
var ErrNoAnswer = errors.New("the kubefence admin API gave no answer")

// maxAnswer bounds an admin answer: the largest, the writes log (65,536 entries of a few
// hundred bytes each, names up to 253 characters), stays well below it.
const maxAnswer = 256 << 20

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("%w: permission denied: the admin socket is 0600, owned by the user the proxy runs as (root with the shipped manifests): run this command as that user: %v", ErrUnreachable, err)
	}
	if err != nil && tlsutil.NotSent(err, true) {
		return fmt.Errorf("%w (is 'kubefence proxy' running, and is --admin-socket or --admin-address the same, with the certificates it trusts?): %v", ErrUnreachable, err)
	}
	if err != nil {
		return fmt.Errorf("%w (the proxy may have acted on the request): %v", ErrNoAnswer, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return fmt.Errorf("read admin answer: %w", err)
	}
	if len(data) > maxAnswer {
		return fmt.Errorf("the admin answer to %s %s is larger than %d MiB: not read", method, path, maxAnswer>>20)
	}
	if resp.StatusCode/100 != 2 {
		var e Error
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			if resp.StatusCode == http.StatusBadRequest && strings.Contains(e.Error, "unknown field") {
				e.Error += fmt.Sprintf(" (the proxy speaks an older admin API than this kubefence's level %d: 'kubefence fence status' shows its version; upgrade the proxy)", APILevel)
			}
			return &APIError{Code: resp.StatusCode, Message: e.Error}
		}
		return &APIError{Code: resp.StatusCode, Message: fmt.Sprintf("admin API answered %s", resp.Status)}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode admin answer: %w", err)
	}
	return nil
}
