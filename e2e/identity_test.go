//go:build e2e

package e2e

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kubefence/kubefence/e2e/framework"

	"github.com/kubefence/kubefence/internal/tlsutil"
)

// TestIdentity proves the proxy is a drop-in for a TLS-terminating load balancer: client
// certificates log in as themselves (forwarded with front-proxy headers), a client cannot
// choose its identity with headers, bearer tokens pass untouched, and the fence treats
// certificate and token clients alike.
func TestIdentity(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "kube-apiserver", framework.Kube136, "kubectl", framework.Kube136)
	ctx := t.Context()
	env := newEnv(t)
	pki, err := framework.NewPKI(filepath.Join(env.Dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	blue, px := startBehindProxy(t, env, pki, "blue", framework.EtcdConfig{Version: framework.Etcd34})

	// The admin client certificate (kubeadm's admin.conf shape), through the proxy.
	kc := px.Kubeconfig
	mustKubectl(t, kc, "create", "namespace", "ident")
	mustKubectl(t, kc, "-n", "ident", "create", "configmap", "c1")
	if out := mustKubectl(t, kc, "auth", "can-i", "create", "pods", "-n", "ident"); strings.TrimSpace(out) != "yes" {
		t.Fatalf("auth can-i = %q", out)
	}
	var who authenticationv1.SelfSubjectReview
	if err := json.Unmarshal([]byte(mustKubectl(t, kc, "auth", "whoami", "-o", "json")), &who); err != nil {
		t.Fatal(err)
	}
	if who.Status.UserInfo.Username != "kubernetes-admin" || !contains(who.Status.UserInfo.Groups, "system:masters") {
		t.Fatalf("whoami through the proxy = %+v, want the certificate's user and groups", who.Status.UserInfo)
	}
	cs, _, err := framework.ClientsetFor(kc)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().ConfigMaps("ident").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	mustKubectl(t, kc, "-n", "ident", "create", "configmap", "c2")
	// The watch through the proxy shows the new configmap: a watch that closes, fails or stays
	// silent fails the test.
	watchDeadline := time.After(30 * time.Second)
	for seen := false; !seen; {
		select {
		case ev, open := <-w.ResultChan():
			if !open {
				t.Fatal("the watch through the proxy closed before it showed configmap c2")
			}
			if ev.Type == watch.Error {
				t.Fatalf("the watch through the proxy failed: %v", apierrors.FromObject(ev.Object))
			}
			cm, ok := ev.Object.(*corev1.ConfigMap)
			seen = ok && ev.Type == watch.Added && cm.Name == "c2"
		case <-watchDeadline:
			t.Fatal("the watch through the proxy did not show configmap c2 within 30s")
		}
	}

	// A certificate user without RBAC rights is refused by the apiserver: the identity is the
	// client's, not the proxy's.
	bobCert, bobKey, err := pki.IssueClient("bob", "bob", "developers")
	if err != nil {
		t.Fatal(err)
	}
	bobKC := filepath.Join(env.Dir, "bob.kubeconfig")
	if err := framework.WriteKubeconfig(bobKC, px.URL, pki.CACert, bobCert, bobKey, ""); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := framework.Kubectl(ctx, bobKC, "-n", "ident", "get", "configmaps")
	if err == nil || !strings.Contains(errOut, `User "bob" cannot list resource "configmaps"`) {
		t.Fatalf("bob without RBAC: err=%v stderr=%s", err, errOut)
	}

	// Headers cannot buy an identity: without a certificate, X-Remote-User is stripped and the
	// request is anonymous.
	code, body := rawGet(t, px.URL+"/api/v1/namespaces/ident/configmaps", pki.CACert, nil, "X-Remote-User", "system:admin", "X-Remote-Group", "system:masters")
	if code != http.StatusForbidden || !strings.Contains(body, "system:anonymous") {
		t.Fatalf("spoofed X-Remote-User without a certificate: %d %s", code, body)
	}
	// ... and not with a certificate either: the certificate's identity wins.
	bobPair, err := tls.LoadX509KeyPair(bobCert, bobKey)
	if err != nil {
		t.Fatal(err)
	}
	code, body = rawGet(t, px.URL+"/api/v1/namespaces/ident/configmaps", pki.CACert, &bobPair, "X-Remote-User", "system:admin", "X-Remote-Group", "system:masters")
	if code != http.StatusForbidden || !strings.Contains(body, `User \"bob\"`) {
		t.Fatalf("spoofed X-Remote-User with bob's certificate: %d %s", code, body)
	}

	// A service-account bearer token passes unchanged.
	if _, err := blue.cs.CoreV1().ServiceAccounts("ident").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A Role of its own: the aggregated edit/view roles need kube-controller-manager.
	if _, err := blue.cs.RbacV1().Roles("ident").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := blue.cs.RbacV1().RoleBindings("ident").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "robot-configmaps"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "configmaps"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "robot", Namespace: "ident"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC authorizes from an informer's cache: the binding counts once the apiserver says so.
	waitForT(t, 30*time.Second, "the apiserver's RBAC to see robot's binding", func() bool {
		r, err := blue.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:ident:robot",
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "ident", Verb: "get", Resource: "configmaps"},
		}}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
	tok, err := blue.cs.CoreV1().ServiceAccounts("ident").CreateToken(ctx, "robot", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	robotKC := filepath.Join(env.Dir, "robot.kubeconfig")
	if err := framework.WriteKubeconfig(robotKC, px.URL, pki.CACert, "", "", tok.Status.Token); err != nil {
		t.Fatal(err)
	}
	if out := mustKubectl(t, robotKC, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"); out != "system:serviceaccount:ident:robot" {
		t.Fatalf("service account whoami through the proxy = %q", out)
	}
	mustKubectl(t, robotKC, "-n", "ident", "get", "configmaps", "c1")

	// The fence treats certificate and token clients alike.
	adminPair, err := tls.LoadX509KeyPair(pki.AdminCert, pki.AdminKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := px.CLI(ctx, "fence", "on", "--reason", "identity"); err != nil {
		t.Fatal(err)
	}
	post := func(cert *tls.Certificate, token, name string) int {
		code, _ := rawDo(t, "POST", px.URL+"/api/v1/namespaces/ident/configmaps", pki.CACert, cert,
			`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"`+name+`"}}`, "Authorization", token)
		return code
	}
	if c1, c2 := post(&adminPair, "", "fenced-cert"), post(nil, "Bearer "+tok.Status.Token, "fenced-token"); c1 != 429 || c2 != 429 {
		t.Fatalf("fenced writes: certificate %d, token %d; want 429 both", c1, c2)
	}
	for _, name := range []string{"fenced-cert", "fenced-token"} {
		_, err := blue.cs.CoreV1().ConfigMaps("ident").Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			t.Fatalf("fenced write %s reached the apiserver", name)
		}
		if !apierrors.IsNotFound(err) {
			t.Fatalf("looking for fenced write %s on the apiserver: %v, want not found", name, err)
		}
	}
	if _, _, err := px.CLI(ctx, "fence", "off"); err != nil {
		t.Fatal(err)
	}
	if c1, c2 := post(&adminPair, "", "open-cert"), post(nil, "Bearer "+tok.Status.Token, "open-token"); c1 != 201 || c2 != 201 {
		t.Fatalf("writes after fence off: certificate %d, token %d; want 201 both", c1, c2)
	}
	// The proxy's log is flushed every 100 ms.
	var logs []byte
	waitForT(t, 5*time.Second, "the refusal log names the certificate user", func() bool {
		logs, _ = os.ReadFile(px.Proc.LogPath)
		return strings.Contains(string(logs), "user=kubernetes-admin")
	})
	if strings.Contains(string(logs), tok.Status.Token) {
		t.Errorf("a bearer token reached the proxy's logs")
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func rawGet(t *testing.T, url, caFile string, cert *tls.Certificate, hdr ...string) (int, string) {
	return rawDo(t, "GET", url, caFile, cert, "", hdr...)
}

func rawDo(t *testing.T, method, url, caFile string, cert *tls.Certificate, body string, hdr ...string) (int, string) {
	t.Helper()
	pool, err := tlsutil.LoadCAPool(caFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: pool}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] != "" {
			req.Header.Add(hdr[i], hdr[i+1])
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp.StatusCode, string(b)
}
