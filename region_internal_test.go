package rdma

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// Host tests of one-sided RDMA: the key's encoding, the bounds, and the
// slot table over a fake QP (the test plays the NIC).

func TestRemoteKeyEncoding(t *testing.T) {
	k := RemoteKey{Addr: 0x7f0012345000, Size: 1 << 20, RKey: 0xabcdef01, Access: RemoteRead | RemoteWrite}
	b, err := k.MarshalBinary()
	require.NoError(t, err)
	require.Len(t, b, RemoteKeyLen)
	require.Equal(t, "GVRK", string(b[:4]))
	var got RemoteKey
	require.NoError(t, got.UnmarshalBinary(b))
	require.Equal(t, k, got)
	b2, err := k.AppendBinary([]byte("x"))
	require.NoError(t, err)
	require.Equal(t, append([]byte("x"), b...), b2)

	mut := func(f func(b []byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	for name, bad := range map[string][]byte{
		"short":          b[:RemoteKeyLen-1],
		"long":           append(append([]byte(nil), b...), 0),
		"magic":          mut(func(b []byte) { b[0] ^= 1 }),
		"version":        mut(func(b []byte) { b[4] = 2 }),
		"no access":      mut(func(b []byte) { b[5] = 0 }),
		"unknown access": mut(func(b []byte) { b[5] = 4 }),
		"reserved":       mut(func(b []byte) { b[7] = 1 }),
		"zero size":      mut(func(b []byte) { clear(b[16:24]) }),
		"huge size":      mut(func(b []byte) { b[16] = 1 }),
		"wraps":          mut(func(b []byte) { copy(b[8:16], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) }),
	} {
		got := RemoteKey{RKey: 42}
		require.Error(t, got.UnmarshalBinary(bad), name)
		require.Equal(t, RemoteKey{RKey: 42}, got, "%s: unchanged on error", name)
	}
	_, err = RemoteKey{}.MarshalBinary()
	require.Error(t, err, "a key that names no region")
	require.Equal(t, "read|write", (RemoteRead | RemoteWrite).String())
	require.Equal(t, "local", Access(0).String())
}

func FuzzRemoteKey(f *testing.F) {
	b, _ := RemoteKey{Addr: 0x1000, Size: 4096, RKey: 1, Access: RemoteRead}.MarshalBinary()
	f.Add(b)
	f.Add([]byte("GVRK"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var k RemoteKey
		if k.UnmarshalBinary(b) != nil {
			require.Equal(t, RemoteKey{}, k)
			return
		}
		if k.Access == 0 || k.Access&^accessMask != 0 || k.Size == 0 || k.Size > MaxRegionSize || k.Addr+k.Size < k.Addr {
			t.Fatalf("accepted %+v", k)
		}
		again, err := k.MarshalBinary()
		require.NoError(t, err)
		require.Equal(t, b, again, "the encoding is canonical")
	})
}

func TestInBounds(t *testing.T) {
	for _, tc := range []struct {
		off  int64
		n    int
		size uint64
		ok   bool
	}{
		{0, 0, 0, true}, {0, 10, 10, true}, {10, 0, 10, true}, {9, 1, 10, true},
		{10, 1, 10, false}, {0, 11, 10, false}, {-1, 1, 10, false}, {0, -1, 10, false},
		{1 << 62, 1 << 62, 1 << 40, false}, {5, 1<<63 - 1, 10, false},
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

// oneSidedPosted returns the one-sided work requests posted so far.
func oneSidedPosted(p *fakePeer) []ibv.SendWR {
	var out []ibv.SendWR
	for _, wr := range p.q.posted() {
		if wr.ID&wrSend == 0 && wr.ID&wrOneSided != 0 {
			out = append(out, wr)
		}
	}
	return out
}

func TestOneSidedSlots(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	local := fakeRegion(p.c, 1<<20)
	remote := p.c.Remote(RemoteKey{Addr: 0x900000, Size: 1 << 20, RKey: 5, Access: RemoteRead | RemoteWrite})
	ctx := context.Background()

	// More operations than slots: the rest wait for one.
	errs := make(chan error, oneSidedDepth+1)
	for i := range oneSidedDepth + 1 {
		go func() { errs <- remote.ReadAtContext(ctx, local, int64(i)*100, 100, int64(i)*1000) }()
	}
	require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == oneSidedDepth }, 5*time.Second, time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	wrs := oneSidedPosted(p)
	require.Len(t, wrs, oneSidedDepth, "no more in flight than slots")
	for _, wr := range wrs {
		require.Equal(t, int32(ibv.SendRead|ibv.SendSignaled), wr.Flags, "always signaled")
		require.EqualValues(t, 100, wr.Len)
		require.Equal(t, uint32(77), wr.LKey)
		require.Equal(t, uint32(5), wr.RKey)
		require.Zero(t, (wr.RemoteAddr-0x900000)%1000)
		require.Equal(t, 0x10000+(wr.RemoteAddr-0x900000)/10, wr.Addr, "local and remote offsets of the same operation")
	}
	p.c.mu.Lock()
	require.Equal(t, oneSidedDepth, local.pins, "each operation pins its region")
	p.c.mu.Unlock()

	// A stale id (an earlier generation) and a foreign one are ignored.
	p.complete(ibv.WC{WRID: wrs[0].ID + 1<<8})
	p.complete(ibv.WC{WRID: wrOneSided | 0xff})
	select {
	case err := <-errs:
		t.Fatalf("an operation returned on a stale completion: %v", err)
	default:
	}
	p.complete(ibv.WC{WRID: wrs[0].ID})
	require.NoError(t, <-errs)
	require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == oneSidedDepth+1 }, 5*time.Second, time.Millisecond, "the waiting one takes the freed slot")
	for _, wr := range oneSidedPosted(p)[1:] {
		p.complete(ibv.WC{WRID: wr.ID})
	}
	for range oneSidedDepth {
		require.NoError(t, <-errs)
	}
	p.c.mu.Lock()
	require.Zero(t, local.pins)
	require.True(t, p.c.os.idle())
	require.Len(t, p.c.os.free, oneSidedDepth)
	p.c.mu.Unlock()
}

func TestOneSidedCancel(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	local := fakeRegion(p.c, 4096)
	remote := p.c.Remote(RemoteKey{Addr: 0x900000, Size: 4096, RKey: 5, Access: RemoteWrite})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- remote.WriteAtContext(ctx, local, 0, 4096, 0) }()
	require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	err := <-errc
	require.ErrorIs(t, err, context.Canceled)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "write", oe.Op)

	// The operation is still in flight: the region stays pinned and the
	// slot taken until the completion comes.
	p.c.mu.Lock()
	require.Equal(t, 1, local.pins)
	require.Equal(t, 1, p.c.os.inFlight)
	p.c.mu.Unlock()
	p.complete(ibv.WC{WRID: oneSidedPosted(p)[0].ID})
	p.c.mu.Lock()
	require.Zero(t, local.pins)
	require.True(t, p.c.os.idle())
	require.Len(t, p.c.os.free, oneSidedDepth)
	p.c.mu.Unlock()

	// A deadline maps to net's timeout error, before anything is posted.
	dl, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err = remote.WriteAtContext(dl, local, 0, 1, 0)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	require.Len(t, oneSidedPosted(p), 1, "nothing posted")
}

