package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The layout of a connection's memory: the rings, their offsets and page
// alignment, the header slots, and the completion queue entries it needs.

func TestLayout(t *testing.T) {
	defaults, err := Options{}.normalized()
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		o    Options
		ring int
		big  int
	}{
		{"small", Options{BufferSize: 4096, RecvDepth: 8, SendDepth: 4}, 8192, 64 << 10},
		{"defaults", defaults, 128 << 10, 1 << 20},
		{"minimum", Options{BufferSize: minBufferSize, RecvDepth: 2, SendDepth: 2}, 4096, 4096},
		{"uneven", Options{BufferSize: 3000, RecvDepth: 3, SendDepth: 5}, 8192, 48 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLayout(tc.o)
			require.Equal(t, tc.o.BufferSize, l.bufSize, "BufferSize is the largest message, payload only")
			require.Equal(t, tc.o.RecvDepth+wire.CtrlDepth+wire.FinSlots, l.recvSlots)
			require.Equal(t, tc.o.SendDepth, l.sendSlots)
			require.Equal(t, wire.CtrlDepth+wire.FinSlots, l.ctrlSlots)
			require.Equal(t, min(tc.ring, initRing), l.ring, "a connection starts small: two of the largest messages, in whole pages, or 16 KiB")
			require.GreaterOrEqual(t, l.bigRing, 2*tc.o.BufferSize)
			require.Equal(t, tc.big, l.bigRing, "and grows to 16 of them, at most 1 MiB (at least two)")
			require.Zero(t, l.recvOff())
			require.Equal(t, l.ring, l.sendOff(), "the send ring follows the receive ring")
			require.Equal(t, 2*l.ring, l.size(), "the depths cost no memory")
			require.Zero(t, l.size()%4096)
			require.Zero(t, l.sendOff()%4096, "each ring is registered on its own: it starts on a page")
		})
	}
}

// A flush completes every work request a QP holds, so a connection's CQ
// reservation covers both its queues whole: every receive, and every
// send it may have posted at once, the keepalive probe and the drain
// marker included (all of them at once: a teardown's marker may follow a
// probe still unanswered, behind full data, control and one-sided
// shares).
func TestCQEntriesCoverEveryWorkRequest(t *testing.T) {
	for _, o := range []Options{{}, {SendDepth: 2, RecvDepth: 2}, {SendDepth: 1024, RecvDepth: 3}} {
		o, err := o.normalized()
		require.NoError(t, err)
		for _, l := range []layout{newLayout(o), newLayout(o).withHeaders()} {
			const probe, marker = 1, 1
			sends := l.dataWRs() + l.ctrlSlots + oneSidedDepth + probe + marker
			require.Equal(t, sends, l.sendQueue(), "%+v: the send queue holds them all", o)
			require.Equal(t, l.recvSlots+sends, l.cqEntries(), "%+v, headers %v", o, l.headers())
		}
	}
}

func TestLayoutWithHeaders(t *testing.T) {
	o := Options{BufferSize: 4096, RecvDepth: 16, SendDepth: 16}
	l := newLayout(o)
	h := l.withHeaders()
	require.False(t, l.headers())
	require.True(t, h.headers())
	require.Equal(t, l.recvSlots, h.hdrs, "a slot per receive")
	require.Equal(t, l.size()+page, h.size(), "the slots take whole pages after the send ring")
	require.Equal(t, 2*l.ring, h.hdrOff())
	require.LessOrEqual(t, h.hdrs*ibv.HeaderSlot, h.size()-h.hdrOff())
	// A data message is an RDMA WRITE and a SEND: the send queue and the
	// CQ hold a second work request for each.
	require.Equal(t, l.sendQueue()+o.SendDepth, h.sendQueue())
	require.Equal(t, l.cqEntries()+o.SendDepth, h.cqEntries())
}
