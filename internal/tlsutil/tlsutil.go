// Package tlsutil holds the TLS helpers the proxy, the cutover and the CLI share.
package tlsutil

import (
	"crypto/x509"
	"fmt"
	"io"
	"os"
)

// maxCABundleBytes bounds a CA bundle (a system bundle of every public root is ~200 KB).
const maxCABundleBytes = 1 << 20

// LoadCAPool reads a PEM bundle into a certificate pool; a file with no certificate is an error.
// The bundle must be a regular file of at most 1 MiB: its path may come over the admin API, and
// a device such as /dev/zero would otherwise be read until memory runs out.
func LoadCAPool(path string) (*x509.CertPool, error) {
	pem, err := ReadCABundle(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", path)
	}
	return pool, nil
}

// ReadCABundle reads a regular file of at most 1 MiB. It is checked before it is opened
// (opening a FIFO would block) and again once open (it may have been replaced).
func ReadCABundle(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	if err := checkCABundle(path, fi); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	if err := checkCABundle(path, fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxCABundleBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	if len(b) > maxCABundleBytes {
		return nil, errTooLarge(path)
	}
	return b, nil
}

func checkCABundle(path string, fi os.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("CA bundle %s is not a regular file (mode %v): give the path of a PEM file of CA certificates", path, fi.Mode())
	}
	if fi.Size() > maxCABundleBytes {
		return errTooLarge(path)
	}
	return nil
}

func errTooLarge(path string) error {
	return fmt.Errorf("CA bundle %s is larger than %d bytes: give the path of a PEM file of CA certificates", path, maxCABundleBytes)
}
