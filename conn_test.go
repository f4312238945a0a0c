package rdma

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The data path of a Conn over a fake QP: the test plays the peer and the
// poller, delivering completions the way the device would. The fake is
// shared by the host tests of the data path (send_test.go, recv_test.go,
// conn_complete_test.go, conn_close_test.go, and more); the round trips
// through it are here.

type nopSpinner struct{}

func (nopSpinner) spinStart() {}
func (nopSpinner) spinEnd()   {}
func (nopSpinner) tryPoll()   {}

type fakePeer struct {
	t      testing.TB
	c      *Conn
	q      *fakeQP
	lay    layout
	nextRx int    // index into q.recvs of the receive the next message lands in
	seenTx int    // sends already examined
	tail   uint64 // where the peer's messages end in our receive ring
	// headers: the transport has no immediate data (iWARP): both sides
	// send headers as SEND payloads into the receives' header slots.
	headers bool
}

// newFakeConn returns an established Conn with depth receives and data
// messages in flight and messages of at most bufSize bytes, whose peer
// granted the same and announced a ring like its own.
func newFakeConn(t testing.TB, depth, bufSize int) *fakePeer {
	return newFakeConnOpts(t, Options{BufferSize: bufSize, SendDepth: depth, RecvDepth: depth, Poll: PollEvent}, false)
}

// newFakeConnOpts is newFakeConn with options; peerMessages says the peer's
// Reads are message-oriented.
func newFakeConnOpts(t testing.TB, opts Options, peerMessages bool) *fakePeer {
	return newFakeConnMode(t, opts, peerMessages, false)
}

// newFakeConnMode is newFakeConnOpts on a transport without immediate data
// when headers is set.
func newFakeConnMode(t testing.TB, opts Options, peerMessages, headers bool) *fakePeer {
	depth, bufSize := opts.RecvDepth, opts.BufferSize
	lay := newLayout(opts)
	if headers {
		lay = lay.withHeaders()
	}
	c := newConn(phaseEstablished)
	q := &fakeQP{}
	c.mu.Lock()
	require.NoError(t, c.initDataPath(q, make([]byte, lay.size()), lay, testBase+uint64(lay.sendOff()), testLKey, 0, opts, nopSpinner{}))
	// The software providers' way (posts with the lock dropped), unless
	// the run asks for a NIC's (RDMA_TEST_POST_HELD, see TestMain).
	c.postHeld = forcePostHeld
	require.Len(t, q.recvs, lay.recvSlots, "every receive is posted at setup")
	var flags uint8
	if peerMessages {
		flags = wire.HelloMessages
	}
	if headers {
		flags |= wire.HelloHeaders
	}
	c.open(wire.Hello{Flags: flags, RecvDepth: uint16(depth), CtrlDepth: wire.CtrlDepth, BufSize: uint32(bufSize),
		RingSize: uint32(lay.ring), RingAddr: testRAddr, RKey: testRKey}, lay)
	c.mu.Unlock()
	require.Equal(t, bufSize, c.tx.ring.maxMsg)
	return &fakePeer{t: t, c: c, q: q, lay: lay, headers: headers}
}

// deliver completes the next posted receive with a message from the peer,
// as the device would: a data message as an RDMA WRITE with immediate
// whose payload the peer placed in our receive ring (wire.RingPlace), anything
// else as a SEND.
func (p *fakePeer) deliver(h wire.Header, payload []byte) {
	p.t.Helper()
	wr, ok := p.q.recvAt(p.nextRx)
	require.True(p.t, ok, "the peer sent with no receive posted")
	if !p.headers {
		require.Equal(p.t, ibv.RecvWR{ID: recvWRID}, wr, "receives are zero-length")
	}
	p.nextRx++
	op := uint32(ibv.WCOpRecv)
	if wire.IsData(h.Type) {
		op = ibv.WCOpRecvWriteImm
		start := wire.RingPlace(p.tail, p.c.rx.span, p.c.rx.maxMsg)
		copy(p.c.mem[p.lay.recvOff()+int(start%uint64(p.c.rx.span)):], payload)
		p.tail = wire.RingEnd(start, len(payload))
	}
	if p.headers {
		// The RDMA WRITE placed the payload; the SEND brings the header
		// and length into the receive's slot.
		p.sendHeader(wr, h.Imm(), uint32(len(payload)))
		return
	}
	p.complete(ibv.WC{WRID: wr.ID, Opcode: op, ByteLen: uint32(len(payload)), Imm: h.Imm(), Flags: ibv.WCWithImm})
}

