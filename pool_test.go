package rdma

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fixed is a pool's bounds that never change.
func fixed(bytes, qps int) func() (int, int) { return func() (int, int) { return bytes, qps } }

func TestReadyPool(t *testing.T) {
	small := poolKey{size: 32 << 10, ring: 16 << 10, sendWR: 60, recvWR: 69}
	deeper := small
	deeper.recvWR = 133 // same memory, other queues
	big := poolKey{size: 64 << 10, ring: 32 << 10, sendWR: 60, recvWR: 69}

	t.Run("empty", func(t *testing.T) {
		p := newReadyPool[string](fixed(1<<20, 4), 0)
		_, _, ok := p.take(small)
		require.False(t, ok)
	})

	t.Run("the newest entry with a QP for the key first", func(t *testing.T) {
		p := newReadyPool[string](fixed(1<<20, 4), 0)
		require.True(t, p.put("memory only", small, false))
		require.True(t, p.put("qp, old", small, true))
		require.True(t, p.put("qp, new", small, true))
		require.True(t, p.put("other queues", deeper, true))
		require.True(t, p.put("other memory", big, true))
		bytes, qps := p.counts()
		require.Equal(t, 4*small.size+big.size, bytes)
		require.Equal(t, 4, qps)

		v, fits, ok := p.take(small)
		require.True(t, ok)
		require.True(t, fits)
		require.Equal(t, "qp, new", v, "the most recently kept, whose QP serves the key, even behind newer entries that do not")
		v, fits, _ = p.take(small)
		require.Equal(t, "qp, old", v)
		require.True(t, fits)

		// No QP for the key left: the newest memory that fits, with a
		// QP for other queues, which the caller destroys.
		v, fits, _ = p.take(small)
		require.Equal(t, "other queues", v)
		require.False(t, fits)
		v, fits, _ = p.take(small)
		require.Equal(t, "memory only", v)
		require.False(t, fits)
		_, _, ok = p.take(small)
		require.False(t, ok, "other memory never serves")

		bytes, qps = p.counts()
		require.Equal(t, big.size, bytes)
		require.Equal(t, 1, qps)
	})

	t.Run("an accept takes memory only, and leaves the QPs to dials", func(t *testing.T) {
		p := newReadyPool[string](fixed(1<<20, 4), 0)
		require.True(t, p.put("memory only", small, false))
		require.True(t, p.put("qp", small, true))
		require.True(t, p.put("other memory", big, false))
		v, ok := p.takeMemory(small)
		require.True(t, ok)
		require.Equal(t, "memory only", v, "older, but without a QP")
		_, ok = p.takeMemory(small)
		require.False(t, ok, "the entry with a QP is not an accept's")
		bytes, qps := p.counts()
		require.Equal(t, small.size+big.size, bytes)
		require.Equal(t, 1, qps)
		v, fits, _ := p.take(small)
		require.Equal(t, "qp", v)
		require.True(t, fits)
	})

	t.Run("a QP made for other queues does not serve them", func(t *testing.T) {
		p := newReadyPool[string](fixed(1<<20, 4), 0)
		require.True(t, p.put("memory only", deeper, false))
		v, fits, ok := p.take(deeper)
		require.True(t, ok)
		require.False(t, fits, "kept without a QP: it has none to serve with, whatever its key said")
		require.Equal(t, "memory only", v)
	})

	t.Run("bounded by memory and by QPs", func(t *testing.T) {
		p := newReadyPool[int](fixed(3*small.size, 2), 0)
		require.True(t, p.put(1, small, true))
		require.True(t, p.put(2, small, true))
		require.False(t, p.put(3, small, true), "the QP bound")
		require.True(t, p.put(3, small, false), "the same entry, without its QP")
		require.False(t, p.put(4, small, false), "the memory bound")
		bytes, qps := p.counts()
		require.Equal(t, 3*small.size, bytes)
		require.Equal(t, 2, qps)

		_, fits, _ := p.take(small)
		require.True(t, fits)
		require.True(t, p.put(4, small, true), "taking one makes room for one")
	})

	t.Run("a QP rests before it serves again", func(t *testing.T) {
		now := time.Unix(1000, 0)
		p := newReadyPool[string](fixed(1<<20, 4), 100*time.Millisecond)
		p.now = func() time.Time { return now }
		require.True(t, p.put("rested", small, true))
		now = now.Add(60 * time.Millisecond)
		require.True(t, p.put("resting", small, true))
		require.True(t, p.put("memory only", small, false))
		now = now.Add(50 * time.Millisecond) // 110 ms and 50 ms after they were kept

		v, fits, ok := p.take(small)
		require.True(t, ok)
		require.True(t, fits)
		require.Equal(t, "rested", v, "the resting QP is newer but not ready")
		v, fits, _ = p.take(small)
		require.Equal(t, "memory only", v, "memory without a QP rather than the resting QP")
		require.False(t, fits)
		_, _, ok = p.take(small)
		require.False(t, ok, "a resting QP's memory is not taken without it")
		now = now.Add(50 * time.Millisecond)
		v, fits, _ = p.take(small)
		require.Equal(t, "resting", v)
		require.True(t, fits)
	})

	t.Run("drop gives everything back", func(t *testing.T) {
		p := newReadyPool[int](fixed(1<<20, 4), 0)
		for i := range 3 {
			require.True(t, p.put(i, small, i%2 == 0))
		}
		require.ElementsMatch(t, []int{0, 1, 2}, p.drop())
		bytes, qps := p.counts()
		require.Zero(t, bytes)
		require.Zero(t, qps)
		_, _, ok := p.take(small)
		require.False(t, ok)
		require.Empty(t, p.drop())
		require.True(t, p.put(7, small, true), "usable again")
	})
}

