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
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"dial refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{"handshake failed (HandshakeDialer)", &net.OpError{Op: "dial", Err: fmt.Errorf("TLS handshake with x: %w", errors.New("EOF"))}, true},
		{"peer refused our certificate", &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, true},
		{"peer's certificate not verified", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, true},
		{"wrong host name", x509.HostnameError{Host: "x"}, true},
		{"read failed after the request left", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, false},
		{"write failed", &net.OpError{Op: "write", Err: errors.New("broken pipe")}, false},
		{"plain EOF", errors.New("EOF"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wrapped := fmt.Errorf("Get \"https://x/\": %w", tc.err)
			if got := NotSent(wrapped); got != tc.want {
				t.Errorf("NotSent(%v) = %v, want %v", wrapped, got, tc.want)
			}
		})
	}
}
