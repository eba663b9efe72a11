package backendurl

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		raw, want, err string
	}{
		{raw: "https://10.0.0.1:6443", want: "https://10.0.0.1:6443"},
		{raw: "https://10.0.0.1:6443/", want: "https://10.0.0.1:6443"},
		// Host names are case-insensitive: one spelling, the one a cutover plan is read in.
		{raw: "HTTPS://CP1.Corp.Example:6443", want: "https://cp1.corp.example:6443"},
		{raw: "https://[FE80::1]:6443", want: "https://[fe80::1]:6443"},
		{raw: "https://[FE80::1%25Eth0]:6443", want: "https://[fe80::1%25Eth0]:6443"},
		{raw: "ftp://x", err: "scheme must be https"},
		{raw: "https://", err: "has no host"},
		{raw: "https://admin:s3cret@10.0.0.1", err: "user name or password"},
		{raw: "https://10.0.0.1/api", err: "no path or query"},
		{raw: "https://10.0.0.1#x", err: "no fragment"},
		{raw: "https://u:s3cret@[::1", err: "does not parse"},
	} {
		u, err := Parse(tc.raw)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Parse(%q) = %v, %v; want an error with %q", tc.raw, u, err, tc.err)
		case tc.err != "" && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("Parse(%q)'s error shows the password: %v", tc.raw, err)
		case tc.err == "" && (err != nil || u.String() != tc.want):
			t.Errorf("Parse(%q) = %v, %v; want %s", tc.raw, u, err, tc.want)
		}
	}
}

func TestAllowed(t *testing.T) {
	const upstream = "https://127.0.0.1:6443"
	patterns := []string{"https://127.0.0.1:*", "https://10.0.0.11:7443", "https://green.example"}
	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"https://127.0.0.1:6443", true},
		{"https://127.0.0.1:7443", true},
		{"http://127.0.0.1:7443", false},
		{"https://10.0.0.11:7443", true},
		{"https://10.0.0.12:7443", false},
		{"https://10.0.0.11:6443", false},
		{"https://GREEN.example:443", true},
		{"https://green.example", true},
		{"https://green.example:8443", false},
	} {
		u, err := Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := Allowed(upstream, patterns, u); got != tc.want {
			t.Errorf("Allowed(%s) = %v, want %v", tc.url, got, tc.want)
		}
	}
	if u, _ := Parse("https://cp1.example:6443"); !Allowed("https://CP1.Example:6443", nil, u) {
		t.Error("--upstream https://CP1.Example:6443: want https://cp1.example:6443 (the same host) allowed")
	}
	u, _ := Parse("https://10.0.0.10:6443")
	if !Allowed("https://10.0.0.10:6443", nil, u) || Allowed("", nil, u) {
		t.Error("--upstream alone: want it allowed, and nothing without it")
	}
}
