package rdma

import (
	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// recvPoster posts a chain of receives: the QP, or a fake in tests.
type recvPoster interface {
	PostRecvs(wrs []ibv.RecvWR) error
}

// rxMsg is an arrived message waiting for Read.
type rxMsg struct {
	off  int32  // where its payload is in the receive ring
	n    int32  // payload bytes; -1 for the fin, 0 for a ring offer (nothing to read)
	more bool   // a fragment: the peer's Write goes on in the next message
	ep   uint8  // the ring it is in: recvRing.buf[ep]
	end  uint64 // the ring's running count after it: consumed up to here once it is read
}

// recvRing is a connection's receive side: the receive ring the peer
// writes into, the messages that arrived and wait for Read (in arrival
// order, the fin last), how much of the head one was read, and the
// receives consumed and waiting to be posted again. Every receive is
// zero-length: it only takes a message's immediate data (its header)
// and length, the payload being in the ring already. The ring's running
// counts follow the peer's placement (wire.RingPlace): tail is where the
// messages that arrived end, read where the consumed ones do, and a
// message that would end more than a ring beyond read overwrote unread
// bytes, which a peer that honours the credits never does. It has no
// lock; Conn.mu guards it, except the payload of queued messages, which a
// Read copies out without it (the completion side only appends behind
// them).
//
// When the peer moves to another ring (switchTo), the messages queued in
// the old one stay queued, in order, and the running counts start again
// at 0 in the new one; the old ring is drained once the last of them is
// consumed (oldLeft).
type recvRing struct {
	buf      [2][]byte // the ring, and the one before it while messages in it are queued
	ep       uint8     // buf[ep] is the ring the peer writes into
	oldLeft  int       // messages queued in buf[ep^1]
	drained  bool      // the old ring's last message was consumed: its memory may go
	span     int       // ring bytes both sides use; 0 until the handshake is done
	maxMsg   int
	tail     uint64
	read     uint64
	reported uint64 // read, as far as the peer has been told (credits reported)

	q       []rxMsg // a ring of slots entries
	head    int
	n       int
	off     int // bytes of the head message already read
	reposts int // consumed receives not yet posted again
	// withSend: consumed receives already reported to the peer in a
	// queued header, posted with the send that carries it (see
	// Conn.repostWithSend).
	withSend int
	wrs      [ibv.MaxRecvBatch]ibv.RecvWR
	posted   int // receives on the QP
	// Header slots, on a transport without immediate data (hdrs > 0):
	// each receive takes its message's header into a slot of its own,
	// the next one round the slots (hdrNext), and its id names the slot.
	// Receives complete in the order they were posted, and never more are
	// posted than there are slots, so a slot is posted again only once its
	// header was read.
	hdrs    int
	hdrOff  int    // arena offset of slot 0
	hdrBase uint64 // its NIC address
	hdrLKey uint32
	hdrNext int
	// discarding is set once CloseRead has dropped the queue while
	// holding the read side: from then on arrivals are dropped at once.
	discarding bool
	// copying: a Read or WriteTo is copying queued payload out of the
	// ring without the lock; the release waits for it to end.
	copying bool
}

func newRecvRing(slots int, ring []byte) recvRing {
	r := recvRing{q: make([]rxMsg, slots)}
	r.buf[0] = ring
	for i := range r.wrs {
		r.wrs[i] = ibv.RecvWR{ID: recvWRID}
	}
	return r
}

// useHeaders gives every receive a header slot: n slots at arena offset
// off, NIC address base under lkey.
func (r *recvRing) useHeaders(n, off int, base uint64, lkey uint32) {
	r.hdrs, r.hdrOff, r.hdrBase, r.hdrLKey = n, off, base, lkey
}

// prepare readies the first k receives of wrs for posting: zero-length
// receives are all alike, receives with header slots take the next k.
func (r *recvRing) prepare(k int) []ibv.RecvWR {
	if r.hdrs > 0 {
		for i := range k {
			s := r.hdrNext
			r.wrs[i] = ibv.RecvWR{ID: uint64(s), Addr: r.hdrBase + uint64(s*ibv.HeaderSlot), Len: ibv.HeaderSlot, LKey: r.hdrLKey}
			if r.hdrNext++; r.hdrNext == r.hdrs {
				r.hdrNext = 0
			}
		}
	}
	return r.wrs[:k]
}

// message decodes what a successful receive completion brings: the
// message's header, the length of its payload, and the payload itself when
// it came in the receive's slot rather than in the ring, checking that it
// came the way its type must. With immediate data, a data message is an
// RDMA WRITE with immediate (the completion's length is the payload's) and
// a control message a SEND with immediate and no payload. Without (header
// slots), every message is a SEND of the header, which gives the payload's
// length. A data message's payload either went ahead by RDMA WRITE, which
// the SEND's completion implies has landed (RC places a WRITE before a
// later SEND completes), or, when small, follows the header in the SEND
// (at most ibv.HeaderData bytes): then it is returned, to be copied where
// the WRITE would have put it.
func (r *recvRing) message(wc ibv.WC, mem []byte) (wire.Header, uint32, []byte, error) {
	var h wire.Header
	var n uint32
	if r.hdrs == 0 {
		if wc.WRID != recvWRID || wc.Flags&ibv.WCWithImm == 0 {
			return h, 0, nil, &protocolError{"message without immediate data (its header)"}
		}
		h, n = wire.HeaderOf(wc.Imm), wc.ByteLen
		if wire.IsData(h.Type) {
			if wc.Opcode != ibv.WCOpRecvWriteImm {
				// Data comes as RDMA WRITE with immediate into the
				// ring, where the placement rule says; a SEND has no
				// place there.
				return h, 0, nil, &protocolError{"data message that is not an RDMA WRITE with immediate data"}
			}
		} else if (wire.IsControl(h.Type) || h.Type == wire.MsgFin) && (wc.Opcode != ibv.WCOpRecv || n != 0) {
			return h, 0, nil, &protocolError{"control message with payload or not a SEND"}
		}
		return h, n, nil, nil
	}
	if wc.WRID >= uint64(r.hdrs) {
		return h, 0, nil, &protocolError{"receive completion of no header slot"}
	}
	if wc.Opcode != ibv.WCOpRecv || wc.Flags&ibv.WCWithImm != 0 || wc.ByteLen < ibv.HeaderLen || wc.ByteLen > ibv.HeaderSlot {
		return h, 0, nil, &protocolError{"message that is not a SEND of a header"}
	}
	b := mem[r.hdrOff+int(wc.WRID)*ibv.HeaderSlot:]
	h, n = wire.ParseHeaderSlot(b)
	var data []byte
	if wc.ByteLen > ibv.HeaderLen {
		if !wire.IsData(h.Type) || n != wc.ByteLen-ibv.HeaderLen {
			return h, 0, nil, &protocolError{"a header SEND with payload that is not its data message's"}
		}
		data = b[ibv.HeaderLen:wc.ByteLen]
	}
	if (wire.IsControl(h.Type) || h.Type == wire.MsgFin) && n != 0 {
		return h, 0, nil, &protocolError{"control message with payload"}
	}
	return h, n, data, nil
}

// The verbs layer sizes the header slots and builds the header SENDs the
// wire package decodes: their sizes must be the same.
var (
	_ [ibv.HeaderLen - wire.HeaderLen]struct{}
	_ [wire.HeaderLen - ibv.HeaderLen]struct{}
	_ [ibv.HeaderSlot - wire.HeaderSlot]struct{}
	_ [wire.HeaderSlot - ibv.HeaderSlot]struct{}
)

// open sets the geometry agreed with the peer.
func (r *recvRing) open(span, maxMsg int) { r.span, r.maxMsg = span, maxMsg }

// opened reports whether the geometry is known: data can be placed.
func (r *recvRing) opened() bool { return r.span > 0 }

// arrived places a data message of n bytes that the peer wrote into the
// ring, as the peer placed it, and returns it (without queueing it); it
// fails for a message the peer could not have sent without breaking the
// protocol.
func (r *recvRing) arrived(n uint32, more bool) (rxMsg, error) {
	if n == 0 {
		return rxMsg{}, &protocolError{"empty data message"}
	}
	if n > uint32(r.maxMsg) {
		return rxMsg{}, &protocolError{"data message larger than the largest agreed"}
	}
	start := wire.RingPlace(r.tail, r.span, r.maxMsg)
	end := wire.RingEnd(start, int(n))
	if end-r.read > uint64(r.span) {
		return rxMsg{}, &protocolError{"peer overran the receive ring: a message over bytes not yet read"}
	}
	r.tail = end
	return rxMsg{off: int32(start % uint64(r.span)), n: int32(n), more: more, ep: r.ep, end: end}, nil
}

// switchTo moves to the ring buf of span bytes whose largest message is
// maxMsg, the peer having said that its next message goes there: the
// queued messages stay, in the old ring. The caller has checked that the
// one before is drained.
func (r *recvRing) switchTo(buf []byte, span, maxMsg int) {
	r.ep ^= 1
	r.buf[r.ep] = buf
	r.span, r.maxMsg = span, maxMsg
	r.tail, r.read, r.reported = 0, 0, 0
	r.oldLeft = r.n
	r.drained = r.n == 0
}

// takeDrained reports, once, that the old ring's last message was
// consumed: its memory may go.
func (r *recvRing) takeDrained() bool {
	d := r.drained
	r.drained = false
	return d
}

// pushOffer queues a ring offer (a message with nothing to read) in
// order with the data: its ring bytes and receive go back when it is
// consumed, as any message's, and not before those ahead of it. With
// nothing queued it is consumed at once.
func (r *recvRing) pushOffer(m rxMsg) bool {
	m.n, m.more = 0, true
	if r.n == 0 {
		r.consumed(m)
		return true
	}
	return r.push(m)
}

// halfUnreported reports whether the peer has not yet been told of half
// the ring's bytes being read: then credits go back at once, not in a
// batch of messages. A ring holds only a couple of the largest messages,
// and a writer that waits for a batch of them to be consumed would find
// the ring full long before: it would alternate with the reader instead
// of writing the next message while this one is read.
func (r *recvRing) halfUnreported() bool { return r.read-r.reported >= uint64(r.span/2) }

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

// queueRepost queues a consumed receive to be posted again.
func (r *recvRing) queueRepost() { r.reposts++ }

// postReposts posts the queued receives in chains of at most
// ibv.MaxRecvBatch and returns how many it posted. The queue is emptied
// whatever happens: a failed post means a failed connection.
func (r *recvRing) postReposts(p recvPoster) (int, error) {
	posted := 0
	var err error
	for left := r.reposts; left > 0 && err == nil; {
		k := min(left, ibv.MaxRecvBatch)
		if err = p.PostRecvs(r.prepare(k)); err == nil {
			posted += k
		}
		left -= k
	}
	r.reposts = 0
	r.posted += posted
	return posted, err
}

// dropReposts forgets the queued receives: no one will post them.
func (r *recvRing) dropReposts() { r.reposts = 0 }

// postOne posts one receive again at once, on its own.
func (r *recvRing) postOne(p recvPoster) error {
	if err := p.PostRecvs(r.prepare(1)); err != nil {
		return err
	}
	r.posted++
	return nil
}

// readable returns what a Read may copy without the lock: from the head,
// avail messages, starting off bytes into the first.
func (r *recvRing) readable() (head, avail, off int) { return r.head, r.n, r.off }

// payload is the part of message m from byte off on, in mem (the arena).
func (r *recvRing) payload(m rxMsg, off int) []byte {
	return r.buf[m.ep][int(m.off)+off : int(m.off)+int(m.n)]
}

// copyOut copies into b the payload of up to avail messages from head on,
// starting off bytes into the first, stopping at a
// fin and, when messages is set, after the end of one of the peer's
// Writes. It returns the bytes copied, how many messages were used up, how
// far into the next one the copy got, and whether it stopped at the end of
// a Write. It only reads the queue's entries from head to head+avail,
// which the completion side never touches, so it runs without the lock.
func (r *recvRing) copyOut(b []byte, head, avail, off int, messages bool) (n, used, next int, ended bool) {
	for used < avail && n < len(b) {
		m := r.q[(head+used)%len(r.q)]
		if m.n < 0 {
			break
		}
		k := copy(b[n:], r.payload(m, off))
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

// consume drops used messages from the head, freeing their ring bytes and
// queueing their receives to be posted again, and records how far into
// the next one Read got. Ring offers that come to the head go too: they
// have nothing to read.
func (r *recvRing) consume(used, off int) {
	for range used {
		r.pop()
	}
	r.off = off
	for off == 0 && r.n > 0 && r.q[r.head].n == 0 {
		r.pop()
	}
}

// pop drops the head message (see consume).
func (r *recvRing) pop() {
	r.consumed(r.q[r.head])
	r.head = (r.head + 1) % len(r.q)
	r.n--
}

// consumed frees a message's ring bytes and queues its receive to be
// posted again.
func (r *recvRing) consumed(m rxMsg) {
	if m.ep == r.ep {
		r.read = m.end
	} else if r.oldLeft--; r.oldLeft == 0 {
		r.drained = true
	}
	r.queueRepost()
}

// discard drops every queued message (CloseRead), freeing their ring bytes
// and queueing their receives to be posted again; the fin's receive is
// never reposted.
func (r *recvRing) discard() {
	for ; r.n > 0; r.n-- {
		if m := r.q[r.head]; m.n >= 0 {
			r.consumed(m)
		}
		r.head = (r.head + 1) % len(r.q)
	}
	r.off = 0
}
