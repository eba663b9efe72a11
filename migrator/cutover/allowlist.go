package cutover

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/kubefence/kubefence/internal/tlsutil"

	"github.com/kubefence/kubefence/proxy/backendurl"
)

// checkProxiesAllowSwitch refuses a cutover whose switch a proxy would refuse: each proxy must
// allow (its --upstream or --allowed-backends) the green apiserver it is switched to and, with a
// bake, the blue one a rollback switches it back to. Found only at the switch, inside the window,
// it would abort the cutover there. A proxy too old to report what it allows is not judged.
func (r *runner) checkProxiesAllowSwitch(ctx context.Context) error {
	g, ok := r.adm.(*proxyGroup)
	if !ok {
		return nil
	}
	targets := []string{r.p.Green.APIServer.URL}
	if r.p.Bake.Enabled {
		targets = append(targets, r.p.Blue.APIServer.URL)
	}
	var errs []error
	for _, px := range g.proxies {
		st, err := px.Client.Status(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("proxy %s: %w", px.Name, err))
			continue
		}
		sw := st.Switchable
		if sw == nil {
			continue
		}
		for _, to := range targets {
			if ra, ok := px.Client.(routedAdmin); ok {
				to = ra.toOwn(to)
			}
			u, err := backendurl.Parse(to)
			if err != nil {
				errs = append(errs, fmt.Errorf("proxy %s: %w", px.Name, err))
				continue
			}
			if !backendurl.Allowed(sw.Upstream, sw.AllowedBackends, u) {
				errs = append(errs, fmt.Errorf("proxy %s would refuse to switch to %s (its --upstream is %s, its --allowed-backends %q): restart it with --allowed-backends naming %s (or a pattern such as %s://%s:*) before the cutover",
					px.Name, u, sw.Upstream, sw.AllowedBackends, u, u.Scheme, u.Hostname()))
			}
		}
	}
	return errors.Join(errs...)
}

// switchBackCATimeout bounds the preflight's handshake with blue's apiserver.
const switchBackCATimeout = 10 * time.Second

// checkSwitchBackCA refuses a cutover whose way back would fail at its switch: with
// green.apiserver.caFile set and blue's not, a switch back to blue (a partial switch undone, an
// abort after it, a rollback) sends no CA, which keeps the proxy's current one, green's; unless
// that verifies blue's serving certificate too (one cluster CA, kubeadm's), the proxies would
// refuse blue and stay fenced. Checked at the preflight, not when the plan is read: abort,
// rollback, finish and --resume must still read the plan of a cutover under way. It checks
// blue.apiserver.url from this host; the proxies' own blueURLs (HA) are theirs to check.
func checkSwitchBackCA(ctx context.Context, p *Plan) error {
	if p.Green.APIServer.CAFile == "" || p.Blue.APIServer.CAFile != "" {
		return nil
	}
	pool, err := tlsutil.LoadCAPool(p.Green.APIServer.CAFile)
	if err != nil {
		return fmt.Errorf("green.apiserver.caFile: %w", err)
	}
	u, err := url.Parse(p.Blue.APIServer.URL)
	if err != nil || u.Scheme != "https" {
		return err // plain http: no certificate to verify
	}
	ctx, cancel := context.WithTimeout(ctx, switchBackCATimeout)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: u.Hostname()}}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), cmp.Or(u.Port(), "443")))
	if err != nil {
		return fmt.Errorf("blue.apiserver.caFile is not set, so a switch back to blue (a partial switch undone, an abort, a rollback) keeps the proxies' current CA, green.apiserver.caFile's, which does not verify blue's apiserver %s (%w): set blue.apiserver.caFile to the CA the proxies' --upstream-ca-file names", p.Blue.APIServer.URL, err)
	}
	return conn.Close()
}
