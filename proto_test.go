package rdma

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Internal tests of the parts that need no device: the wire format, address
// handling, option checking, deadlines and error types.

func TestHelloRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    hello
	}{
		{"defaults", hello{recvDepth: DefaultRecvDepth, ctrlDepth: ctrlDepth, bufSize: DefaultBufferSize,
			ringSize: 128 << 10, ringAddr: 0x7f0012340000, rkey: 0x1234}},
		{"smallest", hello{recvDepth: 1, ctrlDepth: 1, bufSize: 1, ringSize: minRing}},
		{"largest", hello{recvDepth: 0xffff, ctrlDepth: 0xff, bufSize: maxBufferSize, ringSize: maxRing,
			ringAddr: ^uint64(0) - maxRing, rkey: 0xffffffff}},
		{"mixed", hello{recvDepth: 0x1234, ctrlDepth: 0x56, bufSize: 0x789abc, ringSize: 0x12340, ringAddr: 0x0102030405060708, rkey: 0x9abcdef0}},
		{"messages", hello{flags: helloMessages, recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096, ringSize: 8192, ringAddr: 4096, rkey: 1}},
		{"headers as SENDs", hello{flags: helloMessages | helloHeaders, recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096, ringSize: 8192, ringAddr: 4096, rkey: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.h.marshal()
			require.Len(t, b, helloLen)
			got, err := parseHello(b)
			require.NoError(t, err)
			require.Equal(t, tc.h, got)

			// Providers may pad the private data with zeros up to the
			// IB maximum of 56 bytes.
			padded := append(b, make([]byte, 56-len(b))...)
			got, err = parseHello(padded)
			require.NoError(t, err)
			require.Equal(t, tc.h, got)
		})
	}
}

