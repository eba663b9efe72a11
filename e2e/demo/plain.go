package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
	"github.com/kubefence/kubefence/internal/tlsutil"
)

// plainWriter creates configmaps with a plain HTTP client that never retries, as scripts, curl
// and the official Python client's POSTs do: a 429 is a failed write to it.
type plainWriter struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	names  []string
	errs   []error
}

func startPlainWriter(ctx context.Context, proxyURL string, pki *framework.PKI) (*plainWriter, error) {
	pool, err := tlsutil.LoadCAPool(pki.CACert)
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(pki.AdminCert, pki.AdminKey)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	ctx, cancel := context.WithCancel(ctx)
	w := &plainWriter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := 0; ctx.Err() == nil; i++ {
			name := fmt.Sprintf("plain-%05d", i)
			err := w.create(hc, proxyURL, name)
			w.mu.Lock()
			if err != nil {
				w.errs = append(w.errs, err)
			} else {
				w.names = append(w.names, name)
			}
			w.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w, nil
}

func (w *plainWriter) create(hc *http.Client, proxyURL, name string) error {
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q}}`, name)
	resp, err := hc.Post(proxyURL+"/api/v1/namespaces/demo/configmaps", "application/json", bytes.NewBufferString(body))
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("create %s: %s", name, resp.Status)
	}
	return nil
}

// stop ends the writer after its current request and returns what it saw.
func (w *plainWriter) stop() (acked []string, errs []error) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.names, w.errs
}