// sendHeader completes receive wr with a SEND of a header (imm, n) into
// its slot, as an iWARP peer's NIC would.
func (p *fakePeer) sendHeader(wr ibv.RecvWR, imm, n uint32) {
	p.t.Helper()
	p.sendHeaderData(wr, imm, n, nil)
}

// sendHeaderData is sendHeader with data in the SEND, behind the header,
// as a peer sends a small data message.
func (p *fakePeer) sendHeaderData(wr ibv.RecvWR, imm, n uint32, data []byte) {
	p.t.Helper()
	require.Equal(p.t, uint32(ibv.HeaderSlot), wr.Len, "every receive has a header slot")
	slot := p.c.mem[wr.Addr-testBase:]
	binary.BigEndian.PutUint32(slot, imm)
	binary.BigEndian.PutUint32(slot[4:], n)
	copy(slot[ibv.HeaderLen:ibv.HeaderSlot], data)
	p.complete(ibv.WC{WRID: wr.ID, Opcode: ibv.WCOpRecv, ByteLen: uint32(ibv.HeaderLen + min(len(data), ibv.HeaderData))})
}

// complete hands one completion to the Conn as the poller does.
func (p *fakePeer) complete(wc ibv.WC) {
	if p.c.complete(wc) {
		p.c.lockAndFlush()
	}
}

// eventually waits until cond, checked under the connection's lock,
// holds: for a state another goroutine (a blocked Write) reaches.
func (p *fakePeer) eventually(cond func(c *Conn) bool) {
	p.t.Helper()
	require.Eventually(p.t, func() bool {
		p.c.mu.Lock()
		defer p.c.mu.Unlock()
		return cond(p.c)
	}, 5*time.Second, time.Millisecond)
}

// sent returns the messages posted since the last call.
func (p *fakePeer) sent() []ibv.SendWR {
	all := p.q.posted()
	s := all[p.seenTx:]
	p.seenTx = len(all)
	return s
}

func (p *fakePeer) payload(wr ibv.SendWR) string {
	off := wr.Addr - testBase
	return string(p.c.mem[off : off+uint64(wr.Len)])
}

// ack completes every send posted so far, as a signaled completion would.
func (p *fakePeer) ack() {
	all := p.q.posted()
	if len(all) > 0 {
		p.complete(ibv.WC{WRID: all[len(all)-1].ID})
	}
}

func TestConnWriteRead(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	n, err := p.c.Write([]byte("hello"))
	require.NoError(t, err)
	require.Equal(t, 5, n)
	s := p.sent()
	require.Len(t, s, 1)
	require.Equal(t, wire.Header{Type: wire.MsgData}, wire.HeaderOf(s[0].Imm))
	require.Equal(t, "hello", p.payload(s[0]))
	require.Equal(t, 7, p.c.cr.credits)

	// A Write bigger than a buffer is cut into messages, posted as one
	// chain, its partial last one too. Their headers do not ask the peer
	// for its credits (a large Write is never held; see ledger.header), so
	// the next small Write is not held either, and its header asks.
	big := bytes.Repeat([]byte("x"), 2500)
	_, err = p.c.Write(big)
	require.NoError(t, err)
	s = p.sent()
	require.Len(t, s, 3)
	require.Equal(t, []uint32{1024, 1024, 452}, []uint32{s[0].Len, s[1].Len, s[2].Len})
	require.Len(t, p.q.sends, 2, "one post per Write")
	require.False(t, wire.HeaderOf(s[2].Imm).Wants, "a large Write's")
	_, err = p.c.Write([]byte("y"))
	require.NoError(t, err)
	s = p.sent()
	require.Len(t, s, 1, "the peer was not told: not held")
	require.True(t, wire.HeaderOf(s[0].Imm).Wants, "a small Write, four unconsumed before it: hold may hold")
	_, err = p.c.Write([]byte("z"))
	require.NoError(t, err)
	require.Empty(t, p.sent())
	require.Equal(t, 1, p.c.tx.pendLen, "five messages unconsumed at the peer, which was told: the Write is held")

	p.deliver(wire.Header{Type: wire.MsgData, Credits: 5}, []byte("world"))
	s = p.sent()
	require.Len(t, s, 1, "the peer consumed everything: the held buffer goes")
	require.Equal(t, uint32(1), s[0].Len)
	require.Equal(t, 7, p.c.cr.credits)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("!"))
	n, err = p.c.Read(nil)
	require.Zero(t, n)
	require.NoError(t, err)
	b := make([]byte, 64)
	n, err = p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "world!", string(b[:n]), "a Read takes as many messages as fit")
}

