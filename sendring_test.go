package rdma

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// fakeQP records what is posted and fails on demand.
type fakeQP struct {
	mu      sync.Mutex     // posts run without the Conn's lock
	sends   [][]ibv.SendWR // each chain posted
	recvs   []ibv.RecvWR
	sendErr error
	recvErr error
	onSend  func() // runs inside PostSends, as the post would on rxe
}

func (q *fakeQP) PostSends(wrs []ibv.SendWR) error {
	if q.onSend != nil {
		q.onSend()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.sendErr != nil {
		return q.sendErr
	}
	q.sends = append(q.sends, append([]ibv.SendWR(nil), wrs...))
	return nil
}

// postCalls is how many chains were posted (ibv_post_send calls).
func (q *fakeQP) postCalls() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.sends)
}

func (q *fakeQP) PostRecvs(wrs []ibv.RecvWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.recvErr != nil {
		return q.recvErr
	}
	q.recvs = append(q.recvs, wrs...)
	return nil
}

// recvAt returns the i-th receive posted, if there is one.
func (q *fakeQP) recvAt(i int) (ibv.RecvWR, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if i >= len(q.recvs) {
		return ibv.RecvWR{}, false
	}
	return q.recvs[i], true
}

func (q *fakeQP) posted() []ibv.SendWR {
	q.mu.Lock()
	defer q.mu.Unlock()
	var all []ibv.SendWR
	for _, c := range q.sends {
		all = append(all, c...)
	}
	return all
}

const (
	testBase  = 0x10000
	testLKey  = 77
	testRAddr = 0x990000 // the peer's receive ring
	testRKey  = 88
)

// testSendRing returns a send side of depth messages in flight whose ring
// (of span bytes, messages of at most maxMsg) is at testBase, opened to a
// peer that granted window data credits.
func testSendRing(depth, span, maxMsg, window, maxInline int) sendRing {
	r := newSendRing(depth, wire.CtrlDepth+wire.FinSlots, make([]byte, span), testBase, testLKey, maxInline, false)
	r.open(testRAddr, testRKey, span, maxMsg, window, false)
	return r
}

func TestSendRingQueueData(t *testing.T) {
	r := testSendRing(4, 8192, 1024, 8, 128)
	for i := range 4 {
		require.Equal(t, 4-i, r.free())
		r.queue(wire.Header{Type: wire.MsgData, Credits: uint16(i)}, 100*(i+1), false)
	}
	require.Zero(t, r.free())
	wrs := r.take()
	require.Len(t, wrs, 4)
	off := 0
	for i, wr := range wrs {
		require.Equal(t, uint64(testBase+off), wr.Addr, "message %d", i)
		require.Equal(t, uint64(testRAddr+off), wr.RemoteAddr, "message %d: the same offset in the peer's ring", i)
		require.Equal(t, uint32(testRKey), wr.RKey)
		require.NotZero(t, wr.Flags&ibv.SendWriteImm, "data is an RDMA WRITE with immediate")
		off += (100*(i+1) + 63) &^ 63
		require.Equal(t, uint32(100*(i+1)), wr.Len)
		require.Equal(t, uint32(testLKey), wr.LKey)
		require.Equal(t, wire.Header{Type: wire.MsgData, Credits: uint16(i)}, wire.HeaderOf(wr.Imm))
		data, ctrl := parseSendWRID(wr.ID)
		require.Equal(t, uint32(i+1), data)
		require.Zero(t, ctrl)
	}
	require.NotZero(t, wrs[0].Flags&ibv.SendInline, "100 bytes fit inline")
	require.Zero(t, wrs[1].Flags&ibv.SendInline, "200 bytes do not")
	// Signaled every half queue: the second and the fourth.
	sig := []bool{false, true, false, true}
	for i, wr := range wrs {
		require.Equal(t, sig[i], wr.Flags&ibv.SendSignaled != 0, "send %d", i)
	}
	require.Empty(t, r.sends, "take leaves an empty queue")

	// Completions free the send queue, not the ring: that takes the
	// peer's credits. The fifth message follows the fourth in the ring.
	r.completed(wrs[3].ID)
	require.True(t, r.idle())
	require.Equal(t, 4, r.free())
	r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	require.Equal(t, uint64(testBase+off), r.take()[0].Addr)
}

