package rdma_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// TestPacketFallbackUDP runs on every build and host: on loopback, where
// no RDMA device serves (or the build has no RDMA), ListenPacket fails
// with the documented error, and FallbackUDP gives a UDP socket that
// exchanges datagrams with another, *rdma.Addr destinations included.
func TestPacketFallbackUDP(t *testing.T) {
	_, err := rdma.ListenPacket("rdma", "127.0.0.1:0")
	require.Error(t, err)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "rdma", oe.Net)
	require.True(t, isNoDeviceOrUnsupported(err), "%v", err)

	a, b := fallbackUDPPair(t)
	require.True(t, a.(*rdma.PacketConn).IsUDP())
	bu := b.LocalAddr().(*net.UDPAddr)
	_, err = a.WriteTo([]byte("one"), &rdma.Addr{IP: bu.IP, Port: bu.Port})
	require.NoError(t, err)
	ms := []rdma.Message{{Buffers: [][]byte{[]byte("two")}, Addr: b.LocalAddr()}}
	n, err := a.(*rdma.PacketConn).WriteBatch(ms, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 10)
	n, from, err := b.ReadFrom(buf)
	require.NoError(t, err)
	require.Equal(t, "one", string(buf[:n]))
	require.Equal(t, a.LocalAddr().String(), from.String())
	in := []rdma.Message{{Buffers: [][]byte{make([]byte, 2), make([]byte, 10)}}}
	n, err = b.(*rdma.PacketConn).ReadBatch(in, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 3, in[0].N)
	require.Equal(t, "tw", string(in[0].Buffers[0]))
	require.Equal(t, "o", string(in[0].Buffers[1][:1]))
}

// isNoDeviceOrUnsupported reports whether err says that RDMA cannot serve
// here: no device (a host without RDMA, or loopback), or no RDMA in the
// build.
// fallbackUDPPair opens two PacketConns on loopback with FallbackUDP
// (UDP sockets: no RDMA device serves loopback), closed at the test's
// cleanup.
func fallbackUDPPair(t *testing.T) (a, b net.PacketConn) {
	t.Helper()
	lc := rdma.ListenConfig{FallbackUDP: true}
	a, err := lc.ListenPacket(context.Background(), "rdma4", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	b, err = lc.ListenPacket(context.Background(), "rdma4", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return a, b
}

func isNoDeviceOrUnsupported(err error) bool {
	return errors.Is(err, rdma.ErrNoDevice) || errors.Is(err, rdma.ErrUnsupported)
}

// TestPacketFallbackUDPTruncated: with FallbackUDP, a datagram longer
// than the buffers of a ReadBatch message fills them, and the message's
// Flags say MsgTrunc, with one buffer and with several.
func TestPacketFallbackUDPTruncated(t *testing.T) {
	a, b := fallbackUDPPair(t)
	bp := b.(*rdma.PacketConn)
	require.NoError(t, b.SetReadDeadline(time.Now().Add(5*time.Second)))
	for _, bufs := range [][][]byte{{make([]byte, 5)}, {make([]byte, 2), make([]byte, 3)}} {
		_, err := a.WriteTo([]byte("truncated"), b.LocalAddr())
		require.NoError(t, err)
		in := []rdma.Message{{Buffers: bufs}}
		n, err := bp.ReadBatch(in, 0)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, 5, in[0].N, "%d buffers", len(bufs))
		require.Equal(t, rdma.MsgTrunc, in[0].Flags&rdma.MsgTrunc, "%d buffers", len(bufs))
	}
	// One that fits is not truncated.
	_, err := a.WriteTo([]byte("fits"), b.LocalAddr())
	require.NoError(t, err)
	in := []rdma.Message{{Buffers: [][]byte{make([]byte, 2), make([]byte, 3)}}}
	_, err = bp.ReadBatch(in, 0)
	require.NoError(t, err)
	require.Equal(t, 4, in[0].N)
	require.Zero(t, in[0].Flags)
}
