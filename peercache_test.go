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

// testHandle stands for an address handle.
type testHandle struct{ peer netip.AddrPort }

// freeLog records the values a peerCache frees.
type freeLog struct {
	mu    sync.Mutex
	freed []netip.AddrPort
}

func (l *freeLog) free(h *testHandle) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.freed = append(l.freed, h.peer)
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
	ref, err := c.resolved(l.ref, &testHandle{key}, nil, now)
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
	res, err := c.resolved(l.ref, &testHandle{peerAddr(3)}, nil, now)
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
	ref, err = c.resolved(l.ref, &testHandle{key}, nil, now.Add(time.Second))
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
					ref, err := c.resolved(l.ref, &testHandle{key}, nil, now)
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
	ref, err := c.resolved(pending.ref, &testHandle{peerAddr(3)}, nil, now)
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
