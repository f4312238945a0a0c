package rdma_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// deviceStat returns the totals of the test device's entry in rdma.Devices,
// and whether it is listed.
func deviceStat() (rdma.DeviceStats, bool) {
	rdma.WaitReleases()
	for _, d := range rdma.Devices() {
		return d, true // the test bed has one device
	}
	return rdma.DeviceStats{}, false
}

// pooledQPs is how many QPs the device's pool keeps for n closed
// connection ends: none on iWARP, which keeps none.
func pooledQPs(n int) int {
	if siw() {
		return 0
	}
	return n
}

// waitDevice waits up to 5 s for the device's entry to satisfy ok.
func waitDevice(t *testing.T, what string, ok func(d rdma.DeviceStats, listed bool) bool) rdma.DeviceStats {
	t.Helper()
	return waitDeviceFor(t, 5*time.Second, what, ok)
}

// waitDeviceFor waits up to limit for the device's entry to satisfy ok.
func waitDeviceFor(t *testing.T, limit time.Duration, what string, ok func(d rdma.DeviceStats, listed bool) bool) rdma.DeviceStats {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		d, listed := deviceStat()
		if ok(d, listed) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: device still %+v (listed %v)", what, d, listed)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClosedConnectionsMemoryIsReused checks that a closed connection's
// registered memory goes back to its device's pool and the next
// connection takes it from there instead of registering its own, and that
// a device nobody uses any more gives everything back shortly after.
func TestClosedConnectionsMemoryIsReused(t *testing.T) {
	needDevice(t)
	rdma.ReleaseIdleDevices()
	arena := registered(t, rdma.Options{})
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	roundTrip := func() {
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			accepted <- c
		}()
		c, err := rdma.Dial("rdma", ln.Addr().String())
		require.NoError(t, err)
		s := <-accepted
		require.NotNil(t, s)
		_, err = c.Write([]byte("ping"))
		require.NoError(t, err)
		b := make([]byte, 4)
		_, err = io.ReadFull(s, b)
		require.NoError(t, err)
		d, _ := deviceStat()
		require.Equal(t, 2, d.Connections)
		require.Equal(t, 2*arena, d.RegisteredBytes)
		require.NoError(t, c.Close())
		require.NoError(t, s.Close())
	}
	roundTrip()
	d := waitDevice(t, "both ends closed", func(d rdma.DeviceStats, listed bool) bool { return listed && d.Connections == 0 })
	require.Equal(t, 2*arena, d.PooledBytes, "both ends' memory is kept")
	require.Equal(t, pooledQPs(1), d.PooledQPs, "and the dialed end's QP (an accept creates its own)")
	require.Zero(t, d.RegisteredBytes)
	time.Sleep(rdma.QPCooling) // the kept QP rests before it serves again
	roundTrip()
	d = waitDevice(t, "both ends closed again", func(d rdma.DeviceStats, listed bool) bool { return listed && d.Connections == 0 })
	require.Equal(t, 2*arena, d.PooledBytes, "the second pair reused the first pair's memory")
	require.Equal(t, pooledQPs(1), d.PooledQPs, "and the dial took the kept QP: two would be kept otherwise")
	// Unused, the device (its CQ, poller goroutine and pooled memory) goes.
	waitDevice(t, "idle device", func(_ rdma.DeviceStats, listed bool) bool { return !listed })
}

// TestConcurrentDials opens 20 connections at once against one listener,
// as an HTTP client with 20 workers does: every one is set up, accepted and
// usable, and closing the listener while another burst is in progress
// leaves nothing behind (TestMain checks the goroutines and verbs objects).
func TestConcurrentDials(t *testing.T) {
	needDevice(t)
	const n = 20
	lc := rdma.ListenConfig{Backlog: n}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := rdma.Dial("rdma", ln.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			msg := []byte("hello")
			if _, err := c.Write(msg); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadFull(c, msg); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, uint64(n), ln.(*rdma.Listener).Stats().Accepted)

	// A second burst, cut short by Close: the dials fail or succeed, and
	// whatever was being set up is torn down.
	dials := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			d := rdma.Dialer{Timeout: 10 * time.Second}
			c, err := d.Dial("rdma", ln.Addr().String())
			if err == nil {
				c.Close()
			}
			dials <- err
		}()
	}
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, ln.Close())
	for i := 0; i < n; i++ {
		<-dials
	}
}
