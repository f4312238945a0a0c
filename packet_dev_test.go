package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of PacketConn: datagrams over UD between PacketConns of the
// test bed's device.

// listenPacketPair opens two PacketConns on the test bed's address.
func listenPacketPair(t *testing.T) (*rdma.PacketConn, *rdma.PacketConn) {
	t.Helper()
	a, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	b, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	if err != nil {
		a.Close()
	}
	require.NoError(t, err)
	return a, b
}

// TestPacketSizes sends datagrams of every interesting size, from empty
// through one message of the MTU to the largest (fragmented), and each is
// read whole, from the sender's address, and answered to that address.
func TestPacketSizes(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD (TestPacketIWARP)")
	}
	a, b := listenPacketPair(t)
	defer a.Close()
	defer b.Close()
	sizes := []int{0, 1, 64, 1000, 4092, 4093, 4096, 8000, 16384, 65507}
	rnd := rand.New(rand.NewSource(1))
	buf := make([]byte, 70000)
	for _, n := range sizes {
		msg := make([]byte, n)
		rnd.Read(msg)
		require.NoError(t, a.SetDeadline(time.Now().Add(10*time.Second)))
		require.NoError(t, b.SetDeadline(time.Now().Add(10*time.Second)))
		w, err := a.WriteTo(msg, b.LocalAddr())
		require.NoError(t, err, "size %d", n)
		require.Equal(t, n, w)
		r, from, err := b.ReadFrom(buf)
		require.NoError(t, err, "size %d", n)
		require.Equal(t, n, r, "size %d", n)
		require.True(t, bytes.Equal(msg, buf[:r]), "size %d: bytes differ", n)
		require.Equal(t, a.LocalAddr().String(), from.String())
		// The reply goes to the address ReadFrom returned.
		_, err = b.WriteTo(msg, from)
		require.NoError(t, err)
		r, from, err = a.ReadFrom(buf)
		require.NoError(t, err)
		require.Equal(t, n, r)
		require.True(t, bytes.Equal(msg, buf[:r]))
		require.Equal(t, b.LocalAddr().String(), from.String())
	}
	st := b.Stats()
	require.Equal(t, uint64(len(sizes)), st.DatagramsReceived)
	require.Equal(t, uint64(1), st.PeerMisses)
	require.Zero(t, st.DropsMalformed+st.DropsReassembly+st.DropsNoReceive+st.DropsTruncated)
}

// TestPacketManyPeers: many PacketConns send to one, which answers each;
// every datagram arrives from the right peer. The server keeps 4 address
// handles for its 16 peers: they are evicted and resolved again all along,
// never freed under a send that uses them.
func TestPacketManyPeers(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD")
	}
	lc := rdma.ListenConfig{Packet: rdma.PacketOptions{Peers: 4}}
	pc, err := lc.ListenPacket(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	srv := pc.(*rdma.PacketConn)
	defer srv.Close()
	const peers, rounds = 16, 20
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			srv.WriteTo(buf[:n], from)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, peers)
	for i := 0; i < peers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
			if err != nil {
				errs <- err
				return
			}
			defer pc.Close()
			pc.SetDeadline(time.Now().Add(20 * time.Second))
			buf := make([]byte, 2048)
			for r := 0; r < rounds; r++ {
				msg := []byte{byte(i), byte(r), 1, 2, 3}
				if _, err := pc.WriteTo(msg, srv.LocalAddr()); err != nil {
					errs <- err
					return
				}
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf[:n], msg) || from.String() != srv.LocalAddr().String() {
					errs <- errors.New("wrong echo")
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := srv.Stats()
	require.Equal(t, uint64(peers*rounds), st.DatagramsReceived)
	require.Greater(t, st.PeerMisses, uint64(peers), "evicted handles were resolved again: %+v", st)
	t.Logf("%+v", st)
}

// TestPacketDeadlineAndClose: a read past its deadline times out as net's
// do, and Close wakes a blocked read with net.ErrClosed.
func TestPacketDeadlineAndClose(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD")
	}
	pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	pc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, _, err = pc.ReadFrom(make([]byte, 10))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	pc.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, _, err := pc.ReadFrom(make([]byte, 10))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, pc.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake ReadFrom")
	}
	_, err = pc.WriteTo([]byte("x"), pc.LocalAddr())
	require.ErrorIs(t, err, net.ErrClosed)
}

