package rdma

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The send path over the fake QP: Writes and the credits and ring room
// they wait for, failed posts, never-merged message Writes, headers sent as
// SENDs, and ReadFrom.

// chunkReader returns its chunks one per Read, recording the room each Read
// was given.
type chunkReader struct {
	chunks [][]byte
	rooms  []int
	err    error // after the chunks; io.EOF when nil
}

func (r *chunkReader) Read(p []byte) (int, error) {
	r.rooms = append(r.rooms, len(p))
	if len(r.chunks) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if len(r.chunks[0]) == 0 {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}

func TestConnReadFromFillsSendBuffers(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	p.c.SetNoDelay(true)
	r := &chunkReader{chunks: [][]byte{bytes.Repeat([]byte("a"), 1500), []byte("tail")}}
	n, err := p.c.ReadFrom(r)
	require.NoError(t, err)
	require.Equal(t, int64(1504), n)
	require.Equal(t, []int{1024, 1024, 1024, 1024}, r.rooms, "each Read of r gets a whole registered buffer")
	s := p.sent()
	require.Len(t, s, 3)
	require.Equal(t, bytes.Repeat([]byte("a"), 1024), []byte(p.payload(s[0])))
	require.Equal(t, string(bytes.Repeat([]byte("a"), 476)), p.payload(s[1]))
	require.Equal(t, "tail", p.payload(s[2]))
	require.Equal(t, uint64(1504), p.c.Stats().BytesWritten)
}

func TestConnReadFromNeverHoldsWhatItRead(t *testing.T) {
	p := newFakeConn(t, 8, 1024) // holdAt 2: small Writes would gather
	r := &chunkReader{chunks: [][]byte{[]byte("1"), []byte("2"), []byte("3"), []byte("4")}}
	_, err := p.c.ReadFrom(r)
	require.NoError(t, err)
	require.Len(t, p.sent(), 4, "each Read of r goes at once: the next one may block")
	require.Zero(t, p.c.tx.pendLen)
}

// blockingReader returns its first chunks, then blocks until released.
type blockingReader struct {
	chunks  [][]byte
	blocked chan struct{}
	release chan struct{}
}

func (r *blockingReader) Read(p []byte) (int, error) {
	if len(r.chunks) > 0 {
		n := copy(p, r.chunks[0])
		r.chunks = r.chunks[1:]
		return n, nil
	}
	close(r.blocked)
	<-r.release
	return 0, io.EOF
}

// A request read from a source that then blocks (a socket waiting for the
// next one) must reach the peer once a credit allows, not wait for the
// source's next bytes.
func TestConnReadFromDoesNotStallBehindABlockingSource(t *testing.T) {
	p := newFakeConn(t, 2, 64)
	p.c.SetNoDelay(true)
	p.c.Write([]byte("1"))
	p.c.Write([]byte("2"))
	p.ack() // no credit left
	p.sent()
	r := &blockingReader{chunks: [][]byte{[]byte("req")}, blocked: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := p.c.ReadFrom(r)
		done <- err
	}()
	p.eventually(func(c *Conn) bool { return c.tx.pendLen == 3 })
	select {
	case <-r.blocked:
		t.Fatal("ReadFrom blocked in the source on top of bytes it had not sent")
	case <-time.After(10 * time.Millisecond):
	}
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	<-r.blocked
	s := p.sent()
	require.Len(t, s, 1)
	require.Equal(t, "req", p.payload(s[0]), "the request went while the source blocks")
	close(r.release)
	require.NoError(t, <-done)
}

func TestConnReadFromMessages(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 1024, SendDepth: 8, RecvDepth: 8, Poll: PollEvent}, true)
	r := &chunkReader{chunks: [][]byte{[]byte("one"), []byte("two")}}
	_, err := p.c.ReadFrom(r)
	require.NoError(t, err)
	s := p.sent()
	require.Len(t, s, 2, "to a message-oriented peer each Read of r is a message")
	require.Equal(t, "one", p.payload(s[0]))
	require.Equal(t, uint8(wire.MsgData), wire.HeaderOf(s[0].Imm).Type)
}

func TestConnReadFromErrors(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	fail := errors.New("source failed")
	n, err := p.c.ReadFrom(&chunkReader{chunks: [][]byte{[]byte("x")}, err: fail})
	require.Equal(t, int64(1), n)
	require.ErrorIs(t, err, fail)
	requireNetOpError(t, err, "readfrom")
	require.NoError(t, p.c.CloseWrite())
	_, err = p.c.ReadFrom(&chunkReader{})
	require.ErrorIs(t, err, syscall.EPIPE, "after CloseWrite, as Write")
}

