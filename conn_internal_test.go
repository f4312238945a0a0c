package rdma

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The data path of a Conn over a fake QP: the test plays the peer and the
// poller, delivering completions the way the device would.

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

func TestConnCreditsAtZeroGather(t *testing.T) {
	p := newFakeConn(t, 2, 1024)
	p.c.SetNoDelay(true)
	for _, w := range []string{"a", "b"} {
		_, err := p.c.Write([]byte(w))
		require.NoError(t, err)
	}
	require.Len(t, p.sent(), 2)
	require.Zero(t, p.c.cr.credits)
	p.ack() // the send buffers are free again, the peer's receives are not

	// No credit: Writes gather in the pending buffer and return at once.
	for _, w := range []string{"c", "d", "e"} {
		_, err := p.c.Write([]byte(w))
		require.NoError(t, err)
	}
	require.Empty(t, p.sent())
	require.Equal(t, 3, p.c.tx.pendLen)

	// The credit that comes back sends them as one message.
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	s := p.sent()
	require.Len(t, s, 1)
	require.Equal(t, "cde", p.payload(s[0]))
	require.Zero(t, p.c.tx.pendLen)
}

func TestConnHoldReleasedByReturningCredits(t *testing.T) {
	p := newFakeConn(t, 8, 1024) // holdAt 2
	for _, w := range []string{"1", "2", "3", "4"} {
		_, err := p.c.Write([]byte(w))
		require.NoError(t, err)
	}
	require.Len(t, p.sent(), 2, "two unconsumed at the peer: the rest gather")
	require.Equal(t, 2, p.c.tx.pendLen)

	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	require.Empty(t, p.sent(), "one consumed: still streaming")
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	s := p.sent()
	require.Len(t, s, 1, "all consumed: the held buffer goes")
	require.Equal(t, "34", p.payload(s[0]))
	require.Equal(t, wire.Header{Type: wire.MsgData, CtrlAck: 2}, wire.HeaderOf(s[0].Imm), "it acknowledges the two credit messages")

	// SetNoDelay sends a held buffer at once.
	for _, w := range []string{"5", "6"} {
		p.c.Write([]byte(w))
	}
	require.Len(t, p.sent(), 1)
	require.NoError(t, p.c.SetNoDelay(true))
	require.Len(t, p.sent(), 1)
}

func TestConnReturnsCreditsInBatches(t *testing.T) {
	p := newFakeConn(t, 8, 64) // batch 2
	for range 3 {
		p.deliver(wire.Header{Type: wire.MsgData}, []byte("m"))
	}
	b := make([]byte, 1)
	p.c.Read(b)
	require.Empty(t, p.sent(), "less than a batch consumed: nothing to report yet")
	p.c.Read(b)
	s := p.sent()
	require.Len(t, s, 1)
	require.Equal(t, wire.Header{Type: wire.MsgCredit, Credits: 2}, wire.HeaderOf(s[0].Imm))
	require.Len(t, p.q.recvs, p.lay.recvSlots+2, "the consumed buffers were posted again")
}

// A reader that has consumed everything and waits for more returns its
// credits in a message of their own only when the peer's latest header
// wants them: a reader goroutine parked beside request/response traffic
// sends nothing, and the credits ride on the next reply.
func TestConnWaitingReaderReturnsCreditsWhenWanted(t *testing.T) {
	p := newFakeConn(t, 8, 64) // batch 2
	b := make([]byte, 8)
	readInBackground := func() chan string {
		got := make(chan string, 1)
		go func() {
			n, err := p.c.Read(b)
			assert.NoError(t, err)
			got <- string(b[:n])
		}()
		time.Sleep(20 * time.Millisecond) // it waits for data by now
		return got
	}

	p.deliver(wire.Header{Type: wire.MsgData}, []byte("req1"))
	_, err := p.c.Read(b)
	require.NoError(t, err)
	got := readInBackground()
	require.Empty(t, p.sent(), "the peer wants no credits: none go on their own")
	_, err = p.c.Write([]byte("reply"))
	require.NoError(t, err)
	s := p.sent()
	require.Len(t, s, 1)
	require.Equal(t, wire.Header{Type: wire.MsgData, Credits: 1}, wire.HeaderOf(s[0].Imm), "the reply carries the credit")

	p.deliver(wire.Header{Type: wire.MsgData, Wants: true}, []byte("req2"))
	require.Equal(t, "req2", <-got)
	got = readInBackground()
	s = p.sent()
	require.Len(t, s, 1, "the peer may be waiting for the credit: it goes before the reader waits")
	require.Equal(t, wire.Header{Type: wire.MsgCredit, Credits: 1}, wire.HeaderOf(s[0].Imm))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("req3"))
	require.Equal(t, "req3", <-got)
}

