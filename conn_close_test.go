package rdma

import (
	"bytes"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The teardown over the fake QP: the test plays the peer's NIC, which
// acknowledges the fin, and the QP, which flushes what is left once it is
// in the error state.

// finPosted reports whether a fin is among the posted sends.
func (p *fakePeer) finPosted() bool {
	for _, wr := range p.q.posted() {
		if wr.Flags&ibv.SendWriteImm == 0 && wire.HeaderOf(wr.Imm).Type == wire.MsgFin {
			return true
		}
	}
	return false
}

// flushAll completes every posted receive, and the last posted send, as
// flushed: what a QP in the error state does.
func (p *fakePeer) flushAll() {
	p.c.mu.Lock()
	n := p.c.rx.posted
	p.c.mu.Unlock()
	for range n {
		p.complete(ibv.WC{WRID: recvWRID, Status: ibv.WCFlushErr})
	}
	if all := p.q.posted(); len(all) > 0 {
		p.complete(ibv.WC{WRID: all[len(all)-1].ID, Status: ibv.WCFlushErr})
	}
}

// Close sends the fin behind what was written, returns once the peer's
// NIC acknowledged it, and the release drains the QP and lets the memory
// go; nothing can be read or written afterwards.
func TestConnCloseLingersAndDrains(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	_, err := p.c.Write([]byte("last words"))
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() { closed <- p.c.Close() }()
	require.Eventually(t, p.finPosted, 5*time.Second, time.Millisecond, "the fin goes behind the data")
	select {
	case err := <-closed:
		t.Fatalf("Close returned before the fin was acknowledged: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	p.ack()
	require.NoError(t, <-closed)
	p.eventually(func(c *Conn) bool { return c.tx.draining })
	p.flushAll()
	releasing.Wait()
	p.c.mu.Lock()
	require.True(t, p.c.life.has(shutQPGone))
	require.Nil(t, p.c.mem, "the memory is let go")
	require.Equal(t, phaseDead, p.c.life.phase)
	p.c.mu.Unlock()
	_, err = p.c.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, p.c.Close(), net.ErrClosed, "Close once")
}

// Data the peer never granted a receive for is dropped when the linger
// runs out, fin and all, and Close says so.
func TestConnCloseReportsUndelivered(t *testing.T) {
	defer func(d time.Duration) { lingerTimeout = d }(lingerTimeout)
	lingerTimeout = 50 * time.Millisecond
	p := newFakeConn(t, 1, 64)
	require.NoError(t, p.c.SetNoDelay(true))
	_, err := p.c.Write([]byte("x")) // the only credit
	require.NoError(t, err)
	p.ack()                               // the send queue's room back, not the credit
	_, err = p.c.Write([]byte("pending")) // waits for a credit that never comes
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() { closed <- p.c.Close() }()
	select {
	case err = <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not give up on the linger")
	}
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
	require.ErrorContains(t, err, "written data discarded")
	require.False(t, p.finPosted(), "no fin: it would end a stream that lost data")
	p.eventually(func(c *Conn) bool { return c.tx.draining })
	p.flushAll()
	releasing.Wait()
}

// The peer's disconnect during the linger ends it at once; Reads return
// what came and then fail with a reset, Writes fail at once.
func TestConnPeerDisconnected(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("before"))
	p.c.peerDisconnected(true)
	b := make([]byte, 16)
	n, err := p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "before", string(b[:n]))
	p.flushAll()
	_, err = p.c.Read(b)
	require.ErrorIs(t, err, syscall.ECONNRESET)
	_, err = p.c.Write([]byte("x"))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	closed := make(chan error, 1)
	go func() { closed <- p.c.Close() }()
	select {
	case err = <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close lingered for a peer that is gone")
	}
	releasing.Wait()
}

// A device's removal fails the connection at once with ErrNoDevice and
// releases it without waiting for Close (Reads and Writes in progress
// leave first).
func TestConnDeviceRemoved(t *testing.T) {
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = 50 * time.Millisecond
	p := newFakeConn(t, 4, 64)
	read := make(chan error, 1)
	go func() {
		_, err := p.c.Read(make([]byte, 8))
		read <- err
	}()
	time.Sleep(10 * time.Millisecond)
	p.c.deviceRemoved()
	require.ErrorIs(t, <-read, ErrNoDevice)
	p.eventually(func(c *Conn) bool { return c.life.has(shutQPGone) })
	_, err := p.c.Write([]byte("x"))
	require.ErrorIs(t, err, ErrNoDevice)
}

// TestConnCloseBesideRemovalRelease: once a device's removal has started
// the connection's release on a goroutine of its own (releaseLater), Close
// returns at once instead of waiting for it: the release, which may block
// until it has destroyed the id (a kernel deleting the device was seen to
// hold that forever), is not waited for. The test holds the Read and Write
// turns meanwhile, as a Read and a Write blocked in the application would.
func TestConnCloseBesideRemovalRelease(t *testing.T) {
	p := newFakeConn(t, 8, 1024)
	c := p.c
	c.mu.Lock()
	c.life.set(shutPeerGone)
	c.fail(&deviceError{syscall.ENODEV})
	c.releasedLater = true
	c.mu.Unlock()
	// The release, stuck: it holds what Close would otherwise wait for.
	c.takeTurn(&c.wturn)
	c.takeTurn(&c.rturn)
	defer c.giveTurn(&c.wturn)
	defer c.giveTurn(&c.rturn)
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for the removal's release")
	}
	require.ErrorIs(t, c.Close(), net.ErrClosed, "a second Close")
}

