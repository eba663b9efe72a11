package proxy

import (
	"net/http"
	"sync"
	"time"

	"github.com/kubefence/kubefence/policy"
	"github.com/kubefence/kubefence/proxy/admin"
)

// writeLog remembers the last writes the proxy forwarded and the backend applied, so that a
// cutover's preflight can tell the writes that reached blue etcd through a proxy from those that
// went around it (GET /v1/writes). It is a ring of fixed size: a write costs one lock and one
// slot, no allocation.
type writeLog struct {
	mu   sync.Mutex
	ring []admin.ForwardedWrite
	next int  // the slot the next write goes into
	full bool // the ring has wrapped: the oldest entry is at next
	// started is when the log began (the proxy's start): the writes it forwarded before a
	// restart are not in it.
	started time.Time
}

// writeLogSize is how many forwarded writes the proxy remembers (about a minute at 1,000 writes/s).
const writeLogSize = 1 << 16

func newWriteLog(size int) *writeLog {
	return &writeLog{ring: make([]admin.ForwardedWrite, size), started: time.Now()}
}

// add logs a write a answered at at, took after it was forwarded.
func (l *writeLog) add(a *policy.Attributes, at time.Time, took time.Duration) {
	l.mu.Lock()
	l.ring[l.next] = admin.ForwardedWrite{At: at, Verb: a.Verb, Group: a.APIGroup, Resource: a.Resource, Subresource: a.Subresource, Namespace: a.Namespace, Name: a.Name, Took: admin.Duration(took)}
	l.next++
	if l.next == len(l.ring) {
		l.next, l.full = 0, true
	}
	l.mu.Unlock()
}

// since returns the writes forwarded at or after t, oldest first, and whether the log still
// reaches back to t (false: older writes were dropped, or the proxy started after t: the answer
// may be missing some).
func (l *writeLog) since(t time.Time) admin.WritesResponse {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ordered []admin.ForwardedWrite
	if l.full {
		ordered = append(append(ordered, l.ring[l.next:]...), l.ring[:l.next]...)
	} else {
		ordered = l.ring[:l.next]
	}
	// Complete when nothing was dropped since t: the ring has not wrapped and the log began by
	// t (a proxy restarted since t has not the writes of before), or its oldest is from by t.
	resp := admin.WritesResponse{Complete: (!l.full && !t.Before(l.started)) || (len(ordered) > 0 && !ordered[0].At.After(t))}
	for _, w := range ordered {
		if !w.At.Before(t) {
			resp.Writes = append(resp.Writes, w)
		}
	}
	return resp
}

// withWriteLog records every resource write the backend applied (answered 2xx): it sits right
// before the backend, so what it sees was forwarded (a held write when it is released). A write
// the backend refused never reached etcd; counted, it would hide a writer around the proxy in the
// same resource and namespace. A write whose answer never came (the client left, a timeout) is
// not counted either: the preflight may then report a writer that was not there, never miss one.
func withWriteLog(next http.Handler, l *writeLog) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := &reqStateFrom(r.Context()).attrs
		if a.Class() != policy.Write || !a.IsResourceRequest || a.Session() || a.DryRun || a.StoresNothing() {
			next.ServeHTTP(w, r) // reads pay nothing here
			return
		}
		start := time.Now()
		next.ServeHTTP(w, r)
		if applied(w) {
			now := time.Now()
			l.add(a, now, now.Sub(start))
		}
	})
}

// applied says whether the answer written to w says the backend applied the request (2xx). A
// writer that did not record its status (not the chain's statusWriter) counts as applied.
func applied(w http.ResponseWriter) bool {
	sw, ok := w.(*statusWriter)
	return !ok || sw.code == 0 || sw.code/100 == 2
}