func TestConnPastReadDeadlineReturnsCredits(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("m"))
	b := make([]byte, 8)
	_, err := p.c.Read(b)
	require.NoError(t, err)
	require.Empty(t, p.sent())

	require.NoError(t, p.c.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err = p.c.Read(b)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	s := p.sent()
	require.Len(t, s, 1, "a reader polling with a past deadline still gives its credits back")
	require.Equal(t, wire.Header{Type: wire.MsgCredit, Credits: 1}, wire.HeaderOf(s[0].Imm))
}

func TestConnCloseReadDiscardsAndReturnsCredits(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("a"))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("b"))
	posted := len(p.q.recvs)
	require.NoError(t, p.c.CloseRead())
	require.Len(t, p.q.recvs, posted+2)
	s := p.sent()
	require.Len(t, s, 1)
	require.Equal(t, wire.Header{Type: wire.MsgCredit, Credits: 2}, wire.HeaderOf(s[0].Imm))
	_, err := p.c.Read(make([]byte, 8))
	require.Equal(t, io.EOF, err)

	// Later data is discarded and its buffers go back too.
	p.ack()
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("c"))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("d"))
	require.Zero(t, p.c.rx.n)
	require.Len(t, p.sent(), 1)

	_, err = p.c.Write([]byte("still writing"))
	require.NoError(t, err)
}

func TestConnFinThenEOF(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("last"))
	p.deliver(wire.Header{Type: wire.MsgFin}, nil)
	b := make([]byte, 64)
	n, err := p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "last", string(b[:n]))
	_, err = p.c.Read(b)
	require.Equal(t, io.EOF, err, "io.EOF is returned bare")
	_, err = p.c.Read(b)
	require.Equal(t, io.EOF, err)
}

func TestConnCloseWrite(t *testing.T) {
	p := newFakeConn(t, 2, 64)
	p.c.SetNoDelay(true)
	p.c.Write([]byte("x"))
	p.c.Write([]byte("y"))
	p.ack()
	p.c.Write([]byte("pending"))
	require.Equal(t, 7, p.c.tx.pendLen)
	require.NoError(t, p.c.CloseWrite())
	require.Len(t, p.sent(), 2, "the fin waits behind the pending data")
	_, err := p.c.Write([]byte("z"))
	require.ErrorIs(t, err, syscall.EPIPE)
	requireNetOpError(t, err, "write")

	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	s := p.sent()
	require.Len(t, s, 2)
	require.Equal(t, "pending", p.payload(s[0]))
	require.Equal(t, uint8(wire.MsgFin), wire.HeaderOf(s[1].Imm).Type)
	require.NotZero(t, s[1].Flags&ibv.SendSignaled)
	require.NoError(t, p.c.CloseWrite(), "a second CloseWrite is a no-op")
}

func requireNetOpError(t *testing.T, err error, op string) {
	t.Helper()
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, op, oe.Op)
	require.Equal(t, "rdma", oe.Net)
}