// A listener's unaccepted connections are closed at once, without a fin
// or a linger each (their dialers may have vanished, and nothing of the
// application's waits to be delivered), and released in the background,
// however many there are.
func TestAbortConnsSkipsTheLinger(t *testing.T) {
	const n = 3 * abortWorkers // more than run at once
	var peers []*fakePeer
	var conns []*Conn
	for range n {
		p := newFakeConn(t, 4, 64)
		peers = append(peers, p)
		conns = append(conns, p.c)
	}
	done := make(chan struct{})
	go func() {
		abortConns(conns)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(lingerTimeout / 2):
		t.Fatal("abortConns waited for the peers")
	}
	for i, p := range peers {
		_, err := p.c.Read(make([]byte, 1))
		require.ErrorIs(t, err, net.ErrClosed, "connection %d is closed once abortConns returns", i)
		require.ErrorIs(t, p.c.Close(), net.ErrClosed)
	}
	// Each release disconnects, so the QP flushes what it holds.
	for _, p := range peers {
		p.eventually(func(c *Conn) bool { return c.tx.draining })
		p.flushAll()
	}
	releasing.Wait()
	for i, p := range peers {
		require.False(t, p.finPosted(), "connection %d: no fin", i)
		p.c.mu.Lock()
		require.True(t, p.c.life.has(shutQPGone), "connection %d released", i)
		require.Nil(t, p.c.mem, "connection %d's memory let go", i)
		p.c.mu.Unlock()
	}
}

// TestConnSetDeadlineRacingClose: deadline setters that run beside Close
// return, with nil or net.ErrClosed, and never block. They used to check
// for the close and then set the deadline with nothing held across the
// two; a Close in between stopped the timer, and the set waited forever
// for it to fire.
func TestConnSetDeadlineRacingClose(t *testing.T) {
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = time.Millisecond
	for range 200 {
		p := newFakeConn(t, 2, 64)
		c := p.c
		c.mu.Lock()
		c.life.set(shutPeerGone) // no linger: Close goes straight to the release
		c.mu.Unlock()
		setters := []func(time.Time) error{c.SetReadDeadline, c.SetWriteDeadline, c.SetDeadline}
		errs := make(chan error, len(setters))
		running := make(chan struct{}, len(setters))
		for _, set := range setters {
			go func() {
				running <- struct{}{}
				for {
					if err := set(time.Now().Add(time.Hour)); err != nil {
						errs <- err
						return
					}
					if err := set(time.Time{}); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		for range setters {
			<-running
		}
		require.NoError(t, c.Close())
		for range setters {
			select {
			case err := <-errs:
				require.ErrorIs(t, err, net.ErrClosed)
				var oe *net.OpError
				require.ErrorAs(t, err, &oe)
				require.Equal(t, "set", oe.Op)
			case <-time.After(5 * time.Second):
				t.Fatal("a deadline setter racing Close blocked")
			}
		}
	}
	releasing.Wait()
}

// TestConnRemovalReleaseBesideBlockedCopies: a device's removal releases
// the connection while a WriteTo waits in its Writer and a ReadFrom in
// its Reader (an idle io.Copy(conn, os.Stdin)): the release no longer
// waits behind the Read and Write turns, which they hold meanwhile, and
// neither touches the rings while it waits in the application. Once the
// application returns, both fail with the removal's error.
func TestConnRemovalReleaseBesideBlockedCopies(t *testing.T) {
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = 50 * time.Millisecond
	p := newFakeConn(t, 4, 64)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("to the writer"))
	unblock := make(chan struct{})
	inWriter, inReader := make(chan struct{}), make(chan struct{})
	wrote, read := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := p.c.WriteTo(writerFunc(func(b []byte) (int, error) {
			close(inWriter)
			<-unblock
			return len(b), nil
		}))
		wrote <- err
	}()
	go func() {
		_, err := p.c.ReadFrom(readerFunc(func(b []byte) (int, error) {
			close(inReader)
			<-unblock
			return copy(b, "from the reader"), nil
		}))
		read <- err
	}()
	<-inWriter
	<-inReader
	p.c.deviceRemoved()
	p.eventually(func(c *Conn) bool { return c.life.has(shutQPGone) && c.mem == nil })
	close(unblock)
	for _, ch := range []chan error{wrote, read} {
		select {
		case err := <-ch:
			require.ErrorIs(t, err, ErrNoDevice)
		case <-time.After(5 * time.Second):
			t.Fatal("a copy did not return once the application did")
		}
	}
	releasing.Wait()
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

func TestConnDrainWaitsForPostInFlight(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	p.c.postHeld = false // a software provider's post, the lock dropped
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

// The release's waits (waitDroppingLock) take txReady's wakeups only before
// the phase is dead (Close's linger, with the Write turn held). After,
// the release of a removed device runs beside a Write that may be parked
// on txReady alone: the waits leave its wakeup to it, and go on with
// drained.
func TestReleaseWaitsLeaveTxReady(t *testing.T) {
	c := newConn(phaseEstablished)
	c.mu.Lock()
	defer c.mu.Unlock()

	signal(c.txReady)
	looks := 0
	c.waitDroppingLock(time.Minute, func() bool { looks++; return looks > 1 })
	require.Equal(t, 2, looks, "woken by txReady before the phase is dead")
	require.Empty(t, c.txReady)

	c.life.phase = phaseDead
	signal(c.txReady)
	start := time.Now()
	c.waitDroppingLock(20*time.Millisecond, func() bool { return false })
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	require.Len(t, c.txReady, 1, "a dead phase's wait left the Write's wakeup")

	signal(c.drained)
	looks = 0
	c.waitDroppingLock(time.Minute, func() bool { looks++; return looks > 1 })
	require.Equal(t, 2, looks, "woken by drained")
}
