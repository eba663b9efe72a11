package datadir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// fakeEtcd writes binDir/etcd-<name> as a script whose --version says reports.
func fakeEtcd(t *testing.T, binDir, name, reports string) {
	t.Helper()
	script := fmt.Sprintf("#!/bin/sh\nprintf 'etcd Version: %s\\nGit SHA: x\\nGo Version: go1.26\\n'\n", reports)
	if err := os.WriteFile(filepath.Join(binDir, "etcd-"+name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestFindBinary(t *testing.T) {
	// Every dir holds two 3.5 patches whose names sort the other way lexically, and a 3.6;
	// "liar" adds a newer 3.5 that reports another version, "noise" names that are no version
	// (each would be the newest 3.5 if it were taken for one).
	honest := map[string]string{"3.5.9": "3.5.9", "3.5.35": "3.5.35", "3.6.16": "3.6.16"}
	liar := map[string]string{"3.5.9": "3.5.9", "3.5.35": "3.5.35", "3.6.16": "3.6.16", "3.5.99": "3.5.98"}
	noise := map[string]string{"3.5.9": "3.5.9", "3.5.35": "3.5.35", "3.6.16": "3.6.16", "3.5": "3.5.100", "3.5.100.1": "3.5.100", "3.5.0100": "3.5.100"}
	for _, tc := range []struct {
		name    string
		bins    map[string]string // file name suffix → version it reports
		noDir   bool              // binDir ""
		want    Version
		exact   bool
		wantBin string // file name chosen
		wantErr []string
	}{
		{name: "exact 3.6", bins: liar, want: Version{3, 6, 16}, exact: true, wantBin: "etcd-3.6.16"},
		{name: "exact older patch", bins: liar, want: Version{3, 5, 9}, exact: true, wantBin: "etcd-3.5.9"},
		{name: "minor: newest patch, numerically", bins: honest, want: Version{3, 5, 0}, wantBin: "etcd-3.5.35"},
		{name: "minor: the patch asked for does not matter", bins: honest, want: Version{3, 5, 9}, wantBin: "etcd-3.5.35"},
		{name: "minor: misnamed files are ignored", bins: noise, want: Version{3, 5, 0}, wantBin: "etcd-3.5.35"},
		{name: "minor: the newest patch lies", bins: liar, want: Version{3, 5, 0},
			wantErr: []string{"etcd-3.5.99 reports", "etcd Version: 3.5.98", "not etcd Version: 3.5.99"}},
		{name: "exact: the binary lies", bins: liar, want: Version{3, 5, 99}, exact: true,
			wantErr: []string{"etcd-3.5.99 reports", "not etcd Version: 3.5.99"}},
		{name: "exact: missing patch", bins: honest, want: Version{3, 6, 15}, exact: true,
			wantErr: []string{"has no etcd-3.6.15 binary", "it has etcd-3.6.16, etcd-3.5.35, etcd-3.5.9)"}},
		{name: "minor: missing minor", bins: liar, want: Version{3, 7, 0},
			wantErr: []string{"has no etcd-3.7.* binary", "it has etcd-3.6.16, etcd-3.5.99, etcd-3.5.35, etcd-3.5.9)"}},
		{name: "empty bin dir", bins: map[string]string{}, want: Version{3, 5, 0},
			wantErr: []string{"has no etcd-3.5.* binary", "no etcd-<version> binaries"}},
		{name: "no bin dir", noDir: true, want: Version{3, 5, 0}, wantErr: []string{"--bin-dir is required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			binDir := t.TempDir()
			for name, reports := range tc.bins {
				fakeEtcd(t, binDir, name, reports)
			}
			arg := binDir
			if tc.noDir {
				arg = ""
			}
			b, err := findBinary(context.Background(), arg, tc.want, tc.exact)
			if tc.wantErr != nil {
				assertErrContains(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := Binary{Path: filepath.Join(binDir, tc.wantBin), Version: mustParseVersion(t, tc.wantBin[len("etcd-"):])}
			if b != want {
				t.Fatalf("findBinary = %+v, want %+v", b, want)
			}
		})
	}
}

func TestCheckBinaryFails(t *testing.T) {
	binDir := t.TempDir()
	failing := filepath.Join(binDir, "etcd-3.5.9")
	if err := os.WriteFile(failing, []byte("#!/bin/sh\necho 'flag provided but not defined' >&2\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := checkBinary(context.Background(), Binary{Path: failing, Version: Version{3, 5, 9}})
	assertErrContains(t, err, failing+" --version", "exit status 2", "flag provided but not defined")

	// A version that only starts with the one asked for is not it.
	prefixed := filepath.Join(binDir, "etcd-3.5.1")
	if err := os.WriteFile(prefixed, []byte("#!/bin/sh\nprintf 'etcd Version: 3.5.10\\n'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err = checkBinary(context.Background(), Binary{Path: prefixed, Version: Version{3, 5, 1}})
	assertErrContains(t, err, `reports "etcd Version: 3.5.10"`)
}

func mustParseVersion(t *testing.T, s string) Version {
	t.Helper()
	v, err := ParseVersion(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestLogTailKeepsWhyEtcdDied: etcd's panic or fatal line comes before its stack trace, which
// fills the last lines of its log; the tail an error quotes must still say why it died.
func TestLogTailKeepsWhyEtcdDied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etcd.log")
	lines := []string{`{"level":"info","msg":"starting"}`, `{"level":"panic","msg":"detected disallowed v2 WAL for stage --v2-deprecation=write-only","method":"QGET"}`, "panic: detected disallowed v2 WAL"}
	for i := range 30 {
		lines = append(lines, fmt.Sprintf("\tgo.etcd.io/etcd/server/v3/etcdserver.frame%d()", i))
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tail := logTail(path, 12)
	if !strings.Contains(tail, "detected disallowed v2 WAL for stage") {
		t.Errorf("tail %q does not say why etcd died", tail)
	}
	if !strings.Contains(tail, "frame29") {
		t.Errorf("tail %q lost the log's last line", tail)
	}
	// A later run in the same log (a resumed step) that failed otherwise is not given the
	// earlier run's reason.
	later := append(lines, `### 2026-11-26T23:00:00Z kubefence migrate starts ["etcd"]`)
	for i := range 20 {
		later = append(later, fmt.Sprintf(`{"level":"info","msg":"line %d"}`, i))
	}
	if err := os.WriteFile(path, []byte(strings.Join(later, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tail := logTail(path, 12); strings.Contains(tail, "disallowed") {
		t.Errorf("tail %q quotes an earlier run's panic", tail)
	}
}

// TestHealthyStatus: a member holding a NOSPACE or CORRUPT alarm is answered at once with what
// to do (no wait ends an alarm stored in its backend; it waited the whole step timeout and said
// "no leader yet"); a member without a leader yet is waited for.
func TestHealthyStatus(t *testing.T) {
	cases := []struct {
		name      string
		st        clientv3.StatusResponse
		wantErr   string
		wantAlarm bool
	}{
		{"healthy", clientv3.StatusResponse{Leader: 1}, "", false},
		{"no leader yet", clientv3.StatusResponse{}, "no leader yet", false},
		{"NOSPACE", clientv3.StatusResponse{Leader: 1, Errors: []string{"memberID:1 alarm:NOSPACE "}}, "alarm disarm", true},
		{"CORRUPT", clientv3.StatusResponse{Leader: 1, Errors: []string{"memberID:1 alarm:CORRUPT "}}, "CORRUPT", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := healthyStatus(&tc.st)
			if (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("healthyStatus = %v, want %q", err, tc.wantErr)
			}
			var alarm *alarmError
			if errors.As(err, &alarm) != tc.wantAlarm {
				t.Errorf("healthyStatus = %v: an alarm is %v, want %v", err, !tc.wantAlarm, tc.wantAlarm)
			}
		})
	}
}