func TestSendRingQueueFullRingSignals(t *testing.T) {
	r := testSendRing(8, 1<<16, 1024, 16, 0)
	for range 3 {
		r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	}
	r.completed(sendWRID(3, 0)) // three done; lastSig still 0
	r.lastSig = 3
	for range 7 {
		r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	}
	require.Equal(t, 1, r.free())
	r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	wrs := r.take()
	require.NotZero(t, wrs[len(wrs)-1].Flags&ibv.SendSignaled, "the send that fills the queue is signaled, so a waiting writer wakes")
}

// sigOut says whether a signaled send is posted and not yet complete: the
// completion cork waits for. signalLast signals the last prepared send.
func TestSendRingSigOut(t *testing.T) {
	r := testSendRing(8, 8192, 1024, 8, 128) // signals every fourth
	require.False(t, r.sigOut())
	r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	r.take()
	require.False(t, r.sigOut(), "an unsignaled send completes silently")

	r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	r.signalLast()
	require.False(t, r.sigOut(), "prepared is not posted")
	wrs := r.take()
	require.NotZero(t, wrs[0].Flags&ibv.SendSignaled)
	require.True(t, r.sigOut())
	r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	r.take()
	require.True(t, r.sigOut(), "until its completion")
	r.completed(wrs[0].ID)
	require.False(t, r.sigOut())

	// One signaled anyway is left as it is; an empty queue has nothing to
	// signal.
	for r.queue(wire.Header{Type: wire.MsgData}, 1, false); r.sends[len(r.sends)-1].Flags&ibv.SendSignaled == 0; {
		r.queue(wire.Header{Type: wire.MsgData}, 1, false) // until one is signaled: the fourth since the last
	}
	require.Len(t, r.sends, 3, "the fourth data message since the signaled one")
	wr := r.sends[2]
	r.signalLast()
	require.Equal(t, wr, r.sends[2])
	r.take()
	require.True(t, r.sigOut())
	r.signalLast()
	require.Empty(t, r.sends)
}

func TestSendRingControl(t *testing.T) {
	r := testSendRing(4, 1<<16, 1024, 16, 64)
	r.queue(wire.Header{Type: wire.MsgCredit}, 0, false)
	r.queue(wire.Header{Type: wire.MsgCredit}, 0, false)
	r.queue(wire.Header{Type: wire.MsgFin}, 0, true)
	r.queue(wire.Header{Type: wire.MsgCredit}, 0, true)
	wrs := r.take()
	require.Equal(t, 4, r.ctrlInFlight())
	require.Zero(t, wrs[0].Flags&ibv.SendSignaled)
	require.NotZero(t, wrs[1].Flags&ibv.SendSignaled, "half the control credits in flight")
	require.NotZero(t, wrs[2].Flags&ibv.SendSignaled, "the fin")
	require.NotZero(t, wrs[3].Flags&ibv.SendSignaled, "everything after the fin: Close waits for it")
	for _, wr := range wrs {
		require.Zero(t, wr.Len, "control messages carry no payload")
		require.Zero(t, wr.Flags&(ibv.SendInline|ibv.SendWriteImm), "control messages are SENDs")
	}
	r.completed(wrs[1].ID)
	require.Equal(t, 2, r.ctrlInFlight())
	require.False(t, r.idle())

	// The drain marker retires everything posted.
	m := r.marker()
	require.NotZero(t, m.Flags&ibv.SendSignaled)
	require.Zero(t, m.Len)
	r.completed(m.ID)
	require.True(t, r.idle())
}

func TestSendRingControlSequenceWraps(t *testing.T) {
	r := testSendRing(4, 1<<16, 1024, 16, 0)
	// The id keeps 31 bits of the control sequence number.
	r.ctrlSeq, r.ctrlDone = 1<<31-1, 1<<31-1
	r.queue(wire.Header{Type: wire.MsgCredit}, 0, false)
	r.queue(wire.Header{Type: wire.MsgCredit}, 0, false)
	wrs := r.take()
	r.completed(wrs[1].ID)
	require.Equal(t, uint32(1<<31+1), r.ctrlDone)
	require.True(t, r.idle())
}

