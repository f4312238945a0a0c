package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/goverbs/rdma"
)

// The store's side: an http.Handler with PUT and GET of /objects/{name},
// and the state it keeps for each RDMA connection.

// The headers of the token mode.
const (
	// tokenHeader carries the client's region: its RemoteKey as text
	// (rdma.RemoteKey.MarshalText).
	tokenHeader = "Rdma-Token"
	// lengthHeader says, in the answer to a GET by token, how many bytes
	// of the client's region the object filled.
	lengthHeader = "Rdma-Length"
)

// transferTimeout bounds one RDMA READ or WRITE of an object: a client
// that stops answering fails its request rather than hold the connection.
const transferTimeout = 30 * time.Second

// store keeps objects in memory, whole, by name.
type store struct {
	maxObject int // the largest object, in bytes

	mu      sync.RWMutex
	objects map[string][]byte // never changed once stored: a PUT replaces the slice

	connMu sync.Mutex
	conns  map[net.Conn]*connState
	live   sync.WaitGroup // one per connection not yet closed
}

// connState is what the store keeps for one connection: for an RDMA one,
// the staging region its transfers go through, and the tokens it has been
// shown.
type connState struct {
	c *rdma.Conn // nil for TCP

	mu      sync.Mutex // held through a request's transfer
	staging *rdma.Region
	seen    map[rdma.RemoteKey]bool
	closed  bool
}

func newStore(maxObject int) *store {
	return &store{maxObject: maxObject, objects: map[string][]byte{}, conns: map[net.Conn]*connState{}}
}

// server returns an http.Server for the store: its handler, and the hooks
// that give each connection its state and free it at the end.
func (s *store) server() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /objects/{name}", s.put)
	mux.HandleFunc("GET /objects/{name}", s.get)
	return &http.Server{
		Handler:           mux,
		ConnContext:       s.connContext,
		ConnState:         s.connState,
		ReadHeaderTimeout: 10 * time.Second,
	}
}

type stateKey struct{}

// connContext is the server's ConnContext: the connection in the context
// (rdma.ContextWithConn), and for an RDMA one its state.
func (s *store) connContext(ctx context.Context, nc net.Conn) context.Context {
	ctx = rdma.ContextWithConn(ctx, nc)
	c, ok := rdma.ConnFromContext(ctx)
	st := &connState{c: c, seen: map[rdma.RemoteKey]bool{}}
	s.connMu.Lock()
	s.conns[nc] = st
	s.live.Add(1)
	s.connMu.Unlock()
	if !ok {
		return ctx // TCP: bodies only
	}
	return context.WithValue(ctx, stateKey{}, st)
}

// connState is the server's ConnState hook: a connection's end frees its
// staging region (its end revoked it already; only Close unmaps it).
func (s *store) connState(nc net.Conn, cs http.ConnState) {
	if cs != http.StateClosed && cs != http.StateHijacked {
		return
	}
	s.connMu.Lock()
	st := s.conns[nc]
	delete(s.conns, nc)
	s.connMu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	st.closed = true
	if st.staging != nil {
		st.staging.Close()
		st.staging = nil
	}
	st.mu.Unlock()
	s.live.Done()
}

// wait returns once every connection the store's servers accepted is
// closed and its state freed (after the servers' Close).
func (s *store) wait() { s.live.Wait() }

func (s *store) put(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := r.Header[tokenHeader]; ok {
		s.putToken(w, r, name)
		return
	}
	if r.ContentLength > int64(s.maxObject) {
		http.Error(w, fmt.Sprintf("object of %d bytes, the store takes %d at most", r.ContentLength, s.maxObject), http.StatusRequestEntityTooLarge)
		return
	}
	var data []byte
	var err error
	body := http.MaxBytesReader(w, r.Body, int64(s.maxObject))
	if r.ContentLength >= 0 {
		data = make([]byte, r.ContentLength)
		_, err = io.ReadFull(body, data)
	} else {
		data, err = io.ReadAll(body)
	}
	if err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			http.Error(w, fmt.Sprintf("object over %d bytes", s.maxObject), http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
		return
	}
	s.keep(name, data)
	w.WriteHeader(http.StatusNoContent)
}

func (s *store) get(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := r.Header[tokenHeader]; ok {
		s.getToken(w, r, name)
		return
	}
	obj, ok := s.lookup(name)
	if !ok {
		http.Error(w, "no object "+strconv.Quote(name), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(obj)))
	w.Write(obj)
}

