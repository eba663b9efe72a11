package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Loopback is a PKI made for one run of a server on 127.0.0.1 that kubefence starts and talks
// to itself: a CA of its own, the server's certificate for 127.0.0.1, and a client certificate
// with a common name of kubefence's choice. The server's files are in Dir (0700, keys 0600);
// Close removes them. Nothing outside the run trusts the CA, and its key never leaves Dir.
type Loopback struct {
	Dir                       string
	CAFile, CertFile, KeyFile string      // for the server: its trusted CA, certificate, key
	Client                    *tls.Config // trusts only the CA; presents the client certificate
	caCert                    *x509.Certificate
	caKey                     *ecdsa.PrivateKey
}

// loopbackValidity is how long a Loopback's certificates are valid: a run lasts minutes; a
// day leaves room for a clock that moves.
const loopbackValidity = 24 * time.Hour

// NewLoopback makes a Loopback in a new temporary directory, its client certificate with the
// common name clientCN.
func NewLoopback(clientCN string) (*Loopback, error) {
	dir, err := os.MkdirTemp("", "kubefence-tls-")
	if err != nil {
		return nil, fmt.Errorf("loopback TLS: %w", err)
	}
	l := &Loopback{Dir: dir, CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key")}
	if err := l.make(clientCN); err != nil {
		return nil, errors.Join(fmt.Errorf("loopback TLS: %w", err), l.Close())
	}
	return l, nil
}

// Close removes the server's files.
func (l *Loopback) Close() error { return os.RemoveAll(l.Dir) }

func (l *Loopback) make(clientCN string) error {
	ca := &x509.Certificate{Subject: pkix.Name{CommonName: "kubefence loopback CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, caKey, err := l.issue(ca)
	if err != nil {
		return err
	}
	if l.caCert, err = x509.ParseCertificate(caDER); err != nil {
		return err
	}
	l.caKey = caKey
	if err := writePEM(l.CAFile, "CERTIFICATE", caDER); err != nil {
		return err
	}
	server := &x509.Certificate{Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	serverDER, serverKey, err := l.issue(server)
	if err != nil {
		return err
	}
	if err := writePEM(l.CertFile, "CERTIFICATE", serverDER); err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return err
	}
	if err := writePEM(l.KeyFile, "EC PRIVATE KEY", keyDER); err != nil {
		return err
	}
	client := &x509.Certificate{Subject: pkix.Name{CommonName: clientCN},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	clientDER, clientKey, err := l.issue(client)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AddCert(l.caCert)
	l.Client = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool,
		Certificates: []tls.Certificate{{Certificate: [][]byte{clientDER}, PrivateKey: clientKey}}}
	return nil
}

// issue makes a key for tmpl and signs it with the CA (the CA itself, before there is one).
func (l *Loopback) issue(tmpl *x509.Certificate) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)); err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(loopbackValidity)
	parent, signer := tmpl, key
	if l.caCert != nil {
		parent, signer = l.caCert, l.caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	return der, key, err
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