func TestSendRingTakeDoubleBuffers(t *testing.T) {
	r := testSendRing(4, 1<<16, 1024, 16, 0)
	r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	first := r.take()
	r.queue(wire.Header{Type: wire.MsgCredit}, 0, false)
	second := r.take()
	require.Equal(t, uint32(1), first[0].Len, "queueing more does not touch the batch being posted")
	require.Equal(t, uint32(0), second[0].Len)
	require.Equal(t, cap(r.sends), wire.CtrlDepth+wire.FinSlots+4+1, "no growth: appending never allocates (the 1: a keepalive probe)")
}

func TestPostChain(t *testing.T) {
	q := &fakeQP{}
	wrs := make([]ibv.SendWR, 2*ibv.MaxSendBatch+3)
	for i := range wrs {
		wrs[i].ID = uint64(i)
	}
	posts, err := postChain(q, wrs)
	require.NoError(t, err)
	require.Equal(t, 3, posts)
	require.Len(t, q.sends, 3)
	require.Len(t, q.sends[0], ibv.MaxSendBatch)
	require.Len(t, q.sends[2], 3)
	require.Equal(t, wrs, q.posted())

	fail := errors.New("post failed")
	q = &fakeQP{sendErr: fail}
	posts, err = postChain(q, wrs)
	require.ErrorIs(t, err, fail)
	require.Zero(t, posts)
	posts, err = postChain(q, nil)
	require.NoError(t, err)
	require.Zero(t, posts)
}

// The placement rule at the sender: where messages go, when the ring's
// end makes one start over at 0, and how the credits' FIFO of message
// ends frees ring bytes.
func TestRingTxPlacementAndRoom(t *testing.T) {
	var r ringTx
	r.open(1024, 300, 4)
	require.Equal(t, 300, r.room(), "an empty ring has room for a largest message")
	require.Zero(t, r.sent(300))
	require.Equal(t, 320, r.sent(300), "messages take whole 64-byte units")
	require.Equal(t, 640, r.sent(100))
	require.Equal(t, uint64(768), r.tail)

	// 768 + 300 > 1024: the next message starts at 0 (running count
	// 1024) whatever its length, and nothing is consumed yet.
	start, room := r.at(r.tail, r.acked)
	require.Equal(t, uint64(1024), start)
	require.Zero(t, room, "the ring is full of bytes the peer has not read")

	r.ack(1) // the peer consumed the first message
	require.Equal(t, uint64(320), r.acked)
	require.Equal(t, 300, r.room())
	require.Zero(t, r.sent(10), "placed at the ring's start")
	require.Equal(t, uint64(1088), r.tail)
	start, room = r.at(r.tail, r.acked)
	require.Equal(t, uint64(1088), start)
	require.Equal(t, 256, room, "up to the second message, which is unread")

	r.ack(3)
	require.Equal(t, uint64(1088), r.acked, "every credit back: the ring is empty")
	require.Equal(t, 300, r.room())
	require.Zero(t, r.n)
	r.ack(1)
	require.Equal(t, uint64(1088), r.acked, "no message outstanding: nothing to free")
}

// Wherever the tail is, an empty ring has room for a largest message: a
// writer that waits for room never waits for nothing.
func TestRingTxEmptyRingHasRoom(t *testing.T) {
	for _, g := range []struct{ span, maxMsg int }{{1024, 512}, {1024, 500}, {576, 288}, {4096, 1}, {131072, 65536}} {
		var r ringTx
		r.open(g.span, g.maxMsg, 1)
		for t0 := 0; t0 < 3*g.span; t0 += wire.RingAlign {
			r.tail, r.acked = uint64(t0), uint64(t0)
			start, room := r.at(r.tail, r.acked)
			require.Equal(t, g.maxMsg, room, "span %d, max %d, tail %d", g.span, g.maxMsg, t0)
			require.LessOrEqual(t, r.offset(start)+g.maxMsg, g.span, "a message never crosses the ring's end")
		}
	}
}