func TestHelloRejected(t *testing.T) {
	good := hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096, ringSize: 8192, ringAddr: 0x10000, rkey: 5}
	with := func(h hello) []byte { return h.marshal() }
	mutate := func(f func(b []byte)) []byte {
		b := good.marshal()
		f(b)
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string // in the error message
	}{
		{"nil", nil, "handshake of 0 bytes"},
		{"short", good.marshal()[:helloLen-1], "handshake of 29 bytes"},
		{"version 3 (16 bytes)", hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096}.marshal()[:16], "handshake of 16 bytes"},
		{"zeros", make([]byte, 56), "bad magic"},
		{"bad magic", mutate(func(b []byte) { b[0] ^= 0xff }), "bad magic"},
		{"version 0", mutate(func(b []byte) { b[4] = 0 }), "protocol version 0"},
		{"version 1 (header in the payload)", mutate(func(b []byte) { b[4] = 1 }), "protocol version 1"},
		{"version 2 (no flags)", mutate(func(b []byte) { b[4] = 2 }), "protocol version 2, want 7"},
		{"version 3 (receive buffers)", mutate(func(b []byte) { b[4] = 3 }), "protocol version 3, want 7"},
		{"version 4 (immediate data only)", mutate(func(b []byte) { b[4] = 4 }), "protocol version 4, want 7"},
		{"version 5 (fixed rings)", mutate(func(b []byte) { b[4] = 5 }), "protocol version 5, want 7"},
		{"version 6 (no wants flag)", mutate(func(b []byte) { b[4] = 6 }), "protocol version 6, want 7"},
		{"version 8", mutate(func(b []byte) { b[4] = helloVersion + 1 }), "protocol version 8"},
		{"unknown flag", mutate(func(b []byte) { b[5] = 0x80 }), "unknown flags 0x80"},
		{"zero recvDepth", with(hello{recvDepth: 0, ctrlDepth: ctrlDepth, bufSize: 4096}), "bad geometry"},
		{"zero ctrlDepth", with(hello{recvDepth: 16, ctrlDepth: 0, bufSize: 4096}), "bad geometry"},
		{"zero bufSize", with(hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 0, ringSize: 8192}), "bad geometry"},
		{"bufSize over the largest Options allow", with(hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: maxBufferSize + 1, ringSize: 8192}), "buffer size 16777217"},
		{"bufSize 4 GiB - 1", with(hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 0xffffffff, ringSize: 8192}), "buffer size 4294967295"},
		{"no ring", with(hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096}), "bad ring size 0"},
		{"ring too small", with(hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096, ringSize: minRing - ringAlign}), "bad ring size"},
		{"ring too large", with(hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096, ringSize: maxRing + ringAlign}), "bad ring size"},
		{"ring not aligned", with(hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096, ringSize: 8192 + 32}), "bad ring size"},
		{"ring wraps the address space", with(hello{recvDepth: 16, ctrlDepth: ctrlDepth, bufSize: 4096, ringSize: 8192, ringAddr: ^uint64(0) - 4096}), "wraps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseHello(tc.b)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrProtocol)
			require.NotErrorIs(t, err, ErrNoDevice)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// Both sides derive the same geometry from the two hellos, whichever side
// computes it, and a largest message always fits an empty ring.
func TestRingGeometry(t *testing.T) {
	for _, tc := range []struct {
		name                               string
		ownRing, ownBuf, peerRing, peerBuf int
		span, maxMsg                       int
	}{
		{"defaults", 128 << 10, 64 << 10, 128 << 10, 64 << 10, 128 << 10, 64 << 10},
		{"smaller peer", 128 << 10, 64 << 10, 8192, 4096, 8192, 4096},
		{"tiny peer messages", 4096, 256, 4096, 1, 4096, 1},
		{"peer ring small for its messages", 8192, 4096, 576, 65536, 576, 288},
	} {
		t.Run(tc.name, func(t *testing.T) {
			span, maxMsg := ringGeometry(tc.ownRing, tc.ownBuf, tc.peerRing, tc.peerBuf)
			require.Equal(t, tc.span, span)
			require.Equal(t, tc.maxMsg, maxMsg)
			span2, maxMsg2 := ringGeometry(tc.peerRing, tc.peerBuf, tc.ownRing, tc.ownBuf)
			require.Equal(t, []int{span, maxMsg}, []int{span2, maxMsg2}, "the peer computes the same")
		})
	}
}

func TestRingPlace(t *testing.T) {
	const span, maxMsg = 1024, 300
	for _, tc := range []struct {
		t, start uint64
	}{
		{0, 0},
		{64, 64},
		{704, 704},   // 704 + 300 = 1004: fits
		{768, 1024},  // 768 + 300 > 1024: to the ring's start
		{960, 1024},  // likewise
		{1024, 1024}, // at the start already
		{1024 + 704, 1024 + 704},
		{1088 + 704, 2048}, // offset 768
		{2048 + 768, 3072},
	} {
		require.Equal(t, tc.start, ringPlace(tc.t, span, maxMsg), "tail %d", tc.t)
	}
	require.Equal(t, uint64(1024+64), ringEnd(1024, 1))
	require.Equal(t, uint64(1024+64), ringEnd(1024, 64))
	require.Equal(t, uint64(1024+128), ringEnd(1024, 65))
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    header
	}{
		{"data", header{typ: msgData}},
		{"data with credits", header{typ: msgData, ctrlAck: 1, credits: DefaultRecvDepth}},
		{"credit", header{typ: msgCredit, credits: 7}},
		{"fin", header{typ: msgFin, ctrlAck: ctrlDepth}},
		{"wants", header{typ: msgData, wants: true, credits: 3}},
		{"max", header{typ: 0x7f, wants: true, ctrlAck: 0xff, credits: 0xffff}},
		{"zero", header{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.h, headerOf(tc.h.imm()))
			// The layout is part of the wire format: the wants flag,
			// type, ctrlAck, credits.
			want := uint32(tc.h.typ)<<24 | uint32(tc.h.ctrlAck)<<16 | uint32(tc.h.credits)
			if tc.h.wants {
				want |= 1 << 31
			}
			require.Equal(t, want, tc.h.imm())
		})
	}
	// Any immediate decodes to a type of 7 bits (an unknown one is the
	// receiver's to refuse) and the flag.
	require.Equal(t, header{typ: 0x7f, wants: true, ctrlAck: 0xff, credits: 0xffff}, headerOf(0xffffffff))
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
	for _, slot := range []uint64{0, 1, DefaultRecvDepth + ctrlDepth + finSlots, maxDepth + ctrlDepth + finSlots} {
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

// A set after stop (a setter that raced the connection's Close) returns
// at once and reports the stop, whatever the timer was doing: stop used to
// leave a stopped timer recorded, which the next set took for one that had
// fired, waiting forever for its close with the lock held.
func TestDeadlineSetAfterStop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		armed time.Duration // the deadline before stop, from now
	}{
		{"pending", time.Hour},
		{"fired", -time.Second},
		{"firing", time.Microsecond},
		{"unset", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDeadline()
			if tc.armed != 0 {
				require.True(t, d.set(time.Now().Add(tc.armed)))
			}
			d.stop()
			done := make(chan bool, 1)
			go func() {
				ok := d.set(time.Time{})
				ok = d.set(time.Now().Add(time.Hour)) || ok
				d.stop()
				done <- ok
			}()
			select {
			case ok := <-done:
				require.False(t, ok, "a set after stop does nothing")
			case <-time.After(5 * time.Second):
				t.Fatal("set after stop blocked")
			}
			d.mu.Lock()
			require.Nil(t, d.timer, "nothing armed after stop")
			d.mu.Unlock()
		})
	}
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

// Only ENODEV from a look for the host's devices means that there is
// none: a transient ENOMEM or EIO stays the call's error, never
// ErrNoDevice (which a Dialer with FallbackTCP takes as a reason to use
// TCP), and a rescan that failed so says nothing about what is left.
func TestHostDeviceError(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOMEM, syscall.EIO, syscall.EMFILE, syscall.EACCES} {
		err := hostDeviceError(os.NewSyscallError("rdma_create_event_channel", errno))
		require.NotErrorIs(t, err, ErrNoDevice, "%v", errno)
		var se *os.SyscallError
		require.ErrorAs(t, err, &se)
		require.Equal(t, "rdma_create_event_channel", se.Syscall)
		require.ErrorIs(t, err, errno)
		require.False(t, noDeviceLeft(0, os.NewSyscallError("rdma_get_devices", errno)), "%v", errno)
	}
	err := hostDeviceError(os.NewSyscallError("rdma_create_event_channel", syscall.ENODEV))
	require.ErrorIs(t, err, ErrNoDevice)
	require.ErrorIs(t, err, syscall.ENODEV)
	var se *os.SyscallError
	require.ErrorAs(t, err, &se, "the call stays reachable")
	require.True(t, noDeviceLeft(0, os.NewSyscallError("rdma_get_devices", syscall.ENODEV)))
	require.True(t, noDeviceLeft(0, nil))
	require.False(t, noDeviceLeft(2, nil))
}
