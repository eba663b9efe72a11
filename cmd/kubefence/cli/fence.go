package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/proxy"
	"github.com/kubefence/kubefence/proxy/admin"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

// adminOptions are the flags every admin-API command shares; Complete makes the admin client
// and the printer they ask for.
type adminOptions struct {
	printOptions
	sockets   []string
	addresses []string
	cert      string
	key       string
	ca        string
	timeout   time.Duration

	cmd     *cobra.Command
	proxies admin.Group
}

// Environment variables that name the proxies when the flags do not (comma-separated).
const (
	envAdminSocket  = "KUBEFENCE_ADMIN_SOCKET"
	envAdminAddress = "KUBEFENCE_ADMIN_ADDRESS"
)

// defaultAdminTimeout is how long an admin command waits for a proxy's answer (fence on: on top
// of --wait-timeout; backend set: on top of the proxy's drain).
const defaultAdminTimeout = 30 * time.Second

func (o *adminOptions) addFlags(cmd *cobra.Command, timeout time.Duration, timeoutUsage string) {
	cmd.Flags().DurationVar(&o.timeout, "timeout", timeout, timeoutUsage)
	cmd.Flags().StringSliceVar(&o.sockets, "admin-socket", nil, "a proxy's admin socket; repeat (or comma-separate) for every proxy: the command acts on all of them. Default $"+envAdminSocket+", else "+admin.DefaultSocket)
	cmd.Flags().StringSliceVar(&o.addresses, "admin-address", nil, "a proxy's admin API over the network (https://HOST:PORT of its --admin-listen); repeatable like --admin-socket. Default $"+envAdminAddress)
	cmd.Flags().StringVar(&o.cert, "admin-cert-file", "", "client certificate for --admin-address")
	cmd.Flags().StringVar(&o.key, "admin-key-file", "", "private key of --admin-cert-file")
	cmd.Flags().StringVar(&o.ca, "admin-ca-file", "", "CA of the proxy's serving certificate, for --admin-address")
	o.output.addFlags(cmd)
}

// command makes cmd an admin-API command that runs run (o's command) with the shared flags,
// --timeout defaulting to timeout.
func (o *adminOptions) command(cmd *cobra.Command, run command, timeout time.Duration, timeoutUsage string) *cobra.Command {
	cmd.RunE = runE(run)
	o.addFlags(cmd, timeout, timeoutUsage)
	o.cmd = cmd
	return cmd
}

func (o *adminOptions) Complete([]string) error {
	if err := o.printOptions.Complete(nil); err != nil {
		return err
	}
	sockets, addresses, addressFlag := o.sockets, o.addresses, "--admin-address"
	if !o.changed("admin-socket") && !o.changed("admin-address") {
		sockets, addresses = envList(envAdminSocket), envList(envAdminAddress)
		addressFlag = "--admin-address (or $" + envAdminAddress + ")"
		if len(sockets) == 0 && len(addresses) == 0 {
			sockets = []string{admin.DefaultSocket}
		}
	}
	if err := checkProxyNames(sockets, addresses); err != nil {
		return err
	}
	o.proxies = nil
	for _, s := range sockets {
		o.proxies = append(o.proxies, admin.Proxy{Name: s, Client: admin.NewClient(s)})
	}
	for _, a := range addresses {
		c, err := o.newTLSClient(a, addressFlag)
		if err != nil {
			return err
		}
		o.proxies = append(o.proxies, admin.Proxy{Name: a, Client: c})
	}
	return nil
}

// checkProxyNames refuses a command line that names no proxy (--admin-socket "" would otherwise
// act on none and succeed having done nothing), an empty one among others, or one proxy twice.
func checkProxyNames(sockets, addresses []string) error {
	if len(sockets) == 0 && len(addresses) == 0 {
		return UsageErrorf("no proxy named: --admin-socket and --admin-address are empty; give a proxy's admin socket or address, or leave both out for $%s, $%s or %s", envAdminSocket, envAdminAddress, admin.DefaultSocket)
	}
	empty := func(n string) bool { return strings.TrimSpace(n) == "" }
	if slices.ContainsFunc(sockets, empty) {
		return UsageErrorf("--admin-socket has an empty entry in %q: name every proxy", strings.Join(sockets, ","))
	}
	if slices.ContainsFunc(addresses, empty) {
		return UsageErrorf("--admin-address has an empty entry in %q: name every proxy", strings.Join(addresses, ","))
	}
	seen := map[string]string{} // admin.ProxyKey -> the name first given
	check := func(name, key string) error {
		if first, ok := seen[key]; ok {
			return UsageErrorf("%s and %s are one proxy named twice: name each proxy once", first, name)
		}
		seen[key] = name
		return nil
	}
	for _, s := range sockets {
		if err := check(s, admin.ProxyKey(s, "")); err != nil {
			return err
		}
	}
	for _, a := range addresses {
		if err := check(a, admin.ProxyKey("", a)); err != nil {
			return err
		}
	}
	return nil
}

