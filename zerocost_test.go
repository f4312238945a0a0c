package rdma

import (
	"bytes"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"

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
