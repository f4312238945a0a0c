package rdma

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRepostWithSend runs request-response traffic of varied sizes over
// the zero-cost provider, whose posts are made with the lock held as a
// NIC's: every receive a Read consumed goes back in the same call into C
// as the next send (repostWithSend), and the peer's credits still suffice
// for as many exchanges as the ring and the receives turn over many times,
// the large messages (posted without the shared call) included.
func TestRepostWithSend(t *testing.T) {
	z := newZCPair(t, Options{}, Options{})
	a, p := z.e[0].c, z.e[1].c
	rng := rand.New(rand.NewPCG(1, 2))
	out, in := make([]byte, 4<<10), make([]byte, 4<<10) // within the send ring: one goroutine writes, then reads
	exchange := func(from, to *Conn, n int) {
		for i := range out[:n] {
			out[i] = byte(rng.Uint32())
		}
		_, err := from.Write(out[:n])
		require.NoError(t, err)
		_, err = io.ReadFull(to, in[:n])
		require.NoError(t, err)
		require.True(t, bytes.Equal(out[:n], in[:n]), "%d bytes arrived changed", n)
	}
	for i := range 200 {
		exchange(a, p, 64)
		exchange(p, a, 64)
		if i%10 == 0 {
			exchange(a, p, 1+rng.IntN(len(out)))
			exchange(p, a, 1+rng.IntN(len(out)))
		}
	}
	s0 := z.calls()
	c0 := runtime.NumCgoCall()
	const rounds = 100
	for range rounds {
		exchange(a, p, 64)
		exchange(p, a, 64)
	}
	cgo := runtime.NumCgoCall() - c0
	st := z.calls().Sub(s0)
	// A message is a post (with the receives of the last Read) and a
	// poll that finds it; a credit message now and then adds its post.
	require.LessOrEqual(t, cgo, int64(4*rounds+8), "crossings into C for %d round trips (provider: %+v)", rounds, st)
	require.InDelta(t, st.SendWRs, st.RecvWRs, 2, "every consumed receive posted again (%+v)", st)
	for _, c := range []*Conn{a, p} {
		c.mu.Lock()
		require.Zero(t, c.rx.withSend, "a receive reported but not posted")
		c.mu.Unlock()
	}
}

// A parked Read or Write waits on its ready channel alone (waiter.alone):
// the deadline passing, a deadline moved earlier, and Close each wake it,
// in every mode, with the poller running as in a process. A wake that
// is lost hangs the test.
func TestParkedWaitsWake(t *testing.T) {
	for _, mode := range []PollMode{PollEvent, PollAdaptive} {
		t.Run(mode.String(), func(t *testing.T) {
			// The provider flushes nothing: the release of the Close
			// below waits for no completion (see zcPair.close), and is
			// over before the cleanup's close sets this again.
			defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
			drainTimeout = time.Millisecond
			opts := Options{SpinTime: time.Microsecond}
			parked := func(c *Conn, read bool) bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				if read {
					return c.rxParked
				}
				return c.wturn.held
			}
			waitParked := func(c *Conn, read bool) {
				for !parked(c, read) {
					time.Sleep(time.Millisecond)
				}
				time.Sleep(5 * time.Millisecond) // into the park
			}

			z := newZCPairMode(t, opts, opts, mode)
			z.runPoller(t)
			a, p := z.e[0].c, z.e[1].c
			buf := make([]byte, 64)

			// A Read parked with no deadline, then one set after it parked.
			errc := make(chan error, 1)
			go func() { _, err := a.Read(buf); errc <- err }()
			waitParked(a, true)
			require.NoError(t, a.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
			require.ErrorIs(t, <-errc, os.ErrDeadlineExceeded)

			// A far deadline moved to the past while the Read is parked.
			require.NoError(t, a.SetReadDeadline(time.Now().Add(time.Hour)))
			go func() { _, err := a.Read(buf); errc <- err }()
			waitParked(a, true)
			require.NoError(t, a.SetReadDeadline(time.Now().Add(-time.Second)))
			require.ErrorIs(t, <-errc, os.ErrDeadlineExceeded)

			// Data still wakes it, after a stale wake from the deadline.
			require.NoError(t, a.SetReadDeadline(time.Time{}))
			go func() { _, err := a.Read(buf); errc <- err }()
			waitParked(a, true)
			_, err := p.Write(buf)
			require.NoError(t, err)
			require.NoError(t, <-errc)

			// A Write parked for room (the peer reads nothing), woken by
			// its deadline; then one woken by Close.
			big := make([]byte, 1<<20)
			go func() { _, err := p.Write(big); errc <- err }()
			waitParked(p, false)
			require.NoError(t, p.SetWriteDeadline(time.Now().Add(20*time.Millisecond)))
			require.ErrorIs(t, <-errc, os.ErrDeadlineExceeded)

			// A Read parked when its connection is closed.
			go func() { _, err := p.Read(buf); errc <- err }()
			waitParked(p, true)
			require.NoError(t, p.Close())
			require.ErrorIs(t, <-errc, net.ErrClosed)
			releasing.Wait()
		})
	}
}
