package rdma

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// One-sided operations over a fake QP (the test plays the NIC): the slot
// table, cancellation, refusals, errors, and the arguments checked before
// posting.

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

// A one-sided caller that took the wakeup for a free slot and leaves
// without one passes it on while others wait and slots are free; with no
// slot free, or nobody waiting, nothing is signaled.
func TestOneSidedPassesRoom(t *testing.T) {
	var o oneSided
	o.init()
	o.passRoom()
	require.Zero(t, len(o.room), "nobody waits")
	o.roomWaits = 1
	o.passRoom()
	require.Len(t, o.room, 1, "a waiter and free slots")
	<-o.room
	o.free = o.free[:0]
	o.passRoom()
	require.Zero(t, len(o.room), "no slot free")
}
