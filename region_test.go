package rdma

import (
	"math"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// Host tests of regions: the bounds, RegisterRegion's arguments and the
// accessors, over a fake connection.

func TestInBounds(t *testing.T) {
	for _, tc := range []struct {
		off  int64
		n    int
		size uint64
		ok   bool
	}{
		{0, 0, 0, true}, {0, 10, 10, true}, {10, 0, 10, true}, {9, 1, 10, true},
		{10, 1, 10, false}, {0, 11, 10, false}, {-1, 1, 10, false}, {0, -1, 10, false},
		{1 << 62, 1 << 30, 1 << 40, false}, {5, math.MaxInt, 10, false},
	} {
		require.Equal(t, tc.ok, inBounds(tc.off, tc.n, tc.size), "%+v", tc)
	}
}

// fakeRegion is a Region of a fake connection: plain memory at a made-up
// NIC address, never registered.
func fakeRegion(c *Conn, size int) *Region {
	r := &Region{c: c, mem: make([]byte, size), size: size, base: 0x10000, lkey: 77, unpinned: make(chan struct{}, 1)}
	c.os.regions = append(c.os.regions, r)
	return r
}

// RegisterRegion's arguments are checked before anything is registered.
func TestRegisterRegionArguments(t *testing.T) {
	c, _ := benchConn(t)
	_, err := c.RegisterRegion(0, RemoteRead)
	require.ErrorIs(t, err, syscall.EINVAL)
	if tooBig := int64(MaxRegionSize) + 1; tooBig <= math.MaxInt {
		_, err = c.RegisterRegion(int(tooBig), RemoteRead)
		require.ErrorIs(t, err, syscall.EINVAL)
	}
	_, err = c.RegisterRegion(4096, Access(8))
	require.ErrorIs(t, err, syscall.EINVAL)
	c.mu.Lock()
	c.life.set(shutClosed)
	c.mu.Unlock()
	_, err = c.RegisterRegion(4096, RemoteRead)
	require.ErrorIs(t, err, net.ErrClosed)
	var nilConn *Conn
	_, err = nilConn.RegisterRegion(4096, RemoteRead)
	require.ErrorIs(t, err, syscall.EINVAL)
}

// A Region's accessors, and what they say once it is closed or nil.
func TestRegionAccessors(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	r := fakeRegion(p.c, 4096)
	r.access = RemoteRead
	r.key = RemoteKey{Addr: 0x10000, Size: 4096, RKey: 9, Access: RemoteRead}
	require.Len(t, r.Bytes(), 4096)
	require.Equal(t, 4096, r.Len())
	require.Equal(t, RemoteRead, r.Access())
	require.Equal(t, uint32(9), r.Key().RKey)
	p.c.mu.Lock()
	r.closed = true
	p.c.mu.Unlock()
	require.Len(t, r.Bytes(), 4096, "a revoked region's memory stays until Close")
	p.c.mu.Lock()
	r.closing = true
	p.c.mu.Unlock()
	require.Nil(t, r.Bytes(), "a closed region's memory is gone")
	var nilRegion *Region
	require.Nil(t, nilRegion.Bytes())
	require.Zero(t, nilRegion.Len())
	require.Zero(t, nilRegion.Access())
	require.Equal(t, RemoteKey{}, nilRegion.Key())
	require.Equal(t, "read", RemoteRead.String())
	require.Equal(t, "read|write", (RemoteRead | RemoteWrite).String())
}
