package flock

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

func TestTake(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	l, err := Take(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Note("bake")
	_, err = Take(path) // a second open file description: flock refuses it as it would another process
	var held *HeldError
	if !errors.As(err, &held) || held.PID() != strconv.Itoa(os.Getpid()) || held.Holder != strconv.Itoa(os.Getpid())+" bake" {
		t.Fatalf("second Take = %v (%+v), want held by this pid, noted bake", err, held)
	}
	l.Release()
	l2, err := Take(path)
	if err != nil {
		t.Fatalf("Take after Release: %v", err)
	}
	l2.ReleaseRemove()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("ReleaseRemove left %s: %v", path, err)
	}
	l3, err := Take(path)
	if err != nil {
		t.Fatalf("Take after ReleaseRemove: %v", err)
	}
	l3.Release()
}

// TestTakeFollowsNothing: a lock file is only ever one kubefence made. One that another user
// with write access to the directory put there as a link (to /etc/shadow, say) or a hard link
// is refused, and what it leads to is left as it was: Take truncates and writes a lock file.
func TestTakeFollowsNothing(t *testing.T) {
	cases := []struct {
		name  string
		plant func(target, path string) error
	}{
		{"symbolic link", os.Symlink},
		{"hard link", os.Link},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			target, path := filepath.Join(dir, "secret"), filepath.Join(dir, "lock")
			if err := os.WriteFile(target, []byte("secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := tc.plant(target, path); err != nil {
				t.Fatal(err)
			}
			if l, err := Take(path); err == nil {
				l.Release()
				t.Error("Take locked a planted link")
			}
			if got, _ := os.ReadFile(target); string(got) != "secret\n" {
				t.Errorf("the link's target now holds %q", got)
			}
		})
	}
}

// TestTakeRacingRelease: takers racing holders that remove the lock file as they release it
// (ReleaseRemove) only ever find it held, never "not a file kubefence made" (a file removed
// between its open and its check has no link left).
func TestTakeRacingRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 500 {
				l, err := Take(path)
				var held *HeldError
				switch {
				case err == nil:
					l.ReleaseRemove()
				case !errors.As(err, &held):
					t.Errorf("Take: %v; want it taken or held", err)
					return
				}
			}
		})
	}
	wg.Wait()
}
