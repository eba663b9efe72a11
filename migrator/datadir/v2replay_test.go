package datadir

import (
	"slices"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// v2Tail is the WAL entries of v2 requests reqs, as etcd 3.4 proposes them.
func v2Tail(t *testing.T, reqs ...*etcdserverpb.Request) [][]byte {
	t.Helper()
	var out [][]byte
	for _, r := range reqs {
		b, err := (&etcdserverpb.InternalRaftRequest{V2: r}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestV2ReadsInTheWALAreNoV2Content: etcd 3.4 answers /health with a v2 quorum read (QGET) that
// lands in the WAL, so nearly every 3.4 member's WAL tail holds some. They are no v2 content:
// the member is etcd3, a version file saying so is taken, and no v2 migration is planned. But
// etcd 3.6 panics replaying them, so an upgrade to 3.6 runs etcd 3.5 with --snapshot-count=1
// first (planned even when the data's 3.5 needs no run of its own), and says why. A v2 write is
// content as before.
func TestV2ReadsInTheWALAreNoV2Content(t *testing.T) {
	bin := t.TempDir()
	for _, v := range []string{"3.5.35", "3.6.16"} {
		fakeEtcd(t, bin, v, v)
	}
	qget := &etcdserverpb.Request{Method: "QGET"}
	for _, tc := range []struct {
		name, versionFile string // "": inferred
		tail              []*etcdserverpb.Request
		storage           Storage
		want              []string // kind@version, "+snap" for --snapshot-count=1
		wantErr           string
	}{
		{"3.4 /health, inferred", "", []*etcdserverpb.Request{qget, {Method: "SYNC"}}, StorageV3,
			[]string{"backup@3.4", "run@3.5.35+snap", "run@3.6.16"}, ""},
		{"3.4 /health, version.txt etcd3", "3.4.23/etcd3", []*etcdserverpb.Request{qget}, StorageV3,
			[]string{"backup@3.4.23", "run@3.5.35+snap", "run@3.6.16"}, ""},
		{"3.5 --enable-v2, version.txt etcd3", "3.5.35/etcd3", []*etcdserverpb.Request{
			{Method: "PUT", Path: "/2/enabled", Val: "false"}, {Method: "PUT", Path: "/2/users", Dir: true}, qget}, StorageV3,
			[]string{"backup@3.5.35", "run@3.5.35+snap", "run@3.6.16"}, ""},
		{"a v2 write, inferred", "", []*etcdserverpb.Request{qget, {Method: "PUT", Path: "/1/x", Val: "x"}}, StorageV2,
			[]string{"backup@3.4", "run@3.5.35", "migrate-v2@3.5.35", "run@3.6.16"}, ""},
		{"a v2 write, version.txt etcd3", "3.4.23/etcd3", []*etcdserverpb.Request{{Method: "PUT", Path: "/2/users/alice", Val: "{}"}}, StorageV3,
			nil, "holds v2 content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeV2MemberTail(t, dir, testPeers[0], v2store.New("/0", "/1"), v2Tail(t, tc.tail...))
			if tc.versionFile != "" {
				writeTree(t, dir, map[string]string{VersionFileName: tc.versionFile})
			}
			det, err := Detect(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			if det.Storage != tc.storage {
				t.Fatalf("Detect: %s, want storage %s", det, tc.storage)
			}
			rep, err := plan(t.Context(), OpUpgrade, Options{DataDirs: []string{dir}, Target: Version{3, 6, 16}, BinDir: bin})
			if tc.wantErr != "" {
				assertErrContains(t, err, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range rep.Steps {
				k := s.Kind + "@" + s.Version
				if s.SnapshotCount == 1 {
					k += "+snap"
					if !strings.Contains(s.Name, "--snapshot-count=1") || !strings.Contains(s.Name, "3.6 refuses to replay") {
						t.Errorf("step %q does not say why it snapshots", s.Name)
					}
				}
				got = append(got, k)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("steps %v, want %v", got, tc.want)
			}
		})
	}
}
