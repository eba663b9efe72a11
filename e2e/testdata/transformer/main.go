// Command transformer is a transformer program for `etcdctl migrate --transformer` and
// `kubefence migrate v2-to-v3 --transformer`: it reads v2 nodes (concatenated JSON objects) on
// stdin and writes each file node as a length-prefixed mvccpb.KeyValue under /t, with its
// value wrapped, so the e2e tests can check both tools give the same result.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

func main() {
	dec := json.NewDecoder(bufio.NewReader(os.Stdin))
	out := bufio.NewWriter(os.Stdout)
	for dec.More() {
		var n struct {
			Key           string `json:"key"`
			Value         string `json:"value"`
			Dir           bool   `json:"dir"`
			ModifiedIndex int64  `json:"modifiedIndex"`
			CreatedIndex  int64  `json:"createdIndex"`
		}
		if err := dec.Decode(&n); err != nil {
			fmt.Fprintln(os.Stderr, "transformer:", err)
			os.Exit(1)
		}
		if n.Dir {
			continue
		}
		b, err := (&mvccpb.KeyValue{Key: []byte("/t" + n.Key), Value: []byte("[" + n.Value + "]"), CreateRevision: n.CreatedIndex, ModRevision: n.ModifiedIndex, Version: 1}).Marshal()
		if err != nil {
			fmt.Fprintln(os.Stderr, "transformer:", err)
			os.Exit(1)
		}
		var l [8]byte
		binary.LittleEndian.PutUint64(l[:], uint64(len(b)))
		out.Write(l[:])
		out.Write(b)
	}
	if err := out.Flush(); err != nil {
		os.Exit(1)
	}
}
