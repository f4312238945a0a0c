package rdma_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// fallbackEcho accepts one connection on ln, echoes it, and reports whether it
// was RDMA.
func fallbackEcho(ln net.Listener) <-chan bool {
	isRDMA := make(chan bool, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(isRDMA)
			return
		}
		isRDMA <- rdma.IsRDMA(c)
		io.Copy(c, c)
		c.Close()
	}()
	return isRDMA
}

// fallbackRoundTrip writes and reads back a message on c.
func fallbackRoundTrip(t *testing.T, c net.Conn) {
	t.Helper()
	msg := []byte("over whichever transport")
	_, err := c.Write(msg)
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, msg, got)
}

// TestFallbackLoopback runs everywhere: on the loopback address no RDMA
// device serves (on a host without RDMA, none serves any), a listener and
// a dialer with FallbackTCP work over TCP, and say so.
func TestFallbackLoopback(t *testing.T) {
	lc := rdma.ListenConfig{FallbackTCP: true}
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.Equal(t, "tcp", ln.Addr().Network(), "no RDMA here: the listener is TCP alone")
	served := fallbackEcho(ln)

	d := rdma.Dialer{FallbackTCP: true, Timeout: 10 * time.Second}
	c, err := d.Dial("rdma", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.False(t, rdma.IsRDMA(c))
	require.Equal(t, "tcp", c.LocalAddr().Network())
	fallbackRoundTrip(t, c)
	require.False(t, <-served)
	require.Equal(t, uint64(1), ln.(*rdma.Listener).Stats().AcceptedTCP)

	// Without the option nothing falls back.
	_, err = rdma.Dial("rdma", ln.Addr().String())
	require.Error(t, err)
	require.True(t, errors.Is(err, rdma.ErrNoDevice) || errors.Is(err, rdma.ErrUnsupported), "%v", err)

	require.NoError(t, ln.Close())
	_, err = ln.Accept()
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, ln.Close(), net.ErrClosed)
}

// TestFallbackBothTransports: a wildcard listener with FallbackTCP serves
// RDMA on the device's address and TCP on the same port number, so a
// dialer from an address without RDMA (loopback) comes in over TCP, and
// one on the RDMA address over RDMA.
func TestFallbackBothTransports(t *testing.T) {
	needDevice(t)
	needNotSiw(t, fallbackIWARP)
	lc := rdma.ListenConfig{FallbackTCP: true}
	ln, err := lc.Listen(context.Background(), "rdma4", ":0")
	require.NoError(t, err)
	defer ln.Close()
	require.Equal(t, "rdma", ln.Addr().Network())
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	d := rdma.Dialer{FallbackTCP: true, Timeout: 10 * time.Second}

	served := fallbackEcho(ln)
	c, err := d.Dial("rdma", net.JoinHostPort(testAddr, port))
	require.NoError(t, err)
	require.True(t, rdma.IsRDMA(c))
	require.Equal(t, "rdma", c.LocalAddr().Network())
	fallbackRoundTrip(t, c)
	require.True(t, <-served)
	c.Close()

	served = fallbackEcho(ln)
	c, err = d.Dial("rdma", net.JoinHostPort("127.0.0.1", port))
	require.NoError(t, err, "loopback has no RDMA device: TCP")
	require.False(t, rdma.IsRDMA(c))
	fallbackRoundTrip(t, c)
	require.False(t, <-served)
	c.Close()
	st := ln.(*rdma.Listener).Stats()
	require.Equal(t, uint64(1), st.Accepted)
	require.Equal(t, uint64(1), st.AcceptedTCP)
}

// TestFallbackRules: a port where no RDMA listener is but a TCP service
// is falls back to it; a port whose RDMA listener refuses (its backlog is
// full) does not, though a TCP service listens on the same number.
func TestFallbackRules(t *testing.T) {
	needDevice(t)
	needNotSiw(t, fallbackIWARP)
	d := rdma.Dialer{FallbackTCP: true, Timeout: 10 * time.Second}

	tl, err := net.Listen("tcp", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer tl.Close()
	served := fallbackEcho(tl)
	_, err = rdma.Dial("rdma", tl.Addr().String())
	var re *rdma.RefusedError
	require.ErrorAs(t, err, &re, "no RDMA listener on the port")
	require.Equal(t, rdma.RefusedNoListener, re.Reason)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.ErrorContains(t, err, "no RDMA listener on that port")
	c, err := d.Dial("rdma", tl.Addr().String())
	require.NoError(t, err)
	require.False(t, rdma.IsRDMA(c))
	fallbackRoundTrip(t, c)
	c.Close()
	require.False(t, <-served)

	// A backlog of one, taken by a connection nobody accepts.
	full := rdma.ListenConfig{Backlog: 1}
	ln, err := full.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	first, err := rdma.Dial("rdma", ln.Addr().String())
	require.NoError(t, err)
	defer first.Close()
	waitAccepted(t, ln, 1)
	port := ln.Addr().(*rdma.Addr).Port
	other, err := net.Listen("tcp", net.JoinHostPort(testAddr, strconv.Itoa(port)))
	require.NoError(t, err, "a TCP service on the RDMA listener's port number")
	defer other.Close()
	tcpAccepted := make(chan struct{})
	go func() {
		if c, err := other.Accept(); err == nil {
			close(tcpAccepted)
			c.Close()
		}
	}()
	_, err = d.Dial("rdma", ln.Addr().String())
	require.ErrorAs(t, err, &re, "refused by the RDMA listener: %v", err)
	require.Equal(t, rdma.RefusedBacklog, re.Reason)
	other.Close()
	select {
	case <-tcpAccepted:
		t.Fatal("a refused RDMA connection went to the TCP service")
	case <-time.After(50 * time.Millisecond):
	}
}

// fallbackIWARP is why the fallback tests do not run on siw.
const fallbackIWARP = "iWARP's RDMA port is a TCP port (MPA runs over TCP): a TCP listener cannot share its number, and a TCP-only server accepts the connection and fails the MPA exchange instead of refusing it"
