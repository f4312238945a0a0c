package rdma

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/wire"
)

// Internal tests of the parts that need no device: what this package makes
// of the wire's errors, address handling, option checking, deadlines and
// error types. The wire format's own tests are in internal/wire.

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
	require.ErrorContains(t, err, "protocol version 8, want 7")

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

func TestOptionsNormalized(t *testing.T) {
	defaults := Options{BufferSize: DefaultBufferSize, SendDepth: DefaultSendDepth, RecvDepth: DefaultRecvDepth}
	// buffers picks out the settings under test, so that options added
	// later (with defaults of their own) do not break the comparison.
	buffers := func(o Options) [3]int { return [3]int{o.BufferSize, o.SendDepth, o.RecvDepth} }

	t.Run("valid", func(t *testing.T) {
		for _, tc := range []struct {
			in, want Options
		}{
			{Options{}, defaults},
			{Options{BufferSize: 4096}, Options{BufferSize: 4096, SendDepth: DefaultSendDepth, RecvDepth: DefaultRecvDepth}},
			{Options{SendDepth: 3}, Options{BufferSize: DefaultBufferSize, SendDepth: 3, RecvDepth: DefaultRecvDepth}},
			{Options{RecvDepth: 5}, Options{BufferSize: DefaultBufferSize, SendDepth: DefaultSendDepth, RecvDepth: 5}},
			{Options{BufferSize: minBufferSize, SendDepth: 2, RecvDepth: 2}, Options{BufferSize: minBufferSize, SendDepth: 2, RecvDepth: 2}},
			{Options{BufferSize: maxBufferSize, SendDepth: maxDepth, RecvDepth: maxDepth}, Options{BufferSize: maxBufferSize, SendDepth: maxDepth, RecvDepth: maxDepth}},
		} {
			got, err := tc.in.normalized()
			require.NoError(t, err, "%+v", tc.in)
			require.Equal(t, buffers(tc.want), buffers(got), "%+v", tc.in)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		for _, tc := range []struct {
			in   Options
			want string
		}{
			{Options{BufferSize: minBufferSize - 1}, "BufferSize 255 outside"},
			{Options{BufferSize: maxBufferSize + 1}, "BufferSize 16777217 outside"},
			{Options{BufferSize: -1}, "BufferSize -1 outside"},
			{Options{SendDepth: 1}, "SendDepth 1 outside"},
			{Options{SendDepth: maxDepth + 1}, "SendDepth 1025 outside"},
			{Options{SendDepth: -4}, "SendDepth -4 outside"},
			{Options{RecvDepth: 1}, "RecvDepth 1 outside"},
			{Options{RecvDepth: maxDepth + 1}, "RecvDepth 1025 outside"},
			{Options{RecvDepth: -4}, "RecvDepth -4 outside"},
		} {
			_, err := tc.in.normalized()
			require.Error(t, err, "%+v", tc.in)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "rdma: ")
		}
	})
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

func TestDeadlinePast(t *testing.T) {
	d := newDeadline()
	defer d.stop()
	require.False(t, d.expired(), "a new deadline is unset")

	d.set(time.Now().Add(-time.Second))
	require.True(t, isClosed(d.wait()), "a past deadline is expired at once")
	require.True(t, d.expired())

	// Setting it again, to now or the past, keeps it expired (and must not
	// close the channel twice).
	d.set(time.Now())
	require.True(t, d.expired())
	d.set(time.Now().Add(-time.Hour))
	require.True(t, d.expired())
}

func TestDeadlineFuture(t *testing.T) {
	d := newDeadline()
	defer d.stop()

	d.set(time.Now().Add(time.Hour))
	require.False(t, d.expired(), "a deadline an hour away has not passed")

	target := time.Now().Add(20 * time.Millisecond)
	d.set(target)
	select {
	case <-d.wait():
	case <-time.After(2 * time.Second):
		t.Fatal("deadline 20ms away not passed within 2s")
	}
	require.False(t, time.Now().Before(target), "deadline passed early")
	require.True(t, d.expired())
}

func TestDeadlineExtendWhileWaiting(t *testing.T) {
	d := newDeadline()
	defer d.stop()

	start := time.Now()
	old, later := start.Add(30*time.Millisecond), start.Add(200*time.Millisecond)
	d.set(old)
	ch := d.wait()
	woke := make(chan time.Time, 1)
	go func() {
		select {
		case <-ch:
			woke <- time.Now()
		case <-time.After(5 * time.Second):
			woke <- time.Time{}
		}
	}()
	d.set(later)
	if d.wait() != ch {
		// Only a passed deadline gets a new channel.
		t.Skip("the first deadline passed before it could be moved: machine too slow")
	}
	at := <-woke
	require.False(t, at.IsZero(), "waiter not woken within 5s of the moved deadline")
	require.Falsef(t, at.Before(later), "waiter woke %v after start, before the moved deadline (%v); the old one was %v",
		at.Sub(start), later.Sub(start), old.Sub(start))
	require.True(t, d.expired())
}

func TestDeadlineExtendAfterPassing(t *testing.T) {
	d := newDeadline()
	defer d.stop()

	d.set(time.Now().Add(-time.Second))
	require.True(t, d.expired())
	d.set(time.Now().Add(time.Hour))
	require.False(t, d.expired(), "a later deadline re-arms a passed one")
}

func TestDeadlineClear(t *testing.T) {
	d := newDeadline()
	defer d.stop()

	d.set(time.Now().Add(-time.Second))
	require.True(t, d.expired())
	d.set(time.Time{})
	require.False(t, d.expired(), "the zero time clears a passed deadline")

	// Clearing a pending deadline cancels it.
	d.set(time.Now().Add(20 * time.Millisecond))
	d.set(time.Time{})
	ch := d.wait()
	time.Sleep(100 * time.Millisecond)
	require.False(t, isClosed(ch), "a cleared deadline fired")
	require.False(t, d.expired())
}

func TestDeadlineEarlierWakesWaiter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		earlier time.Duration
	}{
		{"soon", 10 * time.Millisecond},
		{"now", 0},
		{"past", -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDeadline()
			defer d.stop()

			d.set(time.Now().Add(time.Hour))
			ch := d.wait()
			waiting := make(chan struct{})
			woke := make(chan bool, 1)
			go func() {
				close(waiting)
				select {
				case <-ch:
					woke <- true
				case <-time.After(5 * time.Second):
					woke <- false
				}
			}()
			<-waiting
			time.Sleep(10 * time.Millisecond) // let the waiter reach its select
			d.set(time.Now().Add(tc.earlier))
			select {
			case ok := <-woke:
				require.True(t, ok, "waiter not woken")
			case <-time.After(2 * time.Second):
				t.Fatal("waiter not woken within 2s of an earlier deadline")
			}
			require.True(t, d.expired())
		})
	}
}

