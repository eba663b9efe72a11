package cutover

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// stateDirCommands are the cutover's commands that use the plan's state dir, as the CLI calls
// them.
var stateDirCommands = []struct {
	name string
	run  func(ctx context.Context, p *Plan) error
}{
	{"run", func(ctx context.Context, p *Plan) error { _, err := Run(ctx, Options{Plan: p}); return err }},
	{"resume", func(ctx context.Context, p *Plan) error {
		_, err := Run(ctx, Options{Plan: p, Resume: true})
		return err
	}},
	{"abort", func(ctx context.Context, p *Plan) error { _, err := Abort(ctx, Options{Plan: p}); return err }},
	{"cleanup", func(ctx context.Context, p *Plan) error { _, err := Cleanup(ctx, Options{Plan: p}, true); return err }},
	{"rollback", func(ctx context.Context, p *Plan) error { _, err := Rollback(ctx, Options{Plan: p}); return err }},
	{"finish", func(ctx context.Context, p *Plan) error { _, err := Finish(ctx, Options{Plan: p}); return err }},
	{"status", func(ctx context.Context, p *Plan) error { _, err := Status(ctx, p); return err }},
	// The CLI's check of the plan's files before --resume, rollback or finish reads the journal
	// to know which: a FIFO planted as journal.json would block it for ever.
	{"files to go on", func(_ context.Context, p *Plan) error { return p.CheckFilesToGoOn() }},
}

// TestUntrustedStateDirRefused: kubefence, as root, acts on what it reads back from the state
// dir (the journal names the static pod manifest an abort removes, the snapshot green is
// restored from; green's logs go there). One that another user owns or may write to, or below
// a directory they may write to, is refused by every command before it takes the lock or reads
// the journal: a journal planted there, naming a file for the abort to remove, is never acted on.
func TestUntrustedStateDirRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the state dir is given to another user")
	}
	cases := []struct {
		name string
		// prep makes the state dir's trouble: dir is the state dir, which exists.
		prep func(t *testing.T, dir string)
		want string
	}{
		{"another user's", func(t *testing.T, dir string) { chown(t, dir, 65534) }, "belongs to uid 65534"},
		{"writable by all", func(t *testing.T, dir string) { chmod(t, dir, 0o777) }, "others can write"},
		{"below a directory writable by all", func(t *testing.T, dir string) { chmod(t, filepath.Dir(dir), 0o777) }, "others can write"},
	}
	for _, c := range cases {
		for _, cmd := range stateDirCommands {
			t.Run(c.name+"/"+cmd.name, func(t *testing.T) {
				p, dir := validPlan(t)
				p.StateDir = filepath.Join(dir, "shared", "state")
				p.Green.APIServer.StaticPod = &StaticPod{Manifest: filepath.Join(dir, "green.yaml"), ManifestDir: filepath.Join(dir, "manifests")}
				if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
					t.Fatal(err)
				}
				victim := writeFile(t, dir, "victim", "someone's file\n")
				planted := &Journal{Version: 1, ID: "planted", PlanHash: p.hash, State: StateRunning, StaticPodPlaced: victim, GreenPIDs: map[string]int{}, PIDsWriteAhead: true}
				if err := planted.save(p.StateDir); err != nil {
					t.Fatal(err)
				}
				before := stateDirListing(t, p.StateDir)
				journal, _ := os.ReadFile(journalPath(p.StateDir))
				c.prep(t, p.StateDir)

				err := cmd.run(t.Context(), p)
				checkStateDirRefusal(t, err, c.want)
				if _, err := os.Stat(victim); err != nil {
					t.Errorf("the file the planted journal names: %v", err)
				}
				if after := stateDirListing(t, p.StateDir); !slices.Equal(before, after) {
					t.Errorf("the state dir changed: %v, then %v", before, after)
				}
				if now, _ := os.ReadFile(journalPath(p.StateDir)); !bytes.Equal(now, journal) {
					t.Errorf("the journal changed:\n%s", now)
				}
			})
		}
	}
	// A state dir to be made below a directory another user may write to is not made.
	t.Run("to be made below a directory writable by all", func(t *testing.T) {
		p, dir := validPlan(t)
		p.StateDir = filepath.Join(dir, "shared", "state")
		if err := os.Mkdir(filepath.Dir(p.StateDir), 0o700); err != nil {
			t.Fatal(err)
		}
		chmod(t, filepath.Dir(p.StateDir), 0o777)
		_, err := Run(t.Context(), Options{Plan: p})
		checkStateDirRefusal(t, err, "others can write")
		if _, err := os.Lstat(p.StateDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the state dir was made: %v", err)
		}
	})
}

// checkStateDirRefusal checks err is the refusal of an untrusted state dir, saying what is
// wrong (want) and what to do.
func checkStateDirRefusal(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Error("not refused")
		return
	}
	for _, s := range []string{"stateDir", want, "chown", "chmod", "another stateDir"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal does not say %q: %v", s, err)
		}
	}
}

func stateDirListing(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		names = append(names, path)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Chown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestStateDirCheckedWhereItIsRead: the trust check sits in the two doors every command goes
// through, the journal's read and the lock, not in each command: a new path through either
// refuses an untrusted state dir before it reads or creates anything there.
func TestStateDirCheckedWhereItIsRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the state dir is given to another user")
	}
	for _, door := range []struct {
		name string
		use  func(dir string) error
	}{
		{"LoadJournal", func(dir string) error { _, err := LoadJournal(dir); return err }},
		{"the rollback's journal", func(dir string) error { _, err := LoadJournal(filepath.Join(dir, "rollback")); return err }},
		{"lockStateDir", func(dir string) error {
			l, err := lockStateDir(dir)
			l.unlock()
			return err
		}},
	} {
		t.Run(door.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.MkdirAll(filepath.Join(dir, "rollback"), 0o700); err != nil {
				t.Fatal(err)
			}
			planted := &Journal{Version: 1, ID: "planted", State: StateRunning}
			for _, d := range []string{dir, filepath.Join(dir, "rollback")} {
				if err := planted.save(d); err != nil {
					t.Fatal(err)
				}
			}
			before := stateDirListing(t, dir)
			chown(t, dir, 65534)
			checkStateDirRefusal(t, door.use(dir), "belongs to uid 65534")
			if after := stateDirListing(t, dir); !slices.Equal(before, after) {
				t.Errorf("the state dir changed: %v, then %v", before, after)
			}
		})
	}
}
