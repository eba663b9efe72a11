package cutover

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kubefence/kubefence/internal/tlsutil"
	"github.com/kubefence/kubefence/proxy/admin"
)

// ProxyRef is one proxy in front of blue: its admin socket on this host, or its admin API over
// the network (--admin-listen, mutual TLS) with the client certificate and the CA of the
// proxy's serving certificate.
type ProxyRef struct {
	AdminSocket  string `yaml:"adminSocket" json:"adminSocket,omitempty"`
	AdminAddress string `yaml:"adminAddress" json:"adminAddress,omitempty"`
	CertFile     string `yaml:"certFile" json:"certFile,omitempty"`
	KeyFile      string `yaml:"keyFile" json:"keyFile,omitempty"`
	CAFile       string `yaml:"caFile" json:"caFile,omitempty"`
	// BlueURL and GreenURL are the apiservers this proxy sends requests to before and after the
	// switch, when they are not blue.apiserver.url and green.apiserver.url: in an HA control
	// plane each node's proxy stands in front of that node's apiserver. GreenURL names
	// green.apiserver or one of green.apiservers.
	BlueURL  string `yaml:"blueURL" json:"blueURL,omitempty"`
	GreenURL string `yaml:"greenURL" json:"greenURL,omitempty"`
}

func (pr ProxyRef) name() string {
	if pr.AdminAddress != "" {
		return pr.AdminAddress
	}
	return pr.AdminSocket
}

// proxyRefs are the plan's proxies: proxies, or the one proxy.adminSocket names.
func (p *Plan) proxyRefs() []ProxyRef {
	if len(p.Proxies) > 0 {
		return p.Proxies
	}
	return []ProxyRef{{AdminSocket: p.Proxy.AdminSocket}}
}

func (p *Plan) validateProxies(ps *problems) {
	for i, pr := range p.Proxies {
		f := fmt.Sprintf("proxies[%d]", i)
		switch {
		case (pr.AdminSocket == "") == (pr.AdminAddress == ""):
			ps.add("%s: give adminSocket or adminAddress (one of them)", f)
		case pr.AdminAddress != "" && (!strings.HasPrefix(pr.AdminAddress, "https://") || pr.CertFile == "" || pr.KeyFile == "" || pr.CAFile == ""):
			ps.add("%s.adminAddress %q needs https:// and certFile, keyFile, caFile (the admin API is mutual TLS only)", f, pr.AdminAddress)
		}
		if pr.BlueURL != "" {
			ps.url(f+".blueURL", pr.BlueURL)
		}
		isGreen := func(u string) bool {
			return slices.ContainsFunc(p.greenAPIServers(), func(a GreenAPIServer) bool { return sameURL(a.URL) == sameURL(u) })
		}
		if pr.GreenURL != "" && !isGreen(pr.GreenURL) {
			ps.add("%s.greenURL %q is not the url of green.apiserver or of one of green.apiservers: the cutover starts and checks only those", f, pr.GreenURL)
		}
		if pr.BlueURL != "" && isGreen(pr.BlueURL) {
			ps.add("%s.blueURL %q is a green apiserver's url", f, pr.BlueURL)
		}
	}
}

// proxyAnswerTimeout bounds one proxy's answer to a change that waits for nothing on the proxy
// (fence off), and, added to the barrier's wait, to fence on: a proxy that takes the connection
// and never answers (its disk stalled in an fsync of its state file, its process stopped, its
// host gone without a reset) must hold neither the other proxies' calls nor what comes after
// them. Status has its own bound (statusAnswerTimeout), a switch back too (switchBackTimeout).
// A variable for the tests.
var proxyAnswerTimeout = 10 * time.Second

// statusAnswerTimeout bounds one proxy's answer to a status request, which takes it
// milliseconds: a silent proxy costs each look at the proxies this long. A variable for the
// tests.
var statusAnswerTimeout = 3 * time.Second

// switchBackTimeout bounds one proxy's switch back to where it was (a partial switch undone, an
// abort putting a proxy back): it drains the watches it had just moved, as a switch does, so
// it is at least what its switch gets (switchBound). A variable for the tests.
var switchBackTimeout = time.Minute

