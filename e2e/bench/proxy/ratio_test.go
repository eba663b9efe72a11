package main

import (
	"testing"
	"time"
)

// TestRatio: a ratio of added latencies is printed only when both are positive: with the peer
// adding nothing, or less than nothing (the direct path slower in that run), "0.00x" or a
// negative ratio read as a target met.
func TestRatio(t *testing.T) {
	cases := []struct {
		a, b time.Duration
		want string
	}{
		{3 * time.Millisecond, 2 * time.Millisecond, "1.50x"},
		{5 * time.Millisecond, -time.Millisecond, "n/a"},
		{5 * time.Millisecond, 0, "n/a"},
		{-time.Millisecond, 2 * time.Millisecond, "n/a"},
		{0, 2 * time.Millisecond, "0.00x"},
	}
	for _, tc := range cases {
		if got := ratio(tc.a, tc.b); len(got) < len(tc.want) || got[:len(tc.want)] != tc.want {
			t.Errorf("ratio(%s, %s) = %q, want %q", tc.a, tc.b, got, tc.want)
		}
	}
}
