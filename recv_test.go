package rdma

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The receive path over the fake QP: Reads, credits returned, the fin,
// protocol violations, reposts, message-oriented Reads, and WriteTo.

// recordWriter keeps what it is given and the length of each Write.
type recordWriter struct {
	buf  bytes.Buffer
	lens []int
	fail error
}

func (w *recordWriter) Write(p []byte) (int, error) {
	w.lens = append(w.lens, len(p))
	if w.fail != nil {
		return 0, w.fail
	}
	return w.buf.Write(p)
}

func TestConnWriteToHandsOverMessages(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("first"))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("second"))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("third"))
	p.deliver(wire.Header{Type: wire.MsgFin}, nil)
	posted := len(p.q.recvs)
	var w recordWriter
	n, err := p.c.WriteTo(&w)
	require.NoError(t, err, "the peer's fin ends WriteTo without an error, as io.Copy expects")
	require.Equal(t, int64(16), n)
	require.Equal(t, "firstsecondthird", w.buf.String())
	require.Equal(t, []int{5, 6, 5}, w.lens, "one Write per message, straight from the ring")
	require.Len(t, p.q.recvs, posted+2, "a batch of buffers went back to the peer")
	require.Equal(t, 1, p.c.rx.reposts, "the rest waits for the next batch, as after Reads")
	require.Equal(t, uint64(16), p.c.Stats().BytesRead)
}

func TestConnWriteToErrors(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("lost?"))
	fail := errors.New("sink failed")
	_, err := p.c.WriteTo(&recordWriter{fail: fail})
	require.ErrorIs(t, err, fail)
	requireNetOpError(t, err, "writeto")
	// Nothing was consumed: a Read still gets the message.
	b := make([]byte, 8)
	n, err := p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "lost?", string(b[:n]))
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

func TestConnMessagesReads(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 8, SendDepth: 8, RecvDepth: 8, Poll: PollEvent, Messages: true}, false)
	require.True(t, p.c.msgRead)
	p.deliver(wire.Header{Type: wire.MsgDataMore}, []byte("hello, w"))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("orld"))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("next"))
	b := make([]byte, 100)
	n, err := p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "hello, world", string(b[:n]), "one Write, whole, and nothing of the next")
	n, err = p.c.Read(b[:2])
	require.NoError(t, err)
	require.Equal(t, "ne", string(b[:n]))
	n, err = p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "xt", string(b[:n]), "a smaller buffer gets the rest of the message, not more")

	// A Read with room for the whole message waits for its last fragment,
	// giving back the buffers of those that came.
	p.deliver(wire.Header{Type: wire.MsgDataMore}, []byte("abcdefgh"))
	got := make(chan string)
	go func() {
		n, err := p.c.Read(b)
		if err != nil {
			got <- err.Error()
		}
		got <- string(b[:n])
	}()
	require.Eventually(t, func() bool { return len(p.q.posted()) > 0 }, 5*time.Second, time.Millisecond,
		"a credit message goes out while the Read waits")
	select {
	case s := <-got:
		t.Fatalf("the Read returned %q before the message ended", s)
	case <-time.After(10 * time.Millisecond):
	}
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("ij"))
	require.Equal(t, "abcdefghij", <-got)

	p.deliver(wire.Header{Type: wire.MsgData}, []byte("z"))
	p.deliver(wire.Header{Type: wire.MsgFin}, nil)
	n, err = p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "z", string(b[:n]))
	_, err = p.c.Read(b)
	require.Equal(t, io.EOF, err)
}

// A Write its writer's Close cut short leaves fragments and then the fin
// at a message-oriented reader: a Read with room for the whole message
// returns the fragments, and the next io.EOF. (It used to go round its
// loop forever with the connection's lock held, which stalled every call
// that takes it, and the CM goroutine behind them.)
func TestConnMessagesFinAfterFragments(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 8, SendDepth: 8, RecvDepth: 8, Poll: PollEvent, Messages: true}, false)
	p.deliver(wire.Header{Type: wire.MsgDataMore}, []byte("abcdefgh"))
	p.deliver(wire.Header{Type: wire.MsgDataMore}, []byte("ijklmnop"))
	p.deliver(wire.Header{Type: wire.MsgFin}, nil)
	type result struct {
		s   string
		err error
	}
	got := make(chan result, 1)
	readAsync := func() {
		go func() {
			b := make([]byte, 64)
			n, err := p.c.Read(b)
			got <- result{string(b[:n]), err}
		}()
	}
	readAsync()
	select {
	case r := <-got:
		require.NoError(t, r.err)
		require.Equal(t, "abcdefghijklmnop", r.s)
	case <-time.After(10 * time.Second):
		t.Fatal("a Read of fragments followed by the fin never returned")
	}
	_, err := p.c.Read(make([]byte, 64))
	require.Equal(t, io.EOF, err)

	// The same when the fin comes while the Read waits for the rest.
	p = newFakeConnOpts(t, Options{BufferSize: 8, SendDepth: 8, RecvDepth: 8, Poll: PollEvent, Messages: true}, false)
	p.deliver(wire.Header{Type: wire.MsgDataMore}, []byte("abcdefgh"))
	readAsync()
	p.eventually(func(c *Conn) bool { return c.rx.n == 0 })
	p.deliver(wire.Header{Type: wire.MsgFin}, nil)
	select {
	case r := <-got:
		require.NoError(t, r.err)
		require.Equal(t, "abcdefgh", r.s)
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting Read never returned once the fin came")
	}
	_, err = p.c.Read(make([]byte, 64))
	require.Equal(t, io.EOF, err)
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

// A Read that a completion wakes counts in wokenReads until it runs, once
// however many completions reach it meanwhile (see wokenReads).
func TestConnWokenReadCountsUntilItRuns(t *testing.T) {
	p := newFakeConn(t, 8, 64)
	base := wokenReads.n.Load()
	got := make(chan string, 1)
	go func() {
		b := make([]byte, 8)
		n, err := p.c.Read(b)
		assert.NoError(t, err)
		got <- string(b[:n])
	}()
	p.eventually(func(c *Conn) bool { return c.rxParked })

	p.c.mu.Lock()
	p.c.wakeReader()
	p.c.wakeReader()
	require.Equal(t, base+1, wokenReads.n.Load(), "counted once")
	p.c.mu.Unlock()
	// It finds nothing, and waits again, uncounted.
	require.Eventually(t, func() bool { return wokenReads.n.Load() == base }, 5*time.Second, time.Millisecond)
	p.eventually(func(c *Conn) bool { return c.rxParked })

	p.deliver(wire.Header{Type: wire.MsgData}, []byte("req"))
	require.Equal(t, "req", <-got)
	require.Equal(t, base, wokenReads.n.Load())
}