// switchBound is how long a proxy with drain timeout drain gets to answer a switch: its drain,
// then switchSlack (parked watches' grace, a ping, a TLS probe) and an answer.
func switchBound(drain time.Duration) time.Duration {
	return drain + switchSlack + proxyAnswerTimeout
}

// statusOf is one proxy's status, within statusAnswerTimeout.
func statusOf(ctx context.Context, c proxyAdmin) (admin.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, statusAnswerTimeout)
	defer cancel()
	return c.Status(ctx)
}

// fenceOf sends one proxy req, within proxyAnswerTimeout after the barrier's longest wait (when
// req fences).
func fenceOf(ctx context.Context, c proxyAdmin, req admin.FenceRequest) (admin.FenceResponse, error) {
	d := proxyAnswerTimeout
	if req.Fenced {
		d += cmp.Or(time.Duration(req.WaitTimeout), admin.DefaultWaitTimeout)
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return c.Fence(ctx, req)
}

// switchBackOf switches one proxy back (or, before the window's unfence, one restarted on its
// --upstream to the target), within switchBackTimeout or its switchBound (drain: its drain
// timeout, 0 when it does not say), even once ctx has ended: the proxies that acknowledged a
// switch another did not must not stay on the new backend because the switch's own time ran
// out waiting for that one.
func switchBackOf(ctx context.Context, c proxyAdmin, req admin.BackendRequest, drain time.Duration) (admin.BackendResponse, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(switchBackTimeout, switchBound(drain)))
	defer cancel()
	return c.SetBackend(ctx, req)
}

// newProxyGroup connects to every proxy of the plan. One whose admin client certificate or CA
// does not load is refused, unless wayBack (an abort, a cleanup): then it is a proxy that does
// not answer, saying why, and the others go on.
func newProxyGroup(p *Plan, wayBack bool) (*proxyGroup, error) {
	g := &proxyGroup{backCA: p.Blue.APIServer.CAFile}
	for _, pr := range p.proxyRefs() {
		c, err := adminClient(pr)
		switch {
		case err != nil && wayBack:
			c = unloadable{fmt.Errorf("its admin client credentials do not load: %w", err)}
		case err != nil:
			return nil, fmt.Errorf("proxy %s: %w", pr.name(), err)
		}
		g.proxies = append(g.proxies, admin.Target[proxyAdmin]{Name: pr.name(), Client: routeProxy(c, p, pr)})
	}
	return g, nil
}

// adminClient is the client of one proxy's admin API.
func adminClient(pr ProxyRef) (proxyAdmin, error) {
	if pr.AdminAddress == "" {
		return admin.NewClient(pr.AdminSocket), nil
	}
	cert, err := tls.LoadX509KeyPair(pr.CertFile, pr.KeyFile)
	if err != nil {
		return nil, err
	}
	pool, err := tlsutil.LoadCAPool(pr.CAFile)
	if err != nil {
		return nil, err
	}
	return admin.NewTLSClient(pr.AdminAddress, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: pool}), nil
}

// unloadable is a proxy whose admin client could not be made: every call fails with why.
type unloadable struct{ err error }

func (u unloadable) Status(context.Context) (admin.Status, error) { return admin.Status{}, u.err }

func (u unloadable) Fence(context.Context, admin.FenceRequest) (admin.FenceResponse, error) {
	return admin.FenceResponse{}, u.err
}

func (u unloadable) SetBackend(context.Context, admin.BackendRequest) (admin.BackendResponse, error) {
	return admin.BackendResponse{}, u.err
}

// routeProxy wraps c when the proxy's own blue or green apiserver is not the plan's.
func routeProxy(c proxyAdmin, p *Plan, pr ProxyRef) proxyAdmin {
	var routes []route
	for _, rt := range []route{{p.Blue.APIServer.URL, pr.BlueURL}, {p.Green.APIServer.URL, pr.GreenURL}} {
		rt = route{plan: sameURL(rt.plan), own: sameURL(rt.own)}
		if rt.own != "" && rt.own != rt.plan {
			routes = append(routes, rt)
		}
	}
	if len(routes) == 0 {
		return c
	}
	return routedAdmin{proxyAdmin: c, routes: routes}
}

