package main

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
)

// The backend: a fast Go TLS server standing in for kube-apiserver. It speaks HTTP/2 and
// HTTP/1.1 (as kube-apiserver does) and answers
//   - GET benchPath: a ~4 KB list;
//   - GET bigListPath: a ~1 MB list;
//   - GET with ?watch=true: a watch stream of the events the broadcaster sends;
//   - anything else: 201 Created, counted in backendPosts.

const (
	benchPath   = "/api/v1/namespaces/default/configmaps"
	bigListPath = "/api/v1/pods"
	watchPath   = "/api/v1/namespaces/default/configmaps?watch=true"
)

// listBody is a ~4 KB Kubernetes-like list; bigListBody a ~1 MB one.
var listBody, bigListBody = makeList(12), makeList(2900)

func makeList(items int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"123456"},"items":[`)
	for i := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"metadata":{"name":"config-%04d","namespace":"default","uid":"0b6a7c52-2f7e-4b1e-9c3e-%012d","resourceVersion":"%d"},"data":{"payload":"%s"}}`,
			i, i, 100000+i, strings.Repeat("x", 200))
	}
	b.WriteString("]}")
	return b.Bytes()
}

var backendPosts atomic.Int64

// broadcaster sends every event to every open watch on the backend.
type broadcaster struct {
	mu      sync.Mutex
	subs    map[chan []byte]struct{}
	dropped atomic.Int64 // events a slow watch could not take (the scenario fails if any)
}

func (bc *broadcaster) subscribe() chan []byte {
	ch := make(chan []byte, 256)
	bc.mu.Lock()
	bc.subs[ch] = struct{}{}
	bc.mu.Unlock()
	return ch
}

func (bc *broadcaster) unsubscribe(ch chan []byte) {
	bc.mu.Lock()
	delete(bc.subs, ch)
	bc.mu.Unlock()
}

func (bc *broadcaster) watchers() int {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return len(bc.subs)
}

// send gives an event to every watch; each watch stamps it with the time it writes it.
func (bc *broadcaster) send(rv int) {
	ev := fmt.Appendf(nil, `{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"watched","namespace":"default","resourceVersion":"%d"},"data":{"sent":"%019d","payload":"%s"}}}`+"\n",
		rv, 0, strings.Repeat("x", 400))
	bc.mu.Lock()
	defer bc.mu.Unlock()
	for ch := range bc.subs {
		select {
		case ch <- ev:
		default:
			bc.dropped.Add(1)
		}
	}
}

func (bc *broadcaster) serveWatch(w http.ResponseWriter, r *http.Request) {
	ch := bc.subscribe()
	defer bc.unsubscribe(ch)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	var buf []byte
	for {
		select {
		case <-r.Context().Done():
			return
		case ev := <-ch:
			// The delay a watcher measures starts here, when the backend writes the event to
			// this watch: the backend's own fan-out to 1,000 watches is not the proxy's.
			buf = append(buf[:0], ev...)
			i := bytes.Index(buf, sentField) + len(sentField)
			copy(buf[i:i+19], fmt.Appendf(nil, "%019d", time.Now().UnixNano()))
			if _, err := w.Write(buf); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}
}

func startBackend(pki *framework.PKI, bc *broadcaster) (string, func(), error) {
	cert, err := tls.LoadX509KeyPair(pki.APIServerCert, pki.APIServerKey)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	created := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}`)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true" {
				bc.serveWatch(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			if r.Method == http.MethodGet {
				body := listBody
				if r.URL.Path == bigListPath {
					body = bigListBody
				}
				_, _ = w.Write(body)
				return
			}
			backendPosts.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(created)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		HTTP2:     &http.HTTP2Config{MaxConcurrentStreams: 1000},
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return "https://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
