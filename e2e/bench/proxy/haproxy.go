package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
)

// startHAProxy starts HAProxy as the peer: TLS termination offering HTTP/2 and HTTP/1.1 (as a
// load balancer in front of apiservers does), HTTP/1.1 with connection reuse to the backend,
// and, when fenced, the same read-only fence as kubefence's. It returns the URL and the pid.
func startHAProxy(env *framework.Env, bin string, pki *framework.PKI, backendURL, name string, fenced bool) (string, int, error) {
	ports, err := framework.FreePorts(1)
	if err != nil {
		return "", 0, err
	}
	pem := filepath.Join(env.Dir, name+".pem")
	var combined []byte
	for _, f := range []string{pki.ProxyServingCert, pki.ProxyServingKey} {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", 0, err
		}
		combined = append(combined, b...)
	}
	if err := os.WriteFile(pem, combined, 0o600); err != nil {
		return "", 0, err
	}
	fence := ""
	if fenced {
		fence = `  http-request return status 429 content-type application/json hdr Retry-After 5 string "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"fenced\",\"reason\":\"TooManyRequests\",\"code\":429}" if !read` + "\n"
	}
	cfg := fmt.Sprintf(`global
  nbthread 2
  maxconn 4000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
frontend api
  bind 127.0.0.1:%d ssl crt %s alpn h2,http/1.1
  acl read method GET HEAD
%s  default_backend apiserver
backend apiserver
  http-reuse always
  server blue %s ssl verify required ca-file %s
`, ports[0], pem, fence, strings.TrimPrefix(backendURL, "https://"), pki.CACert)
	cfgPath := filepath.Join(env.Dir, name+".cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return "", 0, err
	}
	proc, err := env.Start(name, bin, []string{"-db", "-f", cfgPath})
	if err != nil {
		return "", 0, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = framework.WaitUntil(ctx, 50*time.Millisecond, name+" listening", func(context.Context) (bool, error) {
		if err := proc.ExitError(); err != nil {
			b, _ := os.ReadFile(proc.LogPath)
			return false, fmt.Errorf("%w:\n%s", err, b)
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, err
		}
		c.Close()
		return true, nil
	})
	return "https://" + addr, proc.Pid(), err
}

func haproxyVersion(bin string) string {
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	if len(f) > 2 {
		return f[2]
	}
	return "?"
}
