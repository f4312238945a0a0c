package rdma_test

import (
	"context"
	"net"
	"os"
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
	// TCP and blocks while TCP tries); its connection goes once the call
	// returns, when TCP gives up (the test bed allows one SYN retry:
	// measured 6.5 s, where two minutes is the kernel's default).
	waitDeviceFor(t, 20*time.Second, "the abandoned dials' connections gone", func(d rdma.DeviceStats, listed bool) bool {
		return !listed || d.Connections == 0
	})
}
