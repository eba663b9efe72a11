// Package tlsutil holds the TLS helpers the proxy, the cutover and the CLI share.
package tlsutil

import (
	"crypto/x509"
	"fmt"
	"os"
)

// LoadCAPool reads a PEM bundle into a certificate pool; a file with no certificate is an error.
func LoadCAPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", path)
	}
	return pool, nil
}
