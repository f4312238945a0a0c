package rdma_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// On the device: a stream grows the receiver's ring (and the sender's send
// ring to match), the data arrives intact across the switch, and once idle
// both give the big rings back, in the connections' counters and in the
// device's.
func TestRingGrowthOnDevice(t *testing.T) {
	// No shrink until the stream has been checked (a slow run must not
	// find the connection idle midway).
	defer rdma.SetShrinkIdle(time.Hour)()
	// The acceptor's Tracer sees each move of its receive ring.
	var srv traceLog
	d, a := pair(t, &rdma.ListenConfig{Tracer: srv.tracer()}, nil)
	ac := a.(*rdma.Conn)
	small, err := rdma.Options{}.RegisteredMemory()
	require.NoError(t, err)
	grown, err := rdma.Options{}.GrownRegisteredMemory()
	require.NoError(t, err)
	idle := small
	if siw() {
		idle += 8 << 10 // the header slots (see RegisteredMemory)
	}
	require.Equal(t, idle, d.Stats().RegisteredBytes)
	require.Equal(t, idle, ac.Stats().RegisteredBytes)
	before, _ := deviceStat()

	const total, size = 8 << 20, 64 << 10
	src := make([]byte, total)
	for i := range src {
		src[i] = byte(i * 7 / 5)
	}
	stream := func(what string) {
		errc := make(chan error, 1)
		go func() {
			for off := 0; off < total; off += size {
				if _, err := d.Write(src[off : off+size]); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		got := make([]byte, total)
		_, err := io.ReadFull(a, got)
		require.NoError(t, err, what)
		require.NoError(t, <-errc, what)
		require.True(t, bytes.Equal(src, got), "%s: the stream arrives intact across the ring switch", what)
	}
	stream("first stream")

	sa := ac.Stats()
	require.Equal(t, uint64(1), sa.RingGrowths, "the receiver grew its ring")
	half := (grown - small) / 2
	require.Equal(t, idle+half, sa.RegisteredBytes, "the receiver: its arena and a big receive ring")
	require.Equal(t, idle+half, d.Stats().RegisteredBytes, "the sender: its arena and a big send ring")
	if ds, ok := deviceStat(); ok {
		require.Equal(t, before.RegisteredBytes+2*half, ds.RegisteredBytes, "the device counts both")
	}

	rdma.SetShrinkIdle(50 * time.Millisecond)
	rdma.TickRingIdle(ac) // the next tick in 50 ms
	require.Eventually(t, func() bool {
		return ac.Stats().RingShrinks == 1 && ac.Stats().RegisteredBytes == idle && d.Stats().RegisteredBytes == idle
	}, 10*time.Second, 10*time.Millisecond, "idle, both give the big rings back")
	// The device's count follows once the worker has deregistered them.
	waitDevice(t, "the device's registered bytes back to what they were", func(ds rdma.DeviceStats, listed bool) bool {
		return !listed || ds.RegisteredBytes == before.RegisteredBytes
	})
	// The device keeps the big rings' memory, mapped, for the next ones.
	if ds, ok := deviceStat(); ok {
		require.Equal(t, before.PooledBytes+2*half, ds.PooledBytes, "the device keeps both big rings' memory")
	}
	// The connection works on in the small rings, and grows again, into
	// that memory.
	transfer(t, d, a, "after the shrink")
	transfer(t, a, d, "and back")
	rdma.SetShrinkIdle(time.Hour)
	stream("second stream")
	require.Equal(t, uint64(2), ac.Stats().RingGrowths, "the receiver grew its ring again")
	require.Eventually(t, func() bool { return len(srv.of("RingResized")) == 3 }, 5*time.Second, time.Millisecond)
	for i, grew := range []bool{true, false, true} {
		info := srv.of("RingResized")[i].(rdma.RingResizedInfo)
		require.Equal(t, grew, info.Grew, "move %d", i)
		require.Equal(t, ac.LocalAddr(), info.Local)
		require.Equal(t, ac.RemoteAddr(), info.Remote)
		if grew {
			require.Equal(t, half, info.Size, "the big receive ring")
		} else {
			require.Less(t, info.Size, half, "the small one")
		}
	}
	if ds, ok := deviceStat(); ok {
		require.Equal(t, before.PooledBytes, ds.PooledBytes, "the second growth took the kept memory")
		require.Equal(t, before.RegisteredBytes+2*half, ds.RegisteredBytes, "and registered it")
	}
}
