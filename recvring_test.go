package rdma

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// testRecvRing returns the receive side of slots receives over mem, a ring
// of slots × 8 bytes whose every 8 bytes are filled with one letter.
func testRecvRing(slots int) (recvRing, []byte) {
	mem := make([]byte, slots*8)
	for i := range mem {
		mem[i] = byte('a' + i/8)
	}
	return newRecvRing(slots, mem), mem
}

func TestRecvRingPushFullAndFin(t *testing.T) {
	r, _ := testRecvRing(3)
	require.False(t, r.finAtHead())
	require.True(t, r.push(rxMsg{off: 0, n: 8}))
	require.True(t, r.push(rxMsg{off: 8, n: 8}))
	require.True(t, r.push(rxMsg{off: 16, n: -1}))
	require.False(t, r.push(rxMsg{off: 0, n: 1}), "more messages than receives: only a peer over its credits")
	require.False(t, r.finAtHead())
	r.consume(2, 0)
	require.True(t, r.finAtHead())
}

func TestRecvRingCopyOutAcrossMessages(t *testing.T) {
	r, _ := testRecvRing(4)
	r.push(rxMsg{off: 16, n: 5})
	r.push(rxMsg{off: 0, n: 3})
	r.push(rxMsg{off: 24, n: 8})

	// A 6-byte Read takes the first message and one byte of the second.
	head, avail, off := r.readable()
	b := make([]byte, 6)
	n, used, next, _ := r.copyOut(b, head, avail, off, false)
	require.Equal(t, 6, n)
	require.Equal(t, 1, used)
	require.Equal(t, 1, next)
	require.Equal(t, "ccccca", string(b))
	r.consume(used, next)
	require.Equal(t, 1, r.reposts, "the consumed message's receive is queued to be posted again")

	// The next Read resumes inside the second message.
	head, avail, off = r.readable()
	b = make([]byte, 100)
	n, used, next, _ = r.copyOut(b, head, avail, off, false)
	require.Equal(t, "aadddddddd", string(b[:n]))
	require.Equal(t, 2, used)
	require.Zero(t, next)
	r.consume(used, next)
	require.Zero(t, r.n)
}

func TestRecvRingCopyOutStopsAtFin(t *testing.T) {
	r, _ := testRecvRing(4)
	r.push(rxMsg{off: 8, n: 2})
	r.push(rxMsg{off: 16, n: -1})
	head, avail, off := r.readable()
	b := make([]byte, 10)
	n, used, _, _ := r.copyOut(b, head, avail, off, false)
	require.Equal(t, "bb", string(b[:n]))
	require.Equal(t, 1, used, "the fin stays queued for the next Read's io.EOF")
}

func TestRecvRingCopyOutStopsAtWriteEnd(t *testing.T) {
	r, _ := testRecvRing(4)
	r.push(rxMsg{off: 0, n: 8, more: true})
	r.push(rxMsg{off: 8, n: 3})
	r.push(rxMsg{off: 16, n: 8})
	b := make([]byte, 100)
	head, avail, off := r.readable()
	n, used, next, ended := r.copyOut(b, head, avail, off, true)
	require.Equal(t, "aaaaaaaabbb", string(b[:n]), "the fragment and the end of the first Write")
	require.Equal(t, 2, used)
	require.Zero(t, next)
	require.True(t, ended)

	// A stream reader ignores the boundaries.
	n, used, _, ended = r.copyOut(b, head, avail, off, false)
	require.Equal(t, 19, n)
	require.Equal(t, 3, used)
	require.False(t, ended)

	// A buffer that ends inside a message does not end the Write.
	n, _, next, ended = r.copyOut(b[:5], head, avail, off, true)
	require.Equal(t, 5, n)
	require.Equal(t, 5, next)
	require.False(t, ended)
}

func TestRecvRingPostReposts(t *testing.T) {
	r, _ := testRecvRing(4)
	q := &fakeQP{}
	n, err := r.postReposts(q)
	require.NoError(t, err)
	require.Zero(t, n)

	r.queueRepost()
	r.queueRepost()
	n, err = r.postReposts(q)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 2, r.posted)
	require.Zero(t, r.reposts)

	require.NoError(t, r.postOne(q))
	require.Equal(t, 3, r.posted)
	for _, wr := range q.recvs {
		require.Equal(t, ibv.RecvWR{ID: recvWRID}, wr, "every receive is zero-length: the payload is in the ring")
	}

	fail := errors.New("post failed")
	q.recvErr = fail
	r.queueRepost()
	_, err = r.postReposts(q)
	require.ErrorIs(t, err, fail)
	require.Zero(t, r.reposts, "a failed post is not retried")
	require.ErrorIs(t, r.postOne(q), fail)
	require.Equal(t, 3, r.posted)

	r.queueRepost()
	r.dropReposts()
	require.Zero(t, r.reposts)
}

