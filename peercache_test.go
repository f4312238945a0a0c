package rdma

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testHandle stands for an address handle and the QP it sends to.
type testHandle struct {
	peer netip.AddrPort
	qpn  uint32
}

func (h *testHandle) qpNum() uint32 { return h.qpn }

// freeLog records the values a peerCache frees.
type freeLog struct {
	mu    sync.Mutex
	freed []netip.AddrPort
	qpns  []uint32 // the QP numbers of the values freed, in the same order
}

func (l *freeLog) free(h *testHandle) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.freed = append(l.freed, h.peer)
	l.qpns = append(l.qpns, h.qpn)
}

func (l *freeLog) qpnList() []uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint32(nil), l.qpns...)
}

func (l *freeLog) list() []netip.AddrPort {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]netip.AddrPort(nil), l.freed...)
}

func peerAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 7000)
}

// resolveOK looks key up, resolves it if it missed, and returns its
// hold, as a sender does.
func resolveOK(t *testing.T, c *peerCache[*testHandle], key netip.AddrPort, now time.Time) (*peerRef[*testHandle], bool) {
	t.Helper()
	l := c.acquire(key, now)
	require.NoError(t, l.err)
	require.Nil(t, l.wait)
	if !l.resolve {
		require.True(t, l.hit)
		require.Equal(t, key, l.v.peer)
		return l.ref, true
	}
	require.False(t, l.hit)
	ref, err := c.resolved(l.ref, &testHandle{peer: key}, nil, now)
	require.NoError(t, err)
	require.Same(t, l.ref, ref)
	return ref, false
}

func TestPeerCacheHitsAndMisses(t *testing.T) {
	var log freeLog
	c := newPeerCache(4, time.Second, log.free)
	now := time.Unix(1000, 0)
	a, b := peerAddr(1), peerAddr(2)
	ref, hit := resolveOK(t, c, a, now)
	require.False(t, hit)
	c.release(ref)
	for range 3 {
		ref, hit = resolveOK(t, c, a, now)
		require.True(t, hit)
		require.Equal(t, a, ref.v.peer)
		c.release(ref)
	}
	ref, hit = resolveOK(t, c, b, now)
	require.False(t, hit)
	c.release(ref)
	require.Equal(t, 2, c.len())
	require.Empty(t, log.list(), "nothing left the cache")
}

func TestPeerCacheLRU(t *testing.T) {
	var log freeLog
	c := newPeerCache(3, time.Second, log.free)
	now := time.Unix(1000, 0)
	use := func(i int) bool {
		ref, hit := resolveOK(t, c, peerAddr(i), now)
		c.release(ref)
		return hit
	}
	use(1)
	use(2)
	use(3)
	require.True(t, use(1), "1 is now the most recent")
	use(4) // evicts 2, the least recently used
	require.Equal(t, []netip.AddrPort{peerAddr(2)}, log.list())
	use(5) // evicts 3
	require.Equal(t, []netip.AddrPort{peerAddr(2), peerAddr(3)}, log.list())
	require.True(t, use(1))
	require.True(t, use(4))
	require.True(t, use(5))
	require.False(t, use(2), "evicted, resolved again")
	require.Equal(t, 3, c.len())
}

// An entry evicted while a send holds it is freed when the send gives it
// back, not before.
func TestPeerCacheEvictHeld(t *testing.T) {
	var log freeLog
	c := newPeerCache(1, time.Second, log.free)
	now := time.Unix(1000, 0)
	held, _ := resolveOK(t, c, peerAddr(1), now)
	again, hit := resolveOK(t, c, peerAddr(1), now)
	require.True(t, hit)
	require.Same(t, held, again)

	ref, _ := resolveOK(t, c, peerAddr(2), now) // evicts 1
	c.release(ref)
	require.Equal(t, 1, c.len())
	require.Empty(t, log.list(), "1 is held twice")
	c.release(held)
	require.Empty(t, log.list(), "and once still")
	c.release(again)
	require.Equal(t, []netip.AddrPort{peerAddr(1)}, log.list())
	require.Panics(t, func() { c.release(again) }, "released more often than acquired")

	// An entry evicted while it is resolved: the resolver still gets
	// and holds its value, freed on its release.
	l := c.acquire(peerAddr(3), now)
	require.True(t, l.resolve)
	ref, _ = resolveOK(t, c, peerAddr(4), now) // evicts 3, resolving
	c.release(ref)
	res, err := c.resolved(l.ref, &testHandle{peer: peerAddr(3)}, nil, now)
	require.NoError(t, err)
	require.Equal(t, peerAddr(3), res.v.peer)
	require.Len(t, log.list(), 2, "3 is held by its resolver")
	c.release(res)
	require.Equal(t, []netip.AddrPort{peerAddr(1), peerAddr(2), peerAddr(3)}, log.list())
}

