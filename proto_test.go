package rdma

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/wire"
)

// Internal tests of the parts that need no device: what this package makes
// of the wire's errors, the hello, work request ids, and address handling.
// The wire format's own tests are in internal/wire.

// A hello whose buffer size is over the largest the Options allow is
// refused: no side announces one, and as an int on a 32-bit platform a
// size of 2 GiB or more would be negative.
func TestHelloBufferSizeBound(t *testing.T) {
	hello := func(size uint32) []byte {
		return wire.Hello{RecvDepth: 16, CtrlDepth: wire.CtrlDepth, BufSize: size, RingSize: 8192, RingAddr: 0x10000, RKey: 5}.Marshal()
	}
	h, err := parseHello(hello(maxBufferSize))
	require.NoError(t, err)
	require.Equal(t, uint32(maxBufferSize), h.BufSize)
	for _, size := range []uint32{maxBufferSize + 1, 1<<32 - 1} {
		_, err := parseHello(hello(size))
		require.ErrorIs(t, err, ErrProtocol, "buffer size %d", size)
		require.ErrorContains(t, err, "over the largest")
	}
}

// A peer's bytes that the wire's parsers refuse are ErrProtocol here, with
// the wire's detail: what a foreign or broken peer's dialer or listener
// sees.
func TestPeerBytesAreProtocolErrors(t *testing.T) {
	_, err := parseHello([]byte("GVRD"))
	require.ErrorIs(t, err, ErrProtocol)
	require.NotErrorIs(t, err, ErrNoDevice)
	require.Equal(t, ErrProtocol.Error()+": handshake of 4 bytes", err.Error())
	require.Equal(t, RefusedProtocol, refuseReasonOf(err), "a listener refuses it as another protocol")

	b := wire.Hello{RecvDepth: 16, CtrlDepth: wire.CtrlDepth, BufSize: 4096, RingSize: 8192, RingAddr: 0x10000, RKey: 5}.Marshal()
	h, err := parseHello(b)
	require.NoError(t, err)
	require.Equal(t, uint32(8192), h.RingSize)
	b[4] = wire.Version + 1
	_, err = parseHello(b)
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "protocol version 9, want 8")

	_, err = parseRingDesc(make([]byte, 3), 8192)
	var pe *protocolError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "ring offer of 3 bytes", pe.detail)

	// The smallest ring a peer may announce holds two of the smallest
	// messages a side may take.
	require.Equal(t, 2*minBufferSize, wire.MinRing)
}

func TestSendWRID(t *testing.T) {
	const mask = 0x7fffffff
	for _, tc := range []struct {
		name             string
		dataSeq, ctrlSeq uint32
	}{
		{"zero", 0, 0},
		{"small", 1, 2},
		{"data wraps", 0xffffffff, 3},
		{"ctrl at 31 bits", 5, mask},
		{"ctrl bit 31 masked", 5, 0x80000000},
		{"ctrl all ones", 0xffffffff, 0xffffffff},
		{"ctrl above 31 bits", 0x12345678, 0x9abcdef0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := sendWRID(tc.dataSeq, tc.ctrlSeq)
			require.NotZero(t, id&wrSend, "send ids have the send bit")
			data, ctrl := parseSendWRID(id)
			require.Equal(t, tc.dataSeq, data)
			require.Equal(t, tc.ctrlSeq&mask, ctrl)
		})
	}

	// A receive's id is its slot number; none of them looks like a send.
	for _, slot := range []uint64{0, 1, DefaultRecvDepth + wire.CtrlDepth + wire.FinSlots, maxDepth + wire.CtrlDepth + wire.FinSlots} {
		require.Zerof(t, slot&wrSend, "receive slot %d has the send bit", slot)
	}
}