// TestPacketHostile: messages that are not this library's datagrams, or
// break its rules (short, foreign, forged fragment headers, fragments that
// never complete, a flood of them), are each dropped and counted; the
// datagrams around them, from the same sender and from another, arrive
// intact.
func TestPacketHostile(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD")
	}
	a, b := listenPacketPair(t)
	defer a.Close()
	defer b.Close()
	other, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer other.Close()
	port := uint16(a.LocalAddr().(*rdma.Addr).Port)
	frag := func(id uint32, total, off, size, n int) []byte {
		h := []byte{0xD7, 0x11, byte(port >> 8), byte(port), byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id),
			byte(total >> 8), byte(total), byte(off >> 8), byte(off), byte(size >> 8), byte(size), 0, 0}
		return append(h, make([]byte, n)...)
	}
	malformed := [][]byte{
		{},                        // nothing at all
		{0xD7},                    // a short header
		{0xD7, 0x10, 0},           // still short
		{0x00, 0x10, 0, 1, 'x'},   // another magic
		{0xD7, 0x20, 0, 1, 'x'},   // another version
		{0xD7, 0x12, 0, 1, 'x'},   // an unknown flag
		frag(1, 100, 200, 64, 64), // a fragment past the datagram's end
		frag(2, 1000, 64, 64, 10), // a fragment shorter than its size, not the last
		frag(3, 50, 0, 64, 50),    // a "fragment" of a datagram that fits whole
		append(frag(4, 1000, 0, 64, 64)[:14], 1, 0), // reserved bytes set
	}
	mtu := rdma.PacketMTU(a)
	good := []byte("after the bad ones")
	require.NoError(t, b.SetDeadline(time.Now().Add(10*time.Second)))
	for _, m := range malformed {
		require.NoError(t, rdma.WritePacketRaw(a, m, b.LocalAddr()))
	}
	// Fragments that never complete: a flood of first fragments from a,
	// each of a datagram of 65,000 bytes.
	fs := mtu - 16
	for id := uint32(100); id < 400; id++ {
		require.NoError(t, rdma.WritePacketRaw(a, frag(id, 65000, 0, fs, fs), b.LocalAddr()))
	}
	// Meanwhile another sender's large datagrams still get through,
	// and so does a's own.
	big := make([]byte, 60000)
	rand.New(rand.NewSource(2)).Read(big)
	_, err = other.WriteTo(big, b.LocalAddr())
	require.NoError(t, err)
	_, err = a.WriteTo(good, b.LocalAddr())
	require.NoError(t, err)
	buf := make([]byte, 70000)
	got := map[string]bool{}
	for i := 0; i < 2; i++ {
		n, from, err := b.ReadFrom(buf)
		require.NoError(t, err)
		switch from.String() {
		case other.LocalAddr().String():
			require.True(t, bytes.Equal(big, buf[:n]), "the other sender's datagram differs")
		case a.LocalAddr().String():
			require.Equal(t, good, buf[:n])
		default:
			t.Fatalf("a datagram from %v", from)
		}
		got[from.String()] = true
	}
	require.Len(t, got, 2)
	st := b.Stats()
	require.Equal(t, uint64(len(malformed)), st.DropsMalformed, "%+v", st)
	require.NotZero(t, st.DropsReassembly, "the flood's fragments beyond the per-source bound: %+v", st)
	b.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, _, err = b.ReadFrom(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "nothing else was delivered")
}

