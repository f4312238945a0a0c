package rdma

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The datagram path of PacketConns over a fake UD fabric: each end's QP
// is a udEnd, which carries every posted send into a posted receive of
// its destination as the device would (the GRH, then the message), drops
// what finds no receive posted, and completes the signaled sends. The
// MTU is small, so that fragmentation runs to many fragments. The fabric
// also checks what the device would refuse or silently corrupt: a
// receive posted twice, more receives or sends outstanding than the
// queues hold, a message over the MTU.

const (
	fabricMTU    = 1024
	fabricAHBase = 0x1000 // address handle of end i: fabricAHBase+i
	fabricLKey   = 7
)

type udFabric struct {
	t    testing.TB
	ends []*udEnd
	lag  bool          // send completions come from poll, once the send queue is full
	full int           // with lag: how many free slots of the send queue count as full
	hold bool          // with lag: they do not come at all
	wake chan struct{} // a post with lagged completions
	stop chan struct{}
	wg   sync.WaitGroup

	mu   sync.Mutex      // ends (restart) and gone
	gone map[uint32]bool // the QP numbers of ends restarted
	lost int             // sends to a QP that is gone
}

// udEnd is one PacketConn and its fake QP.
type udEnd struct {
	f    *udFabric
	idx  int
	c    *PacketConn
	ap   netip.AddrPort
	qpn  uint32
	base uint64

	mu          sync.Mutex
	ring        []ibv.RecvWR // posted receives, oldest first, from head
	head, n     int
	posted      []bool // by slot
	noRecv      int    // messages that found no receive posted
	sendsPosted uint64
	sendsDone   uint64 // every send before it is complete
	maxOut      int    // the most sends outstanding at a post
	lagged      []ibv.WC
	failSends   error  // what posts of sends fail with,
	failFrom    uint64 // once this many sends are posted
}

// newUDFabric sets n PacketConns up with opts, each knowing every end
// (itself too) as a resolved destination.
func newUDFabric(t testing.TB, n int, opts PacketOptions, lag bool) *udFabric {
	t.Helper()
	f := &udFabric{t: t, lag: lag, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	for i := range n {
		f.ends = append(f.ends, f.newEnd(i, uint32(100+i), opts))
	}
	for _, src := range f.ends {
		for _, dst := range f.ends {
			now := time.Now()
			l := src.c.peers.acquire(dst.ap, now)
			require.True(t, l.resolve)
			ref, err := src.c.peers.resolved(l.ref, udDest{ah: uintptr(fabricAHBase + dst.idx), qpn: dst.qpn, qkey: ibv.UDQKey, free: func() {}}, nil, now)
			require.NoError(t, err)
			src.c.peers.release(ref)
		}
	}
	if lag {
		f.wg.Add(1)
		go f.poll()
	}
	t.Cleanup(f.close)
	return f
}

// newEnd sets end i up, with QP number qpn. Its resolutions (of the
// destinations not resolved in advance, and those done again) find the
// ends the fabric has then.
func (f *udFabric) newEnd(i int, qpn uint32, opts PacketOptions) *udEnd {
	t := f.t
	o, err := opts.normalized()
	require.NoError(t, err)
	o.SendDepth = sendDepthFor(o, fabricMTU)
	e := &udEnd{
		f: f, idx: i, c: newPacketConn(o),
		ap:     netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), uint16(4000+i)),
		qpn:    qpn,
		base:   uint64(i+1) << 32,
		ring:   make([]ibv.RecvWR, o.RecvDepth),
		posted: make([]bool, o.RecvDepth),
	}
	mem := make([]byte, packetMemLen(o, fabricMTU))
	e.c.peers = newPeerCache[udDest](o.Peers, time.Second, func(d udDest) { d.free() })
	e.c.resolveFake = f.resolve
	require.NoError(t, e.c.initPath(e, mem, e.base, fabricLKey, fabricMTU, nopSpinner{}, PollAdaptive))
	e.c.laddr, e.c.port = addrFrom(e.ap), e.ap.Port()
	return e
}

// resolve is the fabric's rdma_cm: the destination of the end at ap now.
func (f *udFabric) resolve(ap netip.AddrPort) (udDest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.ends {
		if e.ap == ap {
			return udDest{ah: uintptr(fabricAHBase + e.idx), qpn: e.qpn, qkey: ibv.UDQKey, free: func() {}}, nil
		}
	}
	return udDest{}, os.NewSyscallError("rdma_connect", syscall.ECONNREFUSED)
}

// restart closes end i and opens another on its address, with a QP of
// another number: the sends still addressed to the old QP are lost, as
// the device loses them.
func (f *udFabric) restart(i int, opts PacketOptions) *udEnd {
	f.mu.Lock()
	old := f.ends[i]
	f.mu.Unlock()
	old.c.Close()
	e := f.newEnd(i, old.qpn+1000, opts)
	f.mu.Lock()
	f.ends[i] = e
	if f.gone == nil {
		f.gone = map[uint32]bool{}
	}
	f.gone[old.qpn] = true
	f.mu.Unlock()
	return e
}

func (f *udFabric) close() {
	for _, e := range f.ends {
		e.c.Close()
	}
	close(f.stop)
	f.wg.Wait()
}

// poll completes the lagged sends of an end once posting pauses with
// its send queue full (f.full slots or fewer free): a writer that goes
// on only when sends complete has then used every slot it may. Once
// posting has stopped for long, it completes them anyway.
func (f *udFabric) poll() {
	defer f.wg.Done()
	for {
		select {
		case <-f.stop:
			return
		case <-f.wake:
		}
		quiet := time.Now()
		for {
			select {
			case <-f.stop:
				return
			case <-f.wake:
				quiet = time.Now()
				continue
			case <-time.After(200 * time.Microsecond):
			}
			if f.hold {
				continue
			}
			long := time.Since(quiet) > 50*time.Millisecond
			left := false
			for _, e := range f.ends {
				e.mu.Lock()
				var wcs []ibv.WC
				if long || e.c.opts.SendDepth-int(e.sendsPosted-e.sendsDone) <= f.full {
					wcs = e.lagged
					e.lagged = nil
				}
				if len(wcs) > 0 {
					e.sendsDone = wcs[len(wcs)-1].WRID + 1
				}
				left = left || len(e.lagged) > 0
				e.mu.Unlock()
				for _, wc := range wcs {
					e.c.complete(wc)
				}
			}
			if !left {
				break
			}
		}
	}
}

func (e *udEnd) PostRecvs(wrs []ibv.RecvWR) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, wr := range wrs {
		slot := int(wr.ID &^ wrRecvFlag)
		if wr.ID&wrRecvFlag == 0 || slot >= len(e.posted) {
			e.f.t.Errorf("end %d: receive posted with id %#x", e.idx, wr.ID)
			continue
		}
		if e.posted[slot] {
			e.f.t.Errorf("end %d: receive slot %d posted twice", e.idx, slot)
			continue
		}
		if wr != e.c.recvWR(slot) {
			e.f.t.Errorf("end %d: receive %+v is not slot %d's", e.idx, wr, slot)
		}
		if e.n == len(e.ring) {
			e.f.t.Errorf("end %d: more receives posted than the queue holds", e.idx)
			continue
		}
		e.posted[slot] = true
		e.ring[(e.head+e.n)%len(e.ring)] = wr
		e.n++
	}
	return nil
}