// TestConnPostAside: where the device says so (siw), the poller steps
// aside while a connection posts, as it does for a spin, and comes back
// once the post returns; elsewhere a post leaves it alone.
func TestConnPostAside(t *testing.T) {
	for _, aside := range []bool{false, true} {
		p := newFakeConn(t, 8, 1024)
		sp := &fakeSpinner{}
		p.c.mu.Lock()
		p.c.w.sp, p.c.w.postAside = sp, aside
		p.c.postHeld = false // siw, where postAside is set, posts in the kernel
		p.c.mu.Unlock()
		during := int32(-1)
		p.q.onSend = func() { during = sp.starts.Load() - sp.ends.Load() }
		_, err := p.c.Write([]byte("hello"))
		require.NoError(t, err)
		require.Len(t, p.sent(), 1)
		want := int32(0)
		if aside {
			want = 1
		}
		require.Equal(t, want, during, "spinners counted during the post (aside %v)", aside)
		require.Equal(t, sp.starts.Load(), sp.ends.Load(), "balanced once the post returned")
		require.Zero(t, sp.polls.Load(), "a poster polls nothing itself")
	}
}

// TestConnPostHeld: where a post is a system call (rxe, siw) the lock is
// dropped around it, so that completions and the other direction go on;
// elsewhere (a NIC's doorbell) it is held, which saves taking it again.
func TestConnPostHeld(t *testing.T) {
	for _, held := range []bool{false, true} {
		p := newFakeConn(t, 8, 1024)
		p.c.mu.Lock()
		p.c.postHeld = held
		p.c.mu.Unlock()
		locked := false
		p.q.onSend = func() {
			if locked = !p.c.mu.TryLock(); !locked {
				p.c.mu.Unlock()
			}
		}
		_, err := p.c.Write([]byte("hello"))
		require.NoError(t, err)
		require.Len(t, p.sent(), 1)
		require.Equal(t, held, locked, "the lock held during the post (postHeld %v)", held)
	}
}

func requireNetOpError(t *testing.T, err error, op string) {
	t.Helper()
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, op, oe.Op)
	require.Equal(t, "rdma", oe.Net)
}

func TestConnZeroAndNil(t *testing.T) {
	for _, c := range []*Conn{nil, {}} {
		_, err := c.Read(nil)
		require.ErrorIs(t, err, syscall.EINVAL)
		_, err = c.Write(nil)
		require.ErrorIs(t, err, syscall.EINVAL)
		require.ErrorIs(t, c.Close(), syscall.EINVAL)
		require.ErrorIs(t, c.CloseRead(), syscall.EINVAL)
		require.ErrorIs(t, c.CloseWrite(), syscall.EINVAL)
		require.ErrorIs(t, c.SetNoDelay(true), syscall.EINVAL)
		require.ErrorIs(t, c.SetDeadline(time.Time{}), syscall.EINVAL)
		require.ErrorIs(t, c.SetReadDeadline(time.Time{}), syscall.EINVAL)
		require.ErrorIs(t, c.SetWriteDeadline(time.Time{}), syscall.EINVAL)
		require.Nil(t, c.LocalAddr())
		require.Nil(t, c.RemoteAddr())
	}
	for _, l := range []*Listener{nil, {}} {
		_, err := l.Accept()
		require.ErrorIs(t, err, syscall.EINVAL)
		require.ErrorIs(t, l.Close(), syscall.EINVAL)
		require.Nil(t, l.Addr())
	}
}

