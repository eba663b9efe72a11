package cli

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// snapshotTree returns every entry under root (the root itself included) as path → content
// ("dir" for a directory, "-> target" for a symlink).
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			out[path] = "dir"
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			out[path] = "-> " + target
			return err
		default:
			b, err := os.ReadFile(path)
			out[path] = string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOutputsApartFromSources runs every command that takes a source and writes an output with
// an output that overlaps its source (lexically, through a symlink, relative, ".", "link/..")
// and checks each is refused before anything is written, with an error that names the overlap.
func TestOutputsApartFromSources(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	data := filepath.Join(root, "data")
	for rel, content := range map[string]string{
		"data/member/snap/db": "backend", "data/member/wal/0.wal": "wal", "data/member/snap/1.snap": "snap",
		"data/member/sub/x": "x", "backup/kubefence-manifest.sha256": "", "wal/0.wal": "wal",
		"data2/member/snap/db": "backend", "data2/member/wal/0.wal": "wal",
	} {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"alias": "data", "into-member": "data/member/sub", "backup-alias": "backup"} {
		if err := os.Symlink(filepath.Join(root, target), filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshotTree(t, root)
	v2v3 := func(dataDir, out string) []string {
		return []string{"migrate", "v2-to-v3", "--data-dir", dataDir, "--output-dir", out,
			"--name", "m", "--initial-cluster", "m=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380"}
	}
	lifecycle := func(op string, backupDir string, dataDirs ...string) []string {
		args := []string{"migrate", op, "--target-version", "3.6.16", "--bin-dir", root, "--backup-dir", backupDir}
		for _, d := range dataDirs {
			args = append(args, "--data-dir", d)
		}
		return args
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"copy: output inside", []string{"migrate", "copy", "--data-dir", "data", "--output-dir", "data/copy"}, "must not be inside"},
		{"copy: output through a symlink", []string{"migrate", "copy", "--data-dir", data, "--output-dir", "alias/copy"}, "must not be inside"},
		{"copy: link/.. lands in the source", []string{"migrate", "copy", "--data-dir", data, "--output-dir", "into-member/../copy"}, "must not be inside"},
		{"copy: source is .", []string{"migrate", "copy", "--data-dir", ".", "--output-dir", "copy"}, "must not be inside"},
		{"copy: output inside the WAL dir", []string{"migrate", "copy", "--data-dir", data, "--wal-dir", "wal", "--output-dir", "wal/copy"}, "must not be inside"},
		{"copy: several members, one copy lands in another member", []string{"migrate", "copy", "--data-dir", "data2", "--data-dir", data, "--output-dir", "alias/copies"}, "must not be inside"},
		{"copy --live: output inside", []string{"migrate", "copy", "--live", "--endpoint", "http://127.0.0.1:1", "--data-dir", data, "--output-dir", "alias/copy"}, "must not be inside"},
		{"v2-to-v3: output inside", v2v3("data", "data/out"), "must not be inside"},
		{"v2-to-v3: output through a symlink", v2v3(data, "alias/out"), "must not be inside"},
		{"v2-to-v3: link/.. lands in the source", v2v3(data, "into-member/../out"), "must not be inside"},
		{"v2-to-v3: output inside the WAL dir", append(v2v3(data, "wal/out"), "--wal-dir", "wal"), "must not be inside"},
		{"upgrade: backup dir inside", lifecycle("upgrade", "data/backups", "data"), "must not be inside"},
		{"upgrade: backup dir through a symlink", lifecycle("upgrade", "alias/backups", data), "must not be inside"},
		{"upgrade: backup dir is the data dir", lifecycle("upgrade", ".", "."), "must not be inside"},
		{"upgrade: one data dir inside another", lifecycle("upgrade", "b", data, "alias/member/sub"), "must not hold"},
		{"downgrade: backup dir inside", lifecycle("downgrade", "into-member/b", data), "must not be inside"},
		{"restore-backup: data dir inside the backup", []string{"migrate", "restore-backup", "--backup", "backup", "--data-dir", "backup-alias/restored"}, "must not be inside"},
		{"restore-backup: data dir holds the backup", []string{"migrate", "restore-backup", "--backup", "backup", "--data-dir", "."}, "must not hold"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runCLI(c.args...)
			if code == ExitOK {
				t.Fatal("accepted")
			}
			if !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, error %q does not say %q", code, stderr, c.want)
			}
			if after := snapshotTree(t, root); !maps.Equal(before, after) {
				t.Fatalf("a refused command changed the tree:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}
