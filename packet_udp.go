package rdma

import (
	"context"
	"errors"
	"net"
	"net/netip"

	"github.com/goverbs/rdma/internal/wire"
)

// fallsBackToUDP reports whether a ListenPacket that failed with err may
// use a UDP socket instead (FallbackUDP): no RDMA device serves the
// address, its transport has no datagrams, or the build has no RDMA.
func fallsBackToUDP(err error) bool {
	return errors.Is(err, ErrNoDevice) || errors.Is(err, ErrUnsupported) || errors.Is(err, errNoDatagrams)
}

// errNoDatagrams is ListenPacket's error on a device whose transport has
// no unreliable datagrams.
var errNoDatagrams = errors.New("rdma: the device's transport (iWARP) has no unreliable datagrams")

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
	c.udp = pc.(*net.UDPConn)
	return c, nil
}

func (c *PacketConn) udpWriteTo(b []byte, addr net.Addr) (int, error) {
	if a, ok := addr.(*Addr); ok {
		addr = net.UDPAddrFromAddrPort(a.AddrPort())
	}
	return c.udp.WriteTo(b, addr)
}

func (c *PacketConn) udpReadBatch(ms []Message) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	var buf []byte
	if len(ms[0].Buffers) == 1 {
		buf = ms[0].Buffers[0]
	} else {
		buf = make([]byte, wire.MaxDatagram)
	}
	n, _, flags, addr, err := c.udp.ReadMsgUDP(buf, nil)
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

func (c *PacketConn) udpWriteBatch(ms []Message) (int, error) {
	for i := range ms {
		var b []byte
		for _, p := range ms[i].Buffers {
			b = append(b, p...)
		}
		n, err := c.udpWriteTo(b, ms[i].Addr)
		if err != nil {
			return i, err
		}
		ms[i].N = n
	}
	return len(ms), nil
}