// routedAdmin is a proxy in front of apiservers of its own (proxies[].blueURL, greenURL: in an
// HA control plane, its node's). The steps speak of blue.apiserver.url and green.apiserver.url;
// it sends this proxy its own apiserver instead and reports that back as the plan's, so that
// every step, and the group's merged status, see one backend for all proxies.
type routedAdmin struct {
	proxyAdmin
	routes []route
}

// route is a plan's apiserver URL and this proxy's own in its place (both without a trailing /).
type route struct{ plan, own string }

func (ra routedAdmin) toOwn(u string) string {
	for _, rt := range ra.routes {
		if sameURL(u) == rt.plan {
			return rt.own
		}
	}
	return u
}

// toPlan names a backend this proxy reports as the plan does. The plan's URL itself, where
// this proxy has its own, is not this proxy's place: it is reported so, and no step accepts it.
func (ra routedAdmin) toPlan(b string) string {
	for _, rt := range ra.routes {
		if b == rt.own {
			return rt.plan
		}
	}
	for _, rt := range ra.routes {
		if b == rt.plan {
			return b + " (not this proxy's " + rt.own + ")"
		}
	}
	return b
}

func (ra routedAdmin) Status(ctx context.Context) (admin.Status, error) {
	st, err := ra.proxyAdmin.Status(ctx)
	st.Backend = ra.toPlan(st.Backend)
	return st, err
}

func (ra routedAdmin) Fence(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
	if req.ExpectBackend != "" {
		req.ExpectBackend = ra.toOwn(req.ExpectBackend)
	}
	resp, err := ra.proxyAdmin.Fence(ctx, req)
	resp.Status.Backend = ra.toPlan(resp.Status.Backend)
	return resp, err
}

func (ra routedAdmin) SetBackend(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
	req.URL = ra.toOwn(req.URL)
	resp, err := ra.proxyAdmin.SetBackend(ctx, req)
	resp.Status.Backend, resp.Previous = ra.toPlan(resp.Status.Backend), ra.toPlan(resp.Previous)
	return resp, err
}

func (ra routedAdmin) PrepareBackend(ctx context.Context, req admin.PrepareRequest) (admin.PrepareResponse, error) {
	req.URL = ra.toOwn(req.URL)
	resp, err := prepareBackend(ctx, ra.proxyAdmin, req)
	resp.Backend = ra.toPlan(resp.Backend)
	return resp, err
}

func (ra routedAdmin) Writes(ctx context.Context, since time.Time) (admin.WritesResponse, error) {
	return listWrites(ctx, ra.proxyAdmin, since)
}

// proxyGroup is every proxy of the plan as one proxyAdmin: each call goes to all of them at once
// and succeeds only when all acknowledged (invariant all-proxies-agree). Their states merge:
// fenced if any is (so an abort unfences every one), one backend if they agree (else a
// "mixed" backend no step accepts), generations, refusals, open watches and held writes added
// up (a generation sum that did not change means no proxy changed: generations only grow).
type proxyGroup struct {
	proxies []admin.Target[proxyAdmin]
	backCA  string // for switching a proxy back after a partial switch (blue's; green's in a rollback)
	// clocks are the proxies' clocks against this host's, by name, as the last Writes measured
	// them.
	clocks map[string]clockReading
}

// namedOnce refuses two of the plan's proxies that are one process (their statuses' instance):
// one proxy named two ways the plan check cannot tell apart (its socket and its --admin-listen
// address, an IP and a host name) would be fenced twice at once, and its generation would never
// be what the switch expects. A proxy that does not answer is left to the status that follows.
func (g *proxyGroup) namedOnce(ctx context.Context) error {
	res, _ := admin.Each(ctx, g.proxies, statusOf)
	seen := map[string]string{}
	var errs []error
	for _, r := range res {
		id := r.Value.Instance
		if r.Err != nil || id == "" { // down, or a proxy too old to say
			continue
		}
		if first, ok := seen[id]; ok {
			errs = append(errs, fmt.Errorf("%s and %s are one proxy (instance %s) named twice in the plan: list each proxy once", named([]string{first}), named([]string{r.Proxy}), id))
			continue
		}
		seen[id] = r.Proxy
	}
	return errors.Join(errs...)
}

