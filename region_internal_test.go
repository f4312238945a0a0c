package rdma

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"os"
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
		if k.Access == 0 || k.Access&^accessMask != 0 || k.Size == 0 || k.Size > maxRemoteRegion || k.Addr+k.Size < k.Addr {
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

// What a one-sided operation's caller gets: for each completion status,
// and for each state of the connection before it starts.
func TestOneSidedErrors(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NoError(t, c.oneSidedEnded())
	require.NoError(t, c.oneSidedErr(ibv.WCSuccess))
	require.ErrorIs(t, c.oneSidedErr(ibv.WCFlushErr), syscall.ECONNRESET)
	refused := c.oneSidedErr(ibv.WCRemAccessErr)
	require.ErrorIs(t, refused, ErrRemoteAccess)
	require.ErrorIs(t, refused, syscall.ECONNRESET)
	require.ErrorContains(t, refused, "one-sided operation failed")
	require.ErrorIs(t, c.oneSidedErr(ibv.WCRetryExcErr), syscall.ETIMEDOUT)
	require.ErrorIs(t, c.oneSidedErr(4), syscall.ECONNRESET) // IBV_WC_LOC_PROT_ERR

	c.qpBroken = true
	require.ErrorIs(t, c.oneSidedEnded(), syscall.ECONNRESET)
	c.life.rerr = syscall.ETIMEDOUT
	require.ErrorIs(t, c.oneSidedEnded(), syscall.ETIMEDOUT)
	c.life.werr = syscall.EIO
	require.ErrorIs(t, c.oneSidedEnded(), syscall.EIO)
	require.ErrorIs(t, c.oneSidedErr(ibv.WCFlushErr), syscall.EIO, "a flush says why the connection failed")
	c.life.set(shutClosed)
	require.ErrorIs(t, c.oneSidedEnded(), net.ErrClosed)

	q := newFakeConn(t, 8, 1024).c
	q.mu.Lock()
	q.life.phase = phaseDialing
	require.ErrorIs(t, q.oneSidedEnded(), net.ErrClosed, "not established yet")
	q.life.set(shutClosed)
	require.ErrorIs(t, q.oneSidedErr(ibv.WCFlushErr), net.ErrClosed)
	q.mu.Unlock()
}

// Close with operations in flight fails them (abortOneSided), and a
// region closed is forgotten by its connection.
func TestOneSidedAbortAndForget(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	local := fakeRegion(p.c, 4096)
	other := fakeRegion(p.c, 4096)
	remote := p.c.Remote(RemoteKey{Addr: 0x900000, Size: 1 << 20, RKey: 5, Access: RemoteRead | RemoteWrite})
	errs := make(chan error, 1)
	go func() { errs <- remote.ReadAtContext(context.Background(), local, 0, 64, 0) }()
	require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == 1 }, 5*time.Second, time.Millisecond)
	p.c.mu.Lock()
	p.c.life.set(shutClosed)
	p.c.abortOneSided()
	p.c.os.forget(other)
	require.Equal(t, []*Region{local}, p.c.os.regions)
	p.c.mu.Unlock()
	require.ErrorIs(t, <-errs, net.ErrClosed)
}