// takeRecv takes the oldest posted receive, as the device fills them.
func (e *udEnd) takeRecv() (ibv.RecvWR, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == 0 {
		e.noRecv++
		return ibv.RecvWR{}, false
	}
	wr := e.ring[e.head]
	e.head = (e.head + 1) % len(e.ring)
	e.n--
	e.posted[int(wr.ID&^wrRecvFlag)] = false
	return wr, true
}

func (e *udEnd) PostUDSends(wrs []ibv.UDSendWR) error {
	e.mu.Lock()
	if err := e.failSends; err != nil && e.sendsPosted >= e.failFrom {
		e.mu.Unlock()
		return err
	}
	e.mu.Unlock()
	for i := range wrs {
		wr := &wrs[i]
		e.mu.Lock()
		if wr.ID != e.sendsPosted {
			e.f.t.Errorf("end %d: send %d posted as the %dth", e.idx, wr.ID, e.sendsPosted)
		}
		e.sendsPosted++
		out := int(e.sendsPosted - e.sendsDone)
		e.maxOut = max(e.maxOut, out)
		if out > e.c.opts.SendDepth {
			e.f.t.Errorf("end %d: %d sends outstanding, the queue holds %d", e.idx, out, e.c.opts.SendDepth)
		}
		e.mu.Unlock()
		e.f.carry(e, wr)
	}
	for i := range wrs {
		if wrs[i].Flags&ibv.SendSignaled == 0 {
			continue
		}
		wc := ibv.WC{WRID: wrs[i].ID}
		e.mu.Lock()
		if e.f.lag {
			e.lagged = append(e.lagged, wc)
			e.mu.Unlock()
			signal(e.f.wake)
			continue
		}
		e.sendsDone = wc.WRID + 1
		e.mu.Unlock()
		e.c.complete(wc)
	}
	return nil
}

// carry delivers a send of src's to its destination's next receive.
func (f *udFabric) carry(src *udEnd, wr *ibv.UDSendWR) {
	i := int(wr.AH) - fabricAHBase
	if i < 0 || i >= len(f.ends) {
		f.t.Errorf("send to address handle %#x", wr.AH)
		return
	}
	f.mu.Lock()
	dst := f.ends[i]
	gone := f.gone[wr.QPN]
	if gone {
		f.lost++
	}
	f.mu.Unlock()
	if gone {
		return
	}
	if wr.QPN != dst.qpn || wr.QKey != ibv.UDQKey || wr.LKey != fabricLKey || int(wr.Len) > fabricMTU {
		f.t.Errorf("bad send %+v to end %d", *wr, i)
		return
	}
	msg := src.c.mem[wr.Addr-src.base:][:wr.Len]
	dst.receive(grhV4(src.ap.Addr()), msg, ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(msg)), QPNum: dst.qpn, Flags: ibv.WCGRH, SrcQP: src.qpn})
}

// receive puts grh and msg in e's next posted receive, as the device
// places a datagram, and completes it with wc (its id filled in), as
// the poller does. It reports false when no receive was posted.
func (e *udEnd) receive(grh [ibv.GRHLen]byte, msg []byte, wc ibv.WC) bool {
	wr, ok := e.takeRecv()
	if !ok {
		return false
	}
	buf := e.c.mem[wr.Addr-e.base:][:wr.Len]
	copy(buf, grh[:])
	copy(buf[ibv.GRHLen:], msg)
	wc.WRID = wr.ID
	if e.c.complete(wc) {
		e.c.lockAndFlush()
	}
	return true
}

// receiveFrom delivers msg, a UD message made up by the test, from src.
func (e *udEnd) receiveFrom(src netip.Addr, msg []byte) bool {
	return e.receive(grhV4(src), msg, ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(msg)), QPNum: e.qpn, Flags: ibv.WCGRH})
}

// grhV4 is the GRH of RoCE v2 over IPv4: an IPv4 header in its last 20
// bytes.
func grhV4(src netip.Addr) (g [ibv.GRHLen]byte) {
	g[20] = 0x45
	a := src.As4()
	copy(g[32:36], a[:])
	return g
}

// grhV6 is an IPv6 header's GRH (RoCE v2 over IPv6, or InfiniBand's).
func grhV6(src netip.Addr) (g [ibv.GRHLen]byte) {
	g[0] = 0x60
	a := src.As16()
	copy(g[8:24], a[:])
	return g
}

// dgramMsg is a UD message of header h and payload p.
func dgramMsg(h wire.DgramHeader, p []byte) []byte {
	b := make([]byte, h.Len()+len(p))
	copy(b[wire.PutDgramHeader(b, h):], p)
	return b
}

// state is what the PacketConn and its fake QP hold of receives.
type endState struct {
	posted, fakePosted, held, qlen, reposts int
}

func (e *udEnd) state() endState {
	e.c.rmu.Lock()
	s := endState{posted: e.c.posted, held: e.c.held, qlen: e.c.qlen, reposts: len(e.c.reposts)}
	e.c.rmu.Unlock()
	e.mu.Lock()
	s.fakePosted = e.n
	e.mu.Unlock()
	return s
}

// requireReceives checks that every receive slot is posted, queued for a
// reader or waiting to be posted again, once, and that the PacketConn's
// count of posted receives is the QP's.
func (e *udEnd) requireReceives(t testing.TB) {
	t.Helper()
	s := e.state()
	require.Equal(t, s.fakePosted, s.posted, "receives posted")
	require.Equal(t, e.c.opts.RecvDepth, s.posted+s.held+s.reposts, "receive slots: %+v", s)
	require.GreaterOrEqual(t, s.posted, e.c.minPosted(), "receives posted: %+v", s)
}

// readExpect reads one datagram from e and requires it to be want, from
// src.
func readExpect(t testing.TB, e *udEnd, want []byte, src netip.AddrPort) {
	t.Helper()
	require.NoError(t, e.c.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, wire.MaxDatagram+100)
	n, from, err := e.c.ReadFrom(buf)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	require.True(t, bytes.Equal(want, buf[:n]), "the bytes of a datagram of %d differ", len(want))
	require.Equal(t, src, from.(*Addr).AddrPort())
}