func (g *proxyGroup) Status(ctx context.Context) (admin.Status, error) {
	res, err := admin.Each(ctx, g.proxies, statusOf)
	if err != nil {
		return admin.Status{}, err
	}
	return mergeStatus(res), nil
}

func (g *proxyGroup) Fence(ctx context.Context, req admin.FenceRequest) (admin.FenceResponse, error) {
	res, err := admin.Each(ctx, g.proxies, func(ctx context.Context, c proxyAdmin) (admin.FenceResponse, error) { return fenceOf(ctx, c, req) })
	if err != nil {
		return admin.FenceResponse{}, err
	}
	out := admin.FenceResponse{Status: mergeStatus(statuses(res, func(r admin.FenceResponse) admin.Status { return r.Status }))}
	for _, r := range res {
		out.Flip = max(out.Flip, r.Value.Flip)
		if b := r.Value.Barrier; b != nil {
			if out.Barrier == nil {
				out.Barrier = &admin.Barrier{Complete: true}
			}
			out.Barrier.Complete = out.Barrier.Complete && b.Complete
			out.Barrier.Waited = max(out.Barrier.Waited, b.Waited)
			for _, w := range b.Remaining {
				w.Proxy = r.Proxy
				out.Barrier.Remaining = append(out.Barrier.Remaining, w)
			}
		}
	}
	return out, nil
}

// SetBackend switches every proxy. If some did not acknowledge, the ones that did are switched
// back before the error is returned: no proxy may serve green while another serves blue.
// req.ExpectGeneration is the group's (the sum over the proxies, as Status reports it): each
// proxy is asked to switch only at its own generation of that moment (expectEach).
func (g *proxyGroup) SetBackend(ctx context.Context, req admin.BackendRequest) (admin.BackendResponse, error) {
	calls, err := g.expectEach(ctx, req)
	if err != nil {
		return admin.BackendResponse{}, err
	}
	res, err := admin.Each(ctx, calls, func(ctx context.Context, c backendCall) (admin.BackendResponse, error) {
		if c.drain > 0 { // else a proxy too old to say: the step's own timeout
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, switchBound(c.drain))
			defer cancel()
		}
		return c.p.SetBackend(ctx, c.req)
	})
	if err != nil {
		return admin.BackendResponse{}, g.switchBack(ctx, res, err)
	}
	out := admin.BackendResponse{Status: mergeStatus(statuses(res, func(r admin.BackendResponse) admin.Status { return r.Status })), Previous: res[0].Value.Previous, Prepared: true}
	for _, r := range res {
		out.Prepared = out.Prepared && r.Value.Prepared
		out.Drain.Streams += r.Value.Drain.Streams
		out.Drain.Forced += r.Value.Drain.Forced
		out.Drain.Resumed += r.Value.Drain.Resumed
		out.Drain.Ended += r.Value.Drain.Ended
		out.Drain.Writes += r.Value.Drain.Writes
		out.Drain.UnansweredWrites += r.Value.Drain.UnansweredWrites
		out.Drain.Duration = max(out.Drain.Duration, r.Value.Drain.Duration)
	}
	return out, nil
}

// PrepareBackend asks every proxy to prepare the backend (admin.PrepareRequest); the answer adds
// up the connections of those that did, and the error names those that did not.
func (g *proxyGroup) PrepareBackend(ctx context.Context, req admin.PrepareRequest) (admin.PrepareResponse, error) {
	res, err := admin.Each(ctx, g.proxies, func(ctx context.Context, c proxyAdmin) (admin.PrepareResponse, error) {
		return prepareBackend(ctx, c, req)
	})
	out := admin.PrepareResponse{Backend: req.URL}
	for _, r := range res {
		out.Connections += r.Value.Connections
		out.Took = max(out.Took, r.Value.Took)
	}
	return out, err
}

