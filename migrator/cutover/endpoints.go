package cutover

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubefence/kubefence/internal/proc"
	"github.com/kubefence/kubefence/proxy/admin"
)

// The kubernetes Service's endpoints are what in-cluster clients reach: each must be a proxy,
// or their writes go around the fence. A proxy listening on every address (0.0.0.0, ::, or
// no host) at the endpoint's port proves nothing by itself: on a load-balancer host it says
// nothing about the apiserver's own address at that port (deploy/systemd/proxy.env.example).

// proxyListen is one proxy's API listen address and, where known, its host's addresses.
type proxyListen struct {
	proxy, listen string
	// hostIPs are the addresses of the host the proxy runs on: this host's for a proxy reached
	// through its admin socket, its admin address's for one reached over the network. On its
	// host no other process can take a port the proxy listens on for every address.
	hostIPs []string
}

// endpointVerdict is what checkServiceEndpoints can say of one endpoint.
type endpointVerdict int

const (
	endpointProxy     endpointVerdict = iota
	endpointNotProxy                  // a problem: in-cluster clients go around the proxies
	endpointUndecided                 // a warning: only a wildcard listen could make it a proxy
)

// endpointJudge decides whether a kubernetes Service endpoint (ip:port) is a proxy.
type endpointJudge struct {
	listens []proxyListen
	// apiservers are the addresses (ip:port) the plan names as apiservers, to the field naming
	// each: never a proxy, whatever listens on every address at their port.
	apiservers map[string]string
}

// judge is the verdict on addr, and for anything but a proxy, what to tell the operator.
func (j endpointJudge) judge(addr string) (endpointVerdict, string) {
	host, port, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return endpointNotProxy, fmt.Sprintf("the kubernetes Service's endpoint %q is not an IP and port: check 'kubectl -n default get endpointslices -l kubernetes.io/service-name=kubernetes'", addr)
	}
	if field, ok := j.apiservers[net.JoinHostPort(ip.String(), port)]; ok {
		return endpointNotProxy, fmt.Sprintf("the kubernetes Service's endpoint %s is %s, an apiserver, not a proxy: in-cluster clients reach it around the proxies; move that apiserver behind a proxy on its address (deploy/README.md, stacked recipe), or give it --endpoint-reconciler-type=none and point the kubernetes endpoints at the proxies", addr, field)
	}
	var wild []string
	for _, l := range j.listens {
		lh, lp, err := net.SplitHostPort(l.listen)
		if err != nil || lp != port {
			continue
		}
		lip := net.ParseIP(lh)
		switch {
		case lip != nil && lip.Equal(ip):
			return endpointProxy, ""
		case lh == "" || lip != nil && lip.IsUnspecified():
			if containsIP(l.hostIPs, ip) {
				return endpointProxy, ""
			}
			wild = append(wild, fmt.Sprintf("%s (on %s)", l.proxy, l.listen))
		}
	}
	if len(wild) > 0 {
		return endpointUndecided, fmt.Sprintf("cannot tell whether the kubernetes Service's endpoint %s is a proxy: %s listens on every address at :%s, and %s is neither that proxy's host's known address nor an apiserver the plan names; if it is not the proxy's host, in-cluster clients go around the proxies. Give the proxy --listen=%s to make this check exact", addr, strings.Join(wild, ", "), port, host, addr)
	}
	var ls []string
	for _, l := range j.listens {
		ls = append(ls, l.listen)
	}
	return endpointNotProxy, fmt.Sprintf("the kubernetes Service's endpoint %s is not a proxy (%s): in-cluster clients reach blue's apiserver directly", addr, strings.Join(ls, ", "))
}

func containsIP(ips []string, ip net.IP) bool {
	for _, s := range ips {
		if x := net.ParseIP(s); x != nil && x.Equal(ip) {
			return true
		}
	}
	return false
}

// checkServiceEndpoints checks that the default/kubernetes Service's endpoints (what in-cluster
// clients reach) are the proxies' listen addresses: problems fail the preflight (unless bypass
// is allowed), notes are endpoints it cannot decide on, for the preflight's summary.
func (r *runner) checkServiceEndpoints(ctx context.Context) (problems, notes []string) {
	g, ok := r.adm.(*proxyGroup)
	if !ok {
		return nil, nil
	}
	listens, err := g.listens(ctx)
	if err != nil {
		return []string{"the proxies' listen addresses: " + err.Error()}, nil
	}
	cfg, err := restConfig(r.p.Blue.APIServer.Kubeconfig)
	if err != nil {
		return []string{"blue apiserver: " + err.Error()}, nil
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return []string{"blue apiserver: " + err.Error()}, nil
	}
	addrs, err := serviceEndpoints(ctx, cs)
	if err != nil {
		return []string{"the kubernetes Service's endpoints: " + err.Error()}, nil
	}
	j := endpointJudge{listens: listens, apiservers: r.p.apiserverAddrs(ctx)}
	for _, addr := range addrs {
		switch v, why := j.judge(addr); v {
		case endpointNotProxy:
			problems = append(problems, why)
		case endpointUndecided:
			notes = append(notes, why)
		}
	}
	return problems, notes
}

// apiserverAddrs are the addresses (ip:port, names resolved) of the apiservers the plan names,
// to the field naming each: blue.apiserver.url, proxies[].blueURL, and green's.
func (p *Plan) apiserverAddrs(ctx context.Context) map[string]string {
	urls := [][2]string{{"blue.apiserver.url", p.Blue.APIServer.URL}}
	for i, pr := range p.Proxies {
		urls = append(urls, [2]string{fmt.Sprintf("proxies[%d].blueURL", i), pr.BlueURL})
	}
	urls = append(urls, [2]string{"green.apiserver.url", p.Green.APIServer.URL})
	for i, a := range p.Green.APIServers {
		urls = append(urls, [2]string{fmt.Sprintf("green.apiservers[%d].url", i), a.URL})
	}
	out := map[string]string{}
	for _, u := range urls {
		host, port, err := net.SplitHostPort(proc.HostPort(u[1]))
		if u[1] == "" || err != nil {
			continue
		}
		for _, ip := range hostIPs(ctx, host) {
			if _, ok := out[net.JoinHostPort(ip, port)]; !ok {
				out[net.JoinHostPort(ip, port)] = u[0]
			}
		}
	}
	return out
}

// hostIPs are the addresses host resolves to (host itself if it is an IP), normalised.
func hostIPs(ctx context.Context, host string) []string {
	if ip := net.ParseIP(host); ip != nil {
		return []string{ip.String()}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addrs, _ := net.DefaultResolver.LookupHost(ctx, host)
	var out []string
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			out = append(out, ip.String())
		}
	}
	return out
}

// listens are the proxies' API listen addresses, each with its host's addresses where known.
func (g *proxyGroup) listens(ctx context.Context) ([]proxyListen, error) {
	res, err := admin.Each(ctx, g.proxies, func(ctx context.Context, c proxyAdmin) (admin.Status, error) { return c.Status(ctx) })
	if err != nil {
		return nil, err
	}
	var out []proxyListen
	for _, r := range res {
		out = append(out, proxyListen{proxy: r.Proxy, listen: r.Value.Listen, hostIPs: proxyHostIPs(ctx, r.Proxy)})
	}
	return out, nil
}

// proxyHostIPs are the addresses of a proxy's host, from its name in the plan: an admin
// address's host, or this host's for an admin socket.
func proxyHostIPs(ctx context.Context, name string) []string {
	if u, err := url.Parse(name); err == nil && u.Scheme != "" && u.Host != "" {
		return hostIPs(ctx, u.Hostname())
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP.String())
		}
	}
	return out
}
