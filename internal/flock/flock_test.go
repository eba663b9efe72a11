package flock

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
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