// A write deadline that passes while the source's Read runs ends
// ReadFrom before its next Read, but what that Read returned still goes:
// the source cannot take it back, and the caller counts it sent.
func TestConnReadFromDeadlineDuringRead(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	reads := 0
	src := readerFunc(func(b []byte) (int, error) {
		reads++
		require.NoError(t, p.c.SetWriteDeadline(time.Now().Add(-time.Second)))
		return copy(b, "abc"), nil
	})
	n, err := p.c.ReadFrom(src)
	require.Equal(t, int64(3), n)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Equal(t, 1, reads, "no Read once the deadline passed")
	sent := p.sent()
	require.Len(t, sent, 1)
	require.Equal(t, "abc", p.payload(sent[0]))
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

func TestConnMessagesWritesNeverMerge(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 1024, SendDepth: 8, RecvDepth: 8, Poll: PollEvent}, true)
	p.c.postHeld = false // a post that is a system call, where Writes cork
	_, err := p.c.Write(bytes.Repeat([]byte("m"), 2500))
	require.NoError(t, err)
	s := p.sent()
	require.Len(t, s, 3, "a message-oriented peer gets every fragment at once: nothing is held")
	for i, typ := range []uint8{wire.MsgDataMore, wire.MsgDataMore, wire.MsgData} {
		require.Equal(t, typ, wire.HeaderOf(s[i].Imm).Type, "fragment %d", i)
	}
	require.Equal(t, uint32(452), s[2].Len)

	// Small Writes while the peer is behind: one message each. The
	// first goes at once, signaled; the others are corked until its
	// completion, which posts them as one chain.
	for _, w := range []string{"a", "b", "c", "d"} {
		_, err := p.c.Write([]byte(w))
		require.NoError(t, err)
	}
	s = p.sent()
	require.Len(t, s, 1, "the peer is behind: the Writes after a signaled one wait for its completion")
	require.Equal(t, "a", p.payload(s[0]))
	require.NotZero(t, s[0].Flags&ibv.SendSignaled)
	posts := p.q.postCalls()
	p.ack()
	s = p.sent()
	require.Len(t, s, 3)
	require.Equal(t, posts+1, p.q.postCalls(), "the corked messages go in one post")
	for i, wr := range s {
		require.Equal(t, uint8(wire.MsgData), wire.HeaderOf(wr.Imm).Type)
		require.Equal(t, uint32(1), wr.Len)
		require.Equal(t, string("bcd"[i]), p.payload(wr))
	}
	_, err = p.c.Write(nil)
	require.NoError(t, err)
	require.Empty(t, p.sent(), "a zero-length Write sends nothing")
}

func TestConnMessagesPendingWriteWaits(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 64, SendDepth: 2, RecvDepth: 2, Poll: PollEvent}, true)
	p.c.Write([]byte("1"))
	p.c.Write([]byte("2")) // corked: "1" is unconsumed
	p.ack()                // posts "2"
	p.ack()
	require.Len(t, p.sent(), 2)
	// No credit: the Write's bytes wait in the pending buffer...
	_, err := p.c.Write([]byte("three"))
	require.NoError(t, err)
	require.Equal(t, 5, p.c.tx.pendLen)
	require.False(t, p.c.tx.pendMore)
	// ...and the next Write waits for them to go, instead of joining them.
	done := make(chan struct{})
	go func() {
		p.c.Write([]byte("four"))
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("the Write merged with the pending one")
	case <-time.After(20 * time.Millisecond):
	}
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	<-done
	s := p.sent()
	require.Len(t, s, 1)
	require.Equal(t, "three", p.payload(s[0]))
	require.Equal(t, 4, p.c.tx.pendLen, "four waits for the next credit, on its own")
}

func TestConnMessagesPendingFragment(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 64, SendDepth: 4, RecvDepth: 2, Poll: PollEvent}, true)
	p.c.Write([]byte("1"))
	p.c.Write([]byte("2"))
	p.ack()
	p.sent()
	done := make(chan struct{})
	go func() {
		p.c.Write(bytes.Repeat([]byte("x"), 100)) // two fragments, no credit
		close(done)
	}()
	p.eventually(func(c *Conn) bool { return c.tx.pendLen == 64 })
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	<-done
	s := p.sent()
	require.Len(t, s, 1)
	require.Equal(t, uint8(wire.MsgDataMore), wire.HeaderOf(s[0].Imm).Type, "the pending fragment is marked as one")
	require.Equal(t, 36, p.c.tx.pendLen)
	p.ack()
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	s = p.sent()
	require.Len(t, s, 1)
	require.Equal(t, uint8(wire.MsgData), wire.HeaderOf(s[0].Imm).Type)
}

