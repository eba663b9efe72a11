//go:build e2e

package e2e

import (
	"net/http"

	"k8s.io/client-go/rest"
)

func restHTTPClient(cfg *rest.Config) (*http.Client, error) { return rest.HTTPClientFor(cfg) }