// TestPacketSlowReader: datagrams that arrive while the reader has not
// read the earlier ones are dropped once the receives are nearly all
// taken, and counted; the receives kept posted mean the library, not the
// device, drops them; reading again lets new datagrams in.
func TestPacketSlowReader(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD")
	}
	lc := rdma.ListenConfig{Packet: rdma.PacketOptions{RecvDepth: 64}}
	a, err := lc.ListenPacket(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer a.Close()
	b, err := lc.ListenPacket(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer b.Close()
	const sent = 200
	ms := make([]rdma.Message, sent)
	for i := range ms {
		ms[i] = rdma.Message{Buffers: [][]byte{{byte(i), 1, 2, 3}}, Addr: b.LocalAddr()}
	}
	n, err := a.(*rdma.PacketConn).WriteBatch(ms, 0)
	require.NoError(t, err)
	require.Equal(t, sent, n)
	bp := b.(*rdma.PacketConn)
	// Wait until every datagram is in: taken or dropped.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		st := bp.Stats()
		if st.DropsNoReceive > 0 && st.DropsNoReceive == bp.Stats().DropsNoReceive {
			time.Sleep(100 * time.Millisecond)
			if bp.Stats().DropsNoReceive == st.DropsNoReceive {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := 0
	buf := make([]byte, 100)
	last := -1
	for {
		bp.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, _, err := bp.ReadFrom(buf)
		if err != nil {
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			break
		}
		require.Equal(t, 4, n)
		require.Greater(t, int(buf[0]), last, "in order, none twice")
		last = int(buf[0])
		got++
	}
	st := bp.Stats()
	require.LessOrEqual(t, got, 48, "at most the receives not kept posted hold datagrams")
	require.Greater(t, got, 0)
	require.NotZero(t, st.DropsNoReceive, "%+v", st)
	// Those the device dropped, finding no receive posted in the
	// burst, are not counted.
	require.LessOrEqual(t, uint64(got)+st.DropsNoReceive, uint64(sent), "%+v", st)
	t.Logf("%d sent, %d read, %d dropped by the library, %d by the device", sent, got, st.DropsNoReceive, sent-got-int(st.DropsNoReceive))
	// Reading again made room.
	_, err = a.WriteTo([]byte("again"), bp.LocalAddr())
	require.NoError(t, err)
	bp.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err = bp.ReadFrom(buf)
	require.NoError(t, err)
	require.Equal(t, "again", string(buf[:n]))
}

// TestPacketNoDatagrams: where RDMA cannot carry datagrams (soft-iWARP's
// device, or an address without RDMA), ListenPacket fails with an error
// that says why, and FallbackUDP opens a working UDP socket instead.
func TestPacketNoDatagrams(t *testing.T) {
	needDevice(t)
	addr := "127.0.0.1" // no RDMA device
	if siw() {
		addr = testAddr // iWARP: no UD
	}
	_, err := rdma.ListenPacket("rdma", net.JoinHostPort(addr, "0"))
	require.Error(t, err)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "rdma", oe.Net)
	if siw() {
		require.Contains(t, err.Error(), "iWARP")
	} else {
		require.ErrorIs(t, err, rdma.ErrNoDevice)
	}
	lc := rdma.ListenConfig{FallbackUDP: true}
	pc, err := lc.ListenPacket(context.Background(), "rdma", net.JoinHostPort(addr, "0"))
	require.NoError(t, err)
	defer pc.Close()
	require.True(t, pc.(*rdma.PacketConn).IsUDP())
	peer, err := lc.ListenPacket(context.Background(), "rdma", net.JoinHostPort(addr, "0"))
	require.NoError(t, err)
	defer peer.Close()
	_, err = peer.WriteTo([]byte("over udp"), pc.LocalAddr())
	require.NoError(t, err)
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	n, from, err := pc.ReadFrom(buf)
	require.NoError(t, err)
	require.Equal(t, "over udp", string(buf[:n]))
	require.Equal(t, peer.LocalAddr().String(), from.String())
}

// TestPacketMulticast: three members of a group on the test bed's device
// each get a datagram one of them sends to the group, small or fragmented;
// a PacketConn that did not join cannot send to it.
func TestPacketMulticast(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD")
	}
	group := &rdma.Addr{IP: net.IPv4(239, 7, 7, 7), Port: 7400}
	var members []*rdma.PacketConn
	for i := 0; i < 3; i++ {
		m, err := rdma.ListenMulticast("rdma", nil, group)
		require.NoError(t, err)
		defer m.Close()
		members = append(members, m)
	}
	msg := []byte("to the group")
	_, err := members[0].WriteTo(msg, group)
	require.NoError(t, err)
	buf := make([]byte, 100)
	for i, m := range members[1:] {
		m.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := m.ReadFrom(buf)
		require.NoError(t, err, "member %d", i+1)
		require.Equal(t, msg, buf[:n])
		require.Equal(t, members[0].LocalAddr().String(), from.String())
	}
	// A fragmented datagram reaches the group whole too.
	big := make([]byte, 20000)
	rand.New(rand.NewSource(3)).Read(big)
	_, err = members[1].WriteTo(big, group)
	require.NoError(t, err)
	for _, m := range []*rdma.PacketConn{members[0], members[2]} {
		m.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			b := make([]byte, 30000)
			n, from, err := m.ReadFrom(b)
			require.NoError(t, err)
			if from.String() != members[1].LocalAddr().String() {
				continue // its own earlier datagram, looped back
			}
			require.True(t, bytes.Equal(big, b[:n]))
			break
		}
	}
	outsider, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer outsider.Close()
	_, err = outsider.WriteTo(msg, group)
	require.Error(t, err)
	require.Contains(t, err.Error(), "multicast")
}

