package main

import (
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

// store keeps objects in memory, whole, by name. An object that arrived
// over RDMA lives in a region registered for it on the connection it came
// by: a PUT by token RDMA-READs straight into it, and a GET by token
// RDMA-WRITEs straight from it, on that connection or, through a
// registration of the same memory (rdma.Conn.ShareRegion), on any other.
// The region's memory stays mapped once its connection is over (only its
// Close unmaps it), so the object outlives the connection that brought it.
type store struct {
	maxObject int // the largest object, in bytes

	mu      sync.Mutex
	objects map[string]*object
	closed  bool

	connMu sync.Mutex
	conns  map[net.Conn]*connState
	live   sync.WaitGroup // one per connection not yet closed
}

// object is a stored object. Its bytes never change once it is stored: a
// PUT replaces the object. Whoever uses them holds a reference (lookup,
// release); the last one frees the memory.
type object struct {
	data []byte       // reg's memory, or the Go heap's (an object stored over TCP)
	reg  *rdma.Region // nil for the heap
	home *connState   // the connection reg is registered on

	refs int // under store.mu: the map's, and one per request using it

	mu     sync.Mutex
	shares map[*connState]*rdma.Region // its memory registered on other connections
}

// connState is what the store keeps for one connection: for an RDMA one,
// the tokens it has been shown, the objects' regions registered on it and
// a staging region for the objects that have none.
type connState struct {
	c *rdma.Conn // nil for TCP

	mu      sync.Mutex // held through a request's transfer
	seen    map[rdma.RemoteKey]bool
	spare   []*rdma.Region   // regions of replaced objects, for the next PUTs
	shared  map[*object]bool // the objects with a share on this connection
	staging *rdma.Region     // for objects stored over TCP
	closed  bool
}

// spareBytes bounds the regions a connection keeps for reuse: registering
// a region costs more than the transfer of its bytes on a software RDMA
// device, so a client that replaces its objects reuses the memory of the
// ones it replaced.
const spareBytes = 64 << 20

func newStore(maxObject int) *store {
	return &store{maxObject: maxObject, objects: map[string]*object{}, conns: map[net.Conn]*connState{}}
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
	st := &connState{c: c, seen: map[rdma.RemoteKey]bool{}, shared: map[*object]bool{}}
	s.connMu.Lock()
	s.conns[nc] = st
	s.live.Add(1)
	s.connMu.Unlock()
	if !ok {
		return ctx // TCP: bodies only
	}
	return context.WithValue(ctx, stateKey{}, st)
}

// connState is the server's ConnState hook: a connection's end closes the
// regions it alone used (its end revoked them already; only Close unmaps
// them). The stored objects' own regions stay, mapped, until the objects
// are replaced.
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
	for obj := range st.shared {
		obj.mu.Lock()
		r := obj.shares[st]
		delete(obj.shares, st)
		obj.mu.Unlock()
		if r != nil {
			r.Close()
		}
	}
	st.shared = nil
	for _, r := range st.spare {
		r.Close()
	}
	st.spare = nil
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

// close drops every object, which frees their memory (after wait: no
// request uses them).
func (s *store) close() {
	s.mu.Lock()
	objs := s.objects
	s.objects, s.closed = map[string]*object{}, true
	s.mu.Unlock()
	for _, obj := range objs {
		s.release(obj)
	}
}

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
	st, _ := r.Context().Value(stateKey{}).(*connState)
	var obj *object
	var err error
	body := http.MaxBytesReader(w, r.Body, int64(s.maxObject))
	switch {
	case st != nil && r.ContentLength > 0:
		// Over RDMA the object gets a region of its own, so that a GET
		// by token writes from it with no copy.
		st.mu.Lock()
		obj, err = st.newObject(int(r.ContentLength))
		st.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInsufficientStorage)
			return
		}
		if _, err = io.ReadFull(body, obj.data); err != nil {
			s.release(obj)
		}
	case r.ContentLength >= 0:
		obj = &object{data: make([]byte, r.ContentLength), refs: 1}
		_, err = io.ReadFull(body, obj.data)
	default:
		obj = &object{refs: 1}
		obj.data, err = io.ReadAll(body)
	}
	if err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			http.Error(w, fmt.Sprintf("object over %d bytes", s.maxObject), http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
		return
	}
	s.keep(name, obj)
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
	defer s.release(obj)
	w.Header().Set("Content-Length", strconv.Itoa(len(obj.data)))
	w.Write(obj.data)
}

// putToken RDMA-READs the object from the client's region straight into
// a region of the object's own, and stores it.
func (s *store) putToken(w http.ResponseWriter, r *http.Request, name string) {
	st, key, ok := s.take(w, r, rdma.RemoteRead)
	if !ok {
		return
	}
	obj := s.readObject(w, r, st, key)
	if obj == nil {
		return
	}
	// Out of st.mu: the object it replaces may give its region back to
	// this connection.
	s.keep(name, obj)
	w.WriteHeader(http.StatusNoContent)
}

// readObject is putToken's transfer, st.mu held (and released); it
// answers its failures itself.
func (s *store) readObject(w http.ResponseWriter, r *http.Request, st *connState, key rdma.RemoteKey) *object {
	defer st.mu.Unlock()
	if key.Size > uint64(s.maxObject) {
		http.Error(w, fmt.Sprintf("object of %d bytes, the store takes %d at most", key.Size, s.maxObject), http.StatusRequestEntityTooLarge)
		return nil
	}
	n := int(key.Size)
	obj, err := st.newObject(n)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInsufficientStorage)
		return nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), transferTimeout)
	defer cancel()
	if err := st.c.Remote(key).ReadAtContext(ctx, obj.reg, 0, n, 0); err != nil {
		st.spareRegion(obj.reg) // no one else saw the object
		transferFailed(w, err)
		return nil
	}
	return obj
}

