package rdma

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/goverbs/rdma/internal/wire"
)

// The UDP fallback of a PacketConn: with ListenConfig.FallbackUDP, a
// ListenPacket that RDMA cannot serve (fallsBackToUDP) opens a kernel UDP
// socket on the same address instead (listenUDP), and the PacketConn's
// methods hand their calls to it (udpFallback) where the rest of the
// PacketConn is unused: no QP, no memory, no peers.

// fallsBackToUDP reports whether a ListenPacket that failed with err may
// use a UDP socket instead (FallbackUDP): no RDMA device serves the
// address, its transport has no datagrams, or the build has no RDMA.
func fallsBackToUDP(err error) bool {
	return errors.Is(err, ErrNoDevice) || errors.Is(err, ErrUnsupported) || errors.Is(err, errNoDatagrams)
}

// errNoDatagrams is ListenPacket's error on a device whose transport has
// no unreliable datagrams.
var errNoDatagrams = errors.New("rdma: the device's transport (iWARP) has no unreliable datagrams")

// listenUDP opens the kernel UDP socket of a PacketConn that falls back
// to UDP on ap.
func listenUDP(ctx context.Context, network string, ap netip.AddrPort) (*PacketConn, error) {
	udpNet := "udp"
	switch network {
	case "rdma4":
		udpNet = "udp4"
	case "rdma6":
		udpNet = "udp6"
	}
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, udpNet, ap.String())
	if err != nil {
		return nil, err
	}
	c := newPacketConn(PacketOptions{})
	c.udp = &udpFallback{pc.(*net.UDPConn)}
	return c, nil
}

// udpFallback is the UDP socket of a PacketConn that fell back to UDP.
// Its errors are the socket's own (a *net.OpError of the "udp" network),
// as are the addresses that its reads return (*net.UDPAddr).
type udpFallback struct{ *net.UDPConn }

// setDeadline sets the socket's read deadline, write deadline or both
// (PacketConn.setDeadline).
func (u *udpFallback) setDeadline(t time.Time, read, write bool) error {
	switch {
	case read && write:
		return u.SetDeadline(t)
	case read:
		return u.SetReadDeadline(t)
	default:
		return u.SetWriteDeadline(t)
	}
}

// writeTo is WriteTo's: an *Addr destination is sent to as the
// *net.UDPAddr of its IP address and port.
func (u *udpFallback) writeTo(b []byte, addr net.Addr) (int, error) {
	if a, ok := addr.(*Addr); ok {
		addr = net.UDPAddrFromAddrPort(a.AddrPort())
	}
	return u.WriteTo(b, addr)
}

// readBatch is ReadBatch's: it reads one datagram, into ms[0].
func (u *udpFallback) readBatch(ms []Message) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	var buf []byte
	if len(ms[0].Buffers) == 1 {
		buf = ms[0].Buffers[0]
	} else {
		buf = make([]byte, wire.MaxDatagram)
	}
	n, _, flags, addr, err := u.ReadMsgUDP(buf, nil)
	if err != nil {
		return 0, err
	}
	flags &= MsgTrunc
	if len(ms[0].Buffers) != 1 {
		// Read whole into buf (no datagram is longer), then spread over
		// the buffers: what they do not hold is the truncated tail.
		data := buf[:n]
		n = 0
		for _, b := range ms[0].Buffers {
			n += copy(b, data[n:])
		}
		if n < len(data) {
			flags = MsgTrunc
		}
	}
	ms[0].N, ms[0].Addr, ms[0].Flags = n, addr, flags
	return 1, nil
}

// writeBatch is WriteBatch's: it writes the messages one by one.
func (u *udpFallback) writeBatch(ms []Message) (int, error) {
	for i := range ms {
		var b []byte
		for _, p := range ms[i].Buffers {
			b = append(b, p...)
		}
		n, err := u.writeTo(b, ms[i].Addr)
		if err != nil {
			return i, err
		}
		ms[i].N = n
	}
	return len(ms), nil
}
