package rdma_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// useEveryExport calls every exported function and method of the package.
// It exists to be compiled: make check vets this file with CGO_ENABLED=0 and
// for darwin/arm64, so a method declared on one platform only (the API
// drifting between builds) fails the check. It runs only against values
// that need no device.
func useEveryExport(c *rdma.Conn, l *rdma.Listener) []error {
	var errs []error
	add := func(err error) { errs = append(errs, err) }

	_, err := rdma.Dial("rdma", "192.0.2.1:1")
	add(err)
	_, err = rdma.Listen("rdma", "192.0.2.1:0")
	add(err)
	d := rdma.Dialer{Timeout: time.Millisecond, LocalAddr: &rdma.Addr{}, KeepAlive: -1,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true}, Options: rdma.Options{Poll: rdma.PollEvent}}
	_, err = d.Dial("rdma", "192.0.2.1:1")
	add(err)
	_, err = d.DialContext(context.Background(), "tcp", "192.0.2.1:1")
	add(err)
	lc := rdma.ListenConfig{Backlog: 1, KeepAlive: time.Second, KeepAliveConfig: net.KeepAliveConfig{},
		Refused: func(net.Addr, error) {}}
	_, err = lc.Listen(context.Background(), "rdma", "192.0.2.1:0")
	add(err)
	a, err := rdma.ResolveAddr("rdma", "192.0.2.1:1")
	add(err)
	_, _, _ = a.Network(), a.String(), a.AddrPort()
	_, err = rdma.Options{}.RegisteredMemory()
	add(err)
	_, err = rdma.Options{}.CompletionQueueEntries()
	add(err)
	_, err = rdma.ParsePollMode(rdma.PollBusy.String())
	add(err)

	_, err = c.Read(nil)
	add(err)
	_, err = c.Write(nil)
	add(err)
	add(c.SetDeadline(time.Time{}))
	add(c.SetReadDeadline(time.Time{}))
	add(c.SetWriteDeadline(time.Time{}))
	add(c.SetNoDelay(true))
	add(c.SetKeepAlive(true))
	add(c.SetKeepAlivePeriod(time.Second))
	add(c.SetKeepAliveConfig(net.KeepAliveConfig{}))
	add(c.CloseRead())
	add(c.CloseWrite())
	add(c.Close())
	_, _ = c.LocalAddr(), c.RemoteAddr()
	_ = c.Stats()
	_ = rdma.Devices()

	r, err := c.RegisterRegion(4096, rdma.RemoteRead|rdma.RemoteWrite)
	add(err)
	_, _, _, _ = r.Bytes(), r.Len(), r.Access(), r.Key()
	add(r.Close())
	rr := c.Remote(rdma.RemoteKey{})
	_, _ = rr.Key(), rr.Size()
	_, err = rr.ReadAt(nil, 0)
	add(err)
	_, err = rr.WriteAt(nil, 0)
	add(err)
	add(rr.ReadAtContext(context.Background(), r, 0, 0, 0))
	add(rr.WriteAtContext(context.Background(), r, 0, 0, 0))
	_, err = rr.CompareAndSwap(context.Background(), 0, 0, 1)
	add(err)
	_, err = rr.FetchAdd(context.Background(), 0, 1)
	add(err)
	_, err = c.ShareRegion(r, rdma.RemoteAtomic)
	add(err)
	var k rdma.RemoteKey
	b, _ := k.MarshalBinary()
	_, _ = k.AppendBinary(b)
	_ = k.UnmarshalBinary(b)
	_ = rdma.Access(0).String()
	_ = []error{rdma.ErrRemoteAccess, rdma.ErrOutOfBounds}
	_ = []int{rdma.MaxRegionSize, rdma.MaxTransfer, rdma.RemoteKeyLen, rdma.AtomicSize}

	_, err = l.Accept()
	add(err)
	_ = l.Addr()
	_ = l.Stats().Refused[rdma.RefusedBacklog]
	for r := range rdma.NumRefuseReasons {
		_ = l.Stats().Refused[r]
	}
	add(l.Close())

	_ = []error{rdma.ErrNoDevice, rdma.ErrProtocol, rdma.ErrUnsupported, &rdma.RefusedError{Reason: rdma.RefusedShutdown}}
	_ = []rdma.RefuseReason{rdma.RefusedUnknown, rdma.RefusedLockedMemory, rdma.RefusedResources, rdma.RefusedProtocol, rdma.RefusedNoListener}
	_ = rdma.IsRDMA(c)
	// The token pattern's: a key as text, and the connection in a context.
	var tk rdma.RemoteKey
	txt, _ := tk.MarshalText()
	_, _ = tk.AppendText(txt)
	_ = tk.UnmarshalText(txt)
	_ = rdma.RemoteKeyTextLen
	_, _ = rdma.ConnFromContext(rdma.ContextWithConn(context.Background(), c))
	_ = rdma.Dialer{FallbackTCP: true}
	_ = rdma.ListenConfig{FallbackTCP: true}
	_ = l.Stats().AcceptedTCP
	_ = rdma.RefusedBacklog.String()
	_ = []int{rdma.DefaultBufferSize, rdma.DefaultSendDepth, rdma.DefaultRecvDepth}
	_ = rdma.DefaultSpinTime + 0*time.Second
	_ = rdma.DefaultKeepAliveIdle + rdma.DefaultKeepAliveInterval + rdma.DefaultKeepAliveCount*time.Second
	_ = rdma.PollAdaptive
	return errs
}