// A peer that grants more receives than the ring has 64-byte units gets
// no more FIFO entries than messages that can be outstanding: each takes
// 64 bytes of ring at least.
func TestRingTxFIFOBoundedByRing(t *testing.T) {
	var r ringTx
	r.open(1024, 64, 0xffff)
	require.Len(t, r.ends, 16)
	for i := range 16 {
		_, room := r.at(r.tail, r.acked)
		require.Positive(t, room, "message %d", i)
		r.sent(1)
	}
	_, room := r.at(r.tail, r.acked)
	require.Zero(t, room, "sixteen one-byte messages fill a 1 KiB ring")
	r.ack(16)
	require.Equal(t, r.tail, r.acked)
}

// What a Write does next, as the send ring plans it.
func TestSendRingPlanWrite(t *testing.T) {
	const maxMsg, span = 64, 256
	r := testSendRing(4, span, maxMsg, 8, 0)

	// Credits, an empty ring: fill as many messages as the Write needs,
	// credits and the send queue allow.
	require.Equal(t, writePlan{step: stepFill, slots: 2}, r.planWrite(8, 100, false, false))
	require.Equal(t, writePlan{step: stepFill, slots: 4}, r.planWrite(8, 1000, false, false), "bounded by the send queue")
	require.Equal(t, writePlan{step: stepFill, slots: 1}, r.planWrite(1, 1000, false, false), "bounded by credits")
	// No credit: one message, the pending one, gathers.
	require.Equal(t, writePlan{step: stepFill, slots: 1}, r.planWrite(0, 1000, false, false))

	// A pending message as large as the ring lets it be goes at once
	// with a credit; without one the Write waits for the peer.
	r.setPending(maxMsg, false)
	require.Equal(t, writePlan{step: stepSendPending}, r.planWrite(1, 10, false, false))
	require.Equal(t, writePlan{step: stepWait, noRoom: true}, r.planWrite(0, 10, false, false))
	// To a message-oriented peer a new Write waits for the earlier
	// one's pending bytes to go, whatever the credits.
	r.setPending(10, true)
	require.Equal(t, writePlan{step: stepWait}, r.planWrite(1, 10, false, true))
	require.Equal(t, writePlan{step: stepWait, noRoom: true}, r.planWrite(0, 10, false, true))
	// ... but the Write that left them continues them.
	require.Equal(t, writePlan{step: stepFill, slots: 1}, r.planWrite(1, 10, true, true))
	r.setPending(0, false)

	// A full send queue (the ring has room): wait, not for the peer.
	r = testSendRing(4, 4*span, maxMsg, 8, 0)
	for range 4 {
		r.queue(wire.Header{Type: wire.MsgData}, 1, false)
	}
	require.Equal(t, writePlan{step: stepWait}, r.planWrite(8, 10, false, false))
	r.completed(r.sends[3].ID)

	// The peer has not consumed the ring: with credits, no message is cut
	// short for lack of room; the Write waits for the room.
	r = testSendRing(8, span, maxMsg, 8, 0)
	for range 4 {
		r.queue(wire.Header{Type: wire.MsgData}, maxMsg, false)
	}
	require.Equal(t, writePlan{step: stepWait, noRoom: true}, r.planWrite(4, 10, false, false))
}

// What a ReadFrom does next.
func TestSendRingPlanReadFrom(t *testing.T) {
	const maxMsg, span = 64, 256
	r := testSendRing(4, span, maxMsg, 8, 0)
	step, _ := r.planReadFrom(1)
	require.Equal(t, stepFill, step, "room for a whole message: read into it")
	r.setPending(5, false)
	step, _ = r.planReadFrom(1)
	require.Equal(t, stepSendPending, step, "pending bytes go before the source may block")
	step, noCredit := r.planReadFrom(0)
	require.Equal(t, stepWait, step)
	require.True(t, noCredit, "waiting for the peer's credit")
	r.setPending(0, false)
	for range 4 {
		r.queue(wire.Header{Type: wire.MsgData}, maxMsg, false)
	}
	step, noCredit = r.planReadFrom(1)
	require.Equal(t, stepWait, step)
	require.True(t, noCredit, "the peer's ring is full")

	n, more := r.pending()
	require.Zero(t, n)
	require.False(t, more)
	r.setPending(3, true)
	r.finQueued = true
	r.dropPending()
	n, _ = r.pending()
	require.Zero(t, n)
	require.False(t, r.finQueued, "a fin behind dropped data goes with it")
}
