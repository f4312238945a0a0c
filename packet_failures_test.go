package rdma

import (
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// How a PacketConn's writes count what they sent, and what its failures
// do, over the fake fabric of packet_test.go.

// TestPacketWriteBatchPartialPost: a WriteBatch whose second chain's post
// fails after the first chain went out returns the count of the
// datagrams posted, with the error, as x/net's WriteBatch does (it
// returned 0 while 32 of 40 had gone); DatagramsSent counts those alone.
func TestPacketWriteBatchPartialPost(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	a.mu.Lock()
	a.failSends, a.failFrom = syscall.ENOMEM, ibv.MaxUDSendBatch
	a.mu.Unlock()
	ms := make([]Message, ibv.MaxUDSendBatch+8)
	for i := range ms {
		ms[i] = Message{Buffers: [][]byte{testDatagram(uint32(i), 10)}, Addr: b.c.LocalAddr()}
	}
	n, err := a.c.WriteBatch(ms, 0)
	require.ErrorIs(t, err, syscall.ENOMEM)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, b.c.LocalAddr(), oe.Addr, "the error names the first datagram not sent")
	require.Equal(t, ibv.MaxUDSendBatch, n)
	for i, m := range ms {
		if i < n {
			require.Equal(t, 10, m.N, "message %d", i)
		} else {
			require.Zero(t, m.N, "message %d was not sent", i)
		}
	}
	st := a.c.Stats()
	require.Equal(t, uint64(n), st.DatagramsSent)
	require.Equal(t, uint64(10*n), st.BytesSent)
	for i := range n {
		readExpect(t, b, testDatagram(uint32(i), 10), a.ap)
	}
	readNone(t, b)
}

// TestPacketRemovedDuringSetup: a removal of the device while the setup
// still runs leaves the release to the setup, which then fails with
// ErrNoDevice (a release beside the setup freed what the setup still
// used, or missed what it made afterwards); a removal once it is done
// releases at once.
func TestPacketRemovedDuringSetup(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	released := func(c *PacketConn) bool {
		releasing.Wait()
		l := c.peers.acquire(b.ap, time.Now())
		if l.ref != nil {
			c.peers.release(l.ref)
		}
		return l.err == errCacheClosed
	}
	a.c.settingUp = true
	a.c.failAsync(nil, true)
	require.False(t, released(a.c), "released beside the setup")
	_, err := a.c.WriteTo([]byte("x"), b.c.LocalAddr())
	require.ErrorIs(t, err, ErrNoDevice)
	require.True(t, a.c.endSetup(), "the setup learns of the removal")

	b.c.failAsync(nil, true)
	if releaseRuns {
		require.True(t, released(b.c), "a removal after the setup releases at once")
	}
}

// TestPacketRemovalFailsWithNoDevice: a write that waits for a
// resolution the release cut short fails with ErrNoDevice once the
// device was removed (it failed with "use of closed PacketConn", which
// wraps neither that nor net.ErrClosed), and a write or read that finds
// the QP gone too; after Close, net.ErrClosed.
func TestPacketRemovalFailsWithNoDevice(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	a.c.smu.Lock()
	a.c.wfail = &deviceError{syscall.ENODEV}
	a.c.smu.Unlock()
	cutShortResolution(t, a.c, netip.MustParseAddrPort("10.0.0.99:7"))
	a.c.writeMu.Lock()
	a.c.qpGone = true
	require.ErrorIs(t, a.c.postPending(), ErrNoDevice)
	a.c.writeMu.Unlock()
	_, err := a.c.WriteTo([]byte("x"), b.c.LocalAddr())
	require.ErrorIs(t, err, ErrNoDevice)
	require.NoError(t, b.c.Close())
	require.ErrorIs(t, b.c.goneErr(), net.ErrClosed)
}

// TestPacketNoListenerLost: a write to a port where nothing listens (the
// resolution's outcome errNoListener) succeeds and loses the datagram,
// counted, as UDP's; so do the writes to it while the outcome is
// remembered, in a WriteBatch too, beside datagrams that go.
func TestPacketNoListenerLost(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	nobody := netip.AddrPortFrom(b.ap.Addr(), b.ap.Port()+1)
	l := a.c.peers.acquire(nobody, time.Now())
	require.True(t, l.resolve)
	a.c.resolveDone(l.ref, udDest{}, errNoListener)
	n, err := a.c.WriteTo([]byte("lost"), addrFrom(nobody))
	require.NoError(t, err)
	require.Equal(t, 4, n)
	ms := []Message{
		{Buffers: [][]byte{[]byte("one")}, Addr: b.c.LocalAddr()},
		{Buffers: [][]byte{[]byte("lost")}, Addr: addrFrom(nobody)},
		{Buffers: [][]byte{[]byte("two")}, Addr: b.c.LocalAddr()},
	}
	n, err = a.c.WriteBatch(ms, 0)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, 4, ms[1].N)
	readExpect(t, b, []byte("one"), a.ap)
	readExpect(t, b, []byte("two"), a.ap)
	readNone(t, b)
	st := a.c.Stats()
	require.Equal(t, uint64(2), st.DropsNoListener)
	require.Equal(t, uint64(2), st.DatagramsSent)
	require.Equal(t, uint64(1), st.PeerFailures)
}

// TestPacketPortDownLong: a port down for longer than portDownGrace
// does not break a PacketConn (it broke it for good: every later write
// and read failed with ENETDOWN); datagrams go both ways once it is back.
func TestPacketPortDownLong(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	for _, e := range f.ends {
		e.c.failAsync(&asyncError{"port down for " + portDownGrace.String(), syscall.ENETDOWN}, false)
	}
	_, err := a.c.WriteTo([]byte("after"), b.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, b, []byte("after"), a.ap)
	_, err = b.c.WriteTo([]byte("back"), a.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, a, []byte("back"), b.ap)
}
