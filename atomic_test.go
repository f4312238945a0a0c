package rdma

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// Remote atomics over a fake QP (the test plays the NIC): what is posted,
// where the old value is read from and in which order, and what is
// refused before posting.

// withFakeBounce gives a fake connection atomics and bounce memory that
// is plain memory at a made-up NIC address, as ensureBounce would register.
func withFakeBounce(c *Conn, replyBE bool) *Region {
	b := &Region{c: c, mem: make([]byte, bounceSize), size: bounceSize, base: 0x40000, lkey: 88, unpinned: make(chan struct{}, 1)}
	c.mu.Lock()
	c.os.init()
	c.os.bounce = b
	c.atomics = atomicCaps{device: "fake0", level: ibv.AtomicHCA, replyBE: replyBE}
	c.mu.Unlock()
	return b
}

func TestAccessString(t *testing.T) {
	for a, want := range map[Access]string{
		0:                         "local",
		RemoteRead:                "read",
		RemoteWrite:               "write",
		RemoteAtomic:              "atomic",
		RemoteRead | RemoteWrite:  "read|write",
		RemoteRead | RemoteAtomic: "read|atomic",
		accessMask:                "read|write|atomic",
		Access(8):                 "Access(0x8)",
		RemoteRead | Access(0x40): "Access(0x41)",
	} {
		require.Equal(t, want, a.String(), "%#x", uint8(a))
	}
}

func TestAtomicByteOrder(t *testing.T) {
	require.True(t, replyBigEndian(0x02c9, 4099), "ConnectX-3")
	require.True(t, replyBigEndian(0x02c9, 4103), "ConnectX-3 Pro")
	require.False(t, replyBigEndian(0x02c9, 4115), "ConnectX-4")
	require.False(t, replyBigEndian(0x02c9, 4099+1000), "another part")
	require.False(t, replyBigEndian(0xffffff, 0), "Soft-RoCE")
	require.False(t, isBigEndian() && replyBigEndian(0x02c9, 4099), "no swap on a big-endian host")

	b := binary.BigEndian.AppendUint64(nil, 0x0102030405060708)
	require.Equal(t, uint64(0x0102030405060708), atomicCaps{replyBE: true}.value(b))
	n := binary.NativeEndian.AppendUint64(nil, 0x0102030405060708)
	require.Equal(t, uint64(0x0102030405060708), atomicCaps{}.value(n))
}

// The operations post one signaled atomic of the word at the key's
// address plus off, with the operands, into the slot's 8 bytes of the
// bounce memory; the completion's old value is what they return, in the
// host's order whatever order the device answered in.
func TestAtomicPosts(t *testing.T) {
	for _, replyBE := range []bool{false, true} {
		p := newFakeConn(t, 8, 1024)
		b := withFakeBounce(p.c, replyBE)
		remote := p.c.Remote(RemoteKey{Addr: 0x900000, Size: 4096, RKey: 5, Access: RemoteAtomic})
		ctx := context.Background()
		for _, tc := range []struct {
			op      func() (uint64, error)
			flag    int32
			cmp, sw uint64
			off     uint64
		}{
			{func() (uint64, error) { return remote.CompareAndSwap(ctx, 16, 7, 9) }, ibv.SendCompareSwap, 7, 9, 16},
			{func() (uint64, error) { return remote.FetchAdd(ctx, 4088, ^uint64(0)) }, ibv.SendFetchAdd, ^uint64(0), 0, 4088},
		} {
			type result struct {
				v   uint64
				err error
			}
			done := make(chan result, 1)
			before := len(oneSidedPosted(p))
			go func() {
				v, err := tc.op()
				done <- result{v, err}
			}()
			require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == before+1 }, 5*time.Second, time.Millisecond)
			wr := oneSidedPosted(p)[before]
			require.Equal(t, ibv.SendSignaled|tc.flag, wr.Flags)
			require.Equal(t, 0x900000+tc.off, wr.RemoteAddr)
			require.Equal(t, uint32(5), wr.RKey)
			require.Equal(t, tc.cmp, wr.Compare)
			require.Equal(t, tc.sw, wr.Swap)
			require.EqualValues(t, AtomicSize, wr.Len)
			require.Equal(t, uint32(88), wr.LKey)
			slot := int(wr.ID & 0xff)
			require.Equal(t, b.base+uint64(atomicAt(slot)), wr.Addr, "the slot's word of the bounce memory")
			// The NIC writes the old value there, then completes.
			at := atomicAt(slot)
			if replyBE {
				binary.BigEndian.PutUint64(b.mem[at:], 0xdead_beef_0000_0042)
			} else {
				binary.NativeEndian.PutUint64(b.mem[at:], 0xdead_beef_0000_0042)
			}
			p.complete(ibv.WC{WRID: wr.ID})
			r := <-done
			require.NoError(t, r.err)
			require.Equal(t, uint64(0xdead_beef_0000_0042), r.v)
		}
		p.c.mu.Lock()
		require.True(t, p.c.os.idle())
		require.Zero(t, b.pins)
		p.c.mu.Unlock()
	}
}

