package main

import (
	"context"
	"crypto/tls"
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
// goroutine is left: neither the library's nor quic-go's.
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

// TestEcho: two clients in turn, each echoing 1 MiB on each of four
// streams at once, every byte checked, all of it in RDMA datagrams; then
// a client that trusts another certificate, refused in the handshake.
func TestEcho(t *testing.T) {
	needDevice(t)
	s, err := startServer(net.JoinHostPort(testAddr, "0"), testAddr)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.close()) }()
	require.False(t, s.pc.IsUDP(), "the server's datagrams are RDMA's")
	tlsConf := &tls.Config{RootCAs: s.roots, ServerName: testAddr, NextProtos: []string{alpn}}
	ctx := context.Background()

	const streams, size = 4, 1 << 20
	for range 2 {
		require.NoError(t, runClient(ctx, testAddr, s.pc.LocalAddr(), tlsConf, streams, size))
	}
	st := s.pc.Stats()
	t.Logf("the server's PacketConn: %d datagrams received (%d B), %d sent (%d B)", st.DatagramsReceived, st.BytesReceived, st.DatagramsSent, st.BytesSent)
	require.GreaterOrEqual(t, st.BytesReceived, uint64(2*streams*size), "every byte the clients sent came as RDMA datagrams")
	require.GreaterOrEqual(t, st.BytesSent, uint64(2*streams*size), "and went back so")

	other, err := startServer(net.JoinHostPort(testAddr, "0"), testAddr)
	require.NoError(t, err)
	require.NoError(t, other.close())
	wrong := &tls.Config{RootCAs: other.roots, ServerName: testAddr, NextProtos: []string{alpn}}
	err = runClient(ctx, testAddr, s.pc.LocalAddr(), wrong, 1, 1)
	require.ErrorContains(t, err, "certificate", "a server whose certificate the client does not trust")
}

// TestRun: the program as go run runs it, server and client in one
// process.
func TestRun(t *testing.T) {
	needDevice(t)
	require.NoError(t, run(net.JoinHostPort(testAddr, "0"), "", false, false, 4, 256<<10))
}