// checkNamedOnce refuses, when several proxies are named, two names of one proxy process that
// the names alone do not show (its admin socket and its --admin-listen address, an IP and a
// host name): it reads every proxy's status first and compares their instances. Acting
// through both names at once, a fence on would flip the fence twice, and the first flip's
// barrier would answer 409 every time. A proxy that does not answer is left to the command.
// Not fence off's with --expect-backend: reopening twice is reopening, and a silent proxy
// must not keep the others fenced for --timeout first.
func (o *adminOptions) checkNamedOnce(ctx context.Context) error {
	if len(o.proxies) < 2 {
		return nil
	}
	res, _ := each(ctx, o.proxies, bound{min(o.timeout, namedOnceBound), "--timeout", ""}, func(ctx context.Context, c *admin.Client) (admin.Status, error) {
		return c.Status(ctx)
	})
	return namedOnce(res)
}

// namedOnceBound bounds checkNamedOnce's status round: a live proxy answers in milliseconds,
// and one that does not answer (left to the command) must not hold the others' fence or
// switch up for --timeout first.
const namedOnceBound = 2 * time.Second

// namedOnce refuses two statuses of one proxy instance, naming both names; a proxy that did not
// answer, or too old to name its instance, is left out.
func namedOnce(res []admin.Result[admin.Status]) error {
	seen := map[string]string{} // instance -> the name first given
	var errs []error
	for _, r := range res {
		id := r.Value.Instance
		if r.Err != nil || id == "" {
			continue
		}
		if first, ok := seen[id]; ok {
			errs = append(errs, fmt.Errorf("%s and %s are one proxy (instance %s) named twice: name each proxy once", first, r.Proxy, id))
			continue
		}
		seen[id] = r.Proxy
	}
	return usage(errors.Join(errs...))
}

func (o *adminOptions) Validate() error {
	if o.timeout <= 0 {
		return UsageErrorf("--timeout must be positive")
	}
	return nil
}

func (o *adminOptions) changed(flag string) bool { return o.cmd != nil && o.cmd.Flags().Changed(flag) }