// TestOneSidedRefused: the peer's NIC refusing an access fails the
// operation and the connection, with ErrRemoteAccess; the operations
// flushed behind it fail with the same error.
func TestOneSidedRefused(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	local := fakeRegion(p.c, 4096)
	remote := p.c.Remote(RemoteKey{Addr: 0x900000, Size: 4096, RKey: 5, Access: RemoteRead})
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- remote.ReadAtContext(context.Background(), local, 0, 10, 0) }()
	}
	require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == 2 }, 5*time.Second, time.Millisecond)
	wrs := oneSidedPosted(p)
	p.complete(ibv.WC{WRID: wrs[0].ID, Status: ibv.WCRemAccessErr})
	p.complete(ibv.WC{WRID: wrs[1].ID, Status: ibv.WCFlushErr})
	for range 2 {
		err := <-errs
		require.ErrorIs(t, err, ErrRemoteAccess)
		require.ErrorIs(t, err, syscall.ECONNRESET)
	}
	_, err := p.c.Read(make([]byte, 1))
	require.ErrorIs(t, err, ErrRemoteAccess, "the connection failed with it")
	err = remote.ReadAtContext(context.Background(), local, 0, 10, 0)
	require.ErrorIs(t, err, ErrRemoteAccess, "and later operations too")
	require.Len(t, oneSidedPosted(p), 2, "without posting")
	require.False(t, errors.Is(err, io.EOF))
}
