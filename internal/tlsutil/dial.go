package tlsutil

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"
)

// DialFunc makes a connection, as net.Dialer.DialContext does.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// HandshakeDialer returns a dial for an http.Transport's DialTLSContext: it connects with dial,
// then makes the TLS handshake with a copy of config() (asked at each dial: net/http fills a
// transport's protocol names in on its first use) within timeout (0: only ctx bounds it). A
// handshake that failed or timed out is a dial's error (*net.OpError, Op "dial"), as the
// connection's own failure would be: no request was sent on it (NotSent), which net/http's own
// handshake says only in its timeout's text.
func HandshakeDialer(dial DialFunc, config func() *tls.Config, timeout time.Duration) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := config().Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		c := tls.Client(raw, cfg)
		if err := c.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("TLS handshake with %s: %w", addr, err)}
		}
		return c, nil
	}
}

// NotSent says whether err, from sending a request, came before the peer could read any of it:
// the connection was not made (a dial's error, which HandshakeDialer makes of a failed
// handshake), or the peer's certificate did not verify. fresh says the request was the first on
// its connection (a client that never reuses one): then a fatal alert from the peer (ours not
// trusted: with TLS 1.3 that alert arrives once the request is written, but the peer read none
// of it) counts too. On a connection that carried other requests an alert may come after the
// peer acted on this one. Such a request may be sent again, as it is.
func NotSent(err error, fresh bool) bool {
	var op *net.OpError
	var verify *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &op) && (op.Op == "dial" || fresh && op.Op == "remote error") ||
		errors.As(err, &verify) || errors.As(err, &unknownCA) || errors.As(err, &host) || errors.As(err, &invalid)
}