func TestConnProtocolViolations(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(p *fakePeer)
		want string
	}{
		{"unknown message type", func(p *fakePeer) { p.deliver(wire.Header{Type: 9}, nil) }, "unknown message type"},
		{"more credits than sent", func(p *fakePeer) { p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil) }, "more credits"},
		{"empty data message", func(p *fakePeer) { p.deliver(wire.Header{Type: wire.MsgData}, nil) }, "empty data message"},
		{"more data messages than granted", func(p *fakePeer) {
			for range 5 { // 4 granted
				p.deliver(wire.Header{Type: wire.MsgData}, []byte("x"))
			}
		}, "a data message beyond those granted"},
		{"more credit messages than granted", func(p *fakePeer) {
			for range wire.CtrlDepth + 1 {
				p.deliver(wire.Header{Type: wire.MsgCredit}, nil)
			}
		}, "a credit message beyond those granted"},
		{"data after the fin", func(p *fakePeer) {
			p.deliver(wire.Header{Type: wire.MsgFin}, nil)
			p.deliver(wire.Header{Type: wire.MsgData}, []byte("x"))
		}, "after the fin"},
		{"no header", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: p.q.recvs[0].ID, ByteLen: 1})
		}, "without immediate data"},
		{"unknown buffer", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: 999, ByteLen: 1, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgData}.Imm()})
		}, "without immediate data"},
		{"more messages than receives", func(p *fakePeer) {
			for range p.lay.recvSlots {
				p.deliver(wire.Header{Type: wire.MsgData}, []byte("x"))
			}
			p.c.rx.push(rxMsg{n: 1}) // unreachable through deliver: every receive is used
			p.complete(ibv.WC{WRID: recvWRID, Opcode: ibv.WCOpRecvWriteImm, ByteLen: 1, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgData}.Imm()})
		}, "overran its credits"},
		{"data as a SEND", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: recvWRID, Opcode: ibv.WCOpRecv, ByteLen: 1, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgData}.Imm()})
		}, "not an RDMA WRITE"},
		{"credit with payload", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: recvWRID, Opcode: ibv.WCOpRecv, ByteLen: 1, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgCredit}.Imm()})
		}, "control message with payload"},
		{"fin as a write", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: recvWRID, Opcode: ibv.WCOpRecvWriteImm, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgFin}.Imm()})
		}, "not a SEND"},
		{"message larger than agreed", func(p *fakePeer) {
			p.deliver(wire.Header{Type: wire.MsgData}, make([]byte, 65))
		}, "larger than the largest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakeConn(t, 4, 64)
			tc.send(p)
			_, werr := p.c.Write([]byte("x"))
			require.ErrorIs(t, werr, ErrProtocol)
			require.ErrorContains(t, werr, tc.want)
			// Queued data is still read first; then the error (or, after
			// the fin, which ended the stream cleanly, io.EOF).
			var rerr error
			for rerr == nil {
				_, rerr = p.c.Read(make([]byte, 1024))
			}
			if tc.name == "data after the fin" {
				require.Equal(t, io.EOF, rerr)
				return
			}
			require.ErrorIs(t, rerr, ErrProtocol)
			requireNetOpError(t, rerr, "read")
		})
	}
}

func TestConnFailedCompletions(t *testing.T) {
	const remoteOpErr = 11 // IBV_WC_REM_OP_ERR
	p := newFakeConn(t, 4, 64)
	p.complete(ibv.WC{WRID: p.q.recvs[0].ID, Status: remoteOpErr})
	_, err := p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.ErrorContains(t, err, "work request failed")
	require.NotContains(t, err.Error(), "ibv_poll_cq", "no verb failed: the completion did")

	p = newFakeConn(t, 4, 64)
	p.c.Write([]byte("x"))
	p.complete(ibv.WC{WRID: p.q.posted()[0].ID, Status: remoteOpErr})
	_, err = p.c.Write([]byte("y"))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ECONNRESET, "a broken connection fails Reads too")

	// The NIC's retries ran out (the peer host vanished): a timeout, as
	// TCP's when its retransmissions go unanswered, for both directions.
	p = newFakeConn(t, 4, 64)
	p.c.Write([]byte("x"))
	p.complete(ibv.WC{WRID: p.q.posted()[0].ID, Status: ibv.WCRetryExcErr})
	_, err = p.c.Write([]byte("y"))
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ETIMEDOUT)

	// A flushed receive (the QP went to error) reads as a reset.
	p = newFakeConn(t, 4, 64)
	p.complete(ibv.WC{WRID: p.q.recvs[0].ID, Status: ibv.WCFlushErr})
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.Equal(t, "connection reset by peer", errors.Unwrap(err).Error())
}

