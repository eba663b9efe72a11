package v2v3

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// TestTTLDirectories: a v2 directory with a TTL takes everything under it when it expires, so
// its keys expire with it: a key gets the earliest expiry of itself and its directories, and a
// key under a directory already expired is dropped. Streamed from the snapshot or walked from
// the replay's store, the same.
func TestTTLDirectories(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	st := v2store.New("/0", "/1")
	set := func(p string, dir bool, expire time.Time) {
		t.Helper()
		if _, err := st.Set(p, dir, map[bool]string{false: "v"}[dir], v2store.TTLOptionSet{ExpireTime: expire}); err != nil {
			t.Fatal(err)
		}
	}
	set("/1/d", true, now.Add(time.Minute))
	set("/1/d/k", false, time.Time{})
	set("/1/d/later", false, now.Add(time.Hour))
	set("/1/d/sooner", false, now.Add(30*time.Second))
	set("/1/d/sub", true, time.Time{})
	set("/1/d/sub/deep", false, time.Time{})
	set("/1/gone", true, now.Add(-time.Minute))
	set("/1/gone/k", false, time.Time{})
	set("/1/plain", false, time.Time{})
	want := map[string]int64{"/d/k": 60, "/d/later": 60, "/d/sooner": 30, "/d/sub/deep": 60, "/plain": 0}
	data, err := st.Save()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeSnap(t, filepath.Join(dir, "0000000000000002-0000000000000100.snap"), data, 0x100, false)
	for _, all := range []bool{false, true} {
		src := &Source{}
		if err := src.loadSnapshot(dir); err != nil {
			t.Fatal(err)
		}
		res, err := readV2(src, Options{Now: now}, false, all, nil, nil)
		src.Close()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, kv := range res.c.kvs {
			got[string(kv.Key)] = 0
			if l := res.c.leases[kv.Lease]; l != nil {
				got[string(kv.Key)] = l.TTL
			}
		}
		if len(got) != len(want) {
			t.Errorf("full load %v: keys %v, want %v", all, got, want)
		}
		for k, ttl := range want {
			if g, ok := got[k]; !ok || g != ttl {
				t.Errorf("full load %v: %s has TTL %d (present %v), want %d", all, k, g, ok, ttl)
			}
		}
	}
}

// TestNestedHiddenKeys: v2store lists no hidden child, so the replay's store must be asked for
// every hidden node by name, a hidden node under another one too (/_a/_b), with
// --include-hidden; without it they are counted.
func TestNestedHiddenKeys(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, include := range []bool{true, false} {
		st := v2store.New("/0", "/1")
		for _, p := range []string{"/1/_a/_b", "/1/_a/x", "/1/d/_h/_i/k", "/1/plain"} {
			if _, err := st.Set(p, false, "v", v2store.TTLOptionSet{}); err != nil {
				t.Fatal(err)
			}
		}
		// The tail touches them, so that they are replayed on the store, not streamed.
		src := writeMember(t, st, []*etcdserverpb.Request{{Method: "PUT", Path: "/1/_a/_b", Val: "w"}, {Method: "PUT", Path: "/1/d/_h/_i/k", Val: "w"}})
		c := testConfig(t, src, now)
		c.IncludeHidden = include
		rep, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		out := readOutput(t, c.OutputDir)
		if rep.Keys.Hidden != 3 {
			t.Errorf("include %v: %d hidden keys counted, want 3", include, rep.Keys.Hidden)
		}
		for _, k := range []string{"/_a/_b", "/_a/x", "/d/_h/_i/k"} {
			if _, ok := out[k]; ok != include {
				t.Errorf("include %v: %s in the output: %v", include, k, ok)
			}
		}
		if out["/plain"] == nil {
			t.Errorf("include %v: /plain missing", include)
		}
	}
}

