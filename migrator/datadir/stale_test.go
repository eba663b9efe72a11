package datadir

import (
	"encoding/binary"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// writeMeta makes the backend at dir/member/snap/db with the meta bucket's schema markers: the
// raft term (etcd 3.5+) when term > 0, storageVersion (etcd 3.6+) when not "".
func writeMeta(t *testing.T, dir, storageVersion string, term uint64) {
	t.Helper()
	writeTree(t, filepath.Join(dir, "member", "snap"), nil)
	db, err := bolt.Open(filepath.Join(dir, "member", "snap", "db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("meta"))
		if err != nil {
			return err
		}
		if err := b.Put([]byte("consistent_index"), binary.BigEndian.AppendUint64(nil, 7)); err != nil {
			return err
		}
		if term > 0 {
			if err := b.Put([]byte("term"), binary.BigEndian.AppendUint64(nil, term)); err != nil {
				return err
			}
		}
		if storageVersion != "" {
			return b.Put([]byte("storageVersion"), []byte(storageVersion))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDetectStaleVersionFile: someone ran etcd 3.6 on a data dir outside kubefence, so
// version.txt still says 3.5 while the backend has storageVersion 3.6.0. Taking the file's
// word, upgrade said "nothing to do" and downgrade "use upgrade", and etcd 3.5 refuses the
// data. Detect refuses a version file its backend contradicts, showing both and what to do.
func TestDetectStaleVersionFile(t *testing.T) {
	for _, tc := range []struct {
		name, file     string
		storageVersion string
		term           uint64
		wantErr        []string // nil: the file is taken
	}{
		{name: "3.5 file, 3.6 storage", file: "3.5.21/etcd3", storageVersion: "3.6.0", term: 2,
			wantErr: []string{"3.5.21/etcd3", "storageVersion 3.6.0", "etcd 3.6", "delete it"}},
		{name: "3.4 file, 3.5 term", file: "3.4.23/etcd3", term: 2,
			wantErr: []string{"3.4.23/etcd3", "raft term", "etcd 3.5", "delete it"}},
		{name: "3.6 file, 3.7 storage", file: "3.6.16/etcd3", storageVersion: "3.7.0", term: 2,
			wantErr: []string{"3.6.16/etcd3", "storageVersion 3.7.0"}},
		{name: "3.5 file, 3.5 term", file: "3.5.21/etcd3", term: 2},
		{name: "3.6 file, 3.6 storage", file: "3.6.16/etcd3", storageVersion: "3.6.0", term: 2},
		{name: "3.4 file, no markers", file: "3.4.23/etcd3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeMeta(t, dir, tc.storageVersion, tc.term)
			writeTree(t, dir, map[string]string{VersionFileName: tc.file + "\n"})
			d, err := Detect(dir, "")
			if tc.wantErr == nil {
				if err != nil || d.Version.String()+"/"+string(d.Storage) != tc.file {
					t.Fatalf("Detect = %v, %v; want %s", d, err, tc.file)
				}
				return
			}
			assertErrContains(t, err, append(tc.wantErr, filepath.Join(dir, VersionFileName))...)
		})
	}
}

// TestResumeAfterAKilled36Run: a run killed after etcd 3.6 wrote storageVersion, before
// kubefence wrote version.txt, leaves a 3.5 file on 3.6 storage: that is the started step's
// doing, and its resume repeats the step.
func TestResumeAfterAKilled36Run(t *testing.T) {
	dir := t.TempDir()
	writeMeta(t, dir, "3.6.0", 2)
	writeTree(t, dir, map[string]string{VersionFileName: "3.5.35/etcd3\n"})
	rep := &Report{Operation: OpUpgrade, DataDirs: []string{dir}, Steps: []*StepReport{
		{Kind: StepBackup, Version: "3.5.35", Done: true},
		{Kind: StepRun, Version: "3.6.16", Started: true},
	}, Before: []Detection{{DataDir: dir, Version: Version{3, 5, 35}, Source: VersionFileName}}}
	if err := checkResumedVersions(rep); err != nil {
		t.Fatal(err)
	}
	rep.Steps[1].Started = false
	assertErrContains(t, checkResumedVersions(rep), "storageVersion 3.6.0")
}