func newHeadersConn(t *testing.T, depth, bufSize int) *fakePeer {
	return newFakeConnMode(t, Options{BufferSize: bufSize, SendDepth: depth, RecvDepth: depth, Poll: PollEvent}, false, true)
}

func TestConnHeadersWriteRead(t *testing.T) {
	p := newHeadersConn(t, 8, 1024)
	slots := p.lay.hdrs
	slotAddr := func(i int) uint64 { return testBase + uint64(p.lay.hdrOff()+i*ibv.HeaderSlot) }
	for i, wr := range p.q.recvs {
		require.Equal(t, ibv.RecvWR{ID: uint64(i), Addr: slotAddr(i), Len: ibv.HeaderSlot, LKey: testLKey}, wr,
			"receive %d takes its header into slot %d", i, i)
	}

	// A data message: its payload by RDMA WRITE, then its header by SEND.
	n, err := p.c.Write([]byte("hello"))
	require.NoError(t, err)
	require.Equal(t, 5, n)
	s := p.sent()
	require.Len(t, s, 2)
	write, hdr := s[0], s[1]
	require.Equal(t, int32(ibv.SendWrite), write.Flags&^ibv.SendInline, "an unsignaled, plain RDMA WRITE")
	require.Equal(t, "hello", p.payload(write))
	require.Equal(t, uint64(testRAddr), write.RemoteAddr)
	require.Equal(t, uint32(testRKey), write.RKey)
	require.Equal(t, int32(ibv.SendHeader), hdr.Flags&^ibv.SendSignaled, "the header as a SEND")
	require.Equal(t, uint32(5), hdr.Len, "the header's SEND carries the payload's length")
	require.Equal(t, wire.Header{Type: wire.MsgData}, wire.HeaderOf(hdr.Imm))
	require.Equal(t, write.ID, hdr.ID)

	// The peer's messages, through more receives than there are slots: the
	// reposted receives take the slots round again, in order.
	buf := make([]byte, 16)
	credits := 8  // the peer sends only what our reports allow
	ctrlSeen := 0 // and acknowledges our credit messages
	for i := range 3 * slots {
		require.Positive(t, credits, "message %d: our Reads returned no credits", i)
		credits--
		p.deliver(wire.Header{Type: wire.MsgData, CtrlAck: uint8(ctrlSeen)}, []byte{'a' + byte(i%26), 'z'})
		ctrlSeen = 0
		n, err := p.c.Read(buf)
		require.NoError(t, err)
		require.Equal(t, []byte{'a' + byte(i%26), 'z'}, buf[:n])
		p.ack()
		// The credits our Reads freed go back as header SENDs too.
		for _, wr := range p.sent() {
			if wr.Flags&ibv.SendWrite == 0 {
				require.NotZero(t, wr.Flags&ibv.SendHeader, "every message is a header SEND: %+v", wr)
				require.Zero(t, wr.Len, "a control message announces no payload")
				credits += int(wire.HeaderOf(wr.Imm).Credits)
				ctrlSeen++
			}
		}
	}
	for i, wr := range p.q.recvs {
		require.Equal(t, uint64(i%slots), wr.ID)
		require.Equal(t, slotAddr(i%slots), wr.Addr)
	}

	// The fin ends the stream; our Close sends ours as a header SEND.
	p.deliver(wire.Header{Type: wire.MsgFin}, nil)
	_, err = p.c.Read(buf)
	require.Equal(t, io.EOF, err)
	p.c.mu.Lock()
	p.c.queueSend(wire.MsgFin, 0)
	p.c.mu.Unlock()
	p.c.lockAndFlush()
	s = p.sent()
	require.NotEmpty(t, s)
	last := s[len(s)-1]
	require.Equal(t, wire.MsgFin, int(wire.HeaderOf(last.Imm).Type))
	require.NotZero(t, last.Flags&ibv.SendHeader)
}