func TestPeerCacheNegative(t *testing.T) {
	var log freeLog
	c := newPeerCache(4, time.Second, log.free)
	now := time.Unix(1000, 0)
	unreachable := errors.New("no route")
	key := peerAddr(1)

	l := c.acquire(key, now)
	require.True(t, l.resolve)
	ref, err := c.resolved(l.ref, nil, unreachable, now)
	require.Nil(t, ref)
	require.ErrorIs(t, err, unreachable)

	// Remembered for failTTL: answered at once, as a hit.
	for _, d := range []time.Duration{0, time.Millisecond, 999 * time.Millisecond} {
		l = c.acquire(key, now.Add(d))
		require.ErrorIs(t, l.err, unreachable, "after %v", d)
		require.True(t, l.hit)
		require.False(t, l.resolve)
		require.Nil(t, l.ref)
	}
	// Then tried again.
	l = c.acquire(key, now.Add(time.Second))
	require.NoError(t, l.err)
	require.True(t, l.resolve)
	ref, err = c.resolved(l.ref, &testHandle{peer: key}, nil, now.Add(time.Second))
	require.NoError(t, err)
	c.release(ref)
	got, hit := resolveOK(t, c, key, now.Add(time.Second))
	require.True(t, hit)
	c.release(got)
	require.Equal(t, 1, c.len())

	// Without a failTTL a failure is not remembered.
	z := newPeerCache(4, 0, log.free)
	l = z.acquire(key, now)
	_, err = z.resolved(l.ref, nil, unreachable, now)
	require.ErrorIs(t, err, unreachable)
	require.Zero(t, z.len())
	require.True(t, z.acquire(key, now).resolve)
}

// Writers that miss on the same peer at once: one resolves, the others
// wait for it and then hit.
func TestPeerCacheConcurrentMiss(t *testing.T) {
	var log freeLog
	c := newPeerCache(8, time.Second, log.free)
	now := time.Unix(1000, 0)
	key := peerAddr(1)
	const writers = 32
	var (
		mu        sync.Mutex
		resolves  int
		hits      int
		wg        sync.WaitGroup
		start     = make(chan struct{})
		resolving = make(chan struct{})
	)
	for range writers {
		wg.Go(func() {
			<-start
			for {
				l := c.acquire(key, now)
				if l.wait != nil {
					<-l.wait
					continue
				}
				if l.resolve {
					mu.Lock()
					resolves++
					mu.Unlock()
					// Slow, so that the others find it resolving.
					<-resolving
					ref, err := c.resolved(l.ref, &testHandle{peer: key}, nil, now)
					if err == nil {
						c.release(ref)
					}
					return
				}
				if l.ref != nil {
					mu.Lock()
					hits++
					mu.Unlock()
					c.release(l.ref)
				}
				return
			}
		})
	}
	close(start)
	time.Sleep(10 * time.Millisecond)
	close(resolving)
	wg.Wait()
	require.Equal(t, 1, resolves)
	require.Equal(t, writers-1, hits)
	require.Empty(t, log.list())

	// A resolver that fails wakes its waiters, who find the failure.
	other := peerAddr(2)
	l := c.acquire(other, now)
	require.True(t, l.resolve)
	w := c.acquire(other, now)
	require.NotNil(t, w.wait)
	require.False(t, w.hit)
	_, err := c.resolved(l.ref, nil, errors.New("gave up"), now)
	require.Error(t, err)
	<-w.wait
	require.ErrorContains(t, c.acquire(other, now).err, "gave up")
}