// readNone requires nothing to be queued at e.
func readNone(t testing.TB, e *udEnd) {
	t.Helper()
	require.NoError(t, e.c.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
	_, _, err := e.c.ReadFrom(make([]byte, 16))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

func TestPacketRoundTrip(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	sizes := []int{0, 1, 64, fabricMTU - wire.DgramHeaderLen, fabricMTU - wire.DgramHeaderLen + 1, 2 * (fabricMTU - wire.DgramFragHeaderLen), 4000, wire.MaxDatagram}
	var bytesSent uint64
	for i, n := range sizes {
		msg := testDatagram(uint32(i), n)
		w, err := a.c.WriteTo(msg, b.c.LocalAddr())
		require.NoError(t, err, "size %d", n)
		require.Equal(t, n, w)
		readExpect(t, b, msg, a.ap)
		// And back, to the address ReadFrom gave.
		_, err = b.c.WriteTo(msg, net.UDPAddrFromAddrPort(a.ap))
		require.NoError(t, err)
		readExpect(t, a, msg, b.ap)
		bytesSent += uint64(n)
		b.requireReceives(t)
	}
	// The largest datagram took 65 messages, each within the MTU (carry
	// checks), the one of MTU-3 two.
	st := b.c.Stats()
	require.Equal(t, PacketStats{DatagramsSent: uint64(len(sizes)), DatagramsReceived: uint64(len(sizes)),
		BytesSent: bytesSent, BytesReceived: bytesSent, PeerHits: uint64(len(sizes))}, st)
	require.Zero(t, a.noRecv+b.noRecv)
	require.Equal(t, uint64(len(sizes)), a.c.Stats().DatagramsReceived)
}

// TestPacketPeerRestart: a PacketConn opened again on the address and
// port of one that A wrote to, with a QP of another number, is reached
// again: at once after it wrote to A (the source QP of its datagram sends
// A to resolve it again), and without that once it has been quiet for the
// cache's bound.
func TestPacketPeerRestart(t *testing.T) {
	opts := PacketOptions{RecvDepth: 64}
	f := newUDFabric(t, 2, opts, false)
	a := f.ends[0]
	_, err := a.c.WriteTo([]byte("before"), f.ends[1].c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, f.ends[1], []byte("before"), a.ap)

	b := f.restart(1, opts)
	_, err = b.c.WriteTo([]byte("hello"), a.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, a, []byte("hello"), b.ap)
	_, err = a.c.WriteTo([]byte("reply"), b.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, b, []byte("reply"), a.ap)
	f.mu.Lock()
	require.Zero(t, f.lost, "the reply went to the new QP")
	f.mu.Unlock()

	// Reopened again, and never writing to A: A resolves it again once it
	// has heard nothing from its QP for the bound (shortened here).
	const bound = 20 * time.Millisecond
	a.c.peers.mu.Lock()
	a.c.peers.refreshAfter = bound
	a.c.peers.mu.Unlock()
	b = f.restart(1, opts)
	start := time.Now()
	buf := make([]byte, 64)
	for i := 0; ; i++ {
		require.Less(t, time.Since(start), 5*time.Second, "never reached")
		msg := []byte(fmt.Sprintf("one-way %d", i))
		_, err := a.c.WriteTo(msg, b.c.LocalAddr())
		require.NoError(t, err)
		require.NoError(t, b.c.SetReadDeadline(time.Now().Add(5*time.Millisecond)))
		n, from, err := b.c.ReadFrom(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		require.NoError(t, err)
		require.Equal(t, msg, buf[:n])
		require.Equal(t, a.ap, from.(*Addr).AddrPort())
		break
	}
	require.Zero(t, b.c.Stats().DatagramsSent, "B never wrote")
}

// TestPacketLargestWithSmallestReassembly: the least reassembly memory
// PacketOptions allow still takes the largest datagram, whose buffer is
// 64 KiB, from a source that may hold a quarter of it.
func TestPacketLargestWithSmallestReassembly(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64, ReassemblyBytes: 1}, false)
	a, b := f.ends[0], f.ends[1]
	msg := testDatagram(1, wire.MaxDatagram)
	_, err := a.c.WriteTo(msg, b.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, b, msg, a.ap)
	require.Zero(t, b.c.Stats().DropsReassembly)
}

func TestPacketTruncated(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	for _, n := range []int{100, 3000} { // whole and reassembled
		first, second := testDatagram(1, n), testDatagram(2, n)
		for _, m := range [][]byte{first, second, second} {
			_, err := a.c.WriteTo(m, b.c.LocalAddr())
			require.NoError(t, err)
		}
		before := b.c.Stats().DropsTruncated
		require.NoError(t, b.c.SetReadDeadline(time.Now().Add(5*time.Second)))
		buf := make([]byte, 10)
		r, from, err := b.c.ReadFrom(buf)
		require.NoError(t, err)
		require.Equal(t, 10, r)
		require.Equal(t, first[:10], buf)
		require.Equal(t, a.ap, from.(*Addr).AddrPort())
		require.Equal(t, before+1, b.c.Stats().DropsTruncated)

		ms := []Message{{Buffers: [][]byte{make([]byte, 4), make([]byte, 3)}}}
		k, err := b.c.ReadBatch(ms, 0)
		require.NoError(t, err)
		require.Equal(t, 1, k)
		require.Equal(t, 7, ms[0].N)
		require.Equal(t, MsgTrunc, ms[0].Flags)
		require.Equal(t, second[:7], append(ms[0].Buffers[0], ms[0].Buffers[1]...))
		require.Equal(t, before+2, b.c.Stats().DropsTruncated)

		// The next is whole: nothing of the discarded tails is left.
		readExpect(t, b, second, a.ap)
		readNone(t, b)
		b.requireReceives(t)
	}
}

// TestPacketSlowReader: a reader that falls behind has the excess
// dropped and counted by the library, never by the device for want of a
// receive, and datagrams flow again once it reads.
func TestPacketSlowReader(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	room := b.c.opts.RecvDepth - b.c.minPosted()
	const extra = 40
	for i := range room + extra {
		_, err := a.c.WriteTo(testDatagram(uint32(i), 64+i), b.c.LocalAddr())
		require.NoError(t, err)
	}
	require.Equal(t, uint64(extra), b.c.Stats().DropsNoReceive)
	require.Zero(t, b.noRecv, "the device found no receive posted")
	s := b.state()
	require.Equal(t, room, s.held)
	require.Equal(t, b.c.minPosted(), s.posted)
	b.requireReceives(t)
	for i := range room {
		readExpect(t, b, testDatagram(uint32(i), 64+i), a.ap)
	}
	readNone(t, b)
	for i := range 2 * room {
		m := testDatagram(uint32(i), 100)
		_, err := a.c.WriteTo(m, b.c.LocalAddr())
		require.NoError(t, err)
		readExpect(t, b, m, a.ap)
	}
	require.Equal(t, uint64(extra), b.c.Stats().DropsNoReceive)
	require.Zero(t, b.noRecv)
	b.requireReceives(t)
}

// TestPacketQueueFullOfReassembled: reassembled datagrams hold no
// receive, so a slow reader's queue can fill with them alone; a whole
// datagram that comes then is dropped like them, not written over the
// oldest (which lost it, and later handed the reader an empty entry that
// posted its slot's receive twice).
func TestPacketQueueFullOfReassembled(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: minPacketRecvDepth}, false)
	a, b := f.ends[0], f.ends[1]
	depth := b.c.opts.RecvDepth
	for i := range depth + 1 {
		_, err := a.c.WriteTo(testDatagram(uint32(i), 1500), b.c.LocalAddr())
		require.NoError(t, err)
	}
	_, err := a.c.WriteTo([]byte("whole"), b.c.LocalAddr())
	require.NoError(t, err)
	require.Equal(t, uint64(2), b.c.Stats().DropsNoReceive)
	for i := range depth {
		readExpect(t, b, testDatagram(uint32(i), 1500), a.ap)
	}
	readNone(t, b)
	b.requireReceives(t)
	_, err = a.c.WriteTo([]byte("whole"), b.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, b, []byte("whole"), a.ap)
}