func envList(name string) []string {
	var out []string
	for v := range strings.SplitSeq(os.Getenv(name), ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// newTLSClient returns a client for one proxy's admin API over mutual TLS; flag is where the
// address came from, for the errors.
func (o *adminOptions) newTLSClient(address, flag string) (*admin.Client, error) {
	if !strings.HasPrefix(address, "https://") {
		return nil, UsageErrorf("%s %q: give https://HOST:PORT (the admin API is mutual TLS only)", flag, address)
	}
	if o.cert == "" || o.key == "" || o.ca == "" {
		return nil, UsageErrorf("%s needs --admin-cert-file, --admin-key-file and --admin-ca-file", flag)
	}
	cert, err := tls.LoadX509KeyPair(o.cert, o.key)
	if err != nil {
		return nil, UsageErrorf("load admin client certificate: %v", err)
	}
	pool, err := tlsutil.LoadCAPool(o.ca)
	if err != nil {
		return nil, UsageErrorf("--admin-ca-file: %v", err)
	}
	return admin.NewTLSClient(address, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: pool}), nil
}

func newFenceCommand(g *globals) *cobra.Command {
	return groupCommand(&cobra.Command{
		Use:   "fence",
		Short: "Turn the proxy's write fence on or off, or show it",
	}, newFenceOnCommand(g), newFenceOffCommand(g), newFenceStatusCommand(g))
}

type fenceOnOptions struct {
	adminOptions
	reason      string
	mode        string
	waitTimeout time.Duration
}

func newFenceOnCommand(g *globals) *cobra.Command {
	o := &fenceOnOptions{adminOptions: adminOptions{printOptions: printOptions{Streams: g.streams}}}
	cmd := o.command(&cobra.Command{
		Use:   "on",
		Short: "Refuse (or hold) writes and wait for in-flight writes to finish",
		Long: `Fence the API from now on: reads and watches keep flowing. With --mode refuse (the default)
writes get 429 with Retry-After and a Kubernetes Status: client-go retries them by itself (up to
10 times); a client that does not retry (the official Python client's POST and PATCH, curl, most
scripts) sees an error. With --mode hold a write is kept, unanswered, until 'fence off' and then
sent to the backend active at that moment, whose answer the client gets; a write held longer
than the proxy's --hold-timeout gets the 429 instead and is never sent. The command returns
once every write admitted before the fence has finished. If some are still running after
--wait-timeout it lists them and exits 1; the fence stays on either way.`,
		Args: args(cobra.NoArgs),
	}, o, defaultAdminTimeout, "how long to wait for each proxy's answer on top of --wait-timeout; a proxy that has not answered by then fails the command")
	cmd.Flags().StringVar(&o.reason, "reason", "", "why the API is fenced (shown to refused clients and in status)")
	cmd.Flags().StringVar(&o.mode, "mode", admin.ModeRefuse, "what the fence does with a write: refuse (429 + Retry-After) or hold (keep it until fence off, then forward it)")
	cmd.Flags().DurationVar(&o.waitTimeout, "wait-timeout", 30*time.Second, "how long to wait for writes admitted before the fence to finish")
	return cmd
}

func (o *fenceOnOptions) Validate() error {
	if err := o.adminOptions.Validate(); err != nil {
		return err
	}
	if o.waitTimeout <= 0 {
		return UsageErrorf("--wait-timeout must be positive")
	}
	if o.mode != admin.ModeRefuse && o.mode != admin.ModeHold {
		return UsageErrorf("--mode %q: want %s or %s", o.mode, admin.ModeRefuse, admin.ModeHold)
	}
	return nil
}

func (o *fenceOnOptions) Run(ctx context.Context) error {
	req := admin.FenceRequest{Fenced: true, Reason: o.reason, Mode: o.mode, WaitTimeout: admin.Duration(o.waitTimeout)}
	if err := o.checkNamedOnce(ctx); err != nil {
		return err
	}
	b := bound{o.waitTimeout + o.timeout, "--wait-timeout + --timeout", "whether it fenced writes"}
	res, err := eachProxy(ctx, &o.adminOptions, b, func(ctx context.Context, c *admin.Client) (admin.FenceResponse, error) {
		return c.Fence(ctx, req)
	}, printFenceOn)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range res {
		if b := r.Value.Barrier; b != nil && !b.Complete {
			errs = append(errs, fmt.Errorf("%s: fence is ON, but %d write(s) admitted before it were still running after %s", r.Proxy, len(b.Remaining), o.waitTimeout))
		}
	}
	return errors.Join(errs...)
}

// bound is how long each proxy may take to answer, the flags that say so, and what is left
// unknown when one does not answer in time ("" for a read).
type bound struct {
	limit   time.Duration
	flags   string
	unknown string
}

// each runs f on every proxy at once (admin.Each), each call bounded by b: a proxy that accepts
// the request and never answers fails with an error saying so instead of hanging the command.
func each[T any](ctx context.Context, proxies admin.Group, b bound, f func(context.Context, *admin.Client) (T, error)) ([]admin.Result[T], error) {
	return admin.Each(ctx, proxies, func(ctx context.Context, c *admin.Client) (T, error) {
		cctx, cancel := context.WithTimeout(ctx, b.limit)
		defer cancel()
		v, err := f(cctx, c)
		switch {
		case err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded):
			msg := fmt.Sprintf("no answer within %s (%s): the proxy may be stuck, see its log", b.limit, b.flags)
			if b.unknown != "" {
				msg += "; " + b.unknown + " is unknown: check with 'kubefence fence status'"
			}
			err = errors.New(msg)
		case err != nil && ctx.Err() != nil && b.unknown != "":
			// Not "cannot reach": the request may have arrived and the proxy acted on it.
			err = fmt.Errorf("%v before the proxy answered: %s is unknown: check with 'kubefence fence status'", context.Cause(ctx), b.unknown)
		case errors.Is(err, admin.ErrNoAnswer) && b.unknown != "":
			err = fmt.Errorf("%w; %s is unknown: check with 'kubefence fence status'", err, b.unknown)
		}
		return v, err
	})
}

