package rdma

import "github.com/goverbs/rdma/internal/ibv"

// recvPoster posts a chain of receives: the QP, or a fake in tests.
type recvPoster interface {
	PostRecvs(wrs []ibv.RecvWR) error
}

// rxMsg is an arrived message waiting for Read.
type rxMsg struct {
	slot int32
	n    int32 // payload bytes; -1 for the fin
	more bool  // a fragment: the peer's Write goes on in the next message
}

// recvRing is a connection's receive side: the buffers' work requests, the
// messages that arrived and wait for Read (in arrival order, the fin
// last), how much of the head one was read, and the consumed buffers
// waiting to be posted again. It has no lock; Conn.mu guards it, except
// the payload of queued messages, which a Read copies out without it (the
// completion side only appends behind them).
type recvRing struct {
	slots   int    // receive buffers, posted at arena offset 0
	bufSize int    // bytes per buffer
	base    uint64 // the arena's address for the NIC
	lkey    uint32

	q      []rxMsg // a ring of slots entries
	head   int
	n      int
	off    int          // bytes of the head message already read
	repost []ibv.RecvWR // consumed buffers not yet posted again
	one    [1]ibv.RecvWR
	posted int // receives on the QP
}

func newRecvRing(slots, bufSize int, base uint64, lkey uint32) recvRing {
	return recvRing{
		slots: slots, bufSize: bufSize, base: base, lkey: lkey,
		q:      make([]rxMsg, slots),
		repost: make([]ibv.RecvWR, 0, ibv.MaxRecvBatch),
	}
}

// bufOff is the arena offset of receive buffer slot.
func (r *recvRing) bufOff(slot int) int { return slot * r.bufSize }

func (r *recvRing) wr(slot int) ibv.RecvWR {
	return ibv.RecvWR{ID: uint64(slot), Addr: r.base + uint64(r.bufOff(slot)), Len: uint32(r.bufSize), LKey: r.lkey}
}

// valid reports whether a receive completion's id names one of our buffers.
func (r *recvRing) valid(slot uint64) bool { return slot < uint64(r.slots) }

// push queues an arrived message; it reports false when the queue is full,
// which only a peer that sent more than its credits allow can cause.
func (r *recvRing) push(m rxMsg) bool {
	if r.n == len(r.q) {
		return false
	}
	r.q[(r.head+r.n)%len(r.q)] = m
	r.n++
	return true
}

// finAtHead reports whether the next message is the fin: everything before
// it has been read.
func (r *recvRing) finAtHead() bool { return r.n > 0 && r.q[r.head].n < 0 }

// queueRepost queues a consumed buffer to be posted again.
func (r *recvRing) queueRepost(slot int) { r.repost = append(r.repost, r.wr(slot)) }

// repostFull reports whether no more buffers can be queued for reposting
// before the queued ones are posted.
func (r *recvRing) repostFull() bool { return len(r.repost) == cap(r.repost) }

// postReposts posts the queued buffers in chains of at most
// ibv.MaxRecvBatch and returns how many it posted. The queue is emptied
// whatever happens: a failed post means a failed connection.
func (r *recvRing) postReposts(p recvPoster) (int, error) {
	posted := 0
	var err error
	for wrs := r.repost; len(wrs) > 0 && err == nil; {
		k := min(len(wrs), ibv.MaxRecvBatch)
		if err = p.PostRecvs(wrs[:k]); err == nil {
			posted += k
		}
		wrs = wrs[k:]
	}
	r.repost = r.repost[:0]
	r.posted += posted
	return posted, err
}

// dropReposts forgets the queued buffers: no one will post them.
func (r *recvRing) dropReposts() { r.repost = r.repost[:0] }

// postOne posts one buffer again at once, on its own.
func (r *recvRing) postOne(p recvPoster, slot int) error {
	r.one[0] = r.wr(slot)
	if err := p.PostRecvs(r.one[:]); err != nil {
		return err
	}
	r.posted++
	return nil
}

// readable returns what a Read may copy without the lock: from the head,
// avail messages (no more than the repost queue has room for), starting
// off bytes into the first.
func (r *recvRing) readable() (head, avail, off int) {
	return r.head, min(r.n, cap(r.repost)-len(r.repost)), r.off
}

// copyOut copies into b the payload of up to avail messages from head on,
// starting off bytes into the first, from mem (the arena), stopping at a
// fin and, when messages is set, after the end of one of the peer's
// Writes. It returns the bytes copied, how many messages were used up, how
// far into the next one the copy got, and whether it stopped at the end of
// a Write. It only reads the queue's entries from head to head+avail,
// which the completion side never touches, so it runs without the lock.
func (r *recvRing) copyOut(b, mem []byte, head, avail, off int, messages bool) (n, used, next int, ended bool) {
	for used < avail && n < len(b) {
		m := r.q[(head+used)%len(r.q)]
		if m.n < 0 {
			break
		}
		start := r.bufOff(int(m.slot))
		k := copy(b[n:], mem[start+off:start+int(m.n)])
		n += k
		if off += k; off < int(m.n) {
			break
		}
		off = 0
		used++
		if messages && !m.more {
			return n, used, 0, true
		}
	}
	return n, used, off, false
}

// consume drops used messages from the head, queueing their buffers to be
// posted again, and records how far into the next one Read got.
func (r *recvRing) consume(used, off int) {
	for range used {
		r.queueRepost(int(r.q[r.head].slot))
		r.head = (r.head + 1) % len(r.q)
		r.n--
	}
	r.off = off
}

// discard drops every queued message (CloseRead), queueing the data
// buffers to be posted again; the fin's buffer is never reposted.
func (r *recvRing) discard() {
	for ; r.n > 0; r.n-- {
		if m := r.q[r.head]; m.n >= 0 {
			r.queueRepost(int(m.slot))
		}
		r.head = (r.head + 1) % len(r.q)
	}
	r.off = 0
}
