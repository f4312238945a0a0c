package rdma

import (
	"bytes"
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/wire"
)

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