// eachProxy runs f on every proxy at once, bounded by b, and prints the answers: with one proxy
// as human says, with several each under its proxy's name (-o json: a list of {proxy, result,
// error}). The error names every proxy that did not acknowledge. Commands that must not act on
// one proxy twice check first (checkNamedOnce).
func eachProxy[T any](ctx context.Context, o *adminOptions, b bound, f func(context.Context, *admin.Client) (T, error), human func(io.Writer, T)) ([]admin.Result[T], error) {
	res, err := each(ctx, o.proxies, b, f)
	if len(res) == 1 {
		if err != nil {
			return res, fmt.Errorf("proxy %s: %w", res[0].Proxy, res[0].Err)
		}
		return res, o.printer.print(o.Out, res[0].Value, func(w io.Writer) { human(w, res[0].Value) })
	}
	perr := o.printer.print(o.Out, res, func(w io.Writer) {
		for _, r := range res {
			if r.Err != nil {
				fmt.Fprintf(w, "%s: NOT ACKNOWLEDGED: %v\n", r.Proxy, r.Err)
				continue
			}
			fmt.Fprintf(w, "%s: ", r.Proxy)
			human(w, r.Value)
		}
	})
	return res, errors.Join(err, perr)
}

func printFenceOn(w io.Writer, resp admin.FenceResponse) {
	b := resp.Barrier
	if b == nil {
		fmt.Fprintln(w, "fence is ON")
		return
	}
	writes := "writes refused"
	if resp.Status.Mode == admin.ModeHold {
		writes = "writes held until fence off"
	}
	if b.Complete {
		fmt.Fprintf(w, "fence is ON (generation %d): %s; in-flight writes finished in %s\n",
			resp.Status.Generation, writes, time.Duration(b.Waited).Round(time.Microsecond))
		return
	}
	fmt.Fprintf(w, "fence is ON (generation %d): %s; %d write(s) admitted before the fence still running:\n",
		resp.Status.Generation, writes, len(b.Remaining))
	for _, r := range b.Remaining {
		fmt.Fprintf(w, "  %s\n", r.Describe())
	}
}

type fenceOffOptions struct {
	adminOptions
	expectBackend string
	eachOwn       bool
}

func newFenceOffCommand(g *globals) *cobra.Command {
	o := &fenceOffOptions{adminOptions: adminOptions{printOptions: printOptions{Streams: g.streams}}}
	cmd := o.command(&cobra.Command{
		Use:   "off",
		Short: "Reopen writes",
		Long: `Reopen writes on every proxy named. With --expect-backend only a proxy on that backend opens;
one on another stays fenced and the command fails naming it. Without it, several proxies must
be on one backend: the command reads their backends first and, if they differ (a switch that
reached only some of them), opens none and names each proxy's backend; if they agree, each
proxy opens only if it is still on that backend when the fence off reaches it. In an HA control
plane each proxy stands in front of its own node's apiserver: check each is on the side writes
must go to ('kubefence fence status'), then pass --each-own-backend, which opens each proxy only
if it is still on the backend read for it. A proxy that started fenced with no state file
(--start-fenced) is on --upstream only for want of anything else: it opens only with
--expect-backend naming its backend, or after a 'kubefence backend set'.`,
		Args: args(cobra.NoArgs),
	}, o,
		defaultAdminTimeout, "how long to wait for each proxy's answer; a proxy that has not answered by then fails the command")
	cmd.Flags().StringVar(&o.expectBackend, "expect-backend", "", "open writes only on a proxy whose backend is this URL; a proxy on another stays fenced and the command fails naming it")
	cmd.Flags().BoolVar(&o.eachOwn, "each-own-backend", false, "several proxies, each in front of its own apiserver (an HA control plane): do not require one backend; each opens only if still on the backend read for it")
	return cmd
}

func (o *fenceOffOptions) Validate() error {
	if err := o.adminOptions.Validate(); err != nil {
		return err
	}
	if o.eachOwn && o.expectBackend != "" {
		return UsageErrorf("--each-own-backend and --expect-backend do not go together: the first expects each proxy's own backend, the second one URL for all")
	}
	return nil
}

