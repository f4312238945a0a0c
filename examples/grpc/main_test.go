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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

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
// goroutine is left: neither the library's nor gRPC's.
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

// TestHealth: concurrent Checks all answered, on one connection; a
// client that only watches sees the status as it is, and one that watches
// while the server shuts its health service down sees it change.
func TestHealth(t *testing.T) {
	needDevice(t)
	s, err := startServer(net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := s.ln.Addr().String()

	const calls = 200
	res, err := runClient(ctx, addr, calls, nil)
	require.NoError(t, err)
	require.Equal(t, calls, res.Checks)
	require.Equal(t, []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_SERVING}, res.Watched)
	require.EqualValues(t, 1, s.ln.Stats().Accepted, "every call of a client on one connection")

	res, err = runClient(ctx, addr, 1, s.health.Shutdown)
	require.NoError(t, err)
	require.Equal(t, 1, res.Checks)
	require.Equal(t, []healthpb.HealthCheckResponse_ServingStatus{
		healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING,
	}, res.Watched)
	require.EqualValues(t, 2, s.ln.Stats().Accepted)
	require.NoError(t, s.stop())
}

// TestRun: the program as go run runs it, server and client in one
// process.
func TestRun(t *testing.T) {
	needDevice(t)
	require.NoError(t, run(net.JoinHostPort(testAddr, "0"), false, false, 50))
}
