package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"testing"
)

// TestNotSent: what says a request never reached the peer, through the wrapping net/http adds.
func TestNotSent(t *testing.T) {
	alert := &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}
	cases := []struct {
		name  string
		err   error
		fresh bool
		want  bool
	}{
		{"dial refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, false, true},
		{"handshake failed (HandshakeDialer)", &net.OpError{Op: "dial", Err: fmt.Errorf("TLS handshake with x: %w", errors.New("EOF"))}, false, true},
		{"peer refused our certificate, first request", alert, true, true},
		// On a connection that carried others, the alert may come after the peer acted.
		{"an alert on a reused connection", alert, false, false},
		{"peer's certificate not verified", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, false, true},
		{"wrong host name", x509.HostnameError{Host: "x"}, false, true},
		{"read failed after the request left", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, true, false},
		{"write failed", &net.OpError{Op: "write", Err: errors.New("broken pipe")}, true, false},
		{"plain EOF", errors.New("EOF"), true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wrapped := fmt.Errorf("Get \"https://x/\": %w", tc.err)
			if got := NotSent(wrapped, tc.fresh); got != tc.want {
				t.Errorf("NotSent(%v, fresh %v) = %v, want %v", wrapped, tc.fresh, got, tc.want)
			}
		})
	}
}
