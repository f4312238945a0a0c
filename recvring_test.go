package rdma

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// testRecvRing returns a ring of slots buffers of 8 bytes over mem, with
// each buffer filled with its slot's letter.
func testRecvRing(slots int) (recvRing, []byte) {
	r := newRecvRing(slots, 8, testBase, testLKey)
	mem := make([]byte, slots*8)
	for i := range mem {
		mem[i] = byte('a' + i/8)
	}
	return r, mem
}

func TestRecvRingPushFullAndFin(t *testing.T) {
	r, _ := testRecvRing(3)
	require.False(t, r.finAtHead())
	require.True(t, r.push(rxMsg{slot: 0, n: 8}))
	require.True(t, r.push(rxMsg{slot: 1, n: 8}))
	require.True(t, r.push(rxMsg{slot: 2, n: -1}))
	require.False(t, r.push(rxMsg{slot: 0, n: 1}), "more messages than receives: only a peer over its credits")
	require.False(t, r.finAtHead())
	r.consume(2, 0)
	require.True(t, r.finAtHead())
	require.True(t, r.valid(2))
	require.False(t, r.valid(3))
	require.False(t, r.valid(1<<63|2), "a send's id is no receive buffer")
}

func TestRecvRingCopyOutAcrossMessages(t *testing.T) {
	r, mem := testRecvRing(4)
	r.push(rxMsg{slot: 2, n: 5})
	r.push(rxMsg{slot: 0, n: 3})
	r.push(rxMsg{slot: 3, n: 8})

	// A 6-byte Read takes the first message and one byte of the second.
	head, avail, off := r.readable()
	b := make([]byte, 6)
	n, used, next, _ := r.copyOut(b, mem, head, avail, off, false)
	require.Equal(t, 6, n)
	require.Equal(t, 1, used)
	require.Equal(t, 1, next)
	require.Equal(t, "ccccca", string(b))
	r.consume(used, next)
	require.Len(t, r.repost, 1)
	require.Equal(t, ibv.RecvWR{ID: 2, Addr: testBase + 16, Len: 8, LKey: testLKey}, r.repost[0])

	// The next Read resumes inside the second message.
	head, avail, off = r.readable()
	b = make([]byte, 100)
	n, used, next, _ = r.copyOut(b, mem, head, avail, off, false)
	require.Equal(t, "aadddddddd", string(b[:n]))
	require.Equal(t, 2, used)
	require.Zero(t, next)
	r.consume(used, next)
	require.Zero(t, r.n)
}

func TestRecvRingCopyOutStopsAtFin(t *testing.T) {
	r, mem := testRecvRing(4)
	r.push(rxMsg{slot: 1, n: 2})
	r.push(rxMsg{slot: 2, n: -1})
	head, avail, off := r.readable()
	b := make([]byte, 10)
	n, used, _, _ := r.copyOut(b, mem, head, avail, off, false)
	require.Equal(t, "bb", string(b[:n]))
	require.Equal(t, 1, used, "the fin stays queued for the next Read's io.EOF")
}

func TestRecvRingCopyOutStopsAtWriteEnd(t *testing.T) {
	r, mem := testRecvRing(4)
	r.push(rxMsg{slot: 0, n: 8, more: true})
	r.push(rxMsg{slot: 1, n: 3})
	r.push(rxMsg{slot: 2, n: 8})
	b := make([]byte, 100)
	head, avail, off := r.readable()
	n, used, next, ended := r.copyOut(b, mem, head, avail, off, true)
	require.Equal(t, "aaaaaaaabbb", string(b[:n]), "the fragment and the end of the first Write")
	require.Equal(t, 2, used)
	require.Zero(t, next)
	require.True(t, ended)

	// A stream reader ignores the boundaries.
	n, used, _, ended = r.copyOut(b, mem, head, avail, off, false)
	require.Equal(t, 19, n)
	require.Equal(t, 3, used)
	require.False(t, ended)

	// A buffer that ends inside a message does not end the Write.
	n, _, next, ended = r.copyOut(b[:5], mem, head, avail, off, true)
	require.Equal(t, 5, n)
	require.Equal(t, 5, next)
	require.False(t, ended)
}

func TestRecvRingReadableBoundedByRepostRoom(t *testing.T) {
	r, _ := testRecvRing(ibv.MaxRecvBatch + 8)
	for i := range ibv.MaxRecvBatch + 8 {
		r.push(rxMsg{slot: int32(i), n: 8})
	}
	for i := range ibv.MaxRecvBatch - 3 {
		r.queueRepost(i)
	}
	_, avail, _ := r.readable()
	require.Equal(t, 3, avail, "a Read consumes no more buffers than can be queued without growing")
	require.False(t, r.repostFull())
}

func TestRecvRingPostReposts(t *testing.T) {
	r, _ := testRecvRing(4)
	q := &fakeQP{}
	n, err := r.postReposts(q)
	require.NoError(t, err)
	require.Zero(t, n)

	r.queueRepost(1)
	r.queueRepost(3)
	n, err = r.postReposts(q)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 2, r.posted)
	require.Equal(t, []uint64{1, 3}, []uint64{q.recvs[0].ID, q.recvs[1].ID})
	require.Empty(t, r.repost)

	require.NoError(t, r.postOne(q, 0))
	require.Equal(t, 3, r.posted)
	require.Equal(t, uint64(testBase), q.recvs[2].Addr)

	fail := errors.New("post failed")
	q.recvErr = fail
	r.queueRepost(2)
	_, err = r.postReposts(q)
	require.ErrorIs(t, err, fail)
	require.Empty(t, r.repost, "a failed post is not retried")
	require.ErrorIs(t, r.postOne(q, 2), fail)
	require.Equal(t, 3, r.posted)

	r.queueRepost(2)
	r.dropReposts()
	require.Empty(t, r.repost)
}

func TestRecvRingPostRepostsInChains(t *testing.T) {
	n := 2*ibv.MaxRecvBatch + 5
	r, _ := testRecvRing(n)
	q := &countingQP{}
	for i := range n {
		r.queueRepost(i)
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
	r.push(rxMsg{slot: 1, n: 8})
	r.push(rxMsg{slot: 3, n: 4})
	r.push(rxMsg{slot: 0, n: -1})
	r.off = 2
	r.discard()
	require.Zero(t, r.n)
	require.Zero(t, r.off)
	require.Len(t, r.repost, 2, "data buffers go back to the peer; the fin's does not")
	require.Equal(t, uint64(1), r.repost[0].ID)
	require.Equal(t, uint64(3), r.repost[1].ID)
}