func TestRecvRingPostRepostsInChains(t *testing.T) {
	n := 2*ibv.MaxRecvBatch + 5
	r, _ := testRecvRing(n)
	q := &countingQP{}
	for range n {
		r.queueRepost()
	}
	posted, err := r.postReposts(q)
	require.NoError(t, err)
	require.Equal(t, n, posted)
	require.Equal(t, []int{ibv.MaxRecvBatch, ibv.MaxRecvBatch, 5}, q.chains, "no chain longer than the C shim takes")
	require.Equal(t, n, r.posted)
}

// countingQP records the length of each chain of receives posted.
type countingQP struct{ chains []int }

func (q *countingQP) PostRecvs(wrs []ibv.RecvWR) error {
	if len(wrs) > ibv.MaxRecvBatch {
		return errors.New("chain too long")
	}
	q.chains = append(q.chains, len(wrs))
	return nil
}

func TestRecvRingDiscard(t *testing.T) {
	r, _ := testRecvRing(4)
	r.push(rxMsg{off: 8, n: 8})
	r.push(rxMsg{off: 24, n: 4})
	r.push(rxMsg{off: 0, n: -1})
	r.off = 2
	r.discard()
	require.Zero(t, r.n)
	require.Zero(t, r.off)
	require.Equal(t, 2, r.reposts, "data receives go back to the peer; the fin's does not")
}

// The receive side places messages as the sender does (wire.RingPlace) and
// fails what a sender that honours the credits never sends.
func TestRecvRingArrivedPlacesAndChecks(t *testing.T) {
	r := newRecvRing(8, nil)
	r.open(1024, 300) // span 1024, messages of at most 300 bytes

	m, err := r.arrived(300, false)
	require.NoError(t, err)
	require.Equal(t, rxMsg{off: 0, n: 300, end: 320}, m, "a message takes whole 64-byte units")
	m, err = r.arrived(300, true)
	require.NoError(t, err)
	require.Equal(t, rxMsg{off: 320, n: 300, more: true, end: 640}, m)
	m, err = r.arrived(100, false)
	require.NoError(t, err)
	require.Equal(t, rxMsg{off: 640, n: 100, end: 768}, m)
	// 768 + 300 > 1024 would not fit a largest message: the next one
	// starts at 0 whatever its own length, and the skipped bytes count.
	// Nothing has been read, so a message at 1024 (ring offset 0) would
	// overwrite unread bytes.
	_, err = r.arrived(10, false)
	require.ErrorContains(t, err, "overran the receive ring")
	require.Equal(t, uint64(768), r.tail, "a refused message is not placed")

	r.read = 320 // the first message was read
	m, err = r.arrived(10, false)
	require.NoError(t, err)
	require.Equal(t, rxMsg{off: 0, n: 10, end: 1088}, m, "placed at the ring's start, the skipped bytes used up")
	_, err = r.arrived(300, false)
	require.ErrorContains(t, err, "overran", "1088 + 320 - 320 > 1024: over the second message, unread")
	m, err = r.arrived(200, false)
	require.NoError(t, err, "1088 + 256 - 320 = 1024: up to the unread bytes, not over them")
	require.Equal(t, rxMsg{off: 64, n: 200, end: 1344}, m)

	_, err = r.arrived(0, false)
	require.ErrorContains(t, err, "empty")
	_, err = r.arrived(301, false)
	require.ErrorContains(t, err, "larger than the largest")
}

func TestRecvRingConsumeFreesRing(t *testing.T) {
	r := newRecvRing(4, nil)
	r.open(1024, 512)
	for _, n := range []uint32{100, 200} {
		m, err := r.arrived(n, false)
		require.NoError(t, err)
		require.True(t, r.push(m))
	}
	r.consume(1, 0)
	require.Equal(t, uint64(128), r.read)
	r.discard()
	require.Equal(t, uint64(384), r.read, "discarded messages free their bytes too")
}