// TestPacketBatches: WriteBatch of more datagrams than a post takes and
// than the send queue holds (it waits for completions, which come only
// once it stops posting), ReadBatch taking what is queued at once, and
// messages of several buffers both ways.
func TestPacketBatches(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 512}, true)
	f.full = 2 // a datagram of 3000 bytes waits for 3 slots
	a, b := f.ends[0], f.ends[1]
	const count = 300
	ms := make([]Message, count)
	want := make([][]byte, count)
	for i := range ms {
		n := 1 + i%200
		if i%50 == 7 {
			n = 3000 // fragmented, its fragments across buffers
		}
		want[i] = testDatagram(uint32(i), n)
		// Gathered from three buffers, one empty.
		cut := n / 3
		ms[i] = Message{Buffers: [][]byte{want[i][:cut], nil, want[i][cut:]}, Addr: b.c.LocalAddr()}
	}
	require.NoError(t, a.c.SetWriteDeadline(time.Now().Add(10*time.Second)))
	k, err := a.c.WriteBatch(ms, 0)
	require.NoError(t, err)
	require.Equal(t, count, k)
	for i := range ms {
		require.Equal(t, len(want[i]), ms[i].N)
	}
	a.mu.Lock()
	posted, maxOut := a.sendsPosted, a.maxOut
	a.mu.Unlock()
	require.Greater(t, int(posted), a.c.opts.SendDepth)
	require.GreaterOrEqual(t, maxOut, a.c.opts.SendDepth-f.full, "the writer used every send slot it could, then waited")

	// Read in batches of 64, each scattered into buffers of 5, 0 and the rest.
	rs := make([]Message, 64)
	for i := range rs {
		rs[i].Buffers = [][]byte{make([]byte, 5), nil, make([]byte, 4000)}
	}
	got := 0
	for got < count {
		require.NoError(t, b.c.SetReadDeadline(time.Now().Add(5*time.Second)))
		k, err := b.c.ReadBatch(rs, 0)
		require.NoError(t, err)
		require.Equal(t, min(len(rs), count-got), k, "ReadBatch takes what is queued")
		for _, m := range rs[:k] {
			require.Zero(t, m.Flags)
			require.Equal(t, a.ap, m.Addr.(*Addr).AddrPort())
			data := append(append([]byte(nil), m.Buffers[0]...), m.Buffers[2]...)
			require.True(t, bytes.Equal(want[got], data[:m.N]), "datagram %d", got)
			got++
		}
	}
	readNone(t, b)
	st := b.c.Stats()
	require.Zero(t, st.DropsNoReceive+st.DropsReassembly+st.DropsMalformed+st.DropsTruncated)
	require.Equal(t, uint64(count), st.DatagramsReceived)
	b.requireReceives(t)
}

// TestPacketWriteErrors: writes that cannot be sent fail, clearly and
// sending nothing.
func TestPacketWriteErrors(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	cases := []struct {
		name string
		size int
		addr net.Addr
		is   error
		msg  string
	}{
		{"too long", wire.MaxDatagram + 1, b.c.LocalAddr(), syscall.EMSGSIZE, "longer than 65507"},
		{"nil address", 1, nil, errMissingAddress, "missing address"},
		{"wrong type", 1, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 4001}, nil, "not an rdma or udp address"},
		{"unspecified", 1, &Addr{IP: net.IPv4zero, Port: 4001}, nil, "invalid destination"},
		{"no IP", 1, &Addr{Port: 4001}, nil, "invalid destination"},
		{"port 0", 1, &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2)}, nil, "invalid destination"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, err := a.c.WriteTo(make([]byte, tc.size), tc.addr)
			require.Error(t, err)
			require.Zero(t, n)
			var oe *net.OpError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, "write", oe.Op)
			require.Equal(t, "rdma", oe.Net)
			require.Contains(t, err.Error(), tc.msg)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			k, err := a.c.WriteBatch([]Message{{Buffers: [][]byte{{1}}, Addr: b.c.LocalAddr()}, {Buffers: [][]byte{make([]byte, tc.size)}, Addr: tc.addr}}, 0)
			require.Error(t, err)
			require.Equal(t, 1, k, "WriteBatch sends those before the one that fails")
			readExpect(t, b, []byte{1}, a.ap)
		})
	}
	require.Equal(t, uint64(len(cases)), a.c.Stats().DatagramsSent)
	readNone(t, b)
}