// BenchmarkPacketRoundTrip64 is a 64 B datagram's round trip between two
// PacketConns of the device, through ReadFromAddrPort and
// WriteToAddrPort (which allocate nothing).
func BenchmarkPacketRoundTrip64(b *testing.B) {
	needDevice(b)
	if siw() {
		b.Skip("siw has no UD")
	}
	a, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(b, err)
	defer a.Close()
	srv, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(b, err)
	defer srv.Close()
	go func() {
		buf := make([]byte, 100)
		for {
			n, from, err := srv.ReadFromAddrPort(buf)
			if err != nil {
				return
			}
			srv.WriteToAddrPort(buf[:n], from)
		}
	}()
	dst := srv.LocalAddr().(*rdma.Addr).AddrPort()
	msg, buf := make([]byte, 64), make([]byte, 100)
	round := func() {
		if _, err := a.WriteToAddrPort(msg, dst); err != nil {
			b.Fatal(err)
		}
		if _, _, err := a.ReadFromAddrPort(buf); err != nil {
			b.Fatal(err)
		}
	}
	round() // the resolution
	b.ReportAllocs()
	for b.Loop() {
		round()
	}
}

// BenchmarkPacketWriteBatch64 sends 64 B datagrams in batches of 32 to a
// PacketConn that reads them in batches; ns/op is per datagram sent, and
// the receiver's share arrived (datagrams may be dropped under the
// load) is reported.
func BenchmarkPacketWriteBatch64(b *testing.B) {
	needDevice(b)
	if siw() {
		b.Skip("siw has no UD")
	}
	a, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(b, err)
	defer a.Close()
	srv, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(b, err)
	got := make(chan int, 1)
	go func() {
		in := make([]rdma.Message, 32)
		for i := range in {
			in[i].Buffers = [][]byte{make([]byte, 100)}
		}
		n := 0
		for {
			k, err := srv.ReadBatch(in, 0)
			if err != nil {
				got <- n
				return
			}
			n += k
		}
	}()
	ms := make([]rdma.Message, 32)
	for i := range ms {
		ms[i] = rdma.Message{Buffers: [][]byte{make([]byte, 64)}, Addr: srv.LocalAddr()}
	}
	if _, err := a.WriteBatch(ms[:1], 0); err != nil { // the resolution
		b.Fatal(err)
	}
	b.ReportAllocs()
	i, written := 0, 1
	for b.Loop() {
		if i%32 == 0 {
			if _, err := a.WriteBatch(ms, 0); err != nil {
				b.Fatal(err)
			}
			written += len(ms)
		}
		i++
	}
	time.Sleep(100 * time.Millisecond)
	srv.Close()
	b.ReportMetric(float64(<-got)/float64(written), "arrived/sent")
}

// TestPacketNoListener: a WriteTo to a port of the test bed's address
// where nothing listens succeeds, as UDP's does, and the datagram is
// lost and counted (PacketStats.DropsNoListener; it failed with
// EHOSTUNREACH); so does one after the remembered outcome expired. A
// WriteTo to an address with no route (the test bed routes nothing
// beyond its own subnets) and one to loopback (no RDMA device) still
// fail.
func TestPacketNoListener(t *testing.T) {
	needDevice(t)
	needNotSiw(t, "siw has no UD (TestPacketIWARP)")
	a, b := listenPacketPair(t)
	defer a.Close()
	nobody := b.LocalAddr()
	require.NoError(t, b.Close())
	require.NoError(t, a.SetWriteDeadline(time.Now().Add(10*time.Second)))
	for i := range 3 {
		n, err := a.WriteTo([]byte("lost"), nobody)
		require.NoError(t, err, "write %d", i)
		require.Equal(t, 4, n)
	}
	time.Sleep(1100 * time.Millisecond) // the outcome is remembered for a second
	ms := []rdma.Message{{Buffers: [][]byte{[]byte("lost")}, Addr: nobody}}
	n, err := a.WriteBatch(ms, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st := a.Stats()
	require.Equal(t, uint64(4), st.DropsNoListener, "%+v", st)
	require.Equal(t, uint64(2), st.PeerFailures, "%+v", st)
	require.Zero(t, st.DatagramsSent, "%+v", st)

	for _, to := range []string{"192.0.2.1:9", "127.0.0.1:9"} {
		_, err := a.WriteTo([]byte("x"), &rdma.Addr{IP: net.ParseIP(to[:len(to)-2]), Port: 9})
		require.Error(t, err, to)
		t.Logf("to %s: %v", to, err)
	}
	require.Equal(t, uint64(4), a.Stats().DropsNoListener)

	// The PacketConn serves on.
	c, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer c.Close()
	_, err = a.WriteTo([]byte("served"), c.LocalAddr())
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 16)
	k, _, err := c.ReadFrom(buf)
	require.NoError(t, err)
	require.Equal(t, "served", string(buf[:k]))
}
