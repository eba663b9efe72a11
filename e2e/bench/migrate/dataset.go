package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// dataset is the benchmark's v2 store, key by key, as a pure function of the key's number i:
// Kubernetes-like JSON values of 1-4 KB under /registry/<resource>/ns-<i%50>/, every 20th key an
// event with a one-hour TTL, every 10th (i%10 == 5) updated once, every 50th (i%50 == 7) deleted.
// Keys below split go into the v2 snapshot built offline; the rest are written through etcd
// 3.4's v2 API, so the WAL tail is etcd's own.
type dataset struct {
	n, split int
	// base is the v2 store's index before key 0 (the skeleton member's CurrentIndex).
	base uint64
	// expire is when the snapshot's TTL keys expire (what a one-hour TTL set at generation
	// time gives).
	expire time.Time
}

// maxKeys keeps names' zero padding (obj-%07d) in numeric order, which the snapshot writer's
// sorted output relies on.
const maxKeys = 10_000_000

var resources = []string{"configmaps", "secrets", "pods", "services", "deployments", "replicasets", "endpoints", "serviceaccounts"}

func isEvent(i int) bool { return i%20 == 0 }
func updated(i int) bool { return i%10 == 5 }
func deleted(i int) bool { return i%50 == 7 }

func resource(i int) string {
	if isEvent(i) {
		return "events"
	}
	return resources[i%len(resources)]
}

func namespace(i int) string { return fmt.Sprintf("ns-%d", i%50) }

func leaf(i int) string {
	if isEvent(i) {
		return fmt.Sprintf("ev-%07d", i)
	}
	return fmt.Sprintf("obj-%07d", i)
}

// key is key i's v2 path (without the store's /1 prefix).
func key(i int) string {
	return "/registry/" + resource(i) + "/" + namespace(i) + "/" + leaf(i)
}

// value is key i's first value; an update sets "updated".
func value(i int) string {
	r := rand.New(rand.NewPCG(uint64(i), 42))
	size := 1024 + r.IntN(3072)
	return fmt.Sprintf(`{"kind":"Object","metadata":{"name":"obj-%d","uid":"%016x"},"spec":{"data":"%s"}}`, i, r.Uint64(), strings.Repeat("x", size))
}

// finalValue is what key i holds after its writes.
func finalValue(i int) string {
	if updated(i) {
		return "updated"
	}
	return value(i)
}

// below counts the j in [0, i) with j%m == r.
func below(i, m, r int) int {
	if i <= r {
		return 0
	}
	return (i-r-1)/m + 1
}

// index is the v2 store index of key i's creation when keys are written one at a time in order,
// each followed by its update or delete: every write takes the next index.
func (d dataset) index(i int) uint64 {
	return d.base + 1 + uint64(i+below(i, 10, 5)+below(i, 50, 7))
}

// currentIndex is the store's index once the keys below split are written.
func (d dataset) currentIndex() uint64 { return d.index(d.split) - 1 }