// TestPacketHostile: messages no PacketConn sends, and completions that
// carry none, each drop that one message, counted, and the datagrams
// around them arrive intact.
func TestPacketHostile(t *testing.T) {
	src := netip.MustParseAddr("10.9.9.9")
	frag := func(id uint32, total, off, size int, n int) []byte {
		return dgramMsg(wire.DgramHeader{Port: 9, Fragment: true, ID: id, Total: total, Offset: off, FragSize: size}, make([]byte, n))
	}
	withByte := func(b []byte, i int, v byte) []byte { b[i] = v; return b }
	good := dgramMsg(wire.DgramHeader{Port: 9}, []byte("x"))
	cases := []struct {
		name                  string
		deliver               func(b *udEnd)
		malformed, reassembly uint64
	}{
		{"empty after the GRH", func(b *udEnd) { b.receiveFrom(src, nil) }, 1, 0},
		{"short header", func(b *udEnd) { b.receiveFrom(src, good[:3]) }, 1, 0},
		{"bad magic", func(b *udEnd) { b.receiveFrom(src, withByte(bytes.Clone(good), 0, 0x55)) }, 1, 0},
		{"bad version", func(b *udEnd) { b.receiveFrom(src, withByte(bytes.Clone(good), 1, 0x20)) }, 1, 0},
		{"unknown flag", func(b *udEnd) { b.receiveFrom(src, withByte(bytes.Clone(good), 1, 0x12)) }, 1, 0},
		{"short fragment header", func(b *udEnd) { b.receiveFrom(src, frag(1, 3000, 0, 1008, 8)[:10]) }, 1, 0},
		{"fragment reserved bytes", func(b *udEnd) { b.receiveFrom(src, withByte(frag(1, 3000, 0, 1008, 1008), 15, 1)) }, 1, 0},
		{"fragment offset past the total", func(b *udEnd) { b.receiveFrom(src, frag(1, 3000, 3024, 1008, 100)) }, 1, 0},
		{"fragment offset not a multiple", func(b *udEnd) { b.receiveFrom(src, frag(1, 3000, 1000, 1008, 1008)) }, 1, 0},
		{"fragment longer than its size", func(b *udEnd) { b.receiveFrom(src, frag(1, 3000, 0, 500, 600)) }, 1, 0},
		{"fragment short of its size", func(b *udEnd) { b.receiveFrom(src, frag(1, 3000, 0, 1008, 500)) }, 1, 0},
		{"fragment past the end", func(b *udEnd) { b.receiveFrom(src, frag(1, 3000, 2016, 1008, 1000)) }, 1, 0},
		{"fragment of a datagram that fits one", func(b *udEnd) { b.receiveFrom(src, frag(1, 100, 0, 1008, 100)) }, 1, 0},
		{"fragment size under the least", func(b *udEnd) { b.receiveFrom(src, frag(1, 3000, 0, 32, 32)) }, 1, 0},
		{"fragment total over the largest", func(b *udEnd) { b.receiveFrom(src, frag(1, 65535, 0, 1008, 1008)) }, 1, 0},
		{"empty fragment", func(b *udEnd) { b.receiveFrom(src, frag(1, 3000, 0, 1008, 0)) }, 1, 0},
		{"fragments that disagree", func(b *udEnd) {
			// The second restarts the datagram with its own geometry, the
			// first's bytes given up; the rest of neither comes.
			b.receiveFrom(src, frag(7, 3000, 0, 1008, 1008))
			b.receiveFrom(src, frag(7, 2500, 1008, 1008, 1008))
			b.c.rmu.Lock()
			b.c.reasm.reset()
			b.c.rmu.Unlock()
		}, 0, 1},
		{"ByteLen under the GRH", func(b *udEnd) {
			b.receive(grhV4(src), good, ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: ibv.GRHLen - 1, Flags: ibv.WCGRH})
		}, 1, 0},
		{"ByteLen over the receive", func(b *udEnd) {
			b.receive(grhV4(src), good, ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(b.c.slotLen() + 1), Flags: ibv.WCGRH})
		}, 1, 0},
		{"no GRH flag", func(b *udEnd) {
			b.receive(grhV4(src), good, ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(good))})
		}, 1, 0},
		{"GRH neither IPv4 nor IPv6", func(b *udEnd) {
			b.receive([ibv.GRHLen]byte{}, good, ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(good)), Flags: ibv.WCGRH})
		}, 1, 0},
		{"GRH from 0.0.0.0", func(b *udEnd) { b.receiveFrom(netip.IPv4Unspecified(), good) }, 1, 0},
		{"GRH from ::", func(b *udEnd) {
			b.receive(grhV6(netip.IPv6Unspecified()), good, ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(good)), Flags: ibv.WCGRH})
		}, 1, 0},
		{"error completion", func(b *udEnd) {
			b.receive(grhV4(src), good, ibv.WC{Status: 12, Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(good)), Flags: ibv.WCGRH})
		}, 1, 0},
	}
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := b.c.Stats()
			m1, m2 := testDatagram(uint32(i), 50), testDatagram(uint32(i), 2500)
			_, err := a.c.WriteTo(m1, b.c.LocalAddr())
			require.NoError(t, err)
			tc.deliver(b)
			_, err = a.c.WriteTo(m2, b.c.LocalAddr())
			require.NoError(t, err)
			readExpect(t, b, m1, a.ap)
			readExpect(t, b, m2, a.ap)
			readNone(t, b)
			after := b.c.Stats()
			require.Equal(t, tc.malformed, after.DropsMalformed-before.DropsMalformed, "malformed")
			require.Equal(t, tc.reassembly, after.DropsReassembly-before.DropsReassembly, "reassembly")
			require.Equal(t, before.DropsNoReceive+before.DropsTruncated, after.DropsNoReceive+after.DropsTruncated)
			require.Equal(t, before.DatagramsReceived+2, after.DatagramsReceived)
			b.requireReceives(t)
		})
	}
}

// TestPacketFromIPv6: a GRH with an IPv6 source names the sender by it;
// an IPv4-mapped one by its IPv4 address.
func TestPacketFromIPv6(t *testing.T) {
	f := newUDFabric(t, 1, PacketOptions{RecvDepth: 64}, false)
	b := f.ends[0]
	msg := dgramMsg(wire.DgramHeader{Port: 77}, []byte("six"))
	for _, tc := range []struct{ grh, from string }{{"fd00::5", "fd00::5"}, {"::ffff:10.1.2.3", "10.1.2.3"}} {
		require.True(t, b.receive(grhV6(netip.MustParseAddr(tc.grh)), msg,
			ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(msg)), Flags: ibv.WCGRH}))
		readExpect(t, b, []byte("six"), netip.AddrPortFrom(netip.MustParseAddr(tc.from), 77))
	}
}

// TestPacketFlushedReceive: a flushed receive (the QP going) is not
// posted again; a failed one is.
func TestPacketFlushedReceive(t *testing.T) {
	f := newUDFabric(t, 1, PacketOptions{RecvDepth: 64}, false)
	b := f.ends[0]
	require.True(t, b.receive([ibv.GRHLen]byte{}, nil, ibv.WC{Status: ibv.WCFlushErr}))
	s := b.state()
	require.Equal(t, b.c.opts.RecvDepth-1, s.posted+s.reposts)
	require.Equal(t, s.fakePosted, s.posted)
	require.Zero(t, b.c.Stats().DropsMalformed)
}

// TestPacketReassemblyTimeout: a datagram whose fragments never all come
// is given up after the timeout, counted, its memory back; the
// datagrams of the same source after it complete.
func TestPacketReassemblyTimeout(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	b.c.rmu.Lock()
	b.c.reasm = newReassembler(reassemblyLimits{Total: b.c.opts.ReassemblyBytes, PerSource: b.c.opts.ReassemblyBytes / 4, Timeout: 20 * time.Millisecond})
	b.c.rmu.Unlock()
	// The first fragment of a's next datagram, and not the second.
	a.c.writeMu.Lock()
	id := a.c.nextID + 1
	a.c.writeMu.Unlock()
	require.True(t, b.receiveFrom(a.ap.Addr(), dgramMsg(wire.DgramHeader{Port: a.ap.Port(), Fragment: true, ID: id, Total: 3000, Offset: 0, FragSize: 1008}, make([]byte, 1008))))
	require.NotZero(t, reasmHeld(b))
	time.Sleep(30 * time.Millisecond)
	// a skips the id of the datagram given up: a fragment of it now
	// could complete nothing, and is ignored.
	a.c.writeMu.Lock()
	a.c.nextID++
	a.c.writeMu.Unlock()
	m := testDatagram(3, 3000)
	_, err := a.c.WriteTo(m, b.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, b, m, a.ap)
	require.Equal(t, uint64(1), b.c.Stats().DropsReassembly)
	require.Zero(t, reasmHeld(b))
	readNone(t, b)
}

// reasmHeld is what e's reassembly holds, read under the lock its timer
// takes too.
func reasmHeld(e *udEnd) int {
	e.c.rmu.Lock()
	defer e.c.rmu.Unlock()
	return e.c.reasm.held()
}

// setReassemblyTimeout gives e's reassembly another timeout than its
// second, for the tests not to wait for it.
func setReassemblyTimeout(e *udEnd, d time.Duration) {
	e.c.rmu.Lock()
	e.c.reasm.limits.Timeout = d
	e.c.rmu.Unlock()
}