func TestConnFailedPost(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	fail := os.NewSyscallError("ibv_post_send", syscall.EIO)
	p.q.sendErr = fail
	_, err := p.c.Write([]byte("x"))
	require.NoError(t, err, "the Write was accepted before the post failed")
	_, err = p.c.Write([]byte("y"))
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorContains(t, err, "ibv_post_send")
	// The QP cannot be trusted any more: the whole connection fails, a
	// Read too, rather than waiting for data that may have been lost.
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorContains(t, err, "ibv_post_send")

	// So does a failed post of receives.
	p = newFakeConn(t, 4, 64)
	p.q.mu.Lock()
	p.q.recvErr = os.NewSyscallError("ibv_post_recv", syscall.ENOMEM)
	p.q.mu.Unlock()
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("abc"))
	got := make([]byte, 8)
	n, err := p.c.Read(got)
	require.NoError(t, err, "what arrived is read")
	require.Equal(t, "abc", string(got[:n]))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("def"))
	for err == nil {
		_, err = p.c.Read(got)
	}
	require.ErrorIs(t, err, syscall.ENOMEM)
	_, err = p.c.Write([]byte("x"))
	require.ErrorIs(t, err, syscall.ENOMEM, "the writes fail too")

	// A QP that has left RTS refuses the post (siw): the connection
	// closed under it, which reads as a reset, not as the verb's errno.
	p = newFakeConn(t, 4, 64)
	p.q.sendErr = os.NewSyscallError("ibv_post_send", syscall.ENOTCONN)
	_, err = p.c.Write([]byte("x"))
	require.NoError(t, err)
	_, err = p.c.Write([]byte("y"))
	require.ErrorIs(t, err, syscall.ECONNRESET)
}

