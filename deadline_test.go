package rdma_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

func TestReadDeadline(t *testing.T) {
	c, s := pair(t, nil, nil)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := c.Read(make([]byte, 10))
	oe := requireOpError(t, err, "read")
	require.True(t, oe.Timeout())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	// Still usable after a timeout.
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	transfer(t, s, c, "ok")
}

// TestDialContext: cancellation and deadlines during address resolution
// (10.77.0.2 is on the test bed's subnet but nobody answers for it; on
// iWARP, during rdma_connect, which connects TCP) and before dialing.
func TestDialContext(t *testing.T) {
	needDevice(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var d rdma.Dialer
	_, err := d.DialContext(ctx, "rdma", net.JoinHostPort(testAddr, "1"))
	requireOpError(t, err, "dial")
	require.ErrorIs(t, err, context.Canceled)

	silent := os.Getenv("RDMA_TEST_SILENT_ADDR")
	if silent == "" {
		t.Skip("set RDMA_TEST_SILENT_ADDR to an address on the RDMA subnet that nobody answers for")
	}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = d.DialContext(ctx, "rdma", net.JoinHostPort(silent, "7471"))
	oe := requireOpError(t, err, "dial")
	require.True(t, oe.Timeout(), "%v", err)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	t.Logf("dial to a silent address gave up after %v: %v", time.Since(start).Round(time.Millisecond), err)

	d.Timeout = 300 * time.Millisecond
	_, err = d.Dial("rdma", net.JoinHostPort(silent, "7471"))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)

	// On siw each Dial left its rdma_connect running (the call connects
	// TCP, blocking while TCP tries, after asking the port mapper, iwpmd,
	// if it runs); its connection goes once the call returns: when TCP
	// gives up, after 2^(r+1)-1 s for r SYN retries, besides iwpmd's
	// wait for the silent peer's mapper (the test bed allows one retry
	// and runs no iwpmd: measured 6.4 s, 16.4 s with iwpmd; the kernel's
	// default of 6 retries takes two minutes).
	limit := 40 * time.Second
	if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_syn_retries"); err == nil {
		if r, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && r < 10 {
			limit = max(limit, time.Duration(1<<(r+1))*time.Second+30*time.Second)
		}
	}
	waitDeviceFor(t, limit, "the abandoned dials' connections gone", func(d rdma.DeviceStats, listed bool) bool {
		return !listed || d.Connections == 0
	})
}