// TestPacketReassemblyTimer: an incomplete datagram is given up at its
// timeout, counted and its memory back, though no fragment comes after
// it to sweep the reassembly; Close stops the timer.
func TestPacketReassemblyTimer(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	b := f.ends[1]
	setReassemblyTimeout(b, 20*time.Millisecond)
	first := func(id uint32) []byte {
		return dgramMsg(wire.DgramHeader{Port: 9, Fragment: true, ID: id, Total: wire.MaxDatagram, Offset: 0, FragSize: 1008}, make([]byte, 1008))
	}
	src := netip.MustParseAddr("10.9.9.9")
	require.True(t, b.receiveFrom(src, first(1)))
	require.Equal(t, maxReassemblyBuf, reasmHeld(b))
	require.Eventually(t, func() bool { return reasmHeld(b) == 0 }, 2*time.Second, time.Millisecond, "given up on the timer")
	require.Equal(t, uint64(1), b.c.Stats().DropsReassembly)

	// Two held at once: the timer is set again for the second.
	require.True(t, b.receiveFrom(src, first(2)))
	time.Sleep(5 * time.Millisecond)
	require.True(t, b.receiveFrom(src, first(3)))
	require.Eventually(t, func() bool { return reasmHeld(b) == 0 }, 2*time.Second, time.Millisecond)
	require.Equal(t, uint64(3), b.c.Stats().DropsReassembly)
	b.requireReceives(t)

	// Held at Close: the reassembly lets it go and its timer is stopped
	// (Stop finds it so).
	setReassemblyTimeout(b, time.Hour)
	require.True(t, b.receiveFrom(src, first(4)))
	require.NoError(t, b.c.Close())
	b.c.rmu.Lock()
	defer b.c.rmu.Unlock()
	require.Zero(t, b.c.reasm.held())
	require.False(t, b.c.reasm.armed)
	require.False(t, b.c.reasm.timer.Stop(), "the timer was stopped at Close")
}

// restartAs makes e the sender old after a restart: the same address
// and port, a new PacketConn.
func restartAs(e, old *udEnd) {
	e.ap = old.ap
	e.c.laddr, e.c.port = old.c.laddr, old.c.port
}

// TestPacketSenderRestart: a sender restarted on the same port does not
// reuse the fragment ids of its last incarnation, so a datagram of the
// new one is not merged into one the old one left incomplete (same
// length, same fragment size): it arrives as sent, and the old one's is
// given up at its timeout.
func TestPacketSenderRestart(t *testing.T) {
	f := newUDFabric(t, 3, PacketOptions{RecvDepth: 64}, false)
	old, b, restarted := f.ends[0], f.ends[1], f.ends[2]
	setReassemblyTimeout(b, 50*time.Millisecond)
	// The old sender's next datagram of 3,000 bytes: two of its three
	// fragments arrive, then it dies.
	old.c.writeMu.Lock()
	id := old.c.nextID + 1
	old.c.writeMu.Unlock()
	for k := range 2 {
		h := wire.DgramHeader{Port: old.ap.Port(), Fragment: true, ID: id, Total: 3000, Offset: k * 1008, FragSize: 1008}
		require.True(t, b.receiveFrom(old.ap.Addr(), dgramMsg(h, bytes.Repeat([]byte{0xEE}, 1008))))
	}
	restartAs(restarted, old)
	m := testDatagram(1, 3000)
	_, err := restarted.c.WriteTo(m, b.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, b, m, old.ap)
	readNone(t, b)
	require.Eventually(t, func() bool { return b.c.Stats().DropsReassembly == 1 }, 2*time.Second, time.Millisecond, "the old datagram given up")
	require.Zero(t, reasmHeld(b))
	require.Zero(t, b.c.Stats().DropsStaleFragments)
}

// TestPacketRestartRemembered: the reassembly remembers the datagrams it
// finished for its timeout and drops, counted, the fragments of one under
// the same id and geometry meanwhile (a restarted sender's, should its
// ids meet the old one's); after the timeout they go through.
func TestPacketRestartRemembered(t *testing.T) {
	f := newUDFabric(t, 3, PacketOptions{RecvDepth: 64}, false)
	old, b, restarted := f.ends[0], f.ends[1], f.ends[2]
	// Long enough that a loaded machine sends the 3 datagrams again
	// within it: the memo of each starts when it finished, after first.
	const timeout = time.Second
	setReassemblyTimeout(b, timeout)
	old.c.writeMu.Lock()
	start := old.c.nextID
	old.c.writeMu.Unlock()
	first := time.Now()
	for i := range 3 {
		m := testDatagram(uint32(i), 3000)
		_, err := old.c.WriteTo(m, b.c.LocalAddr())
		require.NoError(t, err)
		readExpect(t, b, m, old.ap)
	}
	restartAs(restarted, old)
	sendAgain := func() time.Time {
		restarted.c.writeMu.Lock()
		restarted.c.nextID = start // the old incarnation's ids, as they would meet
		restarted.c.writeMu.Unlock()
		at := time.Now()
		for i := range 3 {
			_, err := restarted.c.WriteTo(testDatagram(uint32(10+i), 3000), b.c.LocalAddr())
			require.NoError(t, err)
		}
		return at
	}
	sendAgain()
	if time.Since(first) >= timeout {
		t.Skipf("the datagrams were sent again %v after the first finished, past the memo's %v", time.Since(first), timeout)
	}
	st := b.c.Stats()
	readNone(t, b)
	require.Equal(t, uint64(9), st.DropsStaleFragments, "every fragment of the 3 counted")
	require.Equal(t, uint64(3), st.DatagramsReceived)
	time.Sleep(timeout)
	sendAgain()
	for i := range 3 {
		readExpect(t, b, testDatagram(uint32(10+i), 3000), old.ap)
	}
	readNone(t, b)
	require.Zero(t, b.c.Stats().DropsReassembly)
	require.Zero(t, reasmHeld(b))
}

// TestPacketFragmentFlood: a source that sends first fragments only holds
// no more than its share, and the fragmented datagrams of another source
// keep completing meanwhile.
func TestPacketFragmentFlood(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	flooder := netip.MustParseAddr("10.6.6.6")
	share := b.c.opts.ReassemblyBytes / 4
	const floods = 200
	for i := range floods {
		h := wire.DgramHeader{Port: 6, Fragment: true, ID: uint32(i), Total: wire.MaxDatagram, Offset: 0, FragSize: 1008}
		require.True(t, b.receiveFrom(flooder, dgramMsg(h, make([]byte, 1008))))
		if i%10 == 0 {
			m := testDatagram(uint32(i), 20000)
			_, err := a.c.WriteTo(m, b.c.LocalAddr())
			require.NoError(t, err)
			readExpect(t, b, m, a.ap)
		}
		require.LessOrEqual(t, reasmHeld(b), share)
	}
	st := b.c.Stats()
	require.Equal(t, uint64(floods-share/maxReassemblyBuf), st.DropsReassembly, "the flood's oldest given up for its newest")
	require.Equal(t, uint64(floods/10), st.DatagramsReceived)
	b.requireReceives(t)
}