func TestConnDrainWaitsForPostInFlight(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	entered, release := make(chan struct{}), make(chan struct{})
	p.q.onSend = func() {
		p.q.onSend = nil
		close(entered)
		<-release
	}
	go p.c.Write([]byte("x")) // posts without the lock, and blocks in the post
	<-entered

	drained := make(chan struct{})
	go func() {
		p.c.mu.Lock()
		p.c.life.phase = phaseDead
		p.c.drainDroppingLock()
		p.c.mu.Unlock()
		close(drained)
	}()
	time.Sleep(10 * time.Millisecond)
	p.c.mu.Lock()
	require.False(t, p.c.tx.draining, "the teardown waits for the post in flight")
	p.c.mu.Unlock()

	close(release)
	p.eventually(func(c *Conn) bool { return c.tx.draining })

	// Nothing more is posted; the marker retires what was; the flushed
	// receives come back.
	p.c.SetNoDelay(true)
	all := p.q.posted()
	marker := all[len(all)-1]
	require.Equal(t, p.c.tx.marker(), marker)
	p.complete(ibv.WC{WRID: marker.ID, Status: ibv.WCFlushErr})
	for _, wr := range p.q.recvs {
		p.complete(ibv.WC{WRID: wr.ID, Status: ibv.WCFlushErr})
	}
	select {
	case <-drained:
	case <-time.After(drainTimeout / 2):
		t.Fatal("the drain did not end when everything completed")
	}
	require.Len(t, p.q.posted(), len(all), "nothing was posted after the marker")
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

func TestConnLingerWaitsForTheFin(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	p.c.Write([]byte("bye"))
	done := make(chan error, 1)
	go func() {
		p.c.mu.Lock()
		defer p.c.mu.Unlock()
		done <- p.c.lingerDroppingLock()
	}()
	// The fin goes out behind the data; the linger ends when the peer's
	// NIC acknowledges it.
	p.eventually(func(c *Conn) bool { return c.tx.ctrlSeq == 1 })
	select {
	case <-done:
		t.Fatal("the linger ended before the fin was acknowledged")
	case <-time.After(10 * time.Millisecond):
	}
	s := p.q.posted()
	require.Equal(t, uint8(wire.MsgFin), wire.HeaderOf(s[len(s)-1].Imm).Type)
	p.c.mu.Lock()
	p.c.life.phase = phaseDead // completions now signal drained, as in the teardown
	p.c.mu.Unlock()
	p.ack()
	select {
	case err := <-done:
		require.NoError(t, err, "everything was delivered")
	case <-time.After(lingerTimeout / 2):
		t.Fatal("the acknowledged fin did not end the linger")
	}
}

func TestConnCloseOnceThenErrClosed(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	p.c.mu.Lock()
	p.c.life.set(shutClosed) // what Close does first; its teardown needs the verbs
	p.c.mu.Unlock()
	for _, err := range []error{p.c.CloseRead(), p.c.CloseWrite(), p.c.SetNoDelay(true), p.c.SetDeadline(time.Now())} {
		require.ErrorIs(t, err, net.ErrClosed)
	}
	_, err := p.c.Read(make([]byte, 1))
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = p.c.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

// A Write waits for ring room as it waits for credits: the peer holds
// bytes it has not read, and credits alone (eight here) do not let the
// writer overwrite them.
func TestConnWriteWaitsForRingRoom(t *testing.T) {
	p := newFakeConn(t, 8, 1024) // a ring of 4096 bytes: four largest messages
	p.c.SetNoDelay(true)
	big := bytes.Repeat([]byte("r"), 5*1024)
	done := make(chan error, 1)
	go func() {
		_, err := p.c.Write(big)
		done <- err
	}()
	p.eventually(func(c *Conn) bool { return c.tx.dataSeq == 4 })
	select {
	case err := <-done:
		t.Fatalf("the Write overran the peer's ring: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	s := p.sent()
	require.Len(t, s, 4)
	for i, wr := range s {
		require.Equal(t, uint64(testRAddr+i*1024), wr.RemoteAddr)
		require.Equal(t, wr.Addr-testBase-uint64(p.lay.sendOff()), wr.RemoteAddr-testRAddr, "the send ring mirrors the peer's")
	}
	p.c.mu.Lock()
	require.Equal(t, 4, p.c.cr.credits, "credits were there; ring room was not")
	require.Equal(t, uint64(4096), p.c.tx.ring.tail)
	p.c.mu.Unlock()

	p.ack()
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil) // the first message was read
	require.NoError(t, <-done)
	s = p.sent()
	require.Len(t, s, 1)
	require.Equal(t, uint64(testRAddr), s[0].RemoteAddr, "the fifth goes where the first was")
	require.Equal(t, strings.Repeat("r", 1024), p.payload(s[0]))
}

// A peer that writes over bytes not yet read breaks the protocol, however
// many credits it had.
func TestConnRingOverrun(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	for range 4 {
		p.deliver(wire.Header{Type: wire.MsgData}, bytes.Repeat([]byte("o"), 1024))
	}
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("over the first"))
	_, err := p.c.Write([]byte("x"))
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "overran the receive ring")
	b := make([]byte, 8192)
	n, err := p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, 4096, n, "what came before the overrun is read first")
	_, err = p.c.Read(b)
	require.ErrorIs(t, err, ErrProtocol)
}

// A dialer may get data before it has read the listener's hello (the
// listener writes once established): it is handled, in order, when the
// geometry is known.
func TestConnMessagesBeforeOpen(t *testing.T) {
	opts := Options{BufferSize: 1024, SendDepth: 4, RecvDepth: 4, Poll: PollEvent}
	lay := newLayout(opts)
	c := newConn(phaseEstablished)
	q := &fakeQP{}
	c.mu.Lock()
	require.NoError(t, c.initDataPath(q, make([]byte, lay.size()), lay, testBase+uint64(lay.sendOff()), testLKey, 0, opts, nopSpinner{}))
	c.mu.Unlock()
	copy(c.mem, "early")
	c.complete(ibv.WC{WRID: recvWRID, Opcode: ibv.WCOpRecvWriteImm, ByteLen: 5, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgData}.Imm()})
	c.complete(ibv.WC{WRID: recvWRID, Opcode: ibv.WCOpRecv, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgFin}.Imm()})
	c.mu.Lock()
	require.Zero(t, c.rx.n, "nothing is placed before the geometry is known")
	c.open(wire.Hello{RecvDepth: 4, CtrlDepth: wire.CtrlDepth, BufSize: 1024, RingSize: uint32(lay.ring), RingAddr: testRAddr, RKey: testRKey}, lay)
	c.mu.Unlock()
	b := make([]byte, 16)
	n, err := c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "early", string(b[:n]))
	_, err = c.Read(b)
	require.Equal(t, io.EOF, err, "the fin came after the data, and is read after it")
}

