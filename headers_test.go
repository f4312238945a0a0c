package rdma

import (
	"bytes"
	"io"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The data path on a transport without immediate data (iWARP): headers
// travel as the payload of SENDs into header slots (layout.withHeaders),
// over the fake QP.

func TestLayoutWithHeaders(t *testing.T) {
	o := Options{BufferSize: 4096, RecvDepth: 16, SendDepth: 16}
	l := newLayout(o)
	h := l.withHeaders()
	require.False(t, l.headers())
	require.True(t, h.headers())
	require.Equal(t, l.recvSlots, h.hdrs, "a slot per receive")
	require.Equal(t, l.size()+page, h.size(), "the slots take whole pages after the send ring")
	require.Equal(t, 2*l.ring, h.hdrOff())
	require.LessOrEqual(t, h.hdrs*ibv.HeaderSlot, h.size()-h.hdrOff())
	// A data message is an RDMA WRITE and a SEND: the send queue and the
	// CQ hold a second work request for each.
	require.Equal(t, l.sendQueue()+o.SendDepth, h.sendQueue())
	require.Equal(t, l.cqEntries()+o.SendDepth, h.cqEntries())
}

func TestHelloSendable(t *testing.T) {
	require.NoError(t, sendable(wire.Hello{}, false), "immediate data to a peer that wants it")
	require.NoError(t, sendable(wire.Hello{Flags: wire.HelloHeaders}, false), "any transport sends SENDs")
	require.NoError(t, sendable(wire.Hello{Flags: wire.HelloHeaders}, true))
	err := sendable(wire.Hello{}, true)
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "immediate data")
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

func TestConnHeadersFragments(t *testing.T) {
	p := newFakeConnMode(t, Options{BufferSize: 64, SendDepth: 8, RecvDepth: 8, Poll: PollEvent, Messages: true}, true, true)
	big := make([]byte, 150)
	for i := range big {
		big[i] = byte(i)
	}
	_, err := p.c.Write(big)
	require.NoError(t, err)
	s := p.sent()
	require.Len(t, s, 6, "three messages of a WRITE and a SEND each")
	var got []byte
	for i := 0; i < len(s); i += 2 {
		got = append(got, p.payload(s[i])...)
		want := uint8(wire.MsgDataMore)
		if i == len(s)-2 {
			want = wire.MsgData
		}
		require.Equal(t, want, wire.HeaderOf(s[i+1].Imm).Type)
		require.Equal(t, s[i].Len, s[i+1].Len)
	}
	require.Equal(t, big, got)

	// Arriving fragments make one message for a message-oriented Read.
	p.deliver(wire.Header{Type: wire.MsgDataMore}, big[:64])
	p.deliver(wire.Header{Type: wire.MsgData}, big[64:100])
	buf := make([]byte, 200)
	n, err := p.c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, big[:100], buf[:n])
}

func TestConnHeadersProtocolViolations(t *testing.T) {
	next := func(p *fakePeer) ibv.RecvWR {
		wr, ok := p.q.recvAt(p.nextRx)
		require.True(t, ok)
		p.nextRx++
		return wr
	}
	for _, tc := range []struct {
		name string
		send func(p *fakePeer)
		want string
	}{
		{"header of the wrong length", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: next(p).ID, Opcode: ibv.WCOpRecv, ByteLen: 4})
		}, "not a SEND of a header"},
		{"header as immediate data", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: next(p).ID, Opcode: ibv.WCOpRecv, ByteLen: ibv.HeaderLen, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgCredit}.Imm()})
		}, "not a SEND of a header"},
		{"RDMA WRITE with immediate", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: next(p).ID, Opcode: ibv.WCOpRecvWriteImm, ByteLen: 1, Flags: ibv.WCWithImm, Imm: wire.Header{Type: wire.MsgData}.Imm()})
		}, "not a SEND of a header"},
		{"no header slot", func(p *fakePeer) {
			next(p)
			p.complete(ibv.WC{WRID: 999, Opcode: ibv.WCOpRecv, ByteLen: ibv.HeaderLen})
		}, "no header slot"},
		{"a header longer than its slot", func(p *fakePeer) {
			p.complete(ibv.WC{WRID: next(p).ID, Opcode: ibv.WCOpRecv, ByteLen: ibv.HeaderSlot + 1})
		}, "not a SEND of a header"},
		{"inline data of another length", func(p *fakePeer) {
			p.sendHeaderData(next(p), wire.Header{Type: wire.MsgData}.Imm(), 6, []byte("hello"))
		}, "not its data message's"},
		{"a credit with inline data", func(p *fakePeer) {
			p.sendHeaderData(next(p), wire.Header{Type: wire.MsgCredit}.Imm(), 5, []byte("hello"))
		}, "not its data message's"},
		{"inline data past the largest message", func(p *fakePeer) {
			p.sendHeaderData(next(p), wire.Header{Type: wire.MsgData}.Imm(), 72, make([]byte, 72))
		}, "larger than the largest"},
		{"credit with a length", func(p *fakePeer) { p.sendHeader(next(p), wire.Header{Type: wire.MsgCredit}.Imm(), 5) }, "control message with payload"},
		{"fin with a length", func(p *fakePeer) { p.sendHeader(next(p), wire.Header{Type: wire.MsgFin}.Imm(), 1) }, "control message with payload"},
		{"empty data message", func(p *fakePeer) { p.sendHeader(next(p), wire.Header{Type: wire.MsgData}.Imm(), 0) }, "empty data message"},
		{"data longer than agreed", func(p *fakePeer) { p.sendHeader(next(p), wire.Header{Type: wire.MsgData}.Imm(), 65) }, "larger than the largest"},
		{"data past the ring", func(p *fakePeer) { p.sendHeader(next(p), wire.Header{Type: wire.MsgData}.Imm(), 1<<31) }, "larger than the largest"},
		{"unknown message type", func(p *fakePeer) { p.deliver(wire.Header{Type: 9}, nil) }, "unknown message type"},
		{"more data messages than granted", func(p *fakePeer) {
			for range 5 { // 4 granted
				p.deliver(wire.Header{Type: wire.MsgData}, []byte("x"))
			}
		}, "a data message beyond those granted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newHeadersConn(t, 4, 64)
			tc.send(p)
			_, werr := p.c.Write([]byte("x"))
			require.ErrorIs(t, werr, ErrProtocol)
			require.ErrorContains(t, werr, tc.want)
			var rerr error
			for rerr == nil {
				_, rerr = p.c.Read(make([]byte, 1024))
			}
			require.ErrorIs(t, rerr, ErrProtocol)
			requireNetOpError(t, rerr, "read")
		})
	}
}