func (o *fenceOffOptions) Run(ctx context.Context) error {
	expect := func(*admin.Client) string { return o.expectBackend }
	if o.expectBackend == "" && (len(o.proxies) > 1 || o.eachOwn) {
		var err error
		if expect, err = o.agreedBackend(ctx); err != nil {
			return err
		}
	}
	b := bound{o.timeout, "--timeout", "whether it reopened writes"}
	_, err := eachProxy(ctx, &o.adminOptions, b, func(ctx context.Context, c *admin.Client) (admin.FenceResponse, error) {
		return c.Fence(ctx, admin.FenceRequest{Fenced: false, ExpectBackend: expect(c)})
	}, func(w io.Writer, resp admin.FenceResponse) {
		fmt.Fprintf(w, "fence is OFF (generation %d): writes flow to %s\n", resp.Status.Generation, resp.Status.Backend)
	})
	return err
}

// agreedBackend is fence off's check when several proxies are named and --expect-backend is
// not: after a partial switch one proxy would open writes on green and another on blue. It
// reads every proxy's status and refuses if those that answered are on different backends;
// otherwise it returns what each proxy's fence off expects: that backend (the proxy checks it
// under its fence's lock, so a switch since the read keeps that proxy fenced), or nothing for
// a proxy too old for expectBackend (admin API level 0), which would refuse the request.
func (o *fenceOffOptions) agreedBackend(ctx context.Context) (func(*admin.Client) string, error) {
	res, err := each(ctx, o.proxies, bound{o.timeout, "--timeout", ""}, func(ctx context.Context, c *admin.Client) (admin.Status, error) {
		return c.Status(ctx)
	})
	if nerr := namedOnce(res); nerr != nil { // the statuses are read anyway
		return nil, nerr
	}
	var on, unchecked []string
	var backend string
	backends, own, old := map[string]bool{}, map[*admin.Client]string{}, map[*admin.Client]bool{}
	for i, r := range res {
		if r.Err != nil {
			continue // its fence off below expects the others' backend, and most likely fails too
		}
		on = append(on, fmt.Sprintf("%s is on %s", r.Proxy, r.Value.Backend))
		if r.Value.Unchecked {
			unchecked = append(unchecked, r.Proxy)
		}
		backend = strings.TrimSuffix(r.Value.Backend, "/")
		backends[backend] = true
		own[o.proxies[i].Client] = backend
		old[o.proxies[i].Client] = r.Value.APILevel < 1 // it knows no expectBackend, and would refuse it
	}
	switch {
	case len(backends) == 0:
		return nil, fmt.Errorf("fence off: could not read any proxy's backend, so writes stay fenced: %w", err)
	case len(unchecked) > 0: // expecting what was read would take --upstream's guess for a check
		return nil, fmt.Errorf("fence off refused, writes stay fenced: %s started fenced with no state file, so its backend is --upstream, which after a cutover may be the old side (%s); check which side writes must go to ('kubefence cutover status'), then name it with --expect-backend URL (or 'kubefence backend set URL' on each first)",
			strings.Join(unchecked, ", "), strings.Join(on, ", "))
	case len(backends) > 1 && !o.eachOwn:
		return nil, fmt.Errorf("fence off refused, writes stay fenced: the proxies are on different backends (%s); switch them to one with 'kubefence backend set URL', or open only those on the backend writes must go to with --expect-backend URL. If each proxy stands in front of its own apiserver (an HA control plane) and each is on the side writes must go to, pass --each-own-backend", strings.Join(on, ", "))
	}
	return func(c *admin.Client) string {
		switch b, read := own[c]; {
		case old[c]:
			return ""
		case o.eachOwn && read:
			return b
		}
		return backend // one not read expects another's backend, and most likely fails too
	}, nil
}

type fenceStatusOptions struct{ adminOptions }

func newFenceStatusCommand(g *globals) *cobra.Command {
	o := &fenceStatusOptions{adminOptions{printOptions: printOptions{Streams: g.streams}}}
	return o.command(&cobra.Command{Use: "status", Short: "Show the fence state, backend and live counters", Args: args(cobra.NoArgs)}, o,
		defaultAdminTimeout, "how long to wait for each proxy's answer; a proxy that has not answered by then fails the command (for a change: its outcome unknown)")
}

