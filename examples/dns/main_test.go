package main

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"
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
// goroutine is left: neither the library's nor miekg/dns's.
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

// TestQueries: a name's record, a name the server does not know, and an
// answer larger than the device's MTU, whole with EDNS0 and truncated
// without; then many queries in turn.
func TestQueries(t *testing.T) {
	needDevice(t)
	srv, err := startServer(net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.shutdown()) }()
	require.False(t, srv.srv.PacketConn.(*rdma.PacketConn).IsUDP(), "the server's datagrams are RDMA's")
	rs, err := newResolver(testAddr, srv.addr())
	require.NoError(t, err)
	defer rs.Close()

	r, _, err := rs.lookup("db.example.")
	require.NoError(t, err)
	require.Equal(t, dns.RcodeSuccess, r.Rcode)
	require.Len(t, r.Answer, 1)
	require.Equal(t, "10.1.0.1", r.Answer[0].(*dns.A).A.String())

	r, _, err = rs.lookup("nowhere.example.")
	require.NoError(t, err)
	require.Equal(t, dns.RcodeNameError, r.Rcode)
	require.Empty(t, r.Answer)

	before := rs.pc.Stats().BytesReceived
	r, _, err = rs.lookup("pool.example.")
	require.NoError(t, err)
	size := rs.pc.Stats().BytesReceived - before
	require.False(t, r.Truncated)
	require.Len(t, r.Answer, len(zone["pool.example."]))
	for i, rr := range r.Answer {
		require.True(t, rr.(*dns.A).A.Equal(zone["pool.example."][i]), "record %d: %v", i, rr)
	}
	devs := rdma.Devices()
	require.NotEmpty(t, devs)
	require.Greater(t, size, uint64(devs[0].ActiveMTU), "an answer of more than one packet")

	m := new(dns.Msg)
	m.SetQuestion("pool.example.", dns.TypeA)
	r, _, err = rs.c.ExchangeWithConn(m, rs.conn)
	require.NoError(t, err)
	require.True(t, r.Truncated, "without EDNS0: 512 bytes at most")
	require.Less(t, len(r.Answer), len(zone["pool.example."]))

	for i := range 200 {
		r, _, err := rs.lookup("db.example.")
		require.NoError(t, err, "query %d", i)
		require.Len(t, r.Answer, 1, "query %d", i)
	}
}

// TestRun: the program as go run runs it, server and client in one
// process.
func TestRun(t *testing.T) {
	needDevice(t)
	require.NoError(t, run(net.JoinHostPort(testAddr, "0"), "", false, false))
}
