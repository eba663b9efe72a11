package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/migrator/datadir"
)

// restoreFailingLast makes a data dir and its backup, in the default backup dir beside it, with
// two journals of unfinished upgrades of that data dir for the restore to abandon: one it
// abandons, and one it cannot read (a directory where the journal should be), so that the
// restore fails at its last step, after the backup is in place. It returns the backup and the
// data dir.
func restoreFailingLast(t *testing.T) (backup, dataDir string) {
	t.Helper()
	parent := t.TempDir()
	dataDir = filepath.Join(parent, "etcd")
	for rel, content := range map[string]string{"member/snap/db": "backend", "member/wal/0.wal": "wal"} {
		writeFile(t, filepath.Join(dataDir, rel), content, 0o600)
	}
	backups := filepath.Join(parent, "kubefence-backups")
	br, err := datadir.Backup(t.Context(), dataDir, backups, "3.5.9", time.Unix(1800000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(datadir.Report{Operation: datadir.OpUpgrade, Target: "3.6.16", DataDirs: []string{dataDir}, Journal: filepath.Join(backups, "journal-a.json")})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(backups, "journal-a.json"), string(b), 0o600)
	if err := os.Mkdir(filepath.Join(backups, "journal-b.json"), 0o700); err != nil {
		t.Fatal(err)
	}
	return br.Backup, dataDir
}

// TestRestoreBackupFailureSaysWhatWasDone: a restore that fails at its last step (abandoning
// the unfinished runs of the data dir) has already put the backup in place and moved the old
// data dir aside. Its output says so, with -o json too: where the old data dir is kept and which
// journals were abandoned, besides the error; not the error alone.
func TestRestoreBackupFailureSaysWhatWasDone(t *testing.T) {
	for _, output := range []string{"", "json"} {
		t.Run("-o "+output, func(t *testing.T) {
			backup, dataDir := restoreFailingLast(t)
			var out, errOut bytes.Buffer
			o := &restoreBackupOptions{printOptions: printOptions{Streams: Streams{Out: &out, ErrOut: &errOut}}, backup: backup, dataDir: dataDir}
			o.output.format = output
			err := runOptions(t, o)
			if err == nil || !strings.Contains(err.Error(), "journal-b.json") {
				t.Fatalf("error %v, want the failure to abandon journal-b.json", err)
			}
			replaced, _ := filepath.Glob(dataDir + ".replaced-*")
			abandoned, _ := filepath.Glob(filepath.Join(filepath.Dir(dataDir), "kubefence-backups", "journal-a.json.abandoned-*"))
			if len(replaced) != 1 || len(abandoned) != 1 {
				t.Fatalf("replaced %v, abandoned %v: want one of each", replaced, abandoned)
			}
			if output == "json" {
				var rep map[string]any
				if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
					t.Fatalf("stdout %q: %v", &out, err)
				}
				if rep["restored"] != true || rep["replaced"] != replaced[0] || !strings.Contains(out.String(), abandoned[0]) {
					t.Errorf("stdout %s, want restored, replaced %s and abandoned %s", &out, replaced[0], abandoned[0])
				}
				return
			}
			for _, want := range []string{"restored " + backup + " -> " + dataDir, "kept at " + replaced[0], abandoned[0]} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("stdout %q does not say %q", &out, want)
				}
			}
		})
	}
}