// TestIndexPastNewestKey: when the v2 store's last writes deleted keys, its index is past the
// newest key's revision, and the first v3 writes would take revisions v2 clients have seen:
// the report says so and how far to bump, unless the bump covers it.
func TestIndexPastNewestKey(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name string
		bump uint64
		want bool
	}{{"no bump", 0, true}, {"a bump short of it", 1, true}, {"a bump past it", 5, false}} {
		t.Run(tc.name, func(t *testing.T) {
			st := v2store.New("/0", "/1")
			for _, p := range []string{"/1/a", "/1/b", "/1/c"} { // indexes 1, 2, 3
				if _, err := st.Set(p, false, "v", v2store.TTLOptionSet{}); err != nil {
					t.Fatal(err)
				}
			}
			src := writeMember(t, st, []*etcdserverpb.Request{{Method: "DELETE", Path: "/1/b"}, {Method: "DELETE", Path: "/1/c"}}) // 4, 5
			c := testConfig(t, src, now)
			c.RevisionBump, c.MarkCompacted = tc.bump, tc.bump > 0
			rep, err := Run(c)
			if err != nil {
				t.Fatal(err)
			}
			warned := len(rep.Warnings) == 1 && strings.Contains(rep.Warnings[0], "--bump-revision 4")
			if rep.V2Index != 5 || warned != tc.want {
				t.Fatalf("v2 index %d, warnings %q: want index 5 and a warning to bump by 4: %v", rep.V2Index, rep.Warnings, tc.want)
			}
		})
	}
}

// TestV2AuthWarned: v2 auth (its flag, users and roles under /2) is not carried to v3, which
// has an auth store of its own: a store where it was on, or that holds users or roles, gets a
// warning naming them (after the migration, v3 auth is off: any client reads and writes every
// key), whether the snapshot or the WAL tail says so. The flag off and nothing else (3.5
// writes that with --enable-v2) is no auth at all.
func TestV2AuthWarned(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	set := func(t *testing.T, st v2store.Store, kv ...string) {
		for i := 0; i+1 < len(kv); i += 2 {
			if _, err := st.Set(kv[i], false, kv[i+1], v2store.TTLOptionSet{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name     string
		snapshot []string
		tail     []*etcdserverpb.Request
		want     []string // in the warning; none: no warning
	}{
		{"on, in the snapshot", []string{"/2/enabled", "true", "/2/users/alice", `{"user":"alice"}`, "/2/roles/reader", `{"role":"reader"}`}, nil, []string{"v2 auth was on", "alice", "reader"}},
		{"turned on in the WAL tail", []string{"/2/enabled", "false", "/2/users/root", `{"user":"root"}`}, []*etcdserverpb.Request{{Method: "PUT", Path: "/2/enabled", Val: "true"}}, []string{"v2 auth was on", "root"}},
		{"off, with a user", []string{"/2/enabled", "false", "/2/users/bob", `{"user":"bob"}`}, nil, []string{"v2 auth was off", "bob"}},
		{"off, nothing else", []string{"/2/enabled", "false"}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := v2store.New("/0", "/1")
			set(t, st, "/1/k", "v")
			set(t, st, tc.snapshot...)
			src := writeMember(t, st, tc.tail)
			rep, err := Run(testConfig(t, src, now))
			if err != nil {
				t.Fatal(err)
			}
			var warning string
			for _, w := range rep.Warnings {
				if strings.Contains(w, "v2 auth") {
					warning = w
				}
			}
			if (warning != "") != (tc.want != nil) {
				t.Fatalf("warnings %q, want one about v2 auth: %v", rep.Warnings, tc.want != nil)
			}
			for _, s := range tc.want {
				if !strings.Contains(warning, s) {
					t.Errorf("warning %q does not say %q", warning, s)
				}
			}
		})
	}
}

// TestV3AuthWithoutKeysWarned: a v2 member whose v3 store holds no keys is migrated onto a
// v3 store built afresh (its v2 revisions kept), so v3 auth set up on it (users, roles, auth
// on) is not carried over: the report says so, and that the migrated member's v3 auth is off.
func TestV3AuthWithoutKeysWarned(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	src := smallMember(t, now)
	db, err := bolt.Open(filepath.Join(src, "member", "snap", "db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for bucket, kv := range map[string][2]string{"auth": {"authEnabled", "\x01"}, "authUsers": {"root", "x"}, "authRoles": {"root", "x"}, "key": {}} {
			b, err := tx.CreateBucketIfNotExists([]byte(bucket))
			if err != nil {
				return err
			}
			if kv[0] != "" {
				if err := b.Put([]byte(kv[0]), []byte(kv[1])); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(testConfig(t, src, now))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range rep.Warnings {
		if strings.Contains(w, "v3 auth was on (1 users, 1 roles)") && strings.Contains(w, "v3 auth is off") {
			return
		}
	}
	t.Fatalf("warnings %q: want one saying the source's v3 auth (on, 1 user, 1 role) is not carried over", rep.Warnings)
}