// ReadAt and WriteAt through the bounce memory, over a QP whose one-sided
// operations complete as they are posted: large transfers go in chunks,
// several in flight; ReadAt past the end is short with io.EOF, WriteAt
// past the end and a key without the access fail before posting.
func TestBounceReadWriteAt(t *testing.T) {
	c, q := benchConn(t)
	q.oneSided = true
	// The bounce memory, as getChunk would register it on first use.
	c.mu.Lock()
	c.os.init()
	c.os.bounce = fakeRegion(c, bounceChunks*bounceChunk)
	for i := bounceChunks - 1; i >= 0; i-- {
		c.os.chunksFree = append(c.os.chunksFree, i)
	}
	c.mu.Unlock()
	const size = 1 << 20
	remote := c.Remote(RemoteKey{Addr: 0x900000, Size: size, RKey: 5, Access: RemoteRead | RemoteWrite})

	p := make([]byte, 5*bounceChunk+123)
	posts := q.posts
	n, err := remote.WriteAt(p, 100)
	require.NoError(t, err)
	require.Equal(t, len(p), n)
	require.Equal(t, 6, q.posts-posts, "one RDMA WRITE per chunk")

	n, err = remote.ReadAt(p, 200)
	require.NoError(t, err)
	require.Equal(t, len(p), n)

	n, err = remote.ReadAt(p[:1000], size-10)
	require.Equal(t, io.EOF, err, "past the end: what there is, and io.EOF")
	require.Equal(t, 10, n)
	_, err = remote.ReadAt(p[:10], size)
	require.Equal(t, io.EOF, err)
	_, err = remote.ReadAt(p[:10], -1)
	require.ErrorIs(t, err, ErrOutOfBounds)
	_, err = remote.WriteAt(p[:1000], size-10)
	require.ErrorIs(t, err, ErrOutOfBounds)

	readOnly := c.Remote(RemoteKey{Addr: 0x900000, Size: size, RKey: 5, Access: RemoteRead})
	posts = q.posts
	_, err = readOnly.WriteAt(p[:10], 0)
	require.ErrorIs(t, err, ErrRemoteAccess)
	require.Equal(t, posts, q.posts, "refused before posting")

	c.mu.Lock()
	require.True(t, c.os.idle(), "every chunk back")
	c.mu.Unlock()
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

// ReadAtContext and WriteAtContext refuse, before posting, what cannot
// work: a key that does not allow the access or is malformed, another
// connection's region, bounds, a context already done; n == 0 posts
// nothing.
func TestOneSidedArguments(t *testing.T) {
	c, q := benchConn(t)
	local := fakeRegion(c, 4096)
	other, _ := benchConn(t)
	foreign := fakeRegion(other, 4096)
	ctx := context.Background()
	key := RemoteKey{Addr: 0x900000, Size: 1 << 20, RKey: 5, Access: RemoteRead}
	remote := c.Remote(key)
	require.ErrorIs(t, remote.WriteAtContext(ctx, local, 0, 64, 0), ErrRemoteAccess)
	require.ErrorIs(t, c.Remote(RemoteKey{Addr: 1, Size: 0, Access: RemoteRead}).ReadAtContext(ctx, local, 0, 64, 0), syscall.EINVAL)
	require.ErrorIs(t, remote.ReadAtContext(ctx, foreign, 0, 64, 0), syscall.EINVAL)
	require.ErrorIs(t, remote.ReadAtContext(ctx, nil, 0, 64, 0), syscall.EINVAL)
	require.ErrorIs(t, remote.ReadAtContext(ctx, local, 4090, 64, 0), ErrOutOfBounds)
	require.ErrorIs(t, remote.ReadAtContext(ctx, local, 0, 64, 1<<20-10), ErrOutOfBounds)
	require.ErrorIs(t, remote.ReadAtContext(ctx, local, 0, MaxTransfer+1, 0), ErrOutOfBounds)
	done, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, remote.ReadAtContext(done, local, 0, 64, 0), context.Canceled)
	expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	require.ErrorIs(t, remote.ReadAtContext(expired, local, 0, 64, 0), os.ErrDeadlineExceeded)
	require.NoError(t, remote.ReadAtContext(ctx, local, 0, 0, 0))
	require.Zero(t, q.posts, "nothing was posted")
	require.Equal(t, key, remote.Key())
	require.Equal(t, int64(1<<20), remote.Size())
}

// TestOneSidedReadCut: a READ the peer refused leaves the QP fit to keep;
// a READ flushed, or failed any other way, perhaps in the middle of its
// response, does not (see Conn.readCut); WRITEs never matter.
func TestOneSidedReadCut(t *testing.T) {
	for _, tc := range []struct {
		name   string
		access Access
		status uint32
		cut    bool
	}{
		{"read done", RemoteRead, ibv.WCSuccess, false},
		{"read refused", RemoteRead, ibv.WCRemAccessErr, false},
		{"read invalid", RemoteRead, ibv.WCRemInvReqErr, false},
		{"read flushed", RemoteRead, ibv.WCFlushErr, true},
		{"read timed out", RemoteRead, ibv.WCRetryExcErr, true},
		{"write flushed", RemoteWrite, ibv.WCFlushErr, false},
		{"write timed out", RemoteWrite, ibv.WCRetryExcErr, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakeConn(t, 8, 1024)
			local := fakeRegion(p.c, 4096)
			remote := p.c.Remote(RemoteKey{Addr: 0x900000, Size: 4096, RKey: 5, Access: tc.access})
			errc := make(chan error, 1)
			go func() {
				if tc.access == RemoteRead {
					errc <- remote.ReadAtContext(context.Background(), local, 0, 4096, 0)
				} else {
					errc <- remote.WriteAtContext(context.Background(), local, 0, 4096, 0)
				}
			}()
			require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == 1 }, 5*time.Second, time.Millisecond)
			p.complete(ibv.WC{WRID: oneSidedPosted(p)[0].ID, Status: tc.status})
			err := <-errc
			require.Equal(t, tc.status == ibv.WCSuccess, err == nil, "%v", err)
			p.c.mu.Lock()
			defer p.c.mu.Unlock()
			require.Equal(t, tc.cut, p.c.readCut)
		})
	}
}