// TestConnHeadersInlineData: a data message small enough travels in its
// header's SEND (one work request, not two), and one that arrives that way
// is read like any other.
func TestConnHeadersInlineData(t *testing.T) {
	p := newHeadersConn(t, 8, 1024)
	p.c.mu.Lock()
	p.c.tx.maxInline = ibv.HeaderSlot // what siw grants
	p.c.mu.Unlock()

	small := bytes.Repeat([]byte("s"), ibv.HeaderData)
	_, err := p.c.Write(small)
	require.NoError(t, err)
	s := p.sent()
	require.Len(t, s, 1, "header and payload in one SEND")
	require.Equal(t, int32(ibv.SendHeader|ibv.SendHeaderData), s[0].Flags&^ibv.SendSignaled)
	require.Equal(t, uint32(len(small)), s[0].Len)
	require.Equal(t, string(small), p.payload(s[0]), "the payload the C side copies behind the header")
	require.Equal(t, wire.Header{Type: wire.MsgData}, wire.HeaderOf(s[0].Imm))

	// One byte more than fits: the RDMA WRITE and the header SEND.
	_, err = p.c.Write(append(small, 'x'))
	require.NoError(t, err)
	s = p.sent()
	require.Len(t, s, 2)
	require.NotZero(t, s[0].Flags&ibv.SendWrite)
	require.Equal(t, int32(ibv.SendHeader), s[1].Flags&^ibv.SendSignaled)

	// Arrivals both ways, in order: inline, by WRITE, inline.
	wr := func() ibv.RecvWR {
		w, ok := p.q.recvAt(p.nextRx)
		require.True(t, ok)
		p.nextRx++
		return w
	}
	place := func(n int) {
		start := wire.RingPlace(p.tail, p.c.rx.span, p.c.rx.maxMsg)
		p.tail = wire.RingEnd(start, n)
	}
	place(5)
	p.sendHeaderData(wr(), wire.Header{Type: wire.MsgData}.Imm(), 5, []byte("hello"))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte(", big "))
	place(5)
	p.sendHeaderData(wr(), wire.Header{Type: wire.MsgData}.Imm(), 5, []byte("world"))
	buf := make([]byte, 64)
	var got []byte
	for len(got) < 16 {
		n, err := p.c.Read(buf)
		require.NoError(t, err)
		got = append(got, buf[:n]...)
	}
	require.Equal(t, "hello, big world", string(got))
}

// A QP whose inline room cannot take a header fails the setup of a
// connection whose headers go as SENDs (posted inline), with an error
// that says why; where immediate data carries the headers, any inline
// room, none included, will do.
func TestCheckInline(t *testing.T) {
	o, err := Options{}.normalized()
	require.NoError(t, err)
	imm, hdrs := newLayout(o), newLayout(o).withHeaders()
	for _, n := range []int{0, 1, ibv.HeaderLen - 1, ibv.HeaderLen, 64, 256} {
		require.NoError(t, checkInline(imm, n), "immediate data, %d bytes inline", n)
		err := checkInline(hdrs, n)
		if n >= ibv.HeaderLen {
			require.NoError(t, err, "headers as SENDs, %d bytes inline", n)
			continue
		}
		require.ErrorIs(t, err, syscall.EOPNOTSUPP, "headers as SENDs, %d bytes inline", n)
		require.Contains(t, err.Error(), "inline")
	}
}