func (o *fenceStatusOptions) Run(ctx context.Context) error {
	status := func(ctx context.Context, c *admin.Client) (admin.Status, error) { return c.Status(ctx) }
	b := bound{o.timeout, "--timeout", ""}
	if len(o.proxies) == 1 {
		_, err := eachProxy(ctx, &o.adminOptions, b, status, printStatus)
		return err
	}
	res, err := each(ctx, o.proxies, b, status)
	if nerr := namedOnce(res); nerr != nil {
		return nerr
	}
	if perr := o.printer.print(o.Out, res, func(w io.Writer) { printStatuses(w, res) }); perr != nil {
		return perr
	}
	return err
}

// printStatuses shows several proxies side by side, one row each: they must agree.
func printStatuses(w io.Writer, res []admin.Result[admin.Status]) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROXY\tFENCE\tMODE\tBACKEND\tGENERATION\tIN-FLIGHT\tHELD\tREFUSED\tVERSION (ADMIN API LEVEL)")
	for _, r := range res {
		if r.Err != nil {
			fmt.Fprintf(tw, "%s\tUNREACHABLE: %v\n", r.Proxy, r.Err)
			continue
		}
		st := r.Value
		fence, mode := "open", "-"
		if st.Fenced {
			fence, mode = "FENCED", st.Mode
		}
		switch {
		case st.Unconfirmed:
			fence += " (unconfirmed)"
		case st.Unchecked:
			fence += " (unchecked)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s (%d)\n", r.Proxy, fence, mode, st.Backend, st.Generation, st.InflightWrites, st.Hold.Held, st.RefusedWrites, st.BuildVersion(), st.APILevel)
	}
	_ = tw.Flush()
}

func printStatus(w io.Writer, st admin.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	state := "OPEN (writes flow)"
	switch {
	case st.Fenced && st.Mode == admin.ModeHold:
		state = "FENCED, HOLD mode (writes held until fence off)"
	case st.Fenced:
		state = "FENCED (writes refused with 429, Retry-After: " + fmt.Sprint(st.RetryAfterSeconds) + "s)"
	}
	switch {
	case st.Unconfirmed:
		state += "; backend UNCONFIRMED, serving nothing (503) until 'kubefence backend set URL'"
	case st.Unchecked:
		state += "; backend UNCHECKED (--upstream, no state file at start): open with 'kubefence fence off --expect-backend URL' once URL is the side writes must go to"
	}
	fmt.Fprintf(tw, "fence:\t%s\n", state)
	fmt.Fprintf(tw, "proxy:\tkubefence %s (admin API level %d)\n", st.BuildVersion(), st.APILevel)
	if st.Reason != "" {
		fmt.Fprintf(tw, "reason:\t%s\n", st.Reason)
	}
	fmt.Fprintf(tw, "since:\t%s (generation %d)\n", st.ChangedAt.Format(time.RFC3339), st.Generation)
	fmt.Fprintf(tw, "backend:\t%s\n", st.Backend)
	fmt.Fprintf(tw, "in-flight writes:\t%d\n", st.InflightWrites)
	fmt.Fprintf(tw, "open watches:\t%d\n", st.OpenWatches)
	if st.ResumesPending > 0 {
		fmt.Fprintf(tw, "watches moved here, waiting for its answer:\t%d\n", st.ResumesPending)
	}
	if st.ResumedThenEnded > 0 {
		fmt.Fprintf(tw, "watches resumed here, then ended by it:\t%d (refused, or resourceVersion older than its watch cache and their collection not shown unchanged since: their clients relisted)\n", st.ResumedThenEnded)
	}
	if st.ResumedPastExpiry > 0 {
		fmt.Fprintf(tw, "watches resumed here from where its watch cache begins:\t%d (it answered 410, resourceVersion older than that; their collection the same at both)\n", st.ResumedPastExpiry)
	}
	fmt.Fprintf(tw, "refused writes:\t%d (since the proxy started)\n", st.RefusedWrites)
	h := st.Hold
	fmt.Fprintf(tw, "held writes:\t%d now (%d bytes); since start: %d released, %d timed out (refused), %d abandoned by their clients, %d refused (waiting room full)\n",
		h.Held, h.HeldBytes, h.Released, h.TimedOut, h.Abandoned, h.Full)
	if h.HeldUnverified > 0 {
		fmt.Fprintf(tw, "held from unverified clients:\t%d now (%d bytes; clients without a certificate the proxy verified fill only their share of the waiting room)\n",
			h.HeldUnverified, h.HeldUnverifiedBytes)
	}
	_ = tw.Flush()
}

