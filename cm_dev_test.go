//go:build linux && cgo

package rdma_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// Device tests with a peer made directly on the rdma_cm layer
// (internal/rdmacm, or rawPeer): a server that does not follow this
// package's handshake, a dialer that vanishes. They need the cgo build's
// internals, hence the build tag.

// TestDialServerNeverAnswers: a listener that receives the request and
// never answers it (its process stopped reading CM events) does not hold a
// Dial without a timeout forever: DefaultDialTimeout bounds it (shortened
// here).
func TestDialServerNeverAnswers(t *testing.T) {
	needDevice(t)
	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	defer func() {
		ch.Interrupt()
		ch.Destroy()
	}()
	id, err := rdmacm.NewID(ch, 1)
	require.NoError(t, err)
	defer id.Destroy()
	require.NoError(t, id.Bind(netip.AddrPortFrom(netip.MustParseAddr(testAddr), 0)))
	require.NoError(t, id.Listen(8))

	defer rdma.SetDefaultDialTimeout(2 * time.Second)()
	recvsLeft := rdma.UnconnectedRecvsLeft()
	start := time.Now()
	_, err = rdma.Dial("rdma", id.LocalAddr().String())
	took := time.Since(start)
	oe := requireOpError(t, err, "dial")
	require.True(t, oe.Timeout(), "%v", err)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	limit := 10 * time.Second
	if siw() {
		// siw holds the teardown of an id whose MPA request went
		// unanswered until its MPA timeout (10 s): this dial took 10.25 s.
		limit = 20 * time.Second
	}
	require.Less(t, took, limit)
	t.Logf("a dial to a server that never answers gave up after %v: %v", took.Round(time.Millisecond), err)
	// Its QP never got connected: the release flushes its receives (on
	// iWARP rdma_disconnect does not, for such a QP) before it goes.
	rdma.WaitReleases()
	require.Equal(t, recvsLeft, rdma.UnconnectedRecvsLeft(), "releases of unconnected dials that left receives posted")
}

// TestRefusedProtocolVersion: a dialer of another protocol version is
// refused with that reason in the reject (what a dialer of this package
// reports as a *RefusedError wrapping ErrProtocol), and the listener
// counts it.
func TestRefusedProtocolVersion(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()

	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	events := make(chan rdmacm.Event, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ch.Run(func(ev rdmacm.Event) { events <- ev })
	}()
	defer func() {
		ch.Interrupt()
		<-done
		ch.Destroy()
	}()
	id, err := rdmacm.NewID(ch, 1)
	require.NoError(t, err)
	defer id.Destroy()
	next := func(want rdmacm.EventType) rdmacm.Event {
		t.Helper()
		select {
		case ev := <-events:
			require.Equal(t, want, ev.Type, "%v", ev)
			return ev
		case <-time.After(10 * time.Second):
			t.Fatalf("no %v", want)
		}
		return rdmacm.Event{}
	}
	dst := netip.MustParseAddrPort(ln.Addr().String())
	require.NoError(t, id.ResolveAddr(netip.Addr{}, dst, 5000))
	next(rdmacm.EventAddrResolved)
	require.NoError(t, id.ResolveRoute(5000))
	next(rdmacm.EventRouteResolved)
	hello := wire.Hello{RecvDepth: 16, CtrlDepth: wire.CtrlDepth, BufSize: 4096, RingSize: 8192, RingAddr: 0x10000, RKey: 1}.Marshal()
	hello[4] = 2 // an older version of the protocol
	// A QP of its own: iWARP's connect names one that must exist (iw_cm
	// looks it up); it never carries anything.
	ctx := ibv.ContextFrom(id.Verbs())
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Dealloc()
	cq, err := ctx.CreatePolledCQ(8)
	require.NoError(t, err)
	defer cq.Destroy()
	qp, err := id.CreateOwnQP(pd.Ptr(), cq.Ptr(), 4, 4)
	require.NoError(t, err)
	defer rdmacm.DestroyOwnQP(qp)
	require.NoError(t, id.ConnectNoQP(hello, ibv.QPFrom(qp).Num))
	ev := next(rdmacm.EventRejected)
	require.Equal(t, rdma.RefusedProtocol, rdma.ParseReject(ev.PrivateData))
	require.Equal(t, uint64(1), ln.Stats().Refused[rdma.RefusedProtocol])
}

// TestListenerCloseVanishedDialers: connections queued for an Accept that
// never comes, whose dialers' QPs stopped answering without a disconnect
// (their hosts vanished, say), are closed by Listener.Close without a
// linger each: Close returns before a single linger (3 s) is over, where
// it took one after another, 24 s for these 8, and everything is given
// back.
func TestListenerCloseVanishedDialers(t *testing.T) {
	needDevice(t)
	const n = 8
	baseConns, baseReg := deviceTotals()
	ln, err := (&rdma.ListenConfig{Backlog: 2 * n}).Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	rl := ln.(*rdma.Listener)
	peers := make([]*rawPeer, n)
	for i := range peers {
		peers[i] = dialRaw(t, ln.Addr().String())
	}
	require.Eventually(t, func() bool { return rl.Stats().Accepted == n }, 10*time.Second, 10*time.Millisecond,
		"all %d connections established and queued", n)
	for _, p := range peers {
		// Packets to a QP in the error state are dropped: the server's
		// fin would never be acknowledged.
		require.NoError(t, p.id.ErrorQP())
	}
	start := time.Now()
	require.NoError(t, ln.Close())
	took := time.Since(start)
	t.Logf("Listener.Close with %d unaccepted connections whose dialers vanished: %v", n, took.Round(time.Millisecond))
	require.Less(t, took, 3*time.Second, "Close lingered for the unaccepted connections")
	waitDeviceTotals(t, baseConns, baseReg)
}
