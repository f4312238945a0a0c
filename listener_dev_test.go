//go:build linux && cgo

package rdma_test

import (
	"context"
	"net"
	"syscall"
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

// TestListenerRefusalOffTheCMGoroutine: a refusal (here a full backlog's)
// is made off the process's CM goroutine, so a Refused hook that blocks
// holds up no other connection: a Dial to another listener connects
// meanwhile, where it waited for the hook before. The refused dialer gets
// its refusal once the hook returns, and the stats count it.
func TestListenerRefusalOffTheCMGoroutine(t *testing.T) {
	needDevice(t)
	baseConns, baseReg := deviceTotals()
	entered, release := make(chan struct{}, 1), make(chan struct{})
	lc := rdma.ListenConfig{Backlog: 1, Refused: func(net.Addr, error) {
		entered <- struct{}{}
		<-release
	}}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	other, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	echoes := serveEcho(other)
	released := false
	defer func() {
		if !released {
			close(release)
		}
		ln.Close()
		other.Close()
		echoes.Wait()
		waitDeviceTotals(t, baseConns, baseReg)
	}()

	queued, err := rdma.Dial("rdma", ln.Addr().String()) // takes the backlog
	require.NoError(t, err)
	defer queued.Close()
	refused := make(chan error, 1)
	go func() {
		_, err := rdma.Dial("rdma", ln.Addr().String())
		refused <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the second Dial was not refused")
	}

	// The Dial runs apart: where the hook holds up the CM goroutine, it
	// waits for the hook, and the test lets the hook go to end.
	start := time.Now()
	type dialed struct {
		c   net.Conn
		err error
	}
	dc := make(chan dialed, 1)
	go func() {
		c, err := (&rdma.Dialer{Timeout: 10 * time.Second}).Dial("rdma", other.Addr().String())
		dc <- dialed{c, err}
	}()
	select {
	case d := <-dc:
		require.NoError(t, d.err, "a Dial to another listener while the Refused hook blocks")
		t.Logf("a Dial while another listener's Refused hook blocks connected in %v", time.Since(start).Round(time.Millisecond))
		roundTrip(t, d.c, "while a refusal waits")
		require.NoError(t, d.c.Close())
	case <-time.After(10 * time.Second):
		close(release)
		released = true
		if d := <-dc; d.err == nil {
			d.c.Close()
		}
		t.Fatal("a Dial to another listener waited for the Refused hook")
	}

	close(release)
	released = true
	select {
	case err := <-refused:
		require.ErrorIs(t, err, syscall.EAGAIN, "a full backlog")
	case <-time.After(10 * time.Second):
		t.Fatal("the refused Dial got no answer after the hook returned")
	}
	require.Equal(t, uint64(1), ln.(*rdma.Listener).Stats().Refused[rdma.RefusedBacklog])
}