// A refused atomic fails with ErrRemoteAccess and fails the connection,
// as a refused READ does; a flushed one with the connection's failure.
func TestAtomicRefused(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	withFakeBounce(p.c, false)
	remote := p.c.Remote(RemoteKey{Addr: 0x900000, Size: 4096, RKey: 5, Access: RemoteAtomic})
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := remote.FetchAdd(context.Background(), 0, 1)
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == 2 }, 5*time.Second, time.Millisecond)
	wrs := oneSidedPosted(p)
	p.complete(ibv.WC{WRID: wrs[0].ID, Status: ibv.WCRemAccessErr})
	p.complete(ibv.WC{WRID: wrs[1].ID, Status: ibv.WCFlushErr})
	for range 2 {
		err := <-errs
		require.ErrorIs(t, err, ErrRemoteAccess)
		var oe *net.OpError
		require.ErrorAs(t, err, &oe)
		require.Equal(t, "fetch-add", oe.Op)
	}
}

// What cannot work is refused before anything is posted: a key without
// RemoteAtomic, a word outside the region or not 8-byte aligned, a device
// without atomics, a context already done.
func TestAtomicArguments(t *testing.T) {
	c, q := benchConn(t)
	withFakeBounce(c, false)
	ctx := context.Background()
	key := RemoteKey{Addr: 0x900000, Size: 4096, RKey: 5, Access: RemoteAtomic}
	remote := c.Remote(key)

	_, err := c.Remote(RemoteKey{Addr: 0x900000, Size: 4096, RKey: 5, Access: RemoteRead | RemoteWrite}).FetchAdd(ctx, 0, 1)
	require.ErrorIs(t, err, ErrRemoteAccess)
	for _, off := range []int64{-8, 4096, 4092, 1 << 40} {
		_, err = remote.CompareAndSwap(ctx, off, 0, 1)
		require.ErrorIs(t, err, ErrOutOfBounds, "offset %d", off)
	}
	for _, off := range []int64{1, 4, 4084} {
		_, err = remote.FetchAdd(ctx, off, 1)
		require.ErrorIs(t, err, syscall.EINVAL, "offset %d", off)
		require.ErrorContains(t, err, "8-byte aligned")
	}
	// The address that must be aligned is the peer's: a key whose address
	// is off by 4 makes offset 4 the aligned one.
	_, err = c.Remote(RemoteKey{Addr: 0x900004, Size: 4096, RKey: 5, Access: RemoteAtomic}).FetchAdd(ctx, 0, 1)
	require.ErrorContains(t, err, "8-byte aligned")

	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = remote.FetchAdd(done, 0, 1)
	require.ErrorIs(t, err, context.Canceled)
	expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	_, err = remote.CompareAndSwap(expired, 0, 0, 1)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)

	c.atomics = atomicCaps{device: "siw0"}
	_, err = remote.FetchAdd(ctx, 0, 1)
	require.ErrorIs(t, err, ErrUnsupported)
	require.ErrorContains(t, err, "siw0 has no remote atomics")
	_, err = c.RegisterRegion(4096, RemoteRead|RemoteAtomic)
	require.ErrorIs(t, err, ErrUnsupported)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "register", oe.Op)
	require.Zero(t, q.posts, "nothing was posted")

	var nilConn *Conn
	_, err = nilConn.Remote(key).FetchAdd(ctx, 0, 1)
	require.ErrorIs(t, err, syscall.EINVAL)
}

// An atomic whose caller gave up (its context) still owns its slot until
// the completion comes, which frees it; the old value goes nowhere.
func TestAtomicCancel(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	b := withFakeBounce(p.c, false)
	remote := p.c.Remote(RemoteKey{Addr: 0x900000, Size: 4096, RKey: 5, Access: RemoteAtomic})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := remote.CompareAndSwap(ctx, 8, 0, 1)
		errc <- err
	}()
	require.Eventually(t, func() bool { return len(oneSidedPosted(p)) == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	err := <-errc
	require.ErrorIs(t, err, context.Canceled)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "compare-and-swap", oe.Op)
	p.c.mu.Lock()
	require.Equal(t, 1, p.c.os.inFlight)
	require.Equal(t, 1, b.pins, "the bounce memory stays pinned for the NIC's answer")
	p.c.mu.Unlock()
	p.complete(ibv.WC{WRID: oneSidedPosted(p)[0].ID})
	p.c.mu.Lock()
	require.True(t, p.c.os.idle())
	require.Zero(t, b.pins)
	require.Len(t, p.c.os.free, oneSidedDepth)
	p.c.mu.Unlock()
}
