package rdma

import "github.com/goverbs/rdma/internal/ibv"

// sendPoster posts a chain of sends: the QP, or a fake in tests.
type sendPoster interface {
	PostSends(wrs []ibv.SendWR) error
}

// sendRing is a connection's send side below the credits: the ring of send
// buffers, the sequence numbers of posted messages and of those known
// complete, the buffer that gathers Writes while no credit allows it out
// (pending), and the queue of prepared work requests with the double
// buffer that lets one goroutine post them while others queue more. It
// has no lock; Conn.mu guards it, except the batch being posted, which is
// the poster's alone.
//
// Sequence numbers count posted messages, data and control apart; the
// done numbers trail them as signaled completions come back. A send's
// work request id carries both numbers reached by that send (RC completes
// sends in order), so a signaled completion retires every unsignaled send
// before it.
type sendRing struct {
	slots     int    // send buffers
	bufSize   int    // bytes per buffer
	off       int    // arena offset of the first send buffer
	base      uint64 // the arena's address for the NIC
	lkey      uint32
	maxInline int // bytes the QP sends inline

	dataSeq, dataDone uint32
	ctrlSeq, ctrlDone uint32
	lastSig           uint32 // dataSeq at the last signaled send
	probeSeq          uint32 // ctrlSeq of the last keepalive probe

	pendLen   int  // bytes waiting in the buffer at dataSeq for a credit
	pendMore  bool // the pending bytes are a fragment: their Write goes on
	filling   bool // a Write is copying into buffers without the lock
	finQueued bool // the fin waits behind pending data

	sends    []ibv.SendWR // prepared, not yet posted
	spare    []ibv.SendWR // the other half of the double buffer
	posting  bool         // a goroutine is posting; others only queue
	draining bool         // the teardown owns the send queue: nothing more is posted
}

// newSendRing returns a ring of slots buffers of bufSize bytes at arena
// offset off; ctrl is how many control messages may be in flight besides
// (and a keepalive probe: see QPSendDepth).
func newSendRing(slots, ctrl, bufSize, off int, base uint64, lkey uint32, maxInline int) sendRing {
	// Room for everything that can be queued at once, so appending never
	// allocates.
	n := slots + ctrl + 1
	return sendRing{
		slots: slots, bufSize: bufSize, off: off, base: base, lkey: lkey, maxInline: maxInline,
		sends: make([]ibv.SendWR, 0, n),
		spare: make([]ibv.SendWR, 0, n),
	}
}

// free is how many send buffers are not in flight (the first may hold
// pending bytes).
func (r *sendRing) free() int { return r.slots - int(r.dataSeq-r.dataDone) }

// bufOff is the arena offset of the buffer that data message seq uses.
func (r *sendRing) bufOff(seq uint32) int {
	return r.off + int(seq%uint32(r.slots))*r.bufSize
}

// ctrlInFlight is how many control messages are posted and not known
// complete.
func (r *sendRing) ctrlInFlight() int { return int(r.ctrlSeq - r.ctrlDone) }

// queue prepares a message: a data message whose n payload bytes are in the
// next send buffer, or a control message (credit, fin), which has none.
// finSent says the write side is shut (the fin is queued, or went):
// every control message from then on is signaled, because Close waits for
// all of them.
func (r *sendRing) queue(h header, n int, finSent bool) {
	var addr uint64
	// Signal every half ring (so buffers come back while the rest are in
	// flight) and whenever a ring becomes full (so a waiting writer is
	// always woken).
	flags := 0
	if h.typ == msgData || h.typ == msgDataMore {
		addr = r.base + uint64(r.bufOff(r.dataSeq))
		r.dataSeq++
		if r.dataSeq-r.lastSig >= uint32(max(1, r.slots/2)) || r.free() == 0 {
			flags |= ibv.SendSignaled
		}
	} else {
		r.ctrlSeq++
		if h.typ == msgFin || finSent || r.ctrlInFlight() >= ctrlDepth/2 {
			flags |= ibv.SendSignaled
		}
	}
	if flags&ibv.SendSignaled != 0 {
		r.lastSig = r.dataSeq
	}
	if n > 0 && n <= r.maxInline {
		flags |= ibv.SendInline
	}
	r.sends = append(r.sends, ibv.SendWR{
		ID:    sendWRID(r.dataSeq, r.ctrlSeq),
		Addr:  addr,
		Len:   uint32(n),
		LKey:  r.lkey,
		Flags: int32(flags),
		Imm:   h.imm(),
	})
}

// queueProbe prepares a keepalive probe: a signaled zero-length RDMA
// WRITE, which the peer's NIC acknowledges without consuming a receive or
// touching memory. It counts as a control message in flight (its
// completion retires the sends before it like any other), and at most one
// is out at a time (probeOut), for which the send queue has a slot of its
// own.
func (r *sendRing) queueProbe() {
	r.ctrlSeq++
	r.probeSeq = r.ctrlSeq
	r.lastSig = r.dataSeq
	r.sends = append(r.sends, ibv.SendWR{
		ID:    sendWRID(r.dataSeq, r.ctrlSeq),
		LKey:  r.lkey,
		Flags: ibv.SendSignaled | ibv.SendEmptyWrite,
	})
}

// probeOut reports whether the last keepalive probe is posted (or queued)
// and not known complete.
func (r *sendRing) probeOut() bool { return int32(r.probeSeq-r.ctrlDone) > 0 }

// completed retires every send up to the one a signaled completion names
// (the ids are ours: the peer cannot forge them).
func (r *sendRing) completed(wrid uint64) {
	data, ctrl := parseSendWRID(wrid)
	r.dataDone = data
	// The id keeps 31 bits of the control sequence number.
	r.ctrlDone = r.ctrlSeq - (r.ctrlSeq-ctrl)&0x7fffffff
}

// idle reports whether everything posted has completed.
func (r *sendRing) idle() bool { return r.dataDone == r.dataSeq && r.ctrlDone == r.ctrlSeq }

// marker is the teardown's drain marker: a signaled, empty send behind
// everything posted, whose (flushed) completion retires all earlier sends,
// signaled or not.
func (r *sendRing) marker() ibv.SendWR {
	return ibv.SendWR{ID: sendWRID(r.dataSeq, r.ctrlSeq), Addr: r.base, LKey: r.lkey, Flags: ibv.SendSignaled}
}

// take hands the queued work requests to the poster and starts an empty
// queue in the other half of the double buffer.
func (r *sendRing) take() []ibv.SendWR {
	batch := r.sends
	r.sends, r.spare = r.spare[:0], batch
	return batch
}

// postChain posts wrs in chains of at most ibv.MaxSendBatch, stopping at
// the first failure.
func postChain(p sendPoster, wrs []ibv.SendWR) error {
	for len(wrs) > 0 {
		k := min(len(wrs), ibv.MaxSendBatch)
		if err := p.PostSends(wrs[:k]); err != nil {
			return err
		}
		wrs = wrs[k:]
	}
	return nil
}
