//go:build linux && cgo

package rdma_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// TestListenerCloseVanishedDialers: connections queued for an Accept that
// never comes, whose dialers' QPs stopped answering without a disconnect
// (their hosts vanished, say), are closed by Listener.Close without a
// linger each: Close returns before a single linger (3 s) is over, where
// it took one after another, 24 s for these 8, and everything is given
// back.
func TestListenerCloseVanishedDialers(t *testing.T) {
	needDevice(t)
	const n = 8
	baseConns, baseReg := deviceTotals()
	ln, err := (&rdma.ListenConfig{Backlog: 2 * n}).Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	rl := ln.(*rdma.Listener)
	peers := make([]*rawPeer, n)
	for i := range peers {
		peers[i] = dialRaw(t, ln.Addr().String())
	}
	require.Eventually(t, func() bool { return rl.Stats().Accepted == n }, 10*time.Second, 10*time.Millisecond,
		"all %d connections established and queued", n)
	for _, p := range peers {
		// Packets to a QP in the error state are dropped: the server's
		// fin would never be acknowledged.
		require.NoError(t, p.id.ErrorQP())
	}
	start := time.Now()
	require.NoError(t, ln.Close())
	took := time.Since(start)
	t.Logf("Listener.Close with %d unaccepted connections whose dialers vanished: %v", n, took.Round(time.Millisecond))
	require.Less(t, took, 3*time.Second, "Close lingered for the unaccepted connections")
	waitDeviceTotals(t, baseConns, baseReg)
}