func TestPeerCacheClose(t *testing.T) {
	var log freeLog
	c := newPeerCache(8, time.Second, log.free)
	now := time.Unix(1000, 0)
	idle, _ := resolveOK(t, c, peerAddr(1), now)
	c.release(idle)
	held, _ := resolveOK(t, c, peerAddr(2), now)
	pending := c.acquire(peerAddr(3), now)
	require.True(t, pending.resolve)
	waiter := c.acquire(peerAddr(3), now)
	require.NotNil(t, waiter.wait)

	c.close()
	require.Zero(t, c.len())
	require.Equal(t, []netip.AddrPort{peerAddr(1)}, log.list(), "what no one holds goes at once")
	<-waiter.wait // woken by the close
	require.ErrorIs(t, c.acquire(peerAddr(3), now).err, errCacheClosed)
	require.ErrorIs(t, c.acquire(peerAddr(1), now).err, errCacheClosed)

	// The resolution that ends after the close frees its value.
	ref, err := c.resolved(pending.ref, &testHandle{peer: peerAddr(3)}, nil, now)
	require.Nil(t, ref)
	require.ErrorIs(t, err, errCacheClosed)
	require.Equal(t, []netip.AddrPort{peerAddr(1), peerAddr(3)}, log.list())
	c.release(held)
	require.Equal(t, []netip.AddrPort{peerAddr(1), peerAddr(3), peerAddr(2)}, log.list())
	c.close() // twice is harmless
}

// A flood of peers keeps the cache at its bound, and frees every value
// it let go of.
func TestPeerCacheFlood(t *testing.T) {
	var log freeLog
	const limit = 64
	c := newPeerCache(limit, time.Second, log.free)
	now := time.Unix(1000, 0)
	for i := range 10000 {
		key := netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 15: byte(i)}), uint16(i))
		if i%3 == 0 {
			l := c.acquire(key, now)
			require.True(t, l.resolve)
			c.resolved(l.ref, nil, fmt.Errorf("peer %d unreachable", i), now)
		} else {
			ref, _ := resolveOK(t, c, key, now)
			c.release(ref)
		}
		require.LessOrEqual(t, c.len(), limit)
	}
	require.Equal(t, limit, c.len())
	c.close()
	require.Len(t, log.list(), 10000-10000/3-1, "every value freed once")
}

// resolveQP resolves key at now to a handle of the QP qpn and gives the
// hold back.
func resolveQP(t *testing.T, c *peerCache[*testHandle], key netip.AddrPort, qpn uint32, now time.Time) {
	t.Helper()
	l := c.acquire(key, now)
	require.True(t, l.resolve)
	ref, err := c.resolved(l.ref, &testHandle{peer: key, qpn: qpn}, nil, now)
	require.NoError(t, err)
	c.release(ref)
}

// sendsTo acquires key at now, requires a value, and returns the QP it
// sends to and the refresh asked for (nil if none); the hold is given
// back.
func sendsTo(t *testing.T, c *peerCache[*testHandle], key netip.AddrPort, now time.Time) (uint32, *peerRef[*testHandle]) {
	t.Helper()
	l := c.acquire(key, now)
	require.NoError(t, l.err)
	require.Nil(t, l.wait, "waits")
	require.NotNil(t, l.ref)
	require.True(t, l.hit)
	c.release(l.ref)
	return l.v.qpn, l.refresh
}

