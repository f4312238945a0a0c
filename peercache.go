package rdma

import (
	"errors"
	"net"
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
//
// A peer may go and another PacketConn open on its address and port, with
// a QP of another number: the entry would send to a QP that is gone. Two
// things resolve it again. A datagram from the peer's address whose
// source QP is not the entry's starts a resolution at once (at most one a
// verifyEvery), and the writes to that peer wait for it: the datagram
// itself is not trusted to say where the peer is, since its port is only
// what its header claims and any process on the peer's host may send one;
// the resolution asks the peer's rdma_cm, which answers with the QP bound
// to the port. And an entry that neither was resolved nor heard from (a
// datagram from its QP) for refreshAfter is resolved again, in the
// background, on its next write: the writes go on to the handle it has
// until the new one is there. A resolution that fails then keeps the
// entry as it is, for another refreshAfter.

// errCacheClosed is what peerCache's calls fail with once it is closed.
var errCacheClosed = errors.New("rdma: peer cache closed")

// peerValue is what a peerCache holds: a resolved destination, which
// names the QP it sends to.
type peerValue interface {
	qpNum() uint32
}

// peerRef is a peer's entry: its value once resolved, or its failure,
// and who holds it.
type peerRef[V peerValue] struct {
	key   netip.AddrPort
	v     V
	ok    bool  // v is resolved
	err   error // a failed resolution, remembered until until
	until time.Time
	wait  chan struct{}
	woken bool // wait is closed
	refs  int  // holders: the resolver while it resolves, then senders
	gone  bool // out of the cache: v is freed when the last holder goes

	// fresh is when v was last known good: resolved, or a datagram came
	// from its QP. After refreshAfter more it is resolved again.
	fresh time.Time
	// refreshing: a resolution of a resolved entry is under way (its
	// resolver holds the entry). With verify, the writes wait for it on
	// verified.
	refreshing bool
	verify     bool
	verified   chan struct{}
	// suspect is when a datagram from another QP than v's last started a
	// resolution; a replacement entry keeps it, so that datagrams cannot
	// start more than one a verifyEvery.
	suspect time.Time

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
// With a value, refresh non-nil asks the caller to resolve the peer
// again, in the background, and to give the outcome to refreshed with
// refresh (a hold of its own); the value is good to use meanwhile.
//
// hit is true for the answers the cache gave from what it had: a value
// or a remembered failure. A resolve is a miss; a wait is neither, and
// its second acquire counts.
type peerLookup[V peerValue] struct {
	v       V
	ref     *peerRef[V]
	wait    <-chan struct{}
	resolve bool
	err     error
	hit     bool
	refresh *peerRef[V]
}

// peerCache maps peer addresses to values (address handles), at most
// limit of them, least recently used evicted first. It is safe for concurrent
// use.
type peerCache[V peerValue] struct {
	limit   int
	failTTL time.Duration
	free    func(V)
	// refreshAfter is how long a resolved entry stays good without a
	// datagram from its QP before it is resolved again (0: for ever);
	// verifyEvery how often at most datagrams from another QP start a
	// resolution of one entry.
	refreshAfter time.Duration
	verifyEvery  time.Duration

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
func newPeerCache[V peerValue](limit int, failTTL time.Duration, free func(V)) *peerCache[V] {
	return &peerCache[V]{
		limit:        max(limit, 1),
		failTTL:      failTTL,
		free:         free,
		refreshAfter: peerRefreshAfter,
		verifyEvery:  peerVerifyEvery,
		entries:      make(map[netip.AddrPort]*peerRef[V]),
	}
}

// peerRefreshAfter is how long a destination's address handle and QP
// number are used with no datagram from that QP before the destination
// is resolved again: at most one resolution per destination so often,
// for a destination written to and never heard from.
const peerRefreshAfter = 5 * time.Second

// peerVerifyEvery is how often at most datagrams from a destination's
// address but another QP start a resolution of it (each one holds up the
// writes to that destination for a resolution's time): a peer sending
// them on purpose costs the writer one resolution a second.
const peerVerifyEvery = time.Second

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
		case e.ok && e.verify:
			// A datagram from another QP says the peer may have moved:
			// the writes wait for its resolution.
			wait := e.verified
			c.mu.Unlock()
			return peerLookup[V]{wait: wait}
		case e.ok:
			e.refs++
			c.touch(e)
			l := peerLookup[V]{v: e.v, ref: e, hit: true}
			if !e.refreshing && c.stale(e, now) {
				e.refreshing = true
				e.refs++
				l.refresh = e
			}
			c.mu.Unlock()
			return l
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
	ref.v, ref.ok, ref.fresh = v, true, now
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

// stale reports whether e, resolved, is to be resolved again at now; mu
// is held.
func (c *peerCache[V]) stale(e *peerRef[V], now time.Time) bool {
	return c.refreshAfter > 0 && now.Sub(e.fresh) >= c.refreshAfter
}

// heard records a datagram from key's address sent by the QP qpn, at
// now. From the entry's QP, it keeps the entry good for refreshAfter
// more. From another QP, it asks for a resolution (at most one a
// verifyEvery) that the writes to key wait for: it returns the entry,
// held, for the caller to resolve and give to refreshed. An address with
// no resolved entry is not added: datagrams from many addresses must not
// push out the peers in use.
func (c *peerCache[V]) heard(key netip.AddrPort, qpn uint32, now time.Time) *peerRef[V] {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil || !e.ok || c.isClosed {
		return nil
	}
	if e.v.qpNum() == qpn {
		if now.After(e.fresh) {
			e.fresh = now
		}
		return nil
	}
	if e.verify || now.Sub(e.suspect) < c.verifyEvery {
		return nil
	}
	e.suspect = now
	e.verify = true
	e.verified = make(chan struct{})
	if e.refreshing {
		// A background resolution is under way: the writes wait for it.
		return nil
	}
	e.refreshing = true
	e.refs++
	return e
}

// refreshed ends a resolution of a resolved entry that acquire (refresh)
// or heard asked for, with ref, the hold they gave: v, or err if it
// failed. A new value replaces the entry (the old one is freed once its
// senders are done with it), and is good for refreshAfter; after a
// failure the entry stays as it was, good for refreshAfter more. Writers
// waiting for the resolution wake.
func (c *peerCache[V]) refreshed(ref *peerRef[V], v V, err error, now time.Time) {
	c.mu.Lock()
	ref.refreshing, ref.verify = false, false
	if ref.verified != nil {
		close(ref.verified)
		ref.verified = nil
	}
	ref.refs--
	var freed []V
	switch {
	case err != nil:
		ref.fresh = now
		if ref.gone && ref.refs == 0 {
			freed = append(freed, ref.v)
		}
	case ref.gone || c.isClosed:
		// Evicted or closed meanwhile: the new value has no entry.
		freed = append(freed, v)
		if ref.gone && ref.refs == 0 {
			freed = append(freed, ref.v)
		}
	default:
		if old, ok := c.evict(ref); ok {
			freed = append(freed, old)
		}
		e := &peerRef[V]{key: ref.key, v: v, ok: true, woken: true, fresh: now, suspect: ref.suspect}
		c.entries[e.key] = e
		c.pushFront(e)
	}
	c.mu.Unlock()
	for _, v := range freed {
		c.free(v)
	}
}

// refreshedGone ends a refresh (see refreshed) whose answer was that the
// destination is no more (nothing listens on its port): the entry leaves
// the cache, so the next write resolves it anew, as a new destination's.
func (c *peerCache[V]) refreshedGone(ref *peerRef[V], err error, now time.Time) {
	c.mu.Lock()
	if !ref.gone && c.entries[ref.key] == ref {
		c.evict(ref) // the refresh holds ref: nothing is freed here
	}
	c.mu.Unlock()
	var none V
	c.refreshed(ref, none, err, now)
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
		if e.verified != nil {
			close(e.verified)
			e.verified = nil
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

// The PacketConn's side of the refreshes.

func (d udDest) qpNum() uint32 { return d.qpn }

// heardFrom records a datagram from src sent by the QP srcQP, on the
// poller: a datagram from another QP than the one src's entry sends to
// starts a resolution of src (see peerCache.heard).
func (c *PacketConn) heardFrom(src netip.AddrPort, srcQP uint32, now time.Time) {
	if ref := c.peers.heard(src, srcQP, now); ref != nil {
		c.startResolve(src, ref, true)
	}
}

// resolutionDone records the outcome of a resolution that startResolve
// ran: of a new destination, or with refresh, of one resolved before.
func (c *PacketConn) resolutionDone(ref *peerRef[udDest], refresh bool, d udDest, err error) {
	if !refresh {
		c.resolveDone(ref, d, err)
		return
	}
	switch {
	case errors.Is(err, errNoListener):
		// Its PacketConn closed and none took the port: what is
		// written to it is lost and counted as such (see writeOne), not
		// sent to the QP that is gone.
		c.peers.refreshedGone(ref, err, time.Now())
		return
	case err != nil && !errors.Is(err, net.ErrClosed):
		// (Not one the release cut short.)
		c.stats.peerFailures.Add(1)
	}
	c.peers.refreshed(ref, d, err, time.Now())
}