func newBackendCommand(g *globals) *cobra.Command {
	return groupCommand(&cobra.Command{
		Use:   "backend",
		Short: "Switch the proxy to another kube-apiserver (only while fenced)",
	}, newBackendSetCommand(g), newBackendPrepareCommand(g))
}

// backendURLOptions are what the backend commands share: the proxies, and the apiserver URL
// with the CA file that verifies it.
type backendURLOptions struct {
	adminOptions
	caFile string
	url    string
}

func (o *backendURLOptions) Complete(a []string) error {
	o.url = a[0]
	return o.adminOptions.Complete(a)
}

func (o *backendURLOptions) Validate() error {
	if err := o.adminOptions.Validate(); err != nil {
		return err
	}
	if !strings.HasPrefix(o.url, "https://") && !strings.HasPrefix(o.url, "http://") {
		return UsageErrorf("URL %q: give the apiserver as https://HOST:PORT", o.url)
	}
	return nil
}

type backendPrepareOptions struct{ backendURLOptions }

func newBackendPrepareCommand(g *globals) *cobra.Command {
	o := &backendPrepareOptions{backendURLOptions{adminOptions: adminOptions{printOptions: printOptions{Streams: g.streams}}}}
	cmd := o.command(&cobra.Command{
		Use:   "prepare URL",
		Short: "Open the connections a coming 'backend set URL' will use, before the fence",
		Long: `Make the kube-apiserver at URL ready for a switch to come, fenced or not: the proxy checks it as
'backend set' would (allowed by --upstream or --allowed-backends, its certificate verified with
--ca-file or the current backend's CA) and opens the connections watches and writes will use
there. A 'backend set URL' with the same --ca-file (the file unchanged) within 60 s then uses
them: the watches it moves (--resume-watches) and the held writes 'fence off' releases go over
connections already open, instead of each dialling and handshaking when they all ask at once.
Nothing is switched and no request changes its way; a newer prepare replaces an older one.
'kubefence cutover' prepares green just before it fences.`,
		Args: args(cobra.ExactArgs(1)),
	}, o, defaultAdminTimeout, "how long to wait for each proxy's answer")
	cmd.Flags().StringVar(&o.caFile, "ca-file", "", "CA bundle for the backend's serving certificate, as the proxy sees the path (default: the current backend's); give 'backend set' the same")
	return cmd
}

func (o *backendPrepareOptions) Run(ctx context.Context) error {
	req := admin.PrepareRequest{URL: o.url, CAFile: o.caFile}
	if err := o.checkNamedOnce(ctx); err != nil {
		return err
	}
	b := bound{o.timeout, "--timeout", "whether it prepared the backend"}
	_, err := eachProxy(ctx, &o.adminOptions, b, func(ctx context.Context, c *admin.Client) (admin.PrepareResponse, error) {
		return c.PrepareBackend(ctx, req)
	}, func(w io.Writer, resp admin.PrepareResponse) {
		fmt.Fprintf(w, "%s prepared: %d connection(s) open, in %s; a 'backend set %s' within %s uses them\n",
			resp.Backend, resp.Connections, time.Duration(resp.Took).Round(time.Millisecond), o.url, admin.PreparedFor)
	})
	return err
}

type backendSetOptions struct {
	backendURLOptions
	resumeWatches bool
	expectGen     uint64
}

