package cutover

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strings"
	"time"
)

// cgroupFile and killModeOf are where the preflight learns whether kubefence runs as a systemd
// service, and how systemd stops it: variables for the tests.
var (
	cgroupFile = "/proc/self/cgroup"
	killModeOf = func(ctx context.Context, unit string, user bool) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		args := []string{"show", "--property=KillMode", "--value", unit}
		if user { // a unit of a user's own manager (user@UID.service)
			args = append([]string{"--user"}, args...)
		}
		out, err := exec.CommandContext(ctx, "systemctl", args...).Output()
		return strings.TrimSpace(string(out)), err
	}
)

// checkSystemdKillMode refuses a cutover run as a systemd service that systemd stops by killing
// its whole control group (KillMode control-group, the default, or mixed): green's etcd and
// apiserver, started by kubefence in their own session, are still in that group, and systemd
// kills them when the command ends (a cutover done, a bake finished) or the unit is stopped,
// taking down the cluster green now serves. The note says what could not be told.
func checkSystemdKillMode(ctx context.Context, p *Plan) (note string, err error) {
	if !startsProcessesHere(p) {
		return "", nil
	}
	unit, user := serviceUnit(cgroupFile)
	if unit == "" {
		return "", nil
	}
	mode, err := killModeOf(ctx, unit, user)
	if err != nil || mode == "" {
		return fmt.Sprintf("kubefence runs in systemd unit %s, whose KillMode could not be read (%v): unless it is KillMode=process, systemd kills the green processes kubefence starts when this command ends or the unit stops", unit, err), nil
	}
	if mode != "control-group" && mode != "mixed" {
		return "", nil
	}
	return "", fmt.Errorf("kubefence runs in systemd unit %s with KillMode=%s: when this command ends (done, or a bake finished) or the unit is stopped, systemd kills every process in its control group, the green etcd and apiserver kubefence starts among them, and the cluster green serves goes down: run it with 'systemd-run --unit kubefence-cutover -p KillMode=process -p WorkingDirectory=\"$PWD\" kubefence cutover --plan PLAN' (or KillMode=process in its unit), or in tmux or screen", unit, mode)
}

// systemdNote is checkSystemdKillMode for a run that leaves green serving (a rehearsal stops
// what it started itself), its note as the preflight's detail ends with one.
func (r *runner) systemdNote(ctx context.Context) (string, error) {
	if r.j.Rehearse {
		return "", nil
	}
	note, err := checkSystemdKillMode(ctx, r.p)
	if note != "" {
		note = "; " + note
	}
	return note, err
}

// startsProcessesHere says whether the cutover starts processes on this host that must outlive
// it: a green etcd member of this host, or green apiservers by command.
func startsProcessesHere(p *Plan) bool {
	for _, m := range p.Green.Etcd.Members {
		if !m.External {
			return true
		}
	}
	for _, a := range p.greenAPIServers() {
		if len(a.Command) > 0 {
			return true
		}
	}
	return false
}

// serviceUnit is the systemd service whose control group this process is in ("" if none: a
// terminal's session scope, a container, no systemd), read from file (/proc/self/cgroup): the
// unified hierarchy's line, else the named systemd one; user says it is a unit of a user's own
// manager (under user@UID.service).
func serviceUnit(file string) (unit string, user bool) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", false
	}
	group := ""
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if (parts[0] == "0" && parts[1] == "") || (parts[1] == "name=systemd" && group == "") {
			group = parts[2]
		}
	}
	if leaf := path.Base(group); strings.HasSuffix(leaf, ".service") {
		return leaf, strings.Contains(path.Dir(group), "/user@")
	}
	return "", false
}
