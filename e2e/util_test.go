//go:build e2e

package e2e

import (
	"io"
	"net/http"

	"go.yaml.in/yaml/v3"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubefence/kubefence/e2e/framework"
)

func restHTTPClient(cfg *rest.Config) (*http.Client, error) { return rest.HTTPClientFor(cfg) }

func clientsetsFor(kubeconfig string) (*rest.Config, *kubernetes.Clientset, error) {
	cs, cfg, err := framework.ClientsetFor(kubeconfig)
	return cfg, cs, err
}

func yamlMarshal(v any) ([]byte, error) { return yaml.Marshal(v) }

func io_Copy(r io.Reader) (int64, error) { return io.Copy(io.Discard, r) }
