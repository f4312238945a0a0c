//go:build linux && cgo

package rdma_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// TestPooledQPAfterFailure: a connection fails (its peer breaks the
// protocol) with work requests still posted; its QP is drained, reset and
// kept, and the next connection on the device takes it and carries a
// stream both ways intact, and keeps it again when closed.
func TestPooledQPAfterFailure(t *testing.T) {
	needDevice(t)
	rdma.ReleaseIdleDevices() // an empty pool
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	accepted := acceptAll(ln)
	next := func() net.Conn {
		select {
		case c := <-accepted:
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("the listener accepted nothing in 10s")
			return nil
		}
	}

	p := dialRaw(t, ln.Addr().String())
	sc := next()
	p.requireSent(p.send(0x7f, 0, 0, nil))
	_, err = readAll(sc)
	require.ErrorIs(t, err, rdma.ErrProtocol)
	p.close()
	require.NoError(t, sc.Close())
	d := waitDevice(t, "the failed connection released", func(d rdma.DeviceStats, listed bool) bool { return listed && d.Connections == 0 })
	require.Equal(t, pooledQPs(1), d.PooledQPs, "the failed connection's QP is kept (the raw peer's is its own)")
	time.Sleep(rdma.QPCooling) // and rests before it serves again

	c, err := rdma.Dial("rdma", ln.Addr().String())
	require.NoError(t, err)
	s := next()
	d, _ = deviceStat()
	require.Zero(t, d.PooledQPs, "the new connection took the kept QP")
	require.Equal(t, 2, d.Connections)

	// A stream each way, long enough to grow the rings, checked byte for
	// byte.
	msg := bytes.Repeat([]byte("pooled QP, new peer. "), 200<<10/21)
	for _, dir := range []struct {
		name string
		w, r net.Conn
	}{{"dialer to server", c, s}, {"server to dialer", s, c}} {
		done := make(chan error, 1)
		go func() {
			_, err := dir.w.Write(msg)
			done <- err
		}()
		got := make([]byte, len(msg))
		require.NoError(t, dir.r.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := io.ReadFull(dir.r, got)
		require.NoError(t, err, dir.name)
		require.NoError(t, <-done, dir.name)
		require.True(t, bytes.Equal(msg, got), "%s: the stream arrived changed", dir.name)
	}
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	d = waitDevice(t, "both ends closed", func(d rdma.DeviceStats, listed bool) bool { return listed && d.Connections == 0 })
	require.Equal(t, pooledQPs(2), d.PooledQPs, "both ends' QPs are kept")
}

// TestDevicePoolBounds: with SetDevicePool(0, 0) a device keeps nothing
// of closed connections, and with the defaults back it keeps both ends'
// memory and QPs again.
func TestDevicePoolBounds(t *testing.T) {
	needDevice(t)
	defer rdma.SetDevicePool(rdma.SetDevicePool(0, 0))
	rdma.ReleaseIdleDevices()
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	wg := serveEcho(ln)
	defer wg.Wait()
	defer ln.Close()
	pair := func(what string) rdma.DeviceStats {
		c, err := rdma.Dial("rdma", ln.Addr().String())
		require.NoError(t, err)
		transfer(t, c, c, what)
		require.NoError(t, c.Close())
		return waitDevice(t, what, func(d rdma.DeviceStats, listed bool) bool { return listed && d.Connections == 0 })
	}
	d := pair("nothing kept")
	require.Zero(t, d.PooledBytes)
	require.Zero(t, d.PooledQPs)

	rdma.SetDevicePool(32<<20, 256)
	d = pair("the defaults again")
	require.Positive(t, d.PooledBytes)
	require.Equal(t, pooledQPs(2), d.PooledQPs)
}
