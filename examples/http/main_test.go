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
// goroutine is left: neither the library's nor net/http's.
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

// TestClients: every request of every client answered over RDMA, on no
// more connections than there are clients, each dial one accepted
// connection, and the other requests on kept connections.
func TestClients(t *testing.T) {
	needDevice(t)
	s, err := startServer(net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	const clients, requests = 8, 40
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := runClients(ctx, s.ln.Addr().String(), clients, requests)
	t.Log(res)
	require.NoError(t, err)
	accepted := s.ln.Stats().Accepted
	require.NoError(t, s.shutdown())

	require.Equal(t, clients*requests, res.Requests)
	require.Equal(t, clients*requests, res.RDMA, "every request over RDMA")
	require.Positive(t, res.Dials)
	require.LessOrEqual(t, res.Dials, clients, "no more connections than clients")
	require.EqualValues(t, res.Dials, accepted, "each dial is one connection the server accepted")
	require.GreaterOrEqual(t, res.Reused, clients*requests-res.Dials, "every request but a connection's first on a kept one")
}

// TestRun: the program as go run runs it, server and clients in one
// process.
func TestRun(t *testing.T) {
	needDevice(t)
	require.NoError(t, run(net.JoinHostPort(testAddr, "0"), false, false, 4, 10))
}