func TestPacketDeadlines(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]

	require.NoError(t, b.c.SetReadDeadline(time.Now().Add(-time.Second)))
	_, _, err := b.c.ReadFrom(make([]byte, 10))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	_, err = b.c.ReadBatch(make([]Message, 2), 0)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)

	start := time.Now()
	require.NoError(t, b.c.SetReadDeadline(start.Add(30*time.Millisecond)))
	_, _, err = b.c.ReadFrom(make([]byte, 10))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)

	// A deadline moved later lets a datagram through.
	require.NoError(t, b.c.SetReadDeadline(time.Time{}))
	_, err = a.c.WriteTo([]byte("late"), b.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, b, []byte("late"), a.ap)

	// Close wakes a blocked ReadFrom.
	require.NoError(t, b.c.SetReadDeadline(time.Time{}))
	done := make(chan error, 1)
	go func() {
		_, _, err := b.c.ReadFrom(make([]byte, 10))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, b.c.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, net.ErrClosed)
		var oe *net.OpError
		require.ErrorAs(t, err, &oe)
		require.Equal(t, "read", oe.Op)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake ReadFrom")
	}
	require.ErrorIs(t, b.c.Close(), net.ErrClosed)
	_, err = b.c.WriteTo([]byte("x"), a.c.LocalAddr())
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, b.c.SetDeadline(time.Now()), net.ErrClosed)
}

// TestPacketWriteDeadline: a writer waiting for send slots that never
// come back returns at its deadline, and Close wakes one that has none.
func TestPacketWriteDeadline(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 512}, true)
	f.hold = true
	a, b := f.ends[0], f.ends[1]
	ms := make([]Message, a.c.opts.SendDepth+1)
	for i := range ms {
		ms[i] = Message{Buffers: [][]byte{{byte(i)}}, Addr: b.c.LocalAddr()}
	}
	// Fill every send slot first with no deadline, so that a slow
	// machine cannot make the deadline fire while slots are still free.
	k, err := a.c.WriteBatch(ms[:a.c.opts.SendDepth], 0)
	require.NoError(t, err)
	require.Equal(t, a.c.opts.SendDepth, k)
	require.NoError(t, a.c.SetWriteDeadline(time.Now().Add(30*time.Millisecond)))
	k, err = a.c.WriteBatch(ms[a.c.opts.SendDepth:], 0)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Equal(t, 0, k)

	require.NoError(t, a.c.SetWriteDeadline(time.Time{}))
	done := make(chan error, 1)
	go func() {
		_, err := a.c.WriteTo([]byte("x"), b.c.LocalAddr())
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, a.c.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake WriteTo")
	}
}

// TestPacketFailedPost: a send post that fails fails the writes from then
// on.
func TestPacketFailedPost(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	a.mu.Lock()
	a.failSends = syscall.ENOMEM
	a.mu.Unlock()
	_, err := a.c.WriteTo([]byte("x"), b.c.LocalAddr())
	require.ErrorIs(t, err, syscall.ENOMEM)
	a.mu.Lock()
	a.failSends = nil
	a.mu.Unlock()
	_, err = a.c.WriteTo([]byte("x"), b.c.LocalAddr())
	require.ErrorIs(t, err, syscall.ENOMEM)
	readNone(t, b)
}

// TestPacketFailedPostMidDatagram: a post that fails between the
// fragments of a datagram leaves its destination held by a send slot,
// where release gives it back, as every hold of a send is (before, that
// hold was lost, and the address handle never destroyed).
func TestPacketFailedPostMidDatagram(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	a.mu.Lock()
	a.failSends, a.failFrom = syscall.ENOMEM, ibv.MaxUDSendBatch
	a.mu.Unlock()
	_, err := a.c.WriteTo(make([]byte, wire.MaxDatagram), b.c.LocalAddr())
	require.ErrorIs(t, err, syscall.ENOMEM)
	a.c.peers.mu.Lock()
	refs := a.c.peers.entries[b.ap].refs
	a.c.peers.mu.Unlock()
	a.c.smu.Lock()
	slots := 0
	for _, r := range a.c.sendRefs {
		if r != nil && r.key == b.ap {
			slots++
		}
	}
	a.c.smu.Unlock()
	require.Equal(t, 1, refs)
	require.Equal(t, refs, slots, "holds of the destination outside the send slots")
}

// TestPacketAllocs measures the allocations of a steady 64 B WriteTo and
// ReadFrom: ReadFrom's net.Addr is the one a call must make.
func TestPacketAllocs(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	msg, buf := make([]byte, 64), make([]byte, 128)
	to := b.c.LocalAddr()
	write := func() {
		if _, err := a.c.WriteTo(msg, to); err != nil {
			t.Fatal(err)
		}
	}
	read := func() {
		if _, _, err := b.c.ReadFrom(buf); err != nil {
			t.Fatal(err)
		}
	}
	ms := []Message{{Buffers: [][]byte{buf}}}
	readBatch := func() {
		if _, err := b.c.ReadBatch(ms, 0); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		write()
		read()
	}
	both := testing.AllocsPerRun(1000, func() { write(); read() })
	writes := testing.AllocsPerRun(1000, func() { write(); readBatch() })
	t.Logf("allocations: WriteTo+ReadFrom %.2f, WriteTo+ReadBatch %.2f", both, writes)
	require.LessOrEqual(t, both, 1.0, "WriteTo+ReadFrom")
	require.LessOrEqual(t, writes, 1.0, "WriteTo+ReadBatch")
}

// FuzzPacketCompletions feeds a PacketConn (over the fake fabric, the
// fuzzer playing the network and the peers' NICs) receive completions
// built from arbitrary bytes: GRHs, messages, lengths, flags and
// statuses, fragments whose headers follow the rules or nearly, datagrams
// of a real peer among them, interleaved with ReadBatch. Whatever
// arrives, it must not panic, and must keep every receive slot posted,
// queued or waiting to be posted (once), its queue and reassembly
// memory within their bounds.
//
// Each event is 4 bytes (op, then its arguments) and, for some, bytes of
// the input after it.
func FuzzPacketCompletions(f *testing.F) {
	good := dgramMsg(wire.DgramHeader{Port: 9}, []byte("hello"))
	ev := func(op, a, b, c byte, tail ...byte) []byte { return append([]byte{op, a, b, c}, tail...) }
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	f.Add(cat(ev(0, 0, 0, byte(len(good)), good...), ev(3, 0, 4, 0)))
	f.Add(cat(ev(0, 8, 0, 3, good...), ev(0, 4, 0, 5, good...), ev(0, 3, 0, 2, good...), ev(3, 3, 255, 0)))
	f.Add(cat(ev(0, 16+5<<5, 0, 5, good...), ev(0, 16+1<<5, 0, 5, good...), ev(3, 0, 1, 0)))
	f.Add(cat(ev(2, 0, 0x0b, 0xb8, 0, 0, 0, 0), ev(2, 0, 0x0b, 0xb8, 0, 1, 0, 0), ev(2, 0, 0x0b, 0xb8, 0, 2, 0, 0), ev(3, 1, 255, 0)))
	f.Add(cat(ev(2, 1, 0x0b, 0xb8, 0, 0, 0, 0), ev(2, 1, 0x09, 0xc4, 0, 1, 0, 0), ev(2, 5, 0xff, 0xe3, 0, 0, 0, 0)))
	f.Add(cat(ev(4, 0, 0x10, 0), ev(4, 0, 0, 64), ev(4, 0, 0xff, 0xe3), ev(3, 3, 255, 0)))
	var flood [][]byte
	for i := range 40 {
		flood = append(flood, ev(4, 0, 0, byte(i)), ev(2, byte(i*4), 0xff, 0xe3, 0, 0, 0, 0))
	}
	f.Add(cat(flood...))
	f.Fuzz(fuzzPacket)
}

