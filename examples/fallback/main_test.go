package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goverbs/rdma"
)

var testAddr = os.Getenv("RDMA_TEST_ADDR")

func needDevice(t testing.TB) {
	t.Helper()
	if testAddr == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test does, in the VM)")
	}
}

// TestMain checks, once the devices the tests used are let go, that no
// goroutine is left.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		for deadline := time.Now().Add(10 * time.Second); len(rdma.Devices()) > 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// serveOn starts the example's server on addr, closed when the test ends.
func serveOn(t *testing.T, addr string) *rdma.Listener {
	t.Helper()
	ln, err := listen(context.Background(), addr)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go serve(ln)
	return ln
}

// TestTCPOnly: on loopback, which no RDMA device serves (on any host), the
// listener is TCP alone, and the dialer with FallbackTCP connects over TCP
// as net.Dial does; both ends say so.
func TestTCPOnly(t *testing.T) {
	ln := serveOn(t, "127.0.0.1:0")
	_, isTCP := ln.Addr().(*net.TCPAddr)
	require.True(t, isTCP, "the listener's address: %T %v", ln.Addr(), ln.Addr())

	results, err := runClients(context.Background(), ln.Addr().String())
	require.NoError(t, err)
	require.Equal(t, []result{
		{client: "rdma.Dialer FallbackTCP", mine: "tcp", server: "tcp"},
		{client: "net.Dialer", mine: "tcp", server: "tcp"},
	}, results)
	s := ln.Stats()
	require.Zero(t, s.Accepted)
	require.EqualValues(t, 2, s.AcceptedTCP)
}

// TestRDMAAndTCP: on an RDMA interface one listener takes the dialer with
// FallbackTCP over RDMA and net.Dial over TCP, on the same port number.
func TestRDMAAndTCP(t *testing.T) {
	needDevice(t)
	ln := serveOn(t, net.JoinHostPort(testAddr, "0"))
	_, isRDMA := ln.Addr().(*rdma.Addr)
	require.True(t, isRDMA, "the listener's address: %T %v", ln.Addr(), ln.Addr())

	results, err := runClients(context.Background(), ln.Addr().String())
	require.NoError(t, err)
	require.Equal(t, []result{
		{client: "rdma.Dialer FallbackTCP", mine: "rdma", server: "rdma"},
		{client: "net.Dialer", mine: "tcp", server: "tcp"},
	}, results)
	s := ln.Stats()
	require.EqualValues(t, 1, s.Accepted)
	require.EqualValues(t, 1, s.AcceptedTCP)
}

// TestRun: the program as go run runs it, server and clients in one
// process, on loopback and, where there is one, on an RDMA interface.
func TestRun(t *testing.T) {
	require.NoError(t, run("127.0.0.1:0", false, false))
	if testAddr != "" {
		require.NoError(t, run(net.JoinHostPort(testAddr, "0"), false, false))
	}
}
