package rdma

import (
	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// sendPoster posts a chain of sends: the QP, or a fake in tests.
type sendPoster interface {
	PostSends(wrs []ibv.SendWR) error
}

// ringTx is the sender's view of the peer's receive ring, which its own
// send ring mirrors byte for byte: where the next message goes (tail),
// how far the peer has consumed (acked), and the end of every message the
// peer has not given a credit back for yet (ends, oldest first). Data
// credits come back in the order the peer consumed the messages, so each
// one returned frees the ring up to the end of the oldest message
// outstanding. It is plain arithmetic, with no lock (Conn.mu guards it).
type ringTx struct {
	span   int // ring bytes both sides use (see wire.RingGeometry); 0 until the handshake is done
	maxMsg int
	tail   uint64 // running count: where the messages sent so far end
	acked  uint64 // running count: what the peer has consumed
	ends   []uint64
	head   int
	n      int
	oldOut int // messages sent into the ring before this one, not yet given a credit back for
}

// open sets the geometry agreed with the peer; window is the peer's
// RecvDepth. No more messages can be outstanding than it grants, nor than
// the ring holds (each takes wire.RingAlign bytes at least), which bounds what
// a peer's hello makes us allocate.
func (r *ringTx) open(span, maxMsg, window int) {
	r.span, r.maxMsg = span, maxMsg
	r.ends = make([]uint64, min(window, span/wire.RingAlign))
}

// at returns where a message that follows running count t starts, and how
// large it may be while the peer has consumed up to acked: the largest
// message, unless that would overwrite bytes the peer has not read (then
// less, possibly nothing).
func (r *ringTx) at(t, acked uint64) (start uint64, room int) {
	start = wire.RingPlace(t, r.span, r.maxMsg)
	used := start - acked
	if used >= uint64(r.span) {
		return start, 0
	}
	return start, min(r.maxMsg, r.span-int(used))
}

// room is how large the message at the tail may be now.
func (r *ringTx) room() int {
	_, n := r.at(r.tail, r.acked)
	return n
}

// tightAfter reports whether, once a message of n bytes is at the tail
// (none for n = 0), the message after it might not fit: the ring's room
// would be less than the largest message. Before the geometry is known
// it says so too.
func (r *ringTx) tightAfter(n int) bool {
	if r.span == 0 {
		return true
	}
	t := r.tail
	if n > 0 {
		t = wire.RingEnd(wire.RingPlace(t, r.span, r.maxMsg), n)
	}
	_, room := r.at(t, r.acked)
	return room < r.maxMsg
}

// offset is a running count's offset in the ring.
func (r *ringTx) offset(t uint64) int { return int(t % uint64(r.span)) }

// sent records a message of n bytes at the tail, which the caller checked
// room for, and returns its ring offset.
func (r *ringTx) sent(n int) int {
	start := wire.RingPlace(r.tail, r.span, r.maxMsg)
	r.tail = wire.RingEnd(start, n)
	r.ends[(r.head+r.n)%len(r.ends)] = r.tail
	r.n++
	return r.offset(start)
}

// restart moves to another ring of the peer's, of span bytes with
// messages of at most maxMsg: the running counts start at 0 there. The
// messages outstanding in the old ring come back first (the peer consumes
// in order); their credits free nothing in the new one.
func (r *ringTx) restart(span, maxMsg, window int) {
	r.oldOut += r.n
	r.tail, r.acked, r.head, r.n = 0, 0, 0, 0
	r.span, r.maxMsg = span, maxMsg
	if k := min(window, span/wire.RingAlign); k != len(r.ends) {
		r.ends = make([]uint64, k)
	}
}

// ack takes k data credits back: the peer has consumed the k oldest
// messages outstanding. The ledger has checked that k is no more than were
// sent (ledger.received).
func (r *ringTx) ack(k int) {
	d := min(k, r.oldOut)
	r.oldOut -= d
	for k -= d; k > 0 && r.n > 0; k-- {
		r.acked = r.ends[r.head]
		r.head = (r.head + 1) % len(r.ends)
		r.n--
	}
}

// sendRing is a connection's send side below the credits: the send ring
// (ringTx), the sequence numbers of posted messages and of those known
// complete, the message that gathers Writes at the tail while no credit
// allows it out (pending), and the queue of prepared work requests with
// the double buffer that lets one goroutine post them while others queue
// more. It has no lock; Conn.mu guards it, except the batch being posted,
// which is the poster's alone.
//
// Sequence numbers count posted messages, data and control apart; the
// done numbers trail them as signaled completions come back. A send's
// work request id carries both numbers reached by that send (RC completes
// sends in order), so a signaled completion retires every unsignaled send
// before it. Data messages in flight in the send queue are bounded by
// depth (SendDepth); the ring's bytes are free again when the peer has
// consumed them (ringTx), which implies our NIC has read them.
type sendRing struct {
	ring      ringTx
	depth     int    // data messages in flight in the send queue
	buf       []byte // the send ring
	base      uint64 // its address for the NIC
	lkey      uint32
	raddr     uint64 // the peer's receive ring, for RDMA WRITE
	rkey      uint32
	maxInline int  // bytes the QP sends inline
	headers   bool // the peer takes headers as SEND payloads (wire.HelloHeaders)

	dataSeq, dataDone uint32
	ctrlSeq, ctrlDone uint32
	lastSig           uint32 // dataSeq at the last signaled send
	postedSig         uint32 // lastSig when the last batch was taken for posting
	probeSeq          uint32 // ctrlSeq of the last keepalive probe

	pendLen   int  // bytes of the message gathering at the tail, waiting for a credit
	pendMore  bool // the pending bytes are a fragment: their Write goes on
	filling   bool // a Write or ReadFrom is copying into the ring without the lock; the release waits for it
	finQueued bool // the fin waits behind pending data

	sends    []ibv.SendWR // prepared, not yet posted
	carries  bool         // a header in sends returns credits or acknowledgements
	spare    []ibv.SendWR // the other half of the double buffer
	posting  bool         // a goroutine is posting; others only queue
	draining bool         // the teardown owns the send queue: nothing more is posted
}

// newSendRing returns the send side of depth data messages in flight, with
// the send ring buf at NIC address base; ctrl is how many control messages
// may be in flight besides (and a keepalive probe: see QPSendDepth).
func newSendRing(depth, ctrl int, buf []byte, base uint64, lkey uint32, maxInline int, headers bool) sendRing {
	// Room for everything that can be queued at once, so appending never
	// allocates: with headers as SENDs a data message is two work
	// requests.
	n := depth + ctrl + 1
	if headers {
		n += depth
	}
	return sendRing{
		depth: depth, buf: buf, base: base, lkey: lkey, maxInline: maxInline,
		sends: make([]ibv.SendWR, 0, n),
		spare: make([]ibv.SendWR, 0, n),
	}
}

// open connects the send side to the peer's receive ring; headers says
// the peer takes headers as SEND payloads.
func (r *sendRing) open(raddr uint64, rkey uint32, span, maxMsg, window int, headers bool) {
	r.raddr, r.rkey, r.headers = raddr, rkey, headers
	r.ring.open(span, maxMsg, window)
}

// switchTo sends from m into the peer's ring d from the next message on,
// at a message boundary (nothing pending, no Write filling).
func (r *sendRing) switchTo(m *ringMem, d wire.RingDesc, maxMsg, window int) {
	r.buf, r.base, r.lkey = m.buf[:d.Size], m.base, m.lkey
	r.raddr, r.rkey = d.Addr, d.RKey
	r.ring.restart(int(d.Size), maxMsg, window)
}

// free is how many more data messages the send queue takes.
func (r *sendRing) free() int { return r.depth - int(r.dataSeq-r.dataDone) }

// pendOff is the send ring's offset of the message at the tail (pending or
// about to be).
func (r *sendRing) pendOff() int {
	return r.ring.offset(wire.RingPlace(r.ring.tail, r.ring.span, r.ring.maxMsg))
}

// ctrlInFlight is how many control messages are posted and not known
// complete.
func (r *sendRing) ctrlInFlight() int { return int(r.ctrlSeq - r.ctrlDone) }

// queue prepares a message: a data message whose n payload bytes are at
// the tail of the send ring (the caller checked the ring's room and the
// send queue's), written to the same offset of the peer's ring, or a
// control message (credit, fin), which has none.
// finSent says the write side is shut (the fin is queued, or went):
// every control message from then on is signaled, because Close waits for
// all of them.
func (r *sendRing) queue(h wire.Header, n int, finSent bool) {
	var addr, raddr uint64
	var rkey uint32
	// Signal every half queue (so send queue entries come back while the
	// rest are in flight) and whenever the queue's data share becomes full
	// (so a waiting writer is always woken).
	flags := 0
	if wire.IsData(h.Type) {
		off := r.ring.sent(n)
		addr, raddr, rkey = r.base+uint64(off), r.raddr+uint64(off), r.rkey
		flags |= ibv.SendWriteImm
		r.dataSeq++
		if r.dataSeq-r.lastSig >= uint32(max(1, r.depth/2)) || r.free() == 0 {
			flags |= ibv.SendSignaled
		}
	} else {
		r.ctrlSeq++
		// A switch is signaled: its completion says the NIC is done with
		// the send ring before it.
		if h.Type == wire.MsgFin || h.Type == wire.MsgSwitched || finSent || r.ctrlInFlight() >= wire.CtrlDepth/2 {
			flags |= ibv.SendSignaled
		}
	}
	if flags&ibv.SendSignaled != 0 {
		r.lastSig = r.dataSeq
	}
	if n > 0 && n <= r.maxInline {
		flags |= ibv.SendInline
	}
	if h.Credits > 0 || h.CtrlAck > 0 {
		r.carries = true
	}
	if r.headers {
		id := sendWRID(r.dataSeq, r.ctrlSeq)
		if n > 0 && n <= ibv.HeaderData && ibv.HeaderLen+n <= r.maxInline {
			// Small: the payload rides in the header's SEND, one work
			// request where a WRITE and a SEND would be two.
			r.sends = append(r.sends, ibv.SendWR{ID: id, Addr: addr, Len: uint32(n), LKey: r.lkey,
				Flags: int32(flags&ibv.SendSignaled | ibv.SendHeader | ibv.SendHeaderData), Imm: h.Imm()})
			return
		}
		// The payload by plain RDMA WRITE, unsignaled (the header's
		// completion retires it), then the header by SEND.
		if n > 0 {
			r.sends = append(r.sends, ibv.SendWR{ID: id, Addr: addr, Len: uint32(n), LKey: r.lkey,
				Flags: int32(flags&ibv.SendInline | ibv.SendWrite), RemoteAddr: raddr, RKey: rkey})
		}
		r.sends = append(r.sends, ibv.SendWR{ID: id, Len: uint32(n), Flags: int32(flags&ibv.SendSignaled | ibv.SendHeader), Imm: h.Imm()})
		return
	}
	r.sends = append(r.sends, ibv.SendWR{
		ID:         sendWRID(r.dataSeq, r.ctrlSeq),
		Addr:       addr,
		Len:        uint32(n),
		LKey:       r.lkey,
		Flags:      int32(flags),
		Imm:        h.Imm(),
		RemoteAddr: raddr,
		RKey:       rkey,
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

// sigOut reports whether a signaled data send is posted (or being posted)
// and its completion not yet seen: that completion will come whatever the
// peer does. A signaled control message leaves dataSeq as it was, so one
// whose data messages have all completed does not count: that only makes
// cork post sooner.
func (r *sendRing) sigOut() bool { return int32(r.postedSig-r.dataDone) > 0 }

// signalLast makes the last prepared work request signaled, if it is not
// yet: its completion retires every send before it, as any signaled
// send's does.
func (r *sendRing) signalLast() {
	if len(r.sends) == 0 {
		return
	}
	wr := &r.sends[len(r.sends)-1]
	if wr.Flags&ibv.SendSignaled == 0 {
		wr.Flags |= ibv.SendSignaled
		r.lastSig = r.dataSeq
	}
}

// idle reports whether everything posted has completed.
func (r *sendRing) idle() bool { return r.dataDone == r.dataSeq && r.ctrlDone == r.ctrlSeq }

// marker is the teardown's drain marker: a signaled, empty work request
// behind everything posted, whose (flushed) completion retires all
// earlier sends, signaled or not. It is a zero-length RDMA WRITE, which
// every transport has (iWARP has no SEND with immediate data).
func (r *sendRing) marker() ibv.SendWR {
	return ibv.SendWR{ID: sendWRID(r.dataSeq, r.ctrlSeq), LKey: r.lkey, Flags: ibv.SendSignaled | ibv.SendEmptyWrite}
}

// take hands the queued work requests to the poster and starts an empty
// queue in the other half of the double buffer.
func (r *sendRing) take() []ibv.SendWR {
	batch := r.sends
	r.postedSig = r.lastSig
	r.sends, r.spare = r.spare[:0], batch
	r.carries = false
	return batch
}

// postChain posts wrs in chains of at most ibv.MaxSendBatch, stopping at
// the first failure, and returns how many chains it posted.
func postChain(p sendPoster, wrs []ibv.SendWR) (int, error) {
	posts := 0
	for len(wrs) > 0 {
		k := min(len(wrs), ibv.MaxSendBatch)
		if err := p.PostSends(wrs[:k]); err != nil {
			return posts, err
		}
		posts++
		wrs = wrs[k:]
	}
	return posts, nil
}

// What a Write or ReadFrom does next, as sendRing plans it (planWrite,
// planReadFrom): the send path asks, and does.
type sendStep uint8

const (
	// stepSendPending: the pending message goes now (the ring lets it
	// grow no more, or a ReadFrom must not block on top of it).
	stepSendPending sendStep = iota
	// stepWait: wait for completions or credits.
	stepWait
	// stepFill: copy into up to slots messages at the tail.
	stepFill
)

// writePlan is planWrite's answer.
type writePlan struct {
	step   sendStep
	noRoom bool // stepWait because the peer is behind (no credit, or its ring is full): counted as a credit wait
	slots  int  // stepFill: messages to fill
}

// planWrite plans a Write's next step with left bytes of it still to go
// (started: some are accepted already), credits data credits granted by
// the peer, to a peer whose Reads are message-oriented if msgWrite. The
// pending message at the tail may already hold bytes. With credits, the
// Write fills as many messages as credits, the send queue and the ring
// allow, to be posted as one chain (one ibv_post_send); without, it adds
// to the pending message. For a message-oriented peer a Write's bytes
// never share a message with an earlier Write's still pending.
func (r *sendRing) planWrite(credits, left int, started, msgWrite bool) writePlan {
	free := r.free()
	room := r.ring.room()
	grow := max(0, room-r.pendLen)
	waitMsg := msgWrite && !started && r.pendLen > 0
	if grow == 0 && r.pendLen > 0 && credits > 0 && free > 0 && !waitMsg {
		// The pending message is as large as the ring lets it be now: it
		// goes, whatever hold would say.
		return writePlan{step: stepSendPending}
	}
	// With credits, a message is not cut short because the peer has yet
	// to read part of the ring: more, smaller messages cost more than
	// waiting, and the room comes (an empty ring has room for a largest
	// message). Without, the pending message gathers in whatever room
	// there is. Either way the peer is what the Write waits for.
	short := credits > 0 && room < min(r.pendLen+left, r.ring.maxMsg)
	noRoom := grow == 0 || short || (credits == 0 && waitMsg)
	if free == 0 || noRoom || waitMsg {
		return writePlan{step: stepWait, noRoom: noRoom}
	}
	slots := 1
	if credits > 0 {
		slots = min(credits, free, ibv.MaxSendBatch, (r.pendLen+left+r.ring.maxMsg-1)/r.ring.maxMsg)
	}
	return writePlan{step: stepFill, slots: slots}
}

// planReadFrom plans a ReadFrom's next step. Each Read of its source may
// fill a whole message: the ring has room for one whenever the peer has
// consumed everything, so waiting for that room never waits for nothing.
// The source's Read may block for as long as it likes (a socket waiting
// for the next request), so pending bytes go first, whatever hold would
// say, and without a credit for them ReadFrom waits for one rather than
// block in the source on top of them. noCredit says a wait is for the peer
// (counted as a credit wait).
func (r *sendRing) planReadFrom(credits int) (step sendStep, noCredit bool) {
	if r.pendLen > 0 && credits > 0 && r.free() > 0 {
		return stepSendPending, false
	}
	noRoom := r.ring.room() < r.ring.maxMsg
	if r.free() == 0 || r.pendLen > 0 || noRoom {
		return stepWait, noRoom || (r.pendLen > 0 && credits == 0)
	}
	return stepFill, false
}

// pending returns the pending message's length and whether its Write goes
// on in the next message.
func (r *sendRing) pending() (n int, more bool) { return r.pendLen, r.pendMore }

// setPending records n bytes (a fragment if more) as the pending message.
func (r *sendRing) setPending(n int, more bool) { r.pendLen, r.pendMore = n, more }

// dropPending forgets the pending message and a fin queued behind it
// (Close's linger gave up on them, or the memory is going).
func (r *sendRing) dropPending() { r.pendLen, r.pendMore, r.finQueued = 0, false, false }