// Credits go back once half the ring has been read, even short of a batch
// of messages: the writer's next large message needs the room.
func TestConnReturnsCreditsAtHalfRing(t *testing.T) {
	p := newFakeConn(t, 16, 1024) // batch 4; a ring of 4096 bytes
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("small"))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("small"))
	b := make([]byte, 4096)
	_, err := p.c.Read(b)
	require.NoError(t, err)
	require.Empty(t, p.sent(), "two small messages read: less than a batch, a fraction of the ring")

	p.deliver(wire.Header{Type: wire.MsgData}, bytes.Repeat([]byte("L"), 1024))
	p.deliver(wire.Header{Type: wire.MsgData}, bytes.Repeat([]byte("L"), 1024))
	n, err := p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, 2048, n)
	s := p.sent()
	require.Len(t, s, 1, "half the ring read: its credits go back at once")
	require.Equal(t, wire.Header{Type: wire.MsgCredit, Credits: 4}, wire.HeaderOf(s[0].Imm))
}

// A failed receive (a peer's SEND with payload, a refused RDMA access)
// breaks the QP: a Write waiting for credit fails at once with the cause,
// not when the CM gives up on a disconnect the peer never answers.
func TestConnFailedReceiveWakesWriter(t *testing.T) {
	const remoteOpErr = 11 // IBV_WC_REM_OP_ERR
	p := newFakeConn(t, 1, 64)
	require.NoError(t, p.c.SetNoDelay(true))
	_, err := p.c.Write([]byte("x")) // spends the only credit
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := p.c.Write(bytes.Repeat([]byte("y"), 1000)) // more than one pending message
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the Write returned before the peer answered: %v", err)
	default:
	}
	p.complete(ibv.WC{WRID: p.q.recvs[0].ID, Status: remoteOpErr})
	select {
	case err := <-done:
		require.ErrorIs(t, err, syscall.ECONNRESET)
		require.ErrorContains(t, err, "work request failed")
	case <-time.After(10 * time.Second):
		t.Fatal("a Write waiting for credit did not see the failed receive")
	}
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorContains(t, err, "work request failed")
	// Close does not linger for a fin that cannot go.
	p.c.mu.Lock()
	require.Error(t, p.c.sendFinDroppingLock())
	p.c.mu.Unlock()
}

// CloseRead while a Read holds a message: what arrives meanwhile is queued,
// not discarded past the message the reader holds, so the ring's read
// position never moves backwards and the peer, writing as its credits
// allow, never overruns the ring.
func TestConnCloseReadDuringRead(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, bytes.Repeat([]byte("a"), 64))
	hold := make(chan struct{})
	held := make(chan struct{})
	w := writerFunc(func(b []byte) (int, error) {
		close(held)
		<-hold
		return len(b), nil
	})
	copied := make(chan error, 1)
	go func() {
		_, err := p.c.WriteTo(w)
		copied <- err
	}()
	<-held
	closed := make(chan error, 1)
	go func() { closed <- p.c.CloseRead() }()
	p.eventually(func(c *Conn) bool { return c.life.has(shutRead) })
	read := p.c.rx.read
	// The peer writes on while the reader holds its message.
	p.deliver(wire.Header{Type: wire.MsgData}, bytes.Repeat([]byte("b"), 64))
	p.deliver(wire.Header{Type: wire.MsgData}, bytes.Repeat([]byte("c"), 64))
	p.c.mu.Lock()
	require.Equal(t, read, p.c.rx.read, "no ring byte past the held message is freed")
	p.c.mu.Unlock()
	close(hold)
	require.NoError(t, <-copied)
	require.NoError(t, <-closed)
	p.c.mu.Lock()
	require.Equal(t, p.c.rx.tail, p.c.rx.read, "CloseRead freed everything, in order")
	require.Nil(t, p.c.life.rerr)
	p.c.mu.Unlock()
	// The peer fills the ring again, as the credits it got back allow:
	// no overrun.
	for range 4 {
		p.deliver(wire.Header{Type: wire.MsgData}, bytes.Repeat([]byte("d"), 64))
	}
	p.c.mu.Lock()
	require.Nil(t, p.c.life.rerr, "the peer's later messages are taken")
	p.c.mu.Unlock()
	_, err := p.c.Write([]byte("still writing"))
	require.NoError(t, err)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// Reposting consumed receives fails (the QP broke): Reads fail with it