// A destination neither resolved nor heard from for refreshAfter is
// resolved again on its next write, which (and those after it) goes on to
// the old QP until the new one is there; a datagram from its QP keeps it
// good.
func TestPeerCacheRefreshAfterQuiet(t *testing.T) {
	var log freeLog
	c := newPeerCache(8, time.Second, log.free)
	require.Equal(t, 5*time.Second, c.refreshAfter, "the bound docs/datagrams.md states")
	t0 := time.Unix(1000, 0)
	key := peerAddr(1)
	resolveQP(t, c, key, 10, t0)

	qpn, refresh := sendsTo(t, c, key, t0.Add(5*time.Second-time.Millisecond))
	require.Equal(t, uint32(10), qpn)
	require.Nil(t, refresh, "not yet old enough")

	at := t0.Add(5 * time.Second)
	qpn, refresh = sendsTo(t, c, key, at)
	require.Equal(t, uint32(10), qpn, "the old value meanwhile")
	require.NotNil(t, refresh, "resolved again after 5 s")
	qpn, again := sendsTo(t, c, key, at.Add(time.Millisecond))
	require.Equal(t, uint32(10), qpn)
	require.Nil(t, again, "one resolution at a time")

	// The peer restarted with QP 20.
	c.refreshed(refresh, &testHandle{peer: key, qpn: 20}, nil, at.Add(10*time.Millisecond))
	require.Equal(t, []uint32{10}, log.qpnList(), "the old value goes once no one holds it")
	qpn, refresh = sendsTo(t, c, key, at.Add(11*time.Millisecond))
	require.Equal(t, uint32(20), qpn)
	require.Nil(t, refresh)
	require.Equal(t, 1, c.len())

	// Datagrams from QP 20 keep it good; from no QP, not.
	heard := at.Add(4 * time.Second)
	require.Nil(t, c.heard(key, 20, heard))
	_, refresh = sendsTo(t, c, key, heard.Add(5*time.Second-time.Millisecond))
	require.Nil(t, refresh, "heard from 4 s after its resolution")
	_, refresh = sendsTo(t, c, key, heard.Add(5*time.Second))
	require.NotNil(t, refresh)

	// A resolution that fails keeps the entry, for another 5 s.
	failed := heard.Add(5*time.Second + time.Millisecond)
	c.refreshed(refresh, nil, errors.New("no answer"), failed)
	qpn, refresh = sendsTo(t, c, key, failed.Add(5*time.Second-time.Millisecond))
	require.Equal(t, uint32(20), qpn)
	require.Nil(t, refresh)
	_, refresh = sendsTo(t, c, key, failed.Add(5*time.Second))
	require.NotNil(t, refresh)
	c.refreshed(refresh, &testHandle{peer: key, qpn: 20}, nil, failed.Add(5*time.Second))
	require.Equal(t, []uint32{10, 20}, log.qpnList(), "the replaced value, though of the same QP")
}

// A datagram from a destination's address but another QP makes the
// writes to it wait for a resolution, which says where the peer is; it
// is not itself trusted.
func TestPeerCacheHeardFromAnotherQP(t *testing.T) {
	var log freeLog
	c := newPeerCache(8, time.Second, log.free)
	require.Equal(t, time.Second, c.verifyEvery)
	t0 := time.Unix(1000, 0)
	key, other := peerAddr(1), peerAddr(2)
	resolveQP(t, c, key, 10, t0)
	resolveQP(t, c, other, 30, t0)

	require.Nil(t, c.heard(key, 10, t0), "its own QP")
	at := t0.Add(time.Millisecond)
	ref := c.heard(key, 20, at)
	require.NotNil(t, ref, "another QP: resolve")
	require.Nil(t, c.heard(key, 21, at), "one resolution at a time")
	l := c.acquire(key, at)
	require.NotNil(t, l.wait, "writes wait for the resolution")
	require.Nil(t, l.ref)
	qpn, _ := sendsTo(t, c, other, at)
	require.Equal(t, uint32(30), qpn, "other destinations do not wait")

	c.refreshed(ref, &testHandle{peer: key, qpn: 20}, nil, at.Add(time.Millisecond))
	<-l.wait
	qpn, refresh := sendsTo(t, c, key, at.Add(2*time.Millisecond))
	require.Equal(t, uint32(20), qpn)
	require.Nil(t, refresh)
	require.Equal(t, []uint32{10}, log.qpnList())

	// At most one a verifyEvery, across the replacement: a peer sending
	// such datagrams on purpose costs one resolution a second.
	require.Nil(t, c.heard(key, 10, at.Add(time.Second-time.Millisecond)))
	ref = c.heard(key, 10, at.Add(time.Second))
	require.NotNil(t, ref)
	// The resolution says QP 20 still: the datagram lied, and the entry
	// sends to 20 as before.
	c.refreshed(ref, &testHandle{peer: key, qpn: 20}, nil, at.Add(time.Second))
	qpn, _ = sendsTo(t, c, key, at.Add(time.Second))
	require.Equal(t, uint32(20), qpn)

	// A failed resolution keeps the entry as it was.
	ref = c.heard(key, 30, at.Add(3*time.Second))
	require.NotNil(t, ref)
	c.refreshed(ref, nil, errors.New("refused"), at.Add(3*time.Second))
	qpn, _ = sendsTo(t, c, key, at.Add(3*time.Second))
	require.Equal(t, uint32(20), qpn)

	// Datagrams from addresses the cache has no value of add nothing.
	for i := 3; i < 100; i++ {
		require.Nil(t, c.heard(peerAddr(i), 5, at))
	}
	l = c.acquire(peerAddr(3), at)
	require.True(t, l.resolve)
	require.Nil(t, c.heard(peerAddr(3), 5, at), "still resolving")
	_, err := c.resolved(l.ref, nil, errors.New("no route"), at)
	require.Error(t, err)
	require.Nil(t, c.heard(peerAddr(3), 5, at), "a failure")
	require.Equal(t, 3, c.len())
}