func TestConnMessagesCutByDeadlineEndsWrites(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 64, SendDepth: 2, RecvDepth: 2, Poll: PollEvent}, true)
	// Long enough that a loaded machine still posts the first fragments
	// before it fires.
	require.NoError(t, p.c.SetWriteDeadline(time.Now().Add(200*time.Millisecond)))
	// Two fragments go, the rest waits for send buffers that never come
	// back: the deadline cuts the Write.
	n, err := p.c.Write(bytes.Repeat([]byte("m"), 300))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Positive(t, n)
	require.NoError(t, p.c.SetWriteDeadline(time.Time{}))
	_, err = p.c.Write([]byte("next"))
	require.ErrorContains(t, err, "cut short", "the next Write would continue the cut message at the reader")
	_, err = p.c.ReadFrom(strings.NewReader("next"))
	require.ErrorContains(t, err, "cut short")

	// The rest of the connection goes on: Reads, the credits they give
	// back, one-sided operations. No fin may end the cut message.
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("reply"))
	b := make([]byte, 8)
	n, err = p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "reply", string(b[:n]))
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	require.NoError(t, p.c.oneSidedEnded(), "one-sided operations and regions are not the message stream")
	p.c.returnCredits(true)
	require.NotEmpty(t, p.c.tx.sends, "credits still go back")
	require.ErrorContains(t, p.c.sendFinDroppingLock(), "cut short")
	require.False(t, p.c.tx.finQueued)
}

// TestConnMessagesNoCorkWherePostsHeld: where a post is no system call (a
// NIC's doorbell, postHeld), corking would save nothing and cost a
// signaled send per batch: every Write is posted at once.
func TestConnMessagesNoCorkWherePostsHeld(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 64, SendDepth: 8, RecvDepth: 8, Poll: PollEvent}, true)
	p.c.postHeld = true
	for _, m := range []string{"a", "b", "c", "d", "e"} {
		_, err := p.c.Write([]byte(m))
		require.NoError(t, err)
		s := p.sent()
		require.Len(t, s, 1, "Write %q posted at once while the peer is behind", m)
		require.Equal(t, m, p.payload(s[0]))
	}
}

func TestConnMessagesCork(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 64, SendDepth: 8, RecvDepth: 8, Poll: PollEvent}, true)
	p.c.postHeld = false // a post that is a system call, where Writes cork
	p.c.postHeld = false // a post that is a system call, where Writes cork
	write := func(s string) {
		t.Helper()
		_, err := p.c.Write([]byte(s))
		require.NoError(t, err)
	}
	// The peer keeps up: every Write is posted at once.
	write("a")
	write("b")
	require.Len(t, p.sent(), 2)
	// Two unconsumed at the peer: the next Write goes signaled, and the
	// Writes after it are corked...
	write("c")
	s := p.sent()
	require.Len(t, s, 1)
	require.NotZero(t, s[0].Flags&ibv.SendSignaled, "what the corked Writes wait for")
	write("d")
	write("e")
	require.Empty(t, p.sent())
	// ...until a completion: here the peer's credits for a and b (its
	// answer comes before c's completion).
	posts := p.q.postCalls()
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 2}, nil)
	s = p.sent()
	require.Len(t, s, 2)
	require.Equal(t, posts+1, p.q.postCalls(), "one post for the corked Writes")
	require.Equal(t, "d", p.payload(s[0]))
	require.Equal(t, "e", p.payload(s[1]))

	// A header that acknowledges the peer's credit message never waits:
	// the peer may need its control credit back.
	write("f")
	s = p.sent()
	require.Len(t, s, 1)
	require.Equal(t, uint8(1), wire.HeaderOf(s[0].Imm).CtrlAck)

	// SetNoDelay(true) posts every Write at once.
	require.NoError(t, p.c.SetNoDelay(true))
	write("g")
	require.Len(t, p.sent(), 1)
	require.NoError(t, p.c.SetNoDelay(false))

	// A Write that must wait posts what is corked first: the peer's
	// answer to it is what ends the wait.
	p.ack() // the send queue has room for all, and no signaled send is out
	require.Equal(t, 3, p.c.cr.credits)
	write("h") // the peer is behind: signaled, posted
	require.Len(t, p.sent(), 1)
	write("i") // corked
	write("j")
	require.Empty(t, p.sent())
	require.Zero(t, p.c.cr.credits)
	write("k") // no credit: pending
	done := make(chan struct{})
	go func() {
		write("l") // waits for k to go
		close(done)
	}()
	p.eventually(func(c *Conn) bool { return len(c.tx.sends) == 0 })
	s = p.sent()
	require.Len(t, s, 2)
	for i, wr := range s {
		require.Equal(t, string("ij"[i]), p.payload(wr))
	}
	p.ack()
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 8}, nil)
	<-done
	s = p.sent()
	require.Len(t, s, 2, "the peer caught up: nothing is corked")
	require.Equal(t, "k", p.payload(s[0]))
	require.Equal(t, "l", p.payload(s[1]))
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
