package rdma

// Message-oriented Reads and never-merged Writes over the fake QP (see
// conn_internal_test.go).

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

func TestConnMessagesWritesNeverMerge(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 1024, SendDepth: 8, RecvDepth: 8, Poll: PollEvent}, true)
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

func TestConnMessagesCutByDeadlineEndsWrites(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 64, SendDepth: 2, RecvDepth: 2, Poll: PollEvent}, true)
	require.NoError(t, p.c.SetWriteDeadline(time.Now().Add(20*time.Millisecond)))
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

func TestConnMessagesCork(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 64, SendDepth: 8, RecvDepth: 8, Poll: PollEvent}, true)
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