func TestResolve(t *testing.T) {
	v4 := netip.MustParseAddr("10.0.0.1")
	v6 := netip.MustParseAddr("fd77::1")
	for _, tc := range []struct {
		network, address string
		want             netip.AddrPort // valid when no error is wanted
		wantErr          any            // pointer to the error type errors.As must find
	}{
		{"rdma", "10.0.0.1:7471", netip.AddrPortFrom(v4, 7471), nil},
		{"rdma4", "10.0.0.1:7471", netip.AddrPortFrom(v4, 7471), nil},
		{"rdma6", "10.0.0.1:7471", netip.AddrPort{}, new(*net.AddrError)},
		{"rdma", "[fd77::1]:80", netip.AddrPortFrom(v6, 80), nil},
		{"rdma6", "[fd77::1]:80", netip.AddrPortFrom(v6, 80), nil},
		{"rdma4", "[fd77::1]:80", netip.AddrPort{}, new(*net.AddrError)},
		{"rdma", "[fe80::1%eth0]:80", netip.AddrPortFrom(netip.MustParseAddr("fe80::1%eth0"), 80), nil},
		{"rdma", ":0", netip.AddrPortFrom(netip.IPv4Unspecified(), 0), nil},
		{"rdma4", ":0", netip.AddrPortFrom(netip.IPv4Unspecified(), 0), nil},
		{"rdma6", ":0", netip.AddrPortFrom(netip.IPv6Unspecified(), 0), nil},
		{"rdma", ":7471", netip.AddrPortFrom(netip.IPv4Unspecified(), 7471), nil},
		{"rdma", "[::ffff:10.0.0.1]:1", netip.AddrPortFrom(v4, 1), nil},
		{"rdma4", "[::ffff:10.0.0.1]:1", netip.AddrPortFrom(v4, 1), nil},
		{"rdma6", "[::ffff:10.0.0.1]:1", netip.AddrPort{}, new(*net.AddrError)},
		{"rdma", "10.0.0.1", netip.AddrPort{}, new(*net.AddrError)},
		{"rdma", "[fd77::1]", netip.AddrPort{}, new(*net.AddrError)},
		{"rdma", "", netip.AddrPort{}, new(*net.AddrError)},
		{"rdma", "10.0.0.1:notaport", netip.AddrPort{}, new(*net.AddrError)},
		{"rdma", "10.0.0.1:70000", netip.AddrPort{}, new(*net.AddrError)},
		{"tcp", "10.0.0.1:7471", netip.AddrPort{}, new(net.UnknownNetworkError)},
		{"", "10.0.0.1:7471", netip.AddrPort{}, new(net.UnknownNetworkError)},
		{"RDMA", "10.0.0.1:7471", netip.AddrPort{}, new(net.UnknownNetworkError)},
	} {
		t.Run(tc.network+"/"+tc.address, func(t *testing.T) {
			got, err := resolve(context.Background(), tc.network, tc.address)
			if tc.wantErr != nil {
				require.Error(t, err)
				require.ErrorAs(t, err, tc.wantErr)
				require.Equal(t, netip.AddrPort{}, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestResolveName(t *testing.T) {
	for _, network := range []string{"rdma", "rdma4", "rdma6"} {
		t.Run(network, func(t *testing.T) {
			got, err := resolve(context.Background(), network, "localhost:1")
			if err != nil && network != "rdma" {
				// Not every host maps localhost to both families.
				t.Skipf("localhost has no %s address here: %v", network, err)
			}
			require.NoError(t, err)
			require.True(t, got.Addr().IsLoopback(), "localhost resolved to %v", got)
			require.Equal(t, uint16(1), got.Port())
			switch network {
			case "rdma4":
				require.True(t, got.Addr().Is4(), "got %v", got)
			case "rdma6":
				require.True(t, got.Addr().Is6(), "got %v", got)
			}
		})
	}
}

func TestResolveAddr(t *testing.T) {
	a, err := ResolveAddr("rdma", "[::ffff:10.0.0.1]:7471")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:7471", a.String())
	require.Len(t, a.IP, net.IPv4len)

	_, err = ResolveAddr("tcp", "10.0.0.1:7471")
	require.ErrorAs(t, err, new(net.UnknownNetworkError))
}

func TestAddr(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    *Addr
		want string
	}{
		{"ipv4", &Addr{IP: net.IPv4(10, 0, 0, 1), Port: 7471}, "10.0.0.1:7471"},
		{"ipv4 4-byte", &Addr{IP: net.IP{10, 0, 0, 1}, Port: 7471}, "10.0.0.1:7471"},
		{"ipv6", &Addr{IP: net.ParseIP("fd77::1"), Port: 80}, "[fd77::1]:80"},
		{"ipv6 zone", &Addr{IP: net.ParseIP("fe80::1"), Port: 80, Zone: "eth0"}, "[fe80::1%eth0]:80"},
		{"no ip", &Addr{Port: 7471}, ":7471"},
		{"nil", nil, "<nil>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.a.String())
			require.Equal(t, "rdma", tc.a.Network())
		})
	}

	var _ net.Addr = (*Addr)(nil)
	require.Equal(t, netip.AddrPort{}, (*Addr)(nil).AddrPort())
	// A 16-byte IPv4 address comes back as plain IPv4.
	require.Equal(t, netip.MustParseAddrPort("10.0.0.1:7471"), (&Addr{IP: net.IPv4(10, 0, 0, 1), Port: 7471}).AddrPort())
}

func TestAddrPortRoundTrip(t *testing.T) {
	for _, s := range []string{
		"10.0.0.1:7471",
		"0.0.0.0:0",
		"255.255.255.255:65535",
		"[fd77::1]:80",
		"[::]:0",
		"[fe80::1%eth0]:80",
	} {
		t.Run(s, func(t *testing.T) {
			ap := netip.MustParseAddrPort(s)
			a := addrFrom(ap)
			require.Equal(t, s, a.String())
			require.Equal(t, ap, a.AddrPort())
		})
	}
}

func TestHelloSendable(t *testing.T) {
	require.NoError(t, sendable(wire.Hello{}, false), "immediate data to a peer that wants it")
	require.NoError(t, sendable(wire.Hello{Flags: wire.HelloHeaders}, false), "any transport sends SENDs")
	require.NoError(t, sendable(wire.Hello{Flags: wire.HelloHeaders}, true))
	err := sendable(wire.Hello{}, true)
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "immediate data")
}
