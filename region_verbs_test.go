//go:build linux && cgo

package rdma

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mappedRegion is a Region of a fake connection over memory of its own
// mapping, as registerMem makes one, with no registration.
func mappedRegion(t *testing.T, c *Conn, size int) *Region {
	mem, err := unix.Mmap(-1, 0, (size+page-1)&^(page-1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	return &Region{c: c, mem: mem, size: size, base: addrOf(mem), lkey: 77, unpinned: make(chan struct{}, 1)}
}

// isMapped reports whether every page of b is mapped (msync fails with
// ENOMEM on a range that is not).
func isMapped(b []byte) bool { return unix.Msync(b[:cap(b)], unix.MS_ASYNC) == nil }

// TestRegionMemoryOutlivesRelease: the connection's release (its Close, a
// failure or the device's removal) revokes its regions but unmaps none
// of them: the application may still hold their Bytes, and memory
// unmapped under it would kill the process at its next use. Only the
// region's Close unmaps it, and works, once, after the release. The
// bounce memory, which callers of ReadAt and WriteAt copy through without
// the lock, is unmapped only once no caller holds a chunk of it.
func TestRegionMemoryOutlivesRelease(t *testing.T) {
	c := newFakeConn(t, 8, 1024).c
	r := mappedRegion(t, c, 2*page+100)
	bounce := mappedRegion(t, c, bounceChunks*bounceChunk)
	c.mu.Lock()
	c.os.init()
	c.os.regions = append(c.os.regions, r)
	c.os.bounce = bounce
	for i := bounceChunks - 1; i >= 0; i-- {
		c.os.chunksFree = append(c.os.chunksFree, i)
	}
	c.mu.Unlock()
	held := r.Bytes()
	require.Len(t, held, 2*page+100)
	copy(held, "before")
	bounceMem := bounce.mem
	chunk, err := c.getChunk(true) // a ReadAt copying out of its chunk
	require.NoError(t, err)

	c.releaseRegions()
	require.True(t, isMapped(held), "the release left the region mapped")
	require.Equal(t, "before", string(held[:6]))
	copy(held[2*page:], "after") // a fault before the region was kept mapped
	require.Equal(t, held, r.Bytes(), "Bytes still returns the memory")
	remote := c.Remote(RemoteKey{Addr: 0x900000, Size: 1 << 20, RKey: 5, Access: RemoteRead})
	require.ErrorIs(t, remote.ReadAtContext(context.Background(), r, 0, 64, 0), net.ErrClosed, "revoked: no operation starts")
	require.True(t, isMapped(bounceMem), "a chunk is held: the bounce memory stays")
	copy(bounceMem[chunk*bounceChunk:], "copied")

	c.putChunk(chunk)
	require.False(t, isMapped(bounceMem), "the last chunk back unmaps the bounce memory")

	require.NoError(t, r.Close(), "Close after the release unmaps the region")
	require.False(t, isMapped(held))
	require.Nil(t, r.Bytes())
	require.ErrorIs(t, r.Close(), net.ErrClosed, "and only once")
}

// A region closed while its connection lives is revoked and unmapped at
// once, and the release later finds nothing of it; the bounce memory
// with no chunk held goes with the release.
func TestRegionCloseBeforeRelease(t *testing.T) {
	c := newFakeConn(t, 8, 1024).c
	r := mappedRegion(t, c, page)
	bounce := mappedRegion(t, c, bounceChunks*bounceChunk)
	c.mu.Lock()
	c.os.init()
	c.os.regions = append(c.os.regions, r)
	c.os.bounce = bounce
	c.mu.Unlock()
	mem := r.Bytes()
	require.NoError(t, r.Close())
	require.False(t, isMapped(mem))
	c.mu.Lock()
	require.Empty(t, c.os.regions, "forgotten")
	c.mu.Unlock()
	bounceMem := bounce.mem
	c.releaseRegions()
	require.False(t, isMapped(bounceMem), "no chunk held: the release unmaps the bounce memory")
	require.ErrorIs(t, r.Close(), net.ErrClosed)
}