// once nothing is queued; after the peer is gone nothing is reposted.
func TestConnRepostFails(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	p.q.mu.Lock()
	p.q.recvErr = os.NewSyscallError("ibv_post_recv", syscall.EIO)
	p.q.mu.Unlock()
	for range 4 {
		p.deliver(wire.Header{Type: wire.MsgData}, []byte("x"))
	}
	b := make([]byte, 8)
	for {
		_, err := p.c.Read(b)
		if err != nil {
			require.ErrorIs(t, err, syscall.EIO)
			require.ErrorContains(t, err, "ibv_post_recv")
			break
		}
	}

	p = newFakeConn(t, 4, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("x"))
	posted := len(p.q.recvs)
	p.c.mu.Lock()
	p.c.life.set(shutPeerGone)
	p.c.mu.Unlock()
	_, err := p.c.Read(b)
	require.NoError(t, err)
	p.c.mu.Lock()
	p.c.returnCredits(true)
	p.c.mu.Unlock()
	require.Len(t, p.q.recvs, posted, "nothing reposted for a peer that is gone")
}

// WriteTo hands its Writer bytes of its own, never the receive ring: the
// peer may rewrite its ring at any moment (an RDMA WRITE needs no credit
// and completes nothing here), and a Writer that reads its argument twice
// (io.MultiWriter(file, hash)) would then store bytes other than those it
// hashed. The Writer here checks where its argument is, and reads it
// again after the peer rewrote the ring under it.
func TestConnWriteToOwnsItsBytes(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	arena := p.c.mem
	ring := p.c.mem[p.lay.recvOff() : p.lay.recvOff()+p.lay.ring]
	for _, msg := range []string{"first message", "second one"} {
		p.deliver(wire.Header{Type: wire.MsgData}, []byte(msg))
		var got string
		w := writerFunc(func(b []byte) (int, error) {
			start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			lo := uintptr(unsafe.Pointer(unsafe.SliceData(arena)))
			require.False(t, start >= lo && start < lo+uintptr(len(arena)), "the Writer got the connection's registered memory")
			got = string(b)
			// The peer writes into its ring meanwhile.
			for i := range ring {
				ring[i] = 'X'
			}
			require.Equal(t, got, string(b), "the Writer's argument changed under it")
			return len(b), errBenchStop
		})
		n, err := p.c.WriteTo(w)
		require.ErrorIs(t, err, errBenchStop)
		require.Equal(t, int64(len(msg)), n)
		require.Equal(t, msg, got)
	}
}

// WriteTo's Writer that takes less than a message, or claims more than it
// was given: the rest of the message stays for the next call, and the
// error is io.ErrShortWrite or the invalid count's.
func TestConnWriteToShortAndInvalid(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("abcdef"))
	_, err := p.c.WriteTo(writerFunc(func(b []byte) (int, error) { return 2, nil }))
	require.ErrorIs(t, err, io.ErrShortWrite)
	_, err = p.c.WriteTo(writerFunc(func(b []byte) (int, error) { return len(b) + 1, nil }))
	require.ErrorIs(t, err, errInvalidWrite)
	b := make([]byte, 8)
	n, err := p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "cdef", string(b[:n]), "what the Writer did not take")
	require.NoError(t, p.c.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err = p.c.WriteTo(writerFunc(func(b []byte) (int, error) { return len(b), nil }))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// TestInFlight: Wait returns once every Add is retired, and an Add from
// zero while another goroutine waits is allowed (a sync.WaitGroup's
// misuse, which the race detector reports).
func TestInFlight(t *testing.T) {
	var f inFlight
	f.Wait() // nothing in flight
	f.Add(1)
	waited := make(chan struct{})
	go func() {
		f.Wait()
		close(waited)
	}()
	f.Add(1)
	f.Done()
	select {
	case <-waited:
		t.Fatal("Wait returned with one still in flight")
	case <-time.After(20 * time.Millisecond):
	}
	f.Done()
	<-waited
}
