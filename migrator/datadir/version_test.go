package datadir

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Version
		wantErr bool
	}{
		{in: "3.5.17", want: Version{3, 5, 17}},
		{in: "v3.6.0", want: Version{3, 6, 0}},
		{in: "0.0.0", want: Version{0, 0, 0}},
		{in: "3.4", wantErr: true},
		{in: "3.4.23.1", wantErr: true},
		{in: "3.4.023", wantErr: true},
		{in: "03.4.23", wantErr: true},
		{in: "3..23", wantErr: true},
		{in: "a.b.c", wantErr: true},
		{in: "3.4.-1", wantErr: true},
		{in: "", wantErr: true},
		{in: "vv3.4.23", wantErr: true},
	} {
		got, err := ParseVersion(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("ParseVersion(%q) = %v, want an error", tc.in, got)
			} else if !strings.Contains(err.Error(), "MAJOR.MINOR.PATCH") {
				t.Errorf("ParseVersion(%q) error %q does not say what a version looks like", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if s := strings.TrimPrefix(tc.in, "v"); got.String() != s {
			t.Errorf("ParseVersion(%q).String() = %q, want %q", tc.in, got.String(), s)
		}
	}
}

func TestParseVersionFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    VersionFile
		wantErr []string // substrings of the error; nil means success
	}{
		{name: "plain", in: "3.4.23/etcd2", want: VersionFile{Version{3, 4, 23}, StorageV2}},
		{name: "surrounding whitespace", in: "  3.4.23/etcd2\n", want: VersionFile{Version{3, 4, 23}, StorageV2}},
		{name: "trailing newline", in: "3.5.9/etcd3\n", want: VersionFile{Version{3, 5, 9}, StorageV3}},
		{name: "leading v", in: "v3.5.1/etcd3", want: VersionFile{Version{3, 5, 1}, StorageV3}},
		{name: "empty", in: "", wantErr: []string{"empty"}},
		{name: "only whitespace", in: " \n\t\n", wantErr: []string{"empty"}},
		{name: "minor only", in: "3.4/etcd2", wantErr: []string{`"3.4/etcd2"`, "MAJOR.MINOR.PATCH"}},
		{name: "no storage", in: "3.4.23", wantErr: []string{`"3.4.23"`, "<etcd version>/<etcd2|etcd3>"}},
		{name: "unknown storage", in: "3.4.23/etcd4", wantErr: []string{`"etcd4"`, "neither etcd2 nor etcd3"}},
		{name: "extra component", in: "3.4.23/etcd2/x", wantErr: []string{`"etcd2/x"`, "neither etcd2 nor etcd3"}},
		{name: "leading zero", in: "3.4.023/etcd3", wantErr: []string{`"3.4.023"`, "MAJOR.MINOR.PATCH"}},
		{name: "not numbers", in: "a.b.c/etcd3", wantErr: []string{`"a.b.c"`, "MAJOR.MINOR.PATCH"}},
		{name: "inner space", in: "3.4.23 /etcd2", wantErr: []string{`"3.4.23 /etcd2"`, "<etcd version>/<etcd2|etcd3>"}},
		{name: "two lines", in: "3.4.23/etcd2\n3.5.0/etcd3\n", wantErr: []string{"<etcd version>/<etcd2|etcd3>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseVersionFile(tc.in)
			if tc.wantErr != nil {
				assertErrContains(t, err, tc.wantErr...)
				if got != (VersionFile{}) {
					t.Errorf("got %v with the error, want the zero value", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseVersionFile(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			// What it prints parses back to the same thing.
			again, err := ParseVersionFile(got.String())
			if err != nil || again != got {
				t.Errorf("round trip of %q: %v, %v", got.String(), again, err)
			}
		})
	}
}

func TestVersionOrder(t *testing.T) {
	for _, tc := range []struct {
		a, b      Version
		less      bool
		sameMinor bool
	}{
		{Version{3, 5, 9}, Version{3, 5, 35}, true, true}, // numeric, not lexical
		{Version{3, 5, 35}, Version{3, 5, 9}, false, true},
		{Version{3, 5, 99}, Version{3, 6, 0}, true, false},
		{Version{3, 6, 0}, Version{3, 5, 99}, false, false},
		{Version{2, 9, 9}, Version{3, 0, 0}, true, false},
		{Version{3, 4, 0}, Version{4, 4, 0}, true, false}, // same minor number, other major
		{Version{3, 6, 1}, Version{3, 6, 1}, false, true},
	} {
		if got := tc.a.Less(tc.b); got != tc.less {
			t.Errorf("%v.Less(%v) = %v, want %v", tc.a, tc.b, got, tc.less)
		}
		if got := tc.a.SameMinor(tc.b); got != tc.sameMinor {
			t.Errorf("%v.SameMinor(%v) = %v, want %v", tc.a, tc.b, got, tc.sameMinor)
		}
		if got := tc.b.SameMinor(tc.a); got != tc.sameMinor {
			t.Errorf("%v.SameMinor(%v) = %v, want %v (symmetric)", tc.b, tc.a, got, tc.sameMinor)
		}
	}
	if got := (Version{3, 5, 17}).MinorString(); got != "3.5" {
		t.Errorf("MinorString = %q, want 3.5", got)
	}
}

func TestDetectVersionFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		wantErr []string
	}{
		{name: "garbled", content: "3.4/etcd2\n", wantErr: []string{"MAJOR.MINOR.PATCH"}},
		{name: "empty", content: "", wantErr: []string{"it is empty"}},
		{name: "unknown storage", content: "3.5.9/etcd4", wantErr: []string{"neither etcd2 nor etcd3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, map[string]string{VersionFileName: tc.content})
			if err := os.Mkdir(filepath.Join(dir, "member"), 0o700); err != nil {
				t.Fatal(err)
			}
			_, err := Detect(dir, "")
			file := filepath.Join(dir, VersionFileName)
			assertErrContains(t, err, append(tc.wantErr, file+": ", "echo 3.4.23/etcd2 > "+file, "delete it")...)
			if strings.Contains(err.Error(), "%!") {
				t.Errorf("error has a formatting mistake: %q", err)
			}
		})
	}
}

func TestDetectNotAMemberDir(t *testing.T) {
	dir := t.TempDir()
	// A valid version file does not make a dir without member/ a data dir.
	if err := WriteVersionFile(dir, VersionFile{Version{3, 5, 9}, StorageV3}); err != nil {
		t.Fatal(err)
	}
	_, err := Detect(dir, "")
	assertErrContains(t, err, dir, "no member/ directory")
}

func TestWriteVersionFileDetect(t *testing.T) {
	for _, vf := range []VersionFile{
		{Version{3, 4, 23}, StorageV2},
		{Version{3, 6, 16}, StorageV3},
	} {
		t.Run(vf.String(), func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "member"), 0o700); err != nil {
				t.Fatal(err)
			}
			// Overwriting a garbled file repairs it.
			writeTree(t, dir, map[string]string{VersionFileName: "garbage"})
			if err := WriteVersionFile(dir, vf); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(dir, VersionFileName))
			if err != nil || string(b) != vf.String()+"\n" {
				t.Fatalf("version.txt = %q, %v; want %q", b, err, vf.String()+"\n")
			}
			d, err := Detect(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			want := Detection{DataDir: dir, Version: vf.Version, Storage: vf.Storage, Source: VersionFileName}
			if d.DataDir != want.DataDir || d.Version != want.Version || d.VersionText() != vf.Version.String() ||
				d.Storage != want.Storage || d.Source != want.Source || len(d.Why) != 0 {
				t.Fatalf("Detect = %+v, want %+v", d, want)
			}
			if got, wantS := d.String(), vf.String()+" (from version.txt)"; got != wantS {
				t.Errorf("String() = %q, want %q", got, wantS)
			}
			// No temp file of the atomic write is left behind.
			if names := dirNames(t, dir); len(names) != 2 {
				t.Errorf("dir holds %v, want member and version.txt only", names)
			}
		})
	}
}

func TestParseVersionRejectsSigns(t *testing.T) {
	for _, s := range []string{"3.5.+7", "+3.5.1", "3.-0.1", "3. 5.1"} {
		if v, err := ParseVersion(s); err == nil {
			t.Errorf("ParseVersion(%q) = %v, want an error", s, v)
		}
	}
}

// TestDetectionJSON: a journal keeps the detected version across a resume.
func TestDetectionJSON(t *testing.T) {
	in := Detection{DataDir: "/d", Version: Version{3, 5, 17}, Storage: StorageV2, Source: VersionFileName}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Detection
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Version != in.Version || out.VersionText() != "3.5.17" || !strings.Contains(string(b), `"version":"3.5.17"`) {
		t.Fatalf("round trip of %s: %+v", b, out)
	}
	if got := (Detection{Version: Version{3, 4, 0}, Source: "inferred"}).VersionText(); got != "3.4" {
		t.Fatalf("inferred VersionText = %q, want 3.4", got)
	}
}