// backendPreparer is a proxy admin API that can prepare a backend for a switch.
type backendPreparer interface {
	PrepareBackend(ctx context.Context, req admin.PrepareRequest) (admin.PrepareResponse, error)
}

// prepareBackend asks one proxy to prepare a backend.
func prepareBackend(ctx context.Context, c proxyAdmin, req admin.PrepareRequest) (admin.PrepareResponse, error) {
	bp, ok := c.(backendPreparer)
	if !ok {
		return admin.PrepareResponse{}, fmt.Errorf("this proxy client cannot prepare a backend")
	}
	return bp.PrepareBackend(ctx, req)
}

// backendCall is one proxy's switch request.
type backendCall struct {
	p   proxyAdmin
	req admin.BackendRequest
	// drain is how long the proxy's switch may wait for its watches (its status says; 0 when
	// not read, or from a proxy too old to say).
	drain time.Duration
}

// switchSlack is what a proxy's switch may take beyond its --drain-timeout: the grace a parked
// watch gets (5 s), a ping of a prepared connection and a TLS probe of the new backend (up to
// 5 s each). A switch call to one proxy waits for that and an answer after it
// (proxyAnswerTimeout), not the switch step's whole timeout, while every other proxy is
// fenced. A variable for the tests.
var switchSlack = 15 * time.Second

// expectEach is each proxy's switch request. When req expects a generation of the group, the
// proxies' generations are read and must add up to it (generations only grow, so an equal sum
// means no proxy changed); each proxy then expects its own, and refuses (409) if its fence or
// backend changes after this look.
func (g *proxyGroup) expectEach(ctx context.Context, req admin.BackendRequest) ([]admin.Target[backendCall], error) {
	calls := make([]admin.Target[backendCall], len(g.proxies))
	for i, p := range g.proxies {
		calls[i] = admin.Target[backendCall]{Name: p.Name, Client: backendCall{p: p.Client, req: req}}
	}
	if req.ExpectGeneration == 0 {
		return calls, nil
	}
	res, err := admin.Each(ctx, g.proxies, statusOf)
	if err != nil {
		return nil, err
	}
	if st := mergeStatus(res); st.Generation != req.ExpectGeneration {
		return nil, fmt.Errorf("the proxies' state changed since (generation %d expected, %d now; last change %s, reason %q): someone ran fence off/on or backend set by hand; not switching", req.ExpectGeneration, st.Generation, st.ChangedAt.Format(time.RFC3339), st.Reason)
	}
	for i, r := range res {
		calls[i].Client.req.ExpectGeneration = r.Value.Generation
		calls[i].Client.drain = time.Duration(r.Value.DrainTimeout)
	}
	return calls, nil
}

// targetOf names the backend a switch went to, from the proxies that acknowledged it.
func (g *proxyGroup) targetOf(res []admin.Result[admin.BackendResponse]) string {
	for _, r := range res {
		if r.Err == nil {
			return r.Value.Status.Backend
		}
	}
	return "the new backend"
}

func (g *proxyGroup) switchBack(ctx context.Context, res []admin.Result[admin.BackendResponse], cause error) error {
	var unknown []error
	var back []admin.Target[backendCall]
	for i, r := range res {
		var refused *admin.APIError
		switch {
		case r.Err != nil && !errors.As(r.Err, &refused):
			// No answer: it may have switched all the same. An abort looks at it again.
			unknown = append(unknown, fmt.Errorf("proxy %s may have switched to %s (no answer); 'kubefence fence status' shows where it is", r.Proxy, g.targetOf(res)))
		case r.Err == nil:
			back = append(back, admin.Target[backendCall]{Name: r.Proxy, Client: backendCall{p: g.proxies[i].Client, req: admin.BackendRequest{URL: r.Value.Previous, CAFile: g.backCA}, drain: time.Duration(r.Value.Status.DrainTimeout)}})
		}
	}
	backRes, _ := admin.Each(ctx, back, func(ctx context.Context, c backendCall) (admin.BackendResponse, error) {
		return switchBackOf(ctx, c.p, c.req, c.drain)
	})
	var failed []error
	for i, r := range backRes {
		if r.Err != nil {
			failed = append(failed, fmt.Errorf("proxy %s switched and could not be switched back to %s: %w", r.Proxy, back[i].Client.req.URL, r.Err))
		}
	}
	if len(failed) == 0 {
		return errors.Join(append([]error{fmt.Errorf("%w (the proxies that acknowledged the switch were switched back)", cause)}, unknown...)...)
	}
	return errors.Join(append(append([]error{cause}, failed...), unknown...)...)
}