// A datagram from another QP while a background resolution is under way
// makes the writes wait for that one; none starts besides.
func TestPeerCacheHeardWhileRefreshing(t *testing.T) {
	var log freeLog
	c := newPeerCache(8, time.Second, log.free)
	t0 := time.Unix(1000, 0)
	key := peerAddr(1)
	resolveQP(t, c, key, 10, t0)
	_, refresh := sendsTo(t, c, key, t0.Add(6*time.Second))
	require.NotNil(t, refresh)
	require.Nil(t, c.heard(key, 20, t0.Add(6*time.Second)), "the resolution under way serves")
	l := c.acquire(key, t0.Add(6*time.Second))
	require.NotNil(t, l.wait)
	c.refreshed(refresh, &testHandle{peer: key, qpn: 20}, nil, t0.Add(6*time.Second))
	<-l.wait
	qpn, _ := sendsTo(t, c, key, t0.Add(6*time.Second))
	require.Equal(t, uint32(20), qpn)
}

// A resolution that ends after its entry was evicted, or the cache
// closed, frees both values, each once, and wakes the writers.
func TestPeerCacheRefreshGone(t *testing.T) {
	var log freeLog
	c := newPeerCache(1, time.Second, log.free)
	t0 := time.Unix(1000, 0)
	resolveQP(t, c, peerAddr(1), 10, t0)
	ref := c.heard(peerAddr(1), 11, t0)
	require.NotNil(t, ref)
	resolveQP(t, c, peerAddr(2), 20, t0) // evicts 1, held by its resolution
	require.Empty(t, log.qpnList())
	c.refreshed(ref, &testHandle{peer: peerAddr(1), qpn: 11}, nil, t0)
	require.ElementsMatch(t, []uint32{10, 11}, log.qpnList())
	require.Equal(t, 1, c.len())

	ref = c.heard(peerAddr(2), 21, t0)
	require.NotNil(t, ref)
	w := c.acquire(peerAddr(2), t0)
	require.NotNil(t, w.wait)
	c.close()
	<-w.wait // woken by the close
	require.ElementsMatch(t, []uint32{10, 11}, log.qpnList(), "20 is held by its resolution")
	c.refreshed(ref, &testHandle{peer: peerAddr(2), qpn: 21}, nil, t0)
	require.ElementsMatch(t, []uint32{10, 11, 20, 21}, log.qpnList())
	require.ErrorIs(t, c.acquire(peerAddr(2), t0).err, errCacheClosed)
}

// A refresh answered with "nothing listens there" takes the entry out of
// the cache (its value freed once the refresh lets go of it): the next
// write resolves the destination anew instead of sending to the QP that
// is gone.
func TestPeerCacheRefreshedGone(t *testing.T) {
	var log freeLog
	c := newPeerCache(4, time.Second, log.free)
	t0 := time.Unix(1000, 0)
	resolveQP(t, c, peerAddr(1), 10, t0)
	ref := c.heard(peerAddr(1), 11, t0)
	require.NotNil(t, ref)
	c.refreshedGone(ref, errors.New("nothing listens"), t0)
	require.Equal(t, []uint32{10}, log.qpnList(), "the entry's value is freed")
	require.Zero(t, c.len())
	w := c.acquire(peerAddr(1), t0)
	require.False(t, w.ref.ok, "the next write resolves anew")
	c.resolved(w.ref, &testHandle{peer: peerAddr(1), qpn: 12}, nil, t0)
}