// putToken RDMA-READs the object from the client's region into the
// connection's staging region, and keeps a copy.
func (s *store) putToken(w http.ResponseWriter, r *http.Request, name string) {
	st, key, ok := s.take(w, r, rdma.RemoteRead)
	if !ok {
		return
	}
	defer st.mu.Unlock()
	if key.Size > uint64(s.maxObject) {
		http.Error(w, fmt.Sprintf("object of %d bytes, the store takes %d at most", key.Size, s.maxObject), http.StatusRequestEntityTooLarge)
		return
	}
	n := int(key.Size)
	staging, err := st.stage(n)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInsufficientStorage)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), transferTimeout)
	defer cancel()
	if err := st.c.Remote(key).ReadAtContext(ctx, staging, 0, n, 0); err != nil {
		transferFailed(w, err)
		return
	}
	s.keep(name, bytes.Clone(staging.Bytes()[:n]))
	w.WriteHeader(http.StatusNoContent)
}

// getToken copies the object into the staging region and RDMA-WRITEs it
// into the client's region.
func (s *store) getToken(w http.ResponseWriter, r *http.Request, name string) {
	st, key, ok := s.take(w, r, rdma.RemoteWrite)
	if !ok {
		return
	}
	defer st.mu.Unlock()
	obj, ok := s.lookup(name)
	if !ok {
		http.Error(w, "no object "+strconv.Quote(name), http.StatusNotFound)
		return
	}
	if uint64(len(obj)) > key.Size {
		http.Error(w, fmt.Sprintf("object of %d bytes, the token's region holds %d", len(obj), key.Size), http.StatusRequestEntityTooLarge)
		return
	}
	staging, err := st.stage(len(obj))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInsufficientStorage)
		return
	}
	copy(staging.Bytes(), obj)
	ctx, cancel := context.WithTimeout(r.Context(), transferTimeout)
	defer cancel()
	if err := st.c.Remote(key).WriteAtContext(ctx, staging, 0, len(obj), 0); err != nil {
		transferFailed(w, err)
		return
	}
	// WriteAtContext returned once the client's NIC had the bytes: the
	// answer, sent after, finds them in place.
	w.Header().Set(lengthHeader, strconv.Itoa(len(obj)))
	w.WriteHeader(http.StatusNoContent)
}

// take decodes the request's token and consumes it. Every well-formed
// token counts as used on its connection, whatever becomes of the
// request: the client closes its region after the answer, and an RDMA
// access to a closed region fails the connection itself (both sides,
// every request on it), so a token seen before is refused without
// touching the memory. On success it returns the connection's state
// locked.
func (s *store) take(w http.ResponseWriter, r *http.Request, need rdma.Access) (*connState, rdma.RemoteKey, bool) {
	var key rdma.RemoteKey
	st, _ := r.Context().Value(stateKey{}).(*connState)
	if st == nil {
		http.Error(w, "a token is good only on an RDMA connection", http.StatusBadRequest)
		return nil, key, false
	}
	values := r.Header.Values(tokenHeader)
	if len(values) != 1 {
		http.Error(w, fmt.Sprintf("%d tokens, want 1", len(values)), http.StatusBadRequest)
		return nil, key, false
	}
	if err := key.UnmarshalText([]byte(values[0])); err != nil {
		http.Error(w, "bad token: "+err.Error(), http.StatusBadRequest)
		return nil, key, false
	}
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		http.Error(w, "connection closed", http.StatusServiceUnavailable)
		return nil, key, false
	}
	if st.seen[key] {
		st.mu.Unlock()
		http.Error(w, "token already used on this connection", http.StatusConflict)
		return nil, key, false
	}
	st.seen[key] = true
	if key.Access&need == 0 {
		st.mu.Unlock()
		http.Error(w, fmt.Sprintf("the token grants %v access, the request needs %v", key.Access, need), http.StatusBadRequest)
		return nil, key, false
	}
	return st, key, true
}

// stage returns the connection's staging region, at least n bytes (one at
// the least), registered anew when it is too small. Its access is local:
// the client never learns its key. st.mu is held.
func (st *connState) stage(n int) (*rdma.Region, error) {
	n = max(n, 1)
	if st.staging != nil && st.staging.Len() >= n {
		return st.staging, nil
	}
	if st.staging != nil {
		st.staging.Close()
		st.staging = nil
	}
	const grain = 1 << 20 // staging grows in MiB, not in the bytes of each object
	r, err := st.c.RegisterRegion((n+grain-1)/grain*grain, 0)
	if err != nil {
		return nil, err
	}
	st.staging = r
	return r, nil
}

// transferFailed answers a failed RDMA READ or WRITE. A remote access
// error (a region the client closed, bounds its key lied about) has
// failed the connection, and the answer will not reach the client; it is
// logged here.
func transferFailed(w http.ResponseWriter, err error) {
	if errors.Is(err, rdma.ErrRemoteAccess) {
		log.Printf("objectstore: %v", err)
	}
	http.Error(w, err.Error(), http.StatusBadGateway)
}

func (s *store) keep(name string, data []byte) {
	s.mu.Lock()
	s.objects[name] = data
	s.mu.Unlock()
}

func (s *store) lookup(name string) ([]byte, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	obj, ok := s.objects[name]
	return obj, ok
}