// README: a device keeps the registered memory of closed connections up to
// 32 MiB, and their QPs up to 256, each resting 100 ms before reuse (see
// TestDocumentedNumbers for the rest).
func TestPooledBound(t *testing.T) {
	require.Equal(t, 32<<20, maxPooled)
	require.Equal(t, 256, maxPooledQPs)
	require.Equal(t, 100*time.Millisecond, qpCooling, "README: a kept QP rests 100 ms")
	b, q := poolLimits()
	require.Equal(t, maxPooled, b, "the defaults are in force")
	require.Equal(t, maxPooledQPs, q)
}

func TestSetDevicePool(t *testing.T) {
	defer SetDevicePool(poolLimits())
	ob, oq := SetDevicePool(64<<10, 1)
	require.Equal(t, maxPooled, ob)
	require.Equal(t, maxPooledQPs, oq)
	p := newReadyPool[int](poolLimits, 0)
	key := poolKey{size: 32 << 10, ring: 16 << 10}
	require.True(t, p.put(1, key, true))
	require.False(t, p.put(2, key, true), "one QP")
	require.True(t, p.put(2, key, false))
	require.False(t, p.put(3, key, false), "64 KiB")

	b, q := SetDevicePool(-1, 0) // keep the memory bound, no QPs
	require.Equal(t, 64<<10, b)
	require.Equal(t, 1, q)
	p.take(key)
	require.False(t, p.put(4, key, true), "a bound read at each put")
	require.True(t, p.put(4, key, false))
	b, q = poolLimits()
	require.Equal(t, 64<<10, b)
	require.Zero(t, q)
}

// ringMaps keeps mappings by size within a bound, hands back the one
// asked for, and gives everything up at once.
func TestRingMaps(t *testing.T) {
	var r ringMaps
	require.Nil(t, r.take(1<<20), "nothing kept yet")
	a, b, c := make([]byte, 1<<20), make([]byte, 1<<20), make([]byte, 256<<10)
	require.True(t, r.put(a, 3<<20))
	require.True(t, r.put(c, 3<<20))
	require.False(t, r.put(b, 1<<20+256<<10), "past the bound: the caller unmaps it")
	require.Equal(t, 1<<20+256<<10, r.kept())
	require.Nil(t, r.take(512<<10), "no mapping of that size")
	got := r.take(1 << 20)
	require.Same(t, &a[0], &got[0])
	require.Nil(t, r.take(1<<20), "taken once")
	require.Equal(t, 256<<10, r.kept())
	require.True(t, r.put(a, 0+2<<20))
	all := r.drop()
	require.Len(t, all, 2)
	require.Zero(t, r.kept())
	require.Nil(t, r.take(256<<10))
	require.False(t, r.put(a, 0), "a bound of 0 keeps nothing")
}

// A kept mapping may be the next connection's receive ring, whose bytes
// are read where the peer's announced length puts them: what its last
// connection left in it is gone before it serves again.
func TestRingMapsClearTaken(t *testing.T) {
	var r ringMaps
	m := make([]byte, 64<<10)
	for i := range m {
		m[i] = 0xa5
	}
	require.True(t, r.put(m, 1<<20))
	got := r.take(len(m))
	require.Same(t, &m[0], &got[0])
	require.Equal(t, make([]byte, len(m)), got, "a reused mapping holds none of its last connection's bytes")
}
