package cutover

import (
	"context"
	"errors"
	"fmt"

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
