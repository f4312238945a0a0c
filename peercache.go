package rdma

import (
	"errors"
	"net/netip"
	"sync"
	"time"
)

// A PacketConn sends to a peer through an address handle, which it
// resolves from the peer's address once (a route and path lookup, as slow
// as a connection's) and keeps while the peer is in use. The cache of
// them is bounded, because every address a program writes to would
// otherwise stay there, each handle holding device memory; least
// recently used goes first. A failed resolution is remembered a while so
// a program writing to an unreachable peer in a loop does not start a
// lookup per datagram, and the writers that want the same peer at once
// share one lookup. A handle evicted while a send that uses it is in
// flight is destroyed only once that send gives it back.

// errCacheClosed is what peerCache's calls fail with once it is closed.
var errCacheClosed = errors.New("rdma: peer cache closed")

// peerRef is a peer's entry: its value once resolved, or its failure,
// and who holds it.
type peerRef[V any] struct {
	key   netip.AddrPort
	v     V
	ok    bool  // v is resolved
	err   error // a failed resolution, remembered until until
	until time.Time
	wait  chan struct{}
	woken bool // wait is closed
	refs  int  // holders: the resolver while it resolves, then senders
	gone  bool // out of the cache: v is freed when the last holder goes

	prev, next *peerRef[V] // the LRU list, most recent first
}

// peerLookup is acquire's answer, one of:
//   - ref non-nil, resolve false: the value v, held; the caller gives ref
//     back with release once done with v;
//   - resolve true: a miss, and this caller resolves: ref is its hold on
//     the entry, which it passes to resolved (and nothing else);
//   - wait non-nil: another caller is resolving; wait is closed once it
//     is done, and then the caller asks again;
//   - err non-nil: a remembered failure, or errCacheClosed.
//
// hit is true for the answers the cache gave from what it had: a value
// or a remembered failure. A resolve is a miss; a wait is neither, and
// its second acquire counts.
type peerLookup[V any] struct {
	v       V
	ref     *peerRef[V]
	wait    <-chan struct{}
	resolve bool
	err     error
	hit     bool
}

// peerCache maps peer addresses to values (address handles), at most
// limit of them, least recently used evicted first. It is safe for concurrent
// use.
type peerCache[V any] struct {
	limit   int
	failTTL time.Duration
	free    func(V)

	mu       sync.Mutex
	entries  map[netip.AddrPort]*peerRef[V]
	newest   *peerRef[V]
	oldest   *peerRef[V]
	isClosed bool
}

// newPeerCache returns a cache of at most limit entries (at least 1) that
// remembers a failed resolution for failTTL and calls free for each
// value once it is out of the cache and no one holds it, never with the
// cache's lock held.
func newPeerCache[V any](limit int, failTTL time.Duration, free func(V)) *peerCache[V] {
	return &peerCache[V]{
		limit:   max(limit, 1),
		failTTL: failTTL,
		free:    free,
		entries: make(map[netip.AddrPort]*peerRef[V]),
	}
}

// acquire looks key up at now: see peerLookup for its answers. Of the
// callers that miss on a key at once, one resolves and the others wait
// for it.
func (c *peerCache[V]) acquire(key netip.AddrPort, now time.Time) peerLookup[V] {
	c.mu.Lock()
	if c.isClosed {
		c.mu.Unlock()
		return peerLookup[V]{err: errCacheClosed}
	}
	if e := c.entries[key]; e != nil {
		switch {
		case e.ok:
			e.refs++
			c.touch(e)
			c.mu.Unlock()
			return peerLookup[V]{v: e.v, ref: e, hit: true}
		case e.err == nil:
			c.mu.Unlock()
			return peerLookup[V]{wait: e.wait}
		case now.Before(e.until):
			c.touch(e)
			c.mu.Unlock()
			return peerLookup[V]{err: e.err, hit: true}
		}
		// The failure is old enough to try again.
		c.evict(e)
	}
	e := &peerRef[V]{key: key, wait: make(chan struct{}), refs: 1}
	c.entries[key] = e
	c.pushFront(e)
	var freed []V
	for len(c.entries) > c.limit {
		if v, ok := c.evict(c.oldest); ok {
			freed = append(freed, v)
		}
	}
	c.mu.Unlock()
	for _, v := range freed {
		c.free(v)
	}
	return peerLookup[V]{ref: e, resolve: true}
}

// resolved ends the resolution acquire asked for with its ref: v, or err
// if it failed. Either way the callers waiting for it wake. On success it
// returns ref again, held (the resolver's hold passes to the send it
// resolved for, to give back with release); on failure the error, which
// the cache remembers for failTTL. If the cache closed meanwhile, v is
// freed and the error is errCacheClosed. A resolver that gives up calls
// resolved with an error too, or its waiters wait forever.
func (c *peerCache[V]) resolved(ref *peerRef[V], v V, err error, now time.Time) (*peerRef[V], error) {
	c.mu.Lock()
	if !ref.woken {
		ref.woken = true
		close(ref.wait)
	}
	if err != nil {
		ref.err, ref.until = err, now.Add(c.failTTL)
		ref.refs--
		if !ref.gone && c.failTTL <= 0 {
			c.evict(ref)
		}
		c.mu.Unlock()
		return nil, err
	}
	ref.v, ref.ok = v, true
	if c.isClosed {
		ref.refs--
		last := ref.refs == 0
		c.mu.Unlock()
		if last {
			c.free(v)
		}
		return nil, errCacheClosed
	}
	c.mu.Unlock()
	return ref, nil
}

// release gives back a hold acquire or resolved gave; the value is freed
// now if it left the cache meanwhile and this was its last holder.
func (c *peerCache[V]) release(ref *peerRef[V]) {
	c.mu.Lock()
	if ref.refs <= 0 {
		c.mu.Unlock()
		panic("rdma: peer cache entry released more often than acquired")
	}
	ref.refs--
	last := ref.refs == 0 && ref.gone && ref.ok
	c.mu.Unlock()
	if last {
		c.free(ref.v)
	}
}

// close empties the cache: values no one holds are freed now, the others
// as they are released; callers waiting on a resolution wake. Later
// acquires fail with errCacheClosed.
func (c *peerCache[V]) close() {
	c.mu.Lock()
	c.isClosed = true
	var freed []V
	for c.oldest != nil {
		e := c.oldest
		if v, ok := c.evict(e); ok {
			freed = append(freed, v)
		}
		if !e.woken {
			e.woken = true
			close(e.wait)
		}
	}
	c.mu.Unlock()
	for _, v := range freed {
		c.free(v)
	}
}

// len is how many peers the cache has: resolved, failed or resolving.
func (c *peerCache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// evict takes e out of the cache and returns its value if it is to be
// freed now (no one holds it). A resolving entry's resolver and waiters
// still finish with it.
func (c *peerCache[V]) evict(e *peerRef[V]) (v V, free bool) {
	delete(c.entries, e.key)
	c.unlink(e)
	e.gone = true
	if e.ok && e.refs == 0 {
		return e.v, true
	}
	return v, false
}

func (c *peerCache[V]) touch(e *peerRef[V]) {
	if c.newest != e {
		c.unlink(e)
		c.pushFront(e)
	}
}

func (c *peerCache[V]) pushFront(e *peerRef[V]) {
	e.prev, e.next = nil, c.newest
	if c.newest != nil {
		c.newest.prev = e
	} else {
		c.oldest = e
	}
	c.newest = e
}

func (c *peerCache[V]) unlink(e *peerRef[V]) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.newest = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.oldest = e.prev
	}
	e.prev, e.next = nil, nil
}
