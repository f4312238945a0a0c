package rdma_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

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

func TestListenerCloseUnblocksAccept(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, ln.Close())
	err = <-errc
	requireOpError(t, err, "accept")
	require.ErrorIs(t, err, net.ErrClosed)
	err = ln.Close()
	requireOpError(t, err, "close")
	require.ErrorIs(t, err, net.ErrClosed)
}

// TestBacklog: connections beyond the backlog that nobody accepts are
// refused, and the queued ones are closed with the listener.
func TestBacklog(t *testing.T) {
	needDevice(t)
	hooked := make(chan error, 1)
	lc := rdma.ListenConfig{Backlog: 2, Refused: func(_ net.Addr, err error) { hooked <- err }}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		c, err := rdma.Dial("rdma", ln.Addr().String())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	_, err = rdma.Dial("rdma", ln.Addr().String())
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.ErrorIs(t, err, syscall.EAGAIN, "a full backlog: try again")
	var re *rdma.RefusedError
	require.ErrorAs(t, err, &re)
	require.Equal(t, rdma.RefusedBacklog, re.Reason)
	require.ErrorContains(t, err, "backlog is full")
	herr := <-hooked
	requireOpError(t, herr, "accept")
	require.ErrorAs(t, herr, &re)
	require.Equal(t, rdma.RefusedBacklog, re.Reason)
	st := ln.(*rdma.Listener).Stats()
	require.Equal(t, uint64(2), st.Accepted)
	require.Equal(t, uint64(1), st.Refused[rdma.RefusedBacklog])
	require.NoError(t, ln.Close())
	// The queued connections were closed by the listener: their peers
	// see the end of the stream.
	for _, c := range conns {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err)
		require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "read: %v", err)
	}
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
