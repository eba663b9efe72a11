package cutover

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdKillsGreen: a cutover run as a systemd service that systemd stops by killing its
// control group is refused (green's processes are in it, and die when the command ends); run
// with KillMode=process, from a terminal's scope or with no systemd it goes on; an unreadable
// KillMode is a note.
func TestSystemdKillsGreen(t *testing.T) {
	cases := []struct {
		name, cgroup, mode string
		modeErr            error
		external           bool
		wantErr, wantNote  string
	}{
		{"a service killed as a group", "0::/system.slice/kubefence-cutover.service\n", "control-group", nil, false, "KillMode=control-group", ""},
		{"mixed", "0::/system.slice/run-r1.service\n", "mixed", nil, false, "KillMode=mixed", ""},
		{"cgroup v1", "9:name=systemd:/system.slice/kubefence-cutover.service\n4:memory:/x\n", "control-group", nil, false, "KillMode=control-group", ""},
		{"a user manager's unit", "0::/user.slice/user-0.slice/user@0.service/app.slice/kc.service\n", "process", nil, false, "", ""},
		{"KillMode=process", "0::/system.slice/kubefence-cutover.service\n", "process", nil, false, "", ""},
		{"a terminal's scope", "0::/user.slice/user-1000.slice/session-3.scope\n", "control-group", nil, false, "", ""},
		{"no systemd", "0::/\n", "", nil, false, "", ""},
		{"unreadable KillMode", "0::/system.slice/kubefence-cutover.service\n", "", errors.New("no systemctl"), false, "", "could not be read"},
		{"nothing started here", "0::/system.slice/kubefence-cutover.service\n", "control-group", nil, true, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "cgroup")
			if err := os.WriteFile(file, []byte(tc.cgroup), 0o600); err != nil {
				t.Fatal(err)
			}
			wasFile, wasMode := cgroupFile, killModeOf
			t.Cleanup(func() { cgroupFile, killModeOf = wasFile, wasMode })
			cgroupFile = file
			killModeOf = func(_ context.Context, unit string, user bool) (string, error) {
				if user != strings.Contains(tc.cgroup, "user@") {
					t.Errorf("unit %s asked of the user manager: %v", unit, user)
				}
				return tc.mode, tc.modeErr
			}
			p, _ := validPlan(t)
			if tc.external {
				p.Green.Etcd.Members = nil
				p.Green.APIServer.Command = nil
			}
			note, err := checkSystemdKillMode(t.Context(), p)
			if (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
			if (tc.wantNote == "") != (note == "") || !strings.Contains(note, tc.wantNote) {
				t.Errorf("note %q, want %q", note, tc.wantNote)
			}
		})
	}
}