// putFencedOn puts every fenced proxy that answers and is not on a (or is, unconfirmed) on it:
// before an abort unfences them (a proxy may have switched although its answer was lost, or a
// crash cut the switch short, and unfenced there it would open writes on green while the others
// write blue), and before the window's unfence (a proxy restarted fenced on its --upstream
// since the switch). An open proxy is not switched (a switch needs the fence): one open away
// from a is returned, "NAME (on BACKEND)", for the caller to judge. One that does not answer,
// or is in skip (found silent just before: one wait for it is enough), is left alone: the
// unfence, which names the backend it expects, fails for it. Each proxy is looked at once.
func (g *proxyGroup) putFencedOn(ctx context.Context, a APIServerRef, skip []string) (openElsewhere []string, _ error) {
	want := sameURL(a.URL)
	ask := slices.DeleteFunc(slices.Clone(g.proxies), func(p admin.Target[proxyAdmin]) bool { return slices.Contains(skip, p.Name) })
	res, err := admin.Each(ctx, ask, func(ctx context.Context, c proxyAdmin) (string, error) {
		st, err := statusOf(ctx, c)
		on := sameURL(st.Backend) == want
		switch {
		case err != nil, st.Fenced && on && !st.Unconfirmed:
			return "", nil
		case !st.Fenced && !on:
			return st.Backend, nil
		case !st.Fenced:
			return "", nil
		}
		if _, err := switchBackOf(ctx, c, admin.BackendRequest{URL: a.URL, CAFile: a.CAFile}, time.Duration(st.DrainTimeout)); err != nil {
			return "", fmt.Errorf("on %s and could not be switched to %s: %w", st.Backend, a.URL, err)
		}
		return "", nil
	})
	for _, r := range res {
		if r.Value != "" {
			openElsewhere = append(openElsewhere, fmt.Sprintf("%s (on %s)", named([]string{r.Proxy}), r.Value))
		}
	}
	return openElsewhere, err
}

func statuses[T any](res []admin.Result[T], get func(T) admin.Status) []admin.Result[admin.Status] {
	out := make([]admin.Result[admin.Status], len(res))
	for i, r := range res {
		out[i] = admin.Result[admin.Status]{Proxy: r.Proxy, Value: get(r.Value)}
	}
	return out
}

// mergeStatus is the group's state as one proxy's.
func mergeStatus(res []admin.Result[admin.Status]) admin.Status {
	var out admin.Status
	out.APILevel, out.Version = oldestProxies(res)
	backends := map[string][]string{}
	for _, r := range res {
		st := r.Value
		out.Fenced = out.Fenced || st.Fenced
		out.Unconfirmed = out.Unconfirmed || st.Unconfirmed
		out.Generation += st.Generation
		out.RefusedWrites += st.RefusedWrites
		out.InflightWrites += st.InflightWrites
		out.OpenWatches += st.OpenWatches
		out.OpenStreams += st.OpenStreams
		out.ResumedThenEnded += st.ResumedThenEnded
		out.ResumedPastExpiry += st.ResumedPastExpiry
		out.ResumesPending += st.ResumesPending
		out.Hold = addHold(out.Hold, st.Hold)
		out.Mode = cmp.Or(out.Mode, st.Mode)
		out.RetryAfterSeconds = max(out.RetryAfterSeconds, st.RetryAfterSeconds)
		out.DrainTimeout = max(out.DrainTimeout, st.DrainTimeout)
		if out.Reason == "" {
			out.Reason = st.Reason
		}
		if st.ChangedAt.After(out.ChangedAt) {
			out.ChangedAt = st.ChangedAt
		}
		backends[st.Backend] = append(backends[st.Backend], r.Proxy)
	}
	if len(backends) == 1 {
		for b := range backends {
			out.Backend = b
		}
		return out
	}
	var parts []string
	for _, b := range slices.Sorted(func(yield func(string) bool) {
		for b := range backends {
			if !yield(b) {
				return
			}
		}
	}) {
		parts = append(parts, b+" ("+strings.Join(backends[b], ", ")+")")
	}
	out.Backend = "mixed: " + strings.Join(parts, "; ")
	return out
}

