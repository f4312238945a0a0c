package rdma_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of closing: graceful and abrupt closes, CloseRead and
// CloseWrite, a killed peer, and a stuck connection that must not stall
// the others.

func TestGracefulClose(t *testing.T) {
	c, s := pair(t, nil, nil)
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	go func() {
		c.Write(data)
		c.Close()
	}()
	got, err := io.ReadAll(s)
	require.NoError(t, err)
	require.Equal(t, data, got)
	n, err := s.Read(make([]byte, 10))
	require.Equal(t, 0, n)
	require.Equal(t, io.EOF, err)
}

func TestCloseUnblocksAndIsIdempotent(t *testing.T) {
	c, _ := pair(t, nil, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, c.Close())
	err := <-errc
	requireOpError(t, err, "read")
	require.ErrorIs(t, err, net.ErrClosed)

	err = c.Close()
	requireOpError(t, err, "close")
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = c.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

// TestPeerKilled: a peer killed mid-transfer becomes an error on Read
// within seconds, not a hang.
func TestPeerKilled(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RDMA_TEST_PEER="+ln.Addr().String())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer cmd.Wait()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "connected\n", line)
	c, err := ln.Accept()
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, 64<<10)
	for read := 0; read < 1<<20; {
		n, err := c.Read(buf)
		require.NoError(t, err)
		read += n
	}
	require.NoError(t, cmd.Process.Kill())
	killed := time.Now()
	var rerr error
	for rerr == nil {
		_, rerr = c.Read(buf)
	}
	took := time.Since(killed)
	t.Logf("Read failed %v after the kill: %v", took.Round(time.Millisecond), rerr)
	requireOpError(t, rerr, "read")
	require.Less(t, took, 10*time.Second)
	_, werr := c.Write(buf)
	require.Error(t, werr)
}

func TestCloseWrite(t *testing.T) {
	c, s := pair(t, nil, nil)
	// c half-closes: s reads to EOF, then still writes back to c.
	_, err := c.Write([]byte("request"))
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	_, err = c.Write([]byte("x"))
	requireOpError(t, err, "write")
	got, err := io.ReadAll(s)
	require.NoError(t, err)
	require.Equal(t, "request", string(got))
	_, err = s.Write([]byte("response"))
	require.NoError(t, err)
	// More messages than the receive window: c keeps returning credits
	// after its fin.
	more := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	go func() {
		for range 8 {
			if _, err := s.Write(more); err != nil {
				return
			}
		}
		s.(*rdma.Conn).CloseWrite()
	}()
	got, err = io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "response"+strings.Repeat(string(more), 8), string(got))
}

// TestCloseReportsUndelivered: when the peer never reads, data a Write
// accepted but could not send is discarded at Close, and Close says so
// instead of returning nil. The peer reads what did arrive, then a reset.
func TestCloseReportsUndelivered(t *testing.T) {
	opts := rdma.Options{BufferSize: 4096, RecvDepth: 2, SendDepth: 2}
	c, s := pair(t, &rdma.ListenConfig{Options: opts}, &rdma.Dialer{Options: opts})
	require.NoError(t, c.SetNoDelay(true))
	msg := bytes.Repeat([]byte("z"), 100)
	for range 5 { // two messages fill the peer's window, three wait
		_, err := c.Write(msg)
		require.NoError(t, err)
	}
	err := c.Close()
	requireOpError(t, err, "close")
	require.ErrorIs(t, err, syscall.ETIMEDOUT)

	got, err := io.ReadAll(s)
	require.Error(t, err)
	require.NotErrorIs(t, err, io.EOF)
	require.Equal(t, bytes.Repeat(msg, 2), got)
}

func TestCloseRead(t *testing.T) {
	c, s := pair(t, nil, &rdma.Dialer{Options: rdma.Options{BufferSize: 1024, RecvDepth: 2}})
	_, err := s.Write([]byte("before"))
	require.NoError(t, err)
	require.NoError(t, c.CloseRead())
	n, err := c.Read(make([]byte, 10))
	require.Equal(t, 0, n)
	require.Equal(t, io.EOF, err)
	// The peer's writes are discarded but never block, far beyond the
	// receive window.
	buf := make([]byte, 1000)
	for i := 0; i < 100; i++ {
		_, err := s.Write(buf)
		require.NoError(t, err)
	}
	// The other direction still works.
	transfer(t, c, s, "after")
}

// A connection whose lock is held (as by a call that never lets go of
// it) delays no other connection's Dial or Close, even while its own CM
// event, the peer's disconnect, waits for the lock: the CM goroutine that
// delivers every id's events never waits on a connection's lock. (The
// poller does, to run a completion: it must find the lock free soon,
// which every holder guarantees by making progress or dropping it; so the
// lock is taken here once the peer has nothing more to send.)
func TestStuckConnDoesNotStallOthers(t *testing.T) {
	needDevice(t)
	needNotSiw(t, "siw moves a QP to the error state as soon as its peer closes, and the poller must hand the flushed completions to the connection this test holds locked: a held lock stalls its CQ's poller (bounded in the library by the rule that mu is never held across a wait), which rxe, whose QP stays up until the local teardown, does not show")
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	accepted := acceptAll(ln)
	a, err := rdma.Dial("rdma", ln.Addr().String())
	require.NoError(t, err)
	as := (<-accepted).(*rdma.Conn)
	require.NoError(t, a.CloseWrite())
	as.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = as.Read(make([]byte, 8))
	require.Equal(t, io.EOF, err, "the peer's fin")
	release := rdma.HoldLock(as)
	released := false
	defer func() {
		if !released {
			release()
		}
		as.Close()
	}()
	// The peer closes: its disconnect is for as, whose lock is held.
	within(t, 20*time.Second, "the peer's Close", func() error { a.Close(); return nil })
	time.Sleep(100 * time.Millisecond)

	within(t, 30*time.Second, "another connection's Dial, round trip and Close", func() error {
		return roundTripNew(ln.Addr().String(), accepted, "while another connection's lock is held")
	})
	release()
	released = true
	var werr error
	for deadline := time.Now().Add(10 * time.Second); werr == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		_, werr = as.Write([]byte("x"))
	}
	require.ErrorIs(t, werr, syscall.ECONNRESET, "the disconnect was handled once the lock was free")
}

// CloseRead while WriteTo hands a message to its Writer: the peer's
// messages that arrive meanwhile must not be counted as read past the one
// the Writer holds, or the ring's read position moves backwards and the
// peer's next message is refused as an overrun (the connection lost).
func TestCloseReadDuringWriteTo(t *testing.T) {
	c, s := pair(t, nil, nil)
	stop := make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		buf := make([]byte, 16<<10)
		for {
			select {
			case <-stop:
				wrote <- nil
				return
			default:
			}
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
	}()
	hold := make(chan struct{})
	held := make(chan struct{})
	var once sync.Once
	w := writerFunc(func(b []byte) (int, error) {
		once.Do(func() { close(held) })
		<-hold
		return len(b), nil
	})
	copied := make(chan error, 1)
	go func() {
		_, err := s.(*rdma.Conn).WriteTo(w)
		copied <- err
	}()
	<-held
	closed := make(chan error, 1)
	go func() { closed <- s.(*rdma.Conn).CloseRead() }()
	time.Sleep(200 * time.Millisecond) // the peer writes on
	close(hold)
	require.NoError(t, <-copied)
	require.NoError(t, <-closed)
	time.Sleep(300 * time.Millisecond) // and on, into a discarding reader
	close(stop)
	require.NoError(t, <-wrote, "the peer's Writes after CloseRead")
	transfer(t, s, c, "the connection still works the other way")
}
