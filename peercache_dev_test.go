package rdma_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of the peer cache: a PacketConn closed and opened again on
// the same address and port (with a QP of another number) is reached
// again by a peer that wrote to the one before it.

// peerRefreshBound is docs/datagrams.md's bound: a destination not heard
// from for 5 s is resolved again on its next write.
const peerRefreshBound = 5 * time.Second

// TestPacketPeerReopened: A writes to B; B closes and B1 opens on B's
// address and port. After B1 wrote to A, A's next datagram reaches B1
// (the source QP of B1's datagram made A resolve it again). Then B1
// closes and B2 opens, and never writes to A: A's datagrams reach B2
// within the bound, plus a resolution.
func TestPacketPeerReopened(t *testing.T) {
	needDevice(t)
	needNotSiw(t, "siw has no UD (TestPacketIWARP)")
	a, b := listenPacketPair(t)
	defer a.Close()
	addr := b.LocalAddr().String()
	buf := make([]byte, 256)
	read := func(pc *rdma.PacketConn, d time.Duration) ([]byte, string, error) {
		require.NoError(t, pc.SetReadDeadline(time.Now().Add(d)))
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return nil, "", err
		}
		return buf[:n], from.String(), nil
	}
	reopen := func(old *rdma.PacketConn) *rdma.PacketConn {
		require.NoError(t, old.Close())
		pc, err := rdma.ListenPacket("rdma", addr)
		require.NoError(t, err, "the port again")
		require.Equal(t, addr, pc.LocalAddr().String())
		return pc
	}

	// A resolves B.
	heard := time.Now()
	_, err := a.WriteTo([]byte("to b"), b.LocalAddr())
	require.NoError(t, err)
	got, from, err := read(b, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "to b", string(got))
	require.Equal(t, a.LocalAddr().String(), from)

	// B1 writes first.
	b1 := reopen(b)
	_, err = b1.WriteTo([]byte("from b1"), a.LocalAddr())
	require.NoError(t, err)
	got, from, err = read(a, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "from b1", string(got))
	require.Equal(t, addr, from)
	sent := time.Now()
	_, err = a.WriteTo([]byte("reply"), b1.LocalAddr())
	require.NoError(t, err)
	got, _, err = read(b1, 2*time.Second)
	require.NoError(t, err, "A's first datagram after B1 wrote did not reach B1")
	require.Equal(t, "reply", string(got))
	t.Logf("after B1 wrote: A's next datagram reached it in %v", time.Since(sent).Round(time.Microsecond))
	require.Less(t, time.Since(heard), peerRefreshBound, "too slow to tell the source QP from the bound")
	heard = time.Now() // B1's datagram: the last A heard from that address

	// B2 never writes to A.
	b2 := reopen(b1)
	defer b2.Close()
	start := time.Now()
	limit := start.Add(peerRefreshBound + 3*time.Second)
	writes := 0
	for {
		require.True(t, time.Now().Before(limit), "no datagram of %d reached B2 in %v", writes, time.Since(start))
		msg := fmt.Sprintf("one-way %d", writes)
		_, err := a.WriteTo([]byte(msg), b2.LocalAddr())
		require.NoError(t, err)
		writes++
		got, from, err := read(b2, 50*time.Millisecond)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(got, []byte("one-way ")), "%q", got)
		require.Equal(t, a.LocalAddr().String(), from)
		break
	}
	t.Logf("B2 never wrote: reached after %v (%v after A last heard from the address), %d writes",
		time.Since(start).Round(time.Millisecond), time.Since(heard).Round(time.Millisecond), writes)
	require.Zero(t, b2.Stats().DatagramsSent)
	// Its datagrams keep coming.
	_, err = a.WriteTo([]byte("again"), b2.LocalAddr())
	require.NoError(t, err)
	for {
		got, _, err := read(b2, 2*time.Second)
		require.NoError(t, err)
		if string(got) == "again" {
			break
		}
	}
}