// addHold adds two proxies' hold counters.
func addHold(a, b admin.HoldStatus) admin.HoldStatus {
	return admin.HoldStatus{Held: a.Held + b.Held, HeldBytes: a.HeldBytes + b.HeldBytes,
		HeldUnverified: a.HeldUnverified + b.HeldUnverified, HeldUnverifiedBytes: a.HeldUnverifiedBytes + b.HeldUnverifiedBytes, Released: a.Released + b.Released,
		TimedOut: a.TimedOut + b.TimedOut, Abandoned: a.Abandoned + b.Abandoned, Full: a.Full + b.Full}
}

// oldestProxies is the lowest admin API level among the proxies and, for messages, the proxies
// that speak it with their kubefence versions: a merged status's Version names them.
func oldestProxies(res []admin.Result[admin.Status]) (int, string) {
	if len(res) == 0 {
		return 0, ""
	}
	lowest := slices.MinFunc(res, func(a, b admin.Result[admin.Status]) int { return a.Value.APILevel - b.Value.APILevel }).Value.APILevel
	var names []string
	for _, r := range res {
		if r.Value.APILevel == lowest {
			names = append(names, r.Proxy+" (kubefence "+r.Value.BuildVersion()+")")
		}
	}
	return lowest, strings.Join(names, ", ")
}

// proxiesSpeakOurs asks every proxy of the plan for its status and checks its admin API level.
func proxiesSpeakOurs(ctx context.Context, p *Plan) error {
	g, err := newProxyGroup(p, false)
	if err != nil {
		return err
	}
	st, err := g.Status(ctx)
	if err != nil {
		return err
	}
	return checkAPILevel(st)
}

// checkAPILevel refuses proxies that speak an older admin API than this kubefence (st is the
// group's merged status): they would refuse a field the window sends (fence off's
// expectBackend) and leave writes fenced.
func checkAPILevel(st admin.Status) error {
	if st.APILevel >= admin.APILevel {
		return nil
	}
	return fmt.Errorf("proxy %s speaks admin API level %d, this kubefence needs %d: it would refuse what the window asks of it (backend set --expect-generation, fence off --expect-backend) and leave writes fenced. Upgrade the proxies to this kubefence first (a restarted proxy keeps its fence state and backend), or run the cutover with the proxies' kubefence", st.Version, st.APILevel, admin.APILevel)
}

// proxyNames lists the plan's proxies for messages.
func proxyNames(p *Plan) string {
	var names []string
	for _, pr := range p.proxyRefs() {
		names = append(names, pr.name())
	}
	return strings.Join(names, ", ")
}

// proxyCommands is the command line each proxy of the plan gets for verb on url (one of the
// plan's apiservers), with the proxy's own apiserver in url's place and the flag that names the
// proxy: what an operator would type for each proxy, one per proxy.
func (p *Plan) proxyCommands(verb, url string) []string {
	var cmds []string
	for _, pr := range p.proxyRefs() {
		own := url
		for _, rt := range []route{{p.Blue.APIServer.URL, pr.BlueURL}, {p.Green.APIServer.URL, pr.GreenURL}} {
			if rt.own != "" && sameURL(url) == sameURL(rt.plan) {
				own = rt.own
			}
		}
		cmd := "kubefence " + verb + " " + own
		switch {
		case pr.AdminAddress != "":
			cmd += fmt.Sprintf(" --admin-address %s --admin-cert-file %s --admin-key-file %s --admin-ca-file %s", pr.AdminAddress, pr.CertFile, pr.KeyFile, pr.CAFile)
		case pr.AdminSocket != "":
			cmd += " --admin-socket " + pr.AdminSocket
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}