func fuzzPacket(t *testing.T, data []byte) {
	fab := newUDFabric(t, 2, PacketOptions{RecvDepth: minPacketRecvDepth, ReassemblyBytes: 1}, false)
	a, b := fab.ends[0], fab.ends[1]
	c := b.c
	sources := []netip.Addr{a.ap.Addr(), netip.MustParseAddr("10.9.0.2"), netip.MustParseAddr("fd00::1")}
	flushed := 0 // receives completed flushed, not posted again
	take := func(n int) []byte {
		n = min(n, len(data))
		p := data[:n]
		data = data[n:]
		return p
	}
	readBuf := make([]byte, wire.MaxDatagram)
	for len(data) >= 4 {
		h := take(4)
		arg := int(h[2])<<8 | int(h[3])
		switch h[0] % 5 {
		case 0, 1: // a message as it arrived, with what the completion says
			msg := take(arg % (c.mtu + 1))
			var grh [ibv.GRHLen]byte
			switch h[1] & 3 {
			case 3:
				copy(grh[:], take(ibv.GRHLen))
			case 2:
				grh = grhV6(sources[2])
			default:
				grh = grhV4(sources[h[1]&1])
			}
			wc := ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(msg)), Flags: ibv.WCGRH}
			if h[1]&4 != 0 {
				wc.Flags = 0
			}
			if h[1]&8 != 0 {
				wc.ByteLen = uint32(arg)
			}
			if h[1]&16 != 0 {
				wc.Status = uint32(h[1] >> 5)
			}
			if b.receive(grh, msg, wc) && wc.Status == ibv.WCFlushErr {
				flushed++
			}
		case 2: // a fragment by the rules, or nearly: total, then offset
			// index, fragment size and length choices
			x := take(4)
			if len(x) < 4 {
				break
			}
			total := arg
			size := []int{1008, 500, wire.MinFragSize, int(x[2]) << 2}[x[1]&3]
			off := int(x[0]) * max(size, 1)
			n := max(0, min(size, total-off))
			if x[1]&4 != 0 {
				n = int(x[3])
			}
			n = min(n, c.mtu-wire.DgramFragHeaderLen)
			port := uint16(9)
			if h[1]&2 == 0 {
				port = a.ap.Port()
			}
			fh := wire.DgramHeader{Port: port, Fragment: true, ID: uint32(h[1] >> 2 & 3), Total: total, Offset: off, FragSize: size}
			b.receiveFrom(sources[h[1]&1], dgramMsg(fh, make([]byte, n)))
		case 3: // the application reads what is queued
			c.rmu.Lock()
			queued := c.qlen > 0
			c.rmu.Unlock()
			if queued {
				ms := make([]Message, int(h[1]%4)+1)
				for i := range ms {
					ms[i].Buffers = [][]byte{readBuf[:int(h[2])*16]}
				}
				require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
				_, err := c.ReadBatch(ms, 0)
				require.NoError(t, err)
			}
		case 4: // a datagram of the real peer's
			_, err := a.c.WriteTo(make([]byte, arg%(wire.MaxDatagram+1)), c.LocalAddr())
			require.NoError(t, err)
		}
		s := b.state()
		if s.posted < 0 || s.posted > c.opts.RecvDepth || s.posted != s.fakePosted {
			t.Fatalf("receives posted: %+v", s)
		}
		if s.posted+s.held+s.reposts+flushed != c.opts.RecvDepth {
			t.Fatalf("receive slots lost or doubled: %+v, %d flushed", s, flushed)
		}
		if s.held > c.opts.RecvDepth-c.minPosted() || s.qlen > len(c.queue) || s.held > s.qlen {
			t.Fatalf("queue: %+v", s)
		}
		c.rmu.Lock()
		held := c.reasm.held()
		for src, rs := range c.reasm.sources {
			if rs.held > c.opts.ReassemblyBytes/4 {
				t.Fatalf("reassembly: %v holds %d", src, rs.held)
			}
		}
		c.rmu.Unlock()
		if held > c.opts.ReassemblyBytes {
			t.Fatalf("reassembly holds %d", held)
		}
	}
	// Drained, the queue holds nothing, every slot is posted again (but
	// the flushed).
	for {
		c.rmu.Lock()
		queued := c.qlen > 0
		c.rmu.Unlock()
		if !queued {
			break
		}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
		_, err := c.ReadBatch([]Message{{Buffers: [][]byte{readBuf}}, {Buffers: [][]byte{readBuf}}}, 0)
		require.NoError(t, err)
	}
	s := b.state()
	if s.held != 0 || s.qlen != 0 || s.posted+s.reposts+flushed != c.opts.RecvDepth {
		t.Fatalf("drained: %+v, %d flushed", s, flushed)
	}
}

// TestPacketSendErrorFailsWrites: a send the device completed with an
// error leaves the QP's send queue in its error state, so the writes
// after it fail with an error that says so instead of vanishing.
func TestPacketSendErrorFailsWrites(t *testing.T) {
	f := newUDFabric(t, 2, PacketOptions{RecvDepth: 64}, false)
	a, b := f.ends[0], f.ends[1]
	_, err := a.c.WriteTo([]byte("one"), b.c.LocalAddr())
	require.NoError(t, err)
	readExpect(t, b, []byte("one"), a.ap)
	a.c.complete(ibv.WC{WRID: 0, Status: ibv.WCRetryExcErr})
	_, err = a.c.WriteTo([]byte("two"), b.c.LocalAddr())
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorContains(t, err, "send failed")
	require.Equal(t, uint64(1), a.c.Stats().SendErrors)
}

// TestPacketStaleGRH: a receive slot that last held an IPv6 datagram's
// GRH and now an IPv4 one's (whose device writes only the GRH room's last
// 20 bytes) reports the IPv4 source.
func TestPacketStaleGRH(t *testing.T) {
	f := newUDFabric(t, 1, PacketOptions{RecvDepth: minPacketRecvDepth}, false)
	b := f.ends[0]
	msg := dgramMsg(wire.DgramHeader{Port: 77}, []byte("x"))
	wc := ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.GRHLen + len(msg)), Flags: ibv.WCGRH}
	// Every slot once with an IPv6 GRH, then each with an IPv4 one that
	// leaves the first 20 bytes as the slot had them.
	for range minPacketRecvDepth {
		require.True(t, b.receive(grhV6(netip.MustParseAddr("fd00::5")), msg, wc))
		readExpect(t, b, []byte("x"), netip.MustParseAddrPort("[fd00::5]:77"))
	}
	var v4 [ibv.GRHLen]byte
	full := grhV4(netip.MustParseAddr("10.9.9.9"))
	for range minPacketRecvDepth {
		b.mu.Lock()
		r := b.ring[b.head] // the receive the next datagram takes
		b.mu.Unlock()
		off := int(r.Addr - b.base)
		copy(v4[:20], b.c.mem[off:off+20]) // what the device leaves
		copy(v4[20:], full[20:])
		require.True(t, b.receive(v4, msg, wc))
		readExpect(t, b, []byte("x"), netip.MustParseAddrPort("10.9.9.9:77"))
	}
}
