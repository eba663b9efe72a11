package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// certFiles are the proxy's serving certificate and client CA bundle, reloaded when their files
// change (k8s.io/apiserver's dynamiccertificates: a file watch, and a re-read every minute), so
// that certificates rotate without a restart. A changed file that does not parse is logged and
// the previous content stays in use.
type certFiles struct {
	serving *keyPairFile
	// clientCA is nil without --client-ca-file.
	clientCA *dynamiccertificates.DynamicFileCAContent
}

func loadCertFiles(certFile, keyFile, clientCAFile string) (*certFiles, error) {
	c := &certFiles{}
	var err error
	if c.serving, err = loadKeyPairFile("serving certificate", certFile, keyFile); err != nil {
		return nil, err
	}
	if clientCAFile != "" {
		if c.clientCA, err = dynamiccertificates.NewDynamicCAContentFromFile("client-ca", clientCAFile); err != nil {
			return nil, fmt.Errorf("--client-ca-file: %w", err)
		}
	}
	return c, nil
}

// run watches the files until ctx ends.
func (c *certFiles) run(ctx context.Context) {
	c.serving.run(ctx)
	if c.clientCA != nil {
		go c.clientCA.Run(ctx, 1)
	}
}

func (c *certFiles) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.serving.get(), nil
}

// keyPairFile is a certificate and its key, reloaded when their files change (as certFiles);
// a changed pair that does not parse is logged and the previous one stays in use.
type keyPairFile struct {
	what    string
	content *dynamiccertificates.DynamicCertKeyPairContent
	current atomic.Pointer[tls.Certificate]
}

// loadKeyPairFile loads the pair what names ("serving certificate").
func loadKeyPairFile(what, certFile, keyFile string) (*keyPairFile, error) {
	k := &keyPairFile{what: what}
	var err error
	if k.content, err = dynamiccertificates.NewDynamicServingContentFromFiles(what, certFile, keyFile); err != nil {
		return nil, fmt.Errorf("load %s: %w", what, err)
	}
	if err := k.parse(); err != nil {
		return nil, err
	}
	k.content.AddListener(k)
	return k, nil
}

// Enqueue is called by the content when its files changed and parsed.
func (k *keyPairFile) Enqueue() { _ = k.parse() }

func (k *keyPairFile) parse() error {
	certPEM, keyPEM := k.content.CurrentCertKeyContent()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("load %s: %w", k.what, err)
	}
	k.current.Store(&pair)
	return nil
}

// run watches the files until ctx ends.
func (k *keyPairFile) run(ctx context.Context) { go k.content.Run(ctx, 1) }

// get is the current pair.
func (k *keyPairFile) get() *tls.Certificate { return k.current.Load() }

// clientVerifyOptions are the current client CA bundle's verify options.
func (c *certFiles) clientVerifyOptions() (x509.VerifyOptions, bool) {
	if c.clientCA == nil {
		return x509.VerifyOptions{}, false
	}
	return c.clientCA.VerifyOptions()
}

// serverTLS returns the API listener's TLS config: the current serving certificate and, with a
// client CA, a request for client certificates verified against the current bundle.
func (c *certFiles) serverTLS() *tls.Config {
	base := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.getCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
	}
	if c.clientCA == nil {
		return base
	}
	// Ask for a certificate; verify it if given. Clients without one (tokens, anonymous) are the
	// apiserver's to authenticate.
	base.ClientAuth = tls.VerifyClientCertIfGiven
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		opts, _ := c.clientVerifyOptions()
		cfg.ClientCAs = opts.Roots
		return cfg, nil
	}
	return base
}

// validity is the time window in which every certificate the client presented, and the chain it
// was verified with, is valid.
func validity(peer []*x509.Certificate, chains [][]*x509.Certificate) (notBefore, notAfter time.Time) {
	all := peer
	for _, ch := range chains {
		all = append(all[:len(all):len(all)], ch...)
	}
	for i, cert := range all {
		if i == 0 || cert.NotBefore.After(notBefore) {
			notBefore = cert.NotBefore
		}
		if i == 0 || cert.NotAfter.Before(notAfter) {
			notAfter = cert.NotAfter
		}
	}
	return notBefore, notAfter
}