// getToken RDMA-WRITEs the object into the client's region: from the
// object's region, or its memory registered on this connection.
func (s *store) getToken(w http.ResponseWriter, r *http.Request, name string) {
	st, key, ok := s.take(w, r, rdma.RemoteWrite)
	if !ok {
		return
	}
	obj, ok := s.lookup(name)
	if !ok {
		st.mu.Unlock()
		http.Error(w, "no object "+strconv.Quote(name), http.StatusNotFound)
		return
	}
	defer s.release(obj) // out of st.mu, which the next line's runs first
	defer st.mu.Unlock()
	n := len(obj.data)
	if uint64(n) > key.Size {
		http.Error(w, fmt.Sprintf("object of %d bytes, the token's region holds %d", n, key.Size), http.StatusRequestEntityTooLarge)
		return
	}
	src, err := st.regionFor(obj)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInsufficientStorage)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), transferTimeout)
	defer cancel()
	if err := st.c.Remote(key).WriteAtContext(ctx, src, 0, n, 0); err != nil {
		transferFailed(w, err)
		return
	}
	// WriteAtContext returned once the client's NIC had the bytes: the
	// answer, sent after, finds them in place.
	w.Header().Set(lengthHeader, strconv.Itoa(n))
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

// newObject returns an object of n bytes (n > 0) in a region of this
// connection: a spare one of n to 2n bytes, or one registered for it. Its
// access is local: the client never learns its key. Its one reference is
// the caller's. st.mu is held.
func (st *connState) newObject(n int) (*object, error) {
	if st.closed {
		return nil, errors.New("connection closed")
	}
	best := -1
	for i, r := range st.spare {
		if r.Len() >= n && r.Len() <= 2*n && (best < 0 || r.Len() < st.spare[best].Len()) {
			best = i
		}
	}
	var reg *rdma.Region
	if best >= 0 {
		reg = st.spare[best]
		st.spare = append(st.spare[:best], st.spare[best+1:]...)
	} else {
		var err error
		if reg, err = st.c.RegisterRegion(n, 0); err != nil {
			return nil, err
		}
	}
	return &object{data: reg.Bytes()[:n], reg: reg, home: st, refs: 1}, nil
}

// spareRegion keeps a region no object uses any more for the next PUTs,
// or closes it: the connection is over, or keeps enough. st.mu is held.
func (st *connState) spareRegion(r *rdma.Region) {
	total := r.Len()
	for _, sr := range st.spare {
		total += sr.Len()
	}
	if st.closed || total > spareBytes {
		r.Close()
		return
	}
	st.spare = append(st.spare, r)
}

// regionFor returns a region of this connection holding obj's bytes: its
// own, on the connection it came by; its memory registered here, made at
// the first GET on this connection and kept until the object or the
// connection goes; or, for an object in the Go heap, the staging region
// with a copy. st.mu is held, and a reference to obj.
func (st *connState) regionFor(obj *object) (*rdma.Region, error) {
	if obj.reg == nil {
		r, err := st.stage(len(obj.data))
		if err != nil {
			return nil, err
		}
		copy(r.Bytes(), obj.data)
		return r, nil
	}
	if obj.home == st {
		return obj.reg, nil
	}
	obj.mu.Lock()
	r := obj.shares[st]
	obj.mu.Unlock()
	if r != nil {
		return r, nil
	}
	r, err := st.c.ShareRegion(obj.reg, 0)
	if err != nil {
		return nil, err
	}
	obj.mu.Lock()
	if obj.shares == nil {
		obj.shares = map[*connState]*rdma.Region{}
	}
	obj.shares[st] = r
	obj.mu.Unlock()
	st.shared[obj] = true
	return r, nil
}

// stage returns the connection's staging region, at least n bytes (one at
// the least), registered anew when it is too small. Its access is local.
// st.mu is held.
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

// keep stores obj as name, handing its reference to the store, and
// releases the object it replaces. No connection's st.mu is held.
func (s *store) keep(name string, obj *object) {
	s.mu.Lock()
	old := s.objects[name]
	if s.closed {
		old = obj
	} else {
		s.objects[name] = obj
	}
	s.mu.Unlock()
	if old != nil {
		s.release(old)
	}
}

// lookup returns the object stored as name, with a reference the caller
// releases.
func (s *store) lookup(name string) (*object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, ok := s.objects[name]
	if ok {
		obj.refs++
	}
	return obj, ok
}

// release drops a reference to obj; the last one frees its memory: the
// other connections' registrations of it are closed, and its region goes
// back to its connection for another object (or is closed, which unmaps
// the memory once no registration shares it). No connection's st.mu is
// held.
func (s *store) release(obj *object) {
	s.mu.Lock()
	obj.refs--
	last := obj.refs == 0
	s.mu.Unlock()
	if !last {
		return
	}
	obj.mu.Lock()
	shares := obj.shares
	obj.shares = nil
	obj.mu.Unlock()
	for st, r := range shares {
		r.Close()
		st.mu.Lock()
		delete(st.shared, obj)
		st.mu.Unlock()
	}
	if obj.reg != nil {
		obj.home.mu.Lock()
		obj.home.spareRegion(obj.reg)
		obj.home.mu.Unlock()
	}
}
