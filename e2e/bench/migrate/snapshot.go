package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/snap"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// v2node is a v2store node the way encoding/json writes etcd's: these fields, in this order.
type v2node struct {
	Path          string
	CreatedIndex  uint64
	ModifiedIndex uint64
	ExpireTime    time.Time
	Value         string
	Children      map[string]*v2node
}

// storeJSON is the top level of a v2 snapshot's JSON. Only Root and CurrentIndex change; the rest
// is carried over from the snapshot etcd wrote.
type storeJSON struct {
	Root           *v2node
	WatcherHub     json.RawMessage
	CurrentIndex   uint64
	Stats          json.RawMessage
	CurrentVersion json.RawMessage
}

// readSkeleton reads a snapshot etcd 3.4 took of a fresh member (membership only, no user keys).
func readSkeleton(path string) (*storeJSON, raftpb.SnapshotMetadata, error) {
	s, err := snap.Read(zap.NewNop(), path)
	if err != nil {
		return nil, raftpb.SnapshotMetadata{}, fmt.Errorf("read etcd's snapshot %s: %w", path, err)
	}
	var st storeJSON
	if err := json.Unmarshal(s.Data, &st); err != nil {
		return nil, s.Metadata, fmt.Errorf("etcd's snapshot %s: %w", path, err)
	}
	if st.Root == nil || st.Root.Children["1"] == nil || len(st.Root.Children["1"].Children) > 0 {
		return nil, s.Metadata, fmt.Errorf("etcd's snapshot %s is not a fresh member's (no empty /1 tree)", path)
	}
	return &st, s.Metadata, nil
}

// jsonWriter writes JSON pieces to a buffered writer, keeping the first error.
type jsonWriter struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (j *jsonWriter) raw(b []byte) {
	if j.err == nil {
		var n int
		n, j.err = j.w.Write(b)
		j.n += int64(n)
	}
}

func (j *jsonWriter) str(s string) { j.raw([]byte(s)) }

func (j *jsonWriter) value(v any) {
	b, err := json.Marshal(v)
	if err != nil && j.err == nil {
		j.err = err
	}
	j.raw(b)
}

// openDir writes a directory node up to the opening brace of its Children.
func (j *jsonWriter) openDir(path string, created, modified uint64, expire time.Time) {
	j.str(`{"Path":`)
	j.value(path)
	j.str(`,"CreatedIndex":` + strconv.FormatUint(created, 10) + `,"ModifiedIndex":` + strconv.FormatUint(modified, 10) + `,"ExpireTime":`)
	j.value(expire)
	j.str(`,"Value":"","Children":{`)
}

func (j *jsonWriter) name(first bool, name string) {
	if !first {
		j.str(",")
	}
	j.value(name)
	j.str(":")
}

func rawOrNull(b json.RawMessage) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

// writeStore streams the snapshot's JSON: the skeleton's store with the dataset's keys below
// split under /1, children in encoding/json's (sorted) order, as etcd's v2store would save it.
func writeStore(w io.Writer, skel *storeJSON, d dataset) (int64, error) {
	j := &jsonWriter{w: bufio.NewWriterSize(w, 1<<20)}
	r := skel.Root
	j.str(`{"Root":`)
	j.openDir(r.Path, r.CreatedIndex, r.ModifiedIndex, r.ExpireTime)
	names := make([]string, 0, len(r.Children))
	for n := range r.Children {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		j.name(i == 0, n)
		if n == "1" {
			u := r.Children["1"]
			j.openDir(u.Path, u.CreatedIndex, u.ModifiedIndex, u.ExpireTime)
			writeRegistry(j, d)
			j.str("}}")
			continue
		}
		j.value(r.Children[n])
	}
	j.str(`}},"WatcherHub":`)
	j.raw(rawOrNull(skel.WatcherHub))
	j.str(`,"CurrentIndex":` + strconv.FormatUint(d.currentIndex(), 10) + `,"Stats":`)
	j.raw(rawOrNull(skel.Stats))
	j.str(`,"CurrentVersion":`)
	j.raw(rawOrNull(skel.CurrentVersion))
	j.str("}")
	if j.err == nil {
		j.err = j.w.Flush()
	}
	return j.n, j.err
}

// writeRegistry writes /1/registry and everything under it. A directory's indices are those of
// the first write under it (v2store creates missing parents with the key); deleted keys leave
// their directories behind.
func writeRegistry(j *jsonWriter, d dataset) {
	if d.split == 0 {
		return
	}
	groups := map[string]map[string][]int{} // resource -> namespace -> keys, ascending
	for i := range d.split {
		r, ns := resource(i), namespace(i)
		if groups[r] == nil {
			groups[r] = map[string][]int{}
		}
		groups[r][ns] = append(groups[r][ns], i)
	}
	j.name(true, "registry")
	j.openDir("/1/registry", d.index(0), d.index(0), time.Time{})
	for ri, r := range sortedKeys(groups) {
		first := d.split
		for _, keys := range groups[r] {
			first = min(first, keys[0])
		}
		j.name(ri == 0, r)
		j.openDir("/1/registry/"+r, d.index(first), d.index(first), time.Time{})
		for ni, ns := range sortedKeys(groups[r]) {
			keys := groups[r][ns]
			j.name(ni == 0, ns)
			j.openDir("/1/registry/"+r+"/"+ns, d.index(keys[0]), d.index(keys[0]), time.Time{})
			writeLeaves(j, d, keys)
			j.str("}}")
		}
		j.str("}}")
	}
	j.str("}}")
}

func writeLeaves(j *jsonWriter, d dataset, keys []int) {
	first := true
	for _, i := range keys {
		if deleted(i) {
			continue
		}
		n := &v2node{Path: "/1" + key(i), CreatedIndex: d.index(i), ModifiedIndex: d.index(i), Value: finalValue(i)}
		if updated(i) { // a v2 set replaces the node: both indices move
			n.CreatedIndex++
			n.ModifiedIndex++
		}
		if isEvent(i) {
			n.ExpireTime = d.expire
		}
		j.name(first, leaf(i))
		j.value(n)
		first = false
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// writeSnapFile writes dst as etcd's snapshotter does — snappb.Snapshot{crc, data} around
// raftpb.Snapshot{data, metadata}, the crc (Castagnoli) over the inner message — with the store's
// JSON streamed from jsonPath (size bytes) rather than held in memory.
func writeSnapFile(dst string, meta raftpb.SnapshotMetadata, jsonPath string, size int64) error {
	md, err := meta.Marshal()
	if err != nil {
		return err
	}
	head := binary.AppendUvarint([]byte{1<<3 | 2}, uint64(size))
	tail := binary.AppendUvarint([]byte{2<<3 | 2}, uint64(len(md)))
	tail = append(tail, md...)
	src, err := os.Open(jsonPath)
	if err != nil {
		return err
	}
	defer src.Close()
	h := crc32.New(castagnoli)
	h.Write(head)
	if n, err := io.Copy(h, src); err != nil || n != size {
		return fmt.Errorf("read %s back: %d of %d bytes: %v", jsonPath, n, size, err)
	}
	h.Write(tail)
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	outer := binary.AppendUvarint([]byte{1 << 3}, uint64(h.Sum32()))
	outer = append(outer, 2<<3|2)
	outer = binary.AppendUvarint(outer, uint64(len(head))+uint64(size)+uint64(len(tail)))
	w.Write(outer)
	w.Write(head)
	_, err = io.Copy(w, src)
	w.Write(tail)
	err = errors.Join(err, w.Flush(), f.Sync(), f.Close())
	if err != nil {
		os.Remove(dst)
	}
	return err
}