// useEveryPacketExport calls every exported function and method of the
// datagram half, as useEveryExport does.
func useEveryPacketExport(p *rdma.PacketConn) []error {
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	_, err := rdma.ListenPacket("rdma", "192.0.2.1:0")
	add(err)
	lc := rdma.ListenConfig{FallbackUDP: false, Packet: rdma.PacketOptions{RecvDepth: 64, SendDepth: 64, Peers: 8,
		ResolveTimeout: time.Second, ReassemblyBytes: 1 << 20}}
	_, err = lc.ListenPacket(context.Background(), "rdma", "192.0.2.1:0")
	add(err)
	// Not a group: it fails before it looks for a device (a join that
	// worked would leave a member open).
	_, err = rdma.ListenMulticast("rdma", nil, &rdma.Addr{IP: net.IPv4(192, 0, 2, 1), Port: 1})
	add(err)
	b := make([]byte, 10)
	_, _, err = p.ReadFrom(b)
	add(err)
	_, err = p.WriteTo(b, &rdma.Addr{IP: net.IPv4(192, 0, 2, 1), Port: 1})
	add(err)
	ms := []rdma.Message{{Buffers: [][]byte{b}, Addr: &rdma.Addr{}}}
	_, err = p.ReadBatch(ms, 0)
	add(err)
	_, err = p.WriteBatch(ms, 0)
	add(err)
	_, _, err = p.ReadFromAddrPort(b)
	add(err)
	_, err = p.WriteToAddrPort(b, netip.MustParseAddrPort("192.0.2.1:1"))
	add(err)
	add(p.SetDeadline(time.Time{}))
	add(p.SetReadDeadline(time.Time{}))
	add(p.SetWriteDeadline(time.Time{}))
	add(p.Close())
	_ = p.LocalAddr()
	_ = p.IsUDP()
	_ = p.Stats().DropsNoReceive + uint64(rdma.MsgTrunc)
	var _ net.PacketConn = p
	return errs
}

// TestPacketZeroValuesFail checks that the methods of a nil or zero
// PacketConn return net's errors instead of panicking.
func TestPacketZeroValuesFail(t *testing.T) {
	for _, p := range []*rdma.PacketConn{nil, new(rdma.PacketConn)} {
		errs := useEveryPacketExport(p)
		n := 0
		for _, err := range errs {
			var oe *net.OpError
			if errors.As(err, &oe) && errors.Is(err, syscall.EINVAL) {
				require.Equal(t, "rdma", oe.Net)
				n++
			}
		}
		require.Equal(t, 10, n, "each PacketConn method that returns an error: %v", errs)
	}
}

// TestZeroValuesFail checks, on every build, that the methods of nil and
// zero values return net's errors instead of panicking, as a zero
// net.TCPConn's do.
func TestZeroValuesFail(t *testing.T) {
	for _, c := range []*rdma.Conn{nil, new(rdma.Conn)} {
		for _, l := range []*rdma.Listener{nil, new(rdma.Listener)} {
			errs := useEveryExport(c, l)
			n := 0
			for _, err := range errs {
				var oe *net.OpError
				if errors.As(err, &oe) && errors.Is(err, syscall.EINVAL) {
					require.Equal(t, "rdma", oe.Net)
					n++
				}
			}
			require.Equal(t, 23, n, "each Conn and Listener method that returns an error: %v", errs)
		}
	}
}