func TestDeviceError(t *testing.T) {
	errNoDev := errors.New("no such device")
	var err error = &deviceError{os.NewSyscallError("rdma_resolve_addr", errNoDev)}

	require.ErrorIs(t, err, ErrNoDevice)
	require.ErrorIs(t, err, errNoDev)
	require.NotErrorIs(t, err, ErrProtocol)
	var se *os.SyscallError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "rdma_resolve_addr", se.Syscall)
	require.ErrorContains(t, err, "no RDMA device")
	require.ErrorContains(t, err, "rdma_resolve_addr")
	require.ErrorContains(t, err, "no such device")

	// Still reachable once wrapped the way Dial and Listen return it.
	op := &net.OpError{Op: "dial", Net: "rdma", Err: err}
	require.ErrorIs(t, op, ErrNoDevice)
	require.ErrorAs(t, op, &se)
	require.ErrorContains(t, op, "no RDMA device")
}

func TestProtocolError(t *testing.T) {
	var err error = &protocolError{"bad magic 0x1"}

	require.ErrorIs(t, err, ErrProtocol)
	require.NotErrorIs(t, err, ErrNoDevice)
	require.Equal(t, ErrProtocol.Error()+": bad magic 0x1", err.Error())

	wrapped := &net.OpError{Op: "read", Net: "rdma", Err: err}
	require.ErrorIs(t, wrapped, ErrProtocol)
	var pe *protocolError
	require.ErrorAs(t, wrapped, &pe)
	require.Equal(t, "bad magic 0x1", pe.detail)
}
