package v2v3

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// maxTransformedKV bounds one message from a transformer; a larger length prefix is garbage.
const maxTransformedKV = 256 << 20

// runTransformer speaks etcdctl migrate's transformer protocol with program: the v2 nodes go
// to its stdin as concatenated JSON objects (v2 API field names: key, value, dir, expiration,
// ttl, modifiedIndex, createdIndex; keys without the /1 prefix), and it answers on stdout with
// repeated 8-byte little-endian lengths, each followed by an mvccpb.KeyValue. A key keeps its
// TTL lease when the transformer keeps its modifiedIndex as mod_revision. A program that exits
// non-zero, writes a malformed message, sets a lease itself, or emits two keys on one revision
// or one key twice fails the migration: nothing is silently dropped.
func runTransformer(ctx context.Context, program string, c *collector, data []byte) ([]KV, error) {
	sort.Slice(c.nodes, func(i, j int) bool { return c.nodes[i].key < c.nodes[j].key })
	leaseOf := map[int64]int64{}
	for _, n := range c.nodes {
		if n.lease != 0 {
			leaseOf[n.kv.ModRevision] = n.lease
		}
	}
	cmd := exec.CommandContext(ctx, program)
	var stderr tailBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start transformer %s: %w", program, err)
	}
	werr := make(chan error, 1)
	go func() {
		w := bufio.NewWriterSize(stdin, 1<<20)
		err := writeNodes(w, c.nodes, data, c.o.Now)
		if err == nil {
			err = w.Flush()
		}
		werr <- errors.Join(err, stdin.Close())
	}()
	kvs, rerr := readTransformed(bufio.NewReaderSize(stdout, 1<<20))
	if rerr != nil {
		_ = cmd.Process.Kill()
	}
	_, _ = io.Copy(io.Discard, stdout)
	waitErr := cmd.Wait()
	writeErr := <-werr
	switch {
	case waitErr != nil && rerr == nil:
		return nil, fmt.Errorf("transformer %s failed: %v%s", program, waitErr, stderr.String())
	case rerr != nil:
		return nil, fmt.Errorf("transformer %s: %w%s", program, rerr, stderr.String())
	case writeErr != nil:
		return nil, fmt.Errorf("transformer %s stopped reading its input: %w%s", program, writeErr, stderr.String())
	}
	c.stats.TransformerIn, c.stats.TransformerOut = len(c.nodes), len(kvs)
	seen := make(map[string]int64, len(kvs))
	for i := range kvs {
		kv := &kvs[i]
		if prev, dup := seen[string(kv.Key)]; dup {
			return nil, fmt.Errorf("transformer %s emitted key %q twice (revisions %d and %d)", program, kv.Key, prev, kv.ModRevision)
		}
		seen[string(kv.Key)] = kv.ModRevision
		if l, ok := leaseOf[kv.ModRevision]; ok {
			kv.Lease = l
			delete(leaseOf, kv.ModRevision)
		}
	}
	// TTL keys whose revision the transformer changed have no lease left: count them (the
	// leases no key holds are left out, and the keys holding one counted, by leasesHeld).
	c.stats.LeaseLost = len(leaseOf)
	if err := sortKVs(kvs); err != nil {
		return nil, fmt.Errorf("transformer %s: %w", program, err)
	}
	return kvs, nil
}

// writeNodes writes each node as a v2 API JSON object.
func writeNodes(w *bufio.Writer, nodes []node, data []byte, now time.Time) error {
	var b []byte
	for _, n := range nodes {
		b = append(b[:0], `{"key":`...)
		b = appendJSONString(b, n.key)
		if n.dir {
			b = append(b, `,"dir":true`...)
		} else {
			b = append(b, `,"value":`...)
			if n.kv.streamed() {
				// The snapshot's JSON string, as it is: already valid JSON.
				b = append(b, '"')
				b = append(b, data[n.kv.raw.off:n.kv.raw.off+int64(n.kv.raw.n)]...)
				b = append(b, '"')
			} else {
				b = appendJSONString(b, string(n.kv.Value))
			}
		}
		if !n.expire.IsZero() {
			d := n.expire.Sub(now)
			ttl := int64(d / time.Second)
			if d%time.Second > 0 {
				ttl++
			}
			b = append(b, `,"expiration":"`...)
			b = n.expire.UTC().AppendFormat(b, time.RFC3339Nano)
			b = append(b, `","ttl":`...)
			b = strconv.AppendInt(b, ttl, 10)
		}
		b = append(b, `,"modifiedIndex":`...)
		b = strconv.AppendInt(b, n.kv.ModRevision, 10)
		b = append(b, `,"createdIndex":`...)
		b = strconv.AppendInt(b, n.kv.CreateRevision, 10)
		b = append(b, '}')
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// readTransformed reads length-prefixed KeyValues until a clean end of stream.
func readTransformed(r io.Reader) ([]KV, error) {
	var kvs []KV
	var off int64
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return kvs, nil
			}
			return nil, fmt.Errorf("output truncated at byte %d (a length prefix is 8 bytes)", off)
		}
		n := int64(binary.LittleEndian.Uint64(hdr[:]))
		if n < 0 || n > maxTransformedKV {
			return nil, fmt.Errorf("output at byte %d: length %d is not a KeyValue length; is the program writing the etcdctl migrate protocol?", off, n)
		}
		off += 8
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, fmt.Errorf("output truncated at byte %d: %d-byte KeyValue cut short", off, n)
		}
		var kv mvccpb.KeyValue
		if err := kv.Unmarshal(buf); err != nil {
			return nil, fmt.Errorf("output at byte %d: not an mvccpb.KeyValue: %w", off, err)
		}
		switch {
		case len(kv.Key) == 0:
			return nil, fmt.Errorf("output at byte %d: a KeyValue without a key", off)
		case kv.ModRevision <= 0 || kv.CreateRevision <= 0 || kv.CreateRevision > kv.ModRevision:
			return nil, fmt.Errorf("key %q: create_revision %d and mod_revision %d must be positive, create <= mod", kv.Key, kv.CreateRevision, kv.ModRevision)
		case kv.Lease != 0:
			return nil, fmt.Errorf("key %q: lease %d set by the transformer; kubefence gives TTL keys their leases (keep mod_revision = modifiedIndex)", kv.Key, kv.Lease)
		case kv.Version < 0:
			return nil, fmt.Errorf("key %q: negative version", kv.Key)
		}
		off += n
		kvs = append(kvs, KV{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, version: kv.Version})
	}
}

// tailBuffer keeps the last few KB a program writes (its stderr, for the error message).
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	if s := bytes.TrimSpace(t.b); len(s) > 0 {
		return "; its stderr: " + string(s)
	}
	return ""
}