func newBackendSetCommand(g *globals) *cobra.Command {
	o := &backendSetOptions{backendURLOptions: backendURLOptions{adminOptions: adminOptions{printOptions: printOptions{Streams: g.streams}}}}
	cmd := o.command(&cobra.Command{
		Use:   "set URL",
		Short: "Send new requests to the apiserver at URL and end (or resume) watches on the old one",
		Long: `Switch the proxy to the kube-apiserver at URL. Only while fenced, and only to --upstream or a URL
the proxy's --allowed-backends allows, whose certificate verifies with --ca-file (or the current
backend's CA): the proxy refuses otherwise. New requests go to URL at once. Watches open on the
old backend are ended between two events: client-go informers reconnect to the new backend and
relist (about a second without events); a client that does not reconnect, such as
'kubectl get -w', exits. Upgraded streams (exec, attach, port-forward) are closed.

With --resume-watches each watch instead goes on, on the same client connection: between two
events it leaves the old backend, and once the fence lifts (or 5 s later) the proxy re-issues it
to URL from the last resourceVersion it delivered, so clients see one stream, with no relist and
no event lost or repeated. Use it only when URL serves the same
etcd revisions as the old backend (a replication cutover, or another apiserver on the same
etcd); otherwise resourceVersions mean different things there and watches must end. A watch
that cannot be resumed (still sending its initial events, or refused by URL) ends as without it.
One URL's apiserver answers 410 because its resourceVersion is older than its watch cache (which
began when that apiserver started) goes on from where that cache begins when the watched
objects are the same at both revisions (the proxy lists them at each), and ends otherwise:
'fence status' counts both.`,
		Args: args(cobra.ExactArgs(1)),
	}, o, defaultAdminTimeout+proxy.NewOptions().DrainTimeout,
		fmt.Sprintf("how long to wait for each proxy's answer, which comes once the watches on the old backend have drained: %s plus the proxy's default --drain-timeout; raise it for a proxy with a longer --drain-timeout", defaultAdminTimeout))
	cmd.Flags().StringVar(&o.caFile, "ca-file", "", "CA bundle for the new backend's serving certificate, as the proxy sees the path (default: keep the current one)")
	cmd.Flags().Uint64Var(&o.expectGen, "expect-generation", 0, "switch only if the proxy's state is still at this generation (as 'fence status' or 'fence on' printed it); 409 if the fence or backend changed since (0: no check)")
	cmd.Flags().BoolVar(&o.resumeWatches, "resume-watches", false, "resume open watches on the new backend from the last resourceVersion delivered, instead of ending them; only when it serves the same etcd revisions as the old (otherwise resourceVersions mean different things there and watches must end)")
	return cmd
}

func (o *backendSetOptions) Validate() error {
	if err := o.backendURLOptions.Validate(); err != nil {
		return err
	}
	if o.expectGen != 0 && len(o.proxies) > 1 {
		// Each proxy counts its own generation: one number would switch only those at it.
		return UsageErrorf("--expect-generation is one proxy's generation, and %d proxies are named: switch each with its own (as its 'fence status' prints it), or leave the flag out", len(o.proxies))
	}
	return nil
}

func (o *backendSetOptions) Run(ctx context.Context) error {
	req := admin.BackendRequest{URL: o.url, CAFile: o.caFile, ResumeWatches: o.resumeWatches, ExpectGeneration: o.expectGen}
	if err := o.checkNamedOnce(ctx); err != nil {
		return err
	}
	b := bound{o.timeout, "--timeout", "whether it switched the backend"}
	_, err := eachProxy(ctx, &o.adminOptions, b, func(ctx context.Context, c *admin.Client) (admin.BackendResponse, error) {
		resp, err := c.SetBackend(ctx, req)
		var apiErr *admin.APIError
		if errors.As(err, &apiErr) && apiErr.Code == 409 {
			return resp, fmt.Errorf("backend not changed: %s", apiErr.Message)
		}
		return resp, err
	}, o.printSwitch)
	return err
}

func (o *backendSetOptions) printSwitch(w io.Writer, resp admin.BackendResponse) {
	d := resp.Drain
	took := time.Duration(d.Duration).Round(time.Millisecond)
	if o.resumeWatches {
		fmt.Fprintf(w, "backend is %s (was %s); of %d long-running request(s) on the old backend, %d watch(es) moved to the new one (they ask it once the fence lifts) and %d ended, in %s",
			resp.Status.Backend, resp.Previous, d.Streams, d.Resumed, d.Ended, took)
	} else {
		fmt.Fprintf(w, "backend is %s (was %s); %d long-running request(s) on the old backend ended in %s",
			resp.Status.Backend, resp.Previous, d.Streams, took)
	}
	if resp.Drain.Forced > 0 {
		fmt.Fprintf(w, " (%d cut at --drain-timeout)", resp.Drain.Forced)
	}
	if d.Writes > 0 {
		fmt.Fprintf(w, "; waited for %d write(s) the fence policy let through to be answered by the old backend", d.Writes)
		if d.UnansweredWrites > 0 {
			fmt.Fprintf(w, " (%d still unanswered at --drain-timeout: the old backend may commit them yet)", d.UnansweredWrites)
		}
	}
	if resp.Prepared {
		fmt.Fprint(w, ", over the connections 'backend prepare' opened")
	}
	fmt.Fprintln(w)
}
