package rdma

import (
	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// layout places a connection's memory in one arena of two rings:
//
//	[ receive ring: ring bytes ]  registered for remote write: the peer's RDMA WRITEs land here
//	[ send ring:    ring bytes ]  local access only: messages are written from here
//
// A ring holds at least two of the largest messages (twice BufferSize,
// rounded up to whole pages), so that a message of any size up to
// BufferSize fits an empty ring wherever the last one ended (see
// wire.RingPlace). A connection starts with rings of initRing bytes (less
// for a small BufferSize, whose messages are then smaller) and moves to
// rings of bigRing bytes (bigRingFor) while the peer streams to it (see
// resize.go).
// The big rings are registered apart, and given back when the connection
// is idle; the arena keeps the small ones. Receives are zero-length:
// a data message's payload goes where the sender put it in the ring, and
// control messages (credits, the fin) carry none, only their header in
// the immediate data. So the receives (RecvDepth for data, the control
// and fin ones besides) and the send queue's depth cost no memory;
// recvSlots counts the receives, sendSlots the data messages and
// ctrlSlots the control messages that may be in flight, for the queues'
// depths.
//
// On a transport without immediate data (iWARP: see withHeaders) every
// message's header comes as the payload of a SEND instead, and each
// receive has a slot of its own for it, after the send ring:
//
//	[ header slots: recvSlots × ibv.HeaderSlot, whole pages ]  local write: receives land here
type layout struct {
	bufSize   int
	ring      int // the arena's rings: what a connection starts with
	bigRing   int // the rings it grows to
	recvSlots int
	sendSlots int
	ctrlSlots int
	hdrs      int // header slots: recvSlots, or 0 where immediate data carries the headers
}

const page = 4096

// initRing is the ring a connection starts with: room for two messages of
// 8 KiB, many more small ones. An idle connection end registers two of
// them (32 KiB), where rings of the largest size would pin 256 KiB by
// default.
const initRing = 16 << 10

// ringFor is the ring of a side whose largest message is bufSize bytes.
func ringFor(bufSize int) int { return (2*bufSize + page - 1) &^ (page - 1) }

// A connection grows its rings, while it streams, to hold grownMsgs of the
// largest messages, up to grownRing bytes (but always two): what a writer
// has in flight is bounded by the peer's ring, and streaming 64 KiB Writes
// reached perftest's rate on the test bed only with about 1 MiB of it. A
// stream has at most SendDepth (default 16) messages in flight, so a
// bigger ring than that many buys nothing.
const (
	grownMsgs = 16
	grownRing = 1 << 20
)

// bigRingFor is the ring a side whose largest message is bufSize bytes
// grows to.
func bigRingFor(bufSize int) int {
	return max(ringFor(bufSize), min(grownRing, ringFor(grownMsgs*bufSize/2)))
}

func newLayout(o Options) layout {
	return layout{
		bufSize:   o.BufferSize, // payload only: the header travels as immediate data
		ring:      min(ringFor(o.BufferSize), initRing),
		bigRing:   bigRingFor(o.BufferSize),
		recvSlots: o.RecvDepth + wire.CtrlDepth + wire.FinSlots,
		sendSlots: o.SendDepth,
		ctrlSlots: wire.CtrlDepth + wire.FinSlots,
	}
}

// withHeaders is l for a transport that carries no immediate data: a
// header slot per receive, and a data message is two work requests (its
// RDMA WRITE, then the SEND of its header).
func (l layout) withHeaders() layout {
	l.hdrs = l.recvSlots
	return l
}

// headers reports whether headers travel as SEND payloads (withHeaders).
func (l layout) headers() bool { return l.hdrs > 0 }

// cqEntries is what a connection reserves on its device's shared CQ: an
// entry for every work request its queues may hold at once, receives and
// sends (sendQueue: data messages, control messages, one-sided
// operations, the keepalive probe and the teardown's drain marker). A
// flush completes every one of them, signaled or not, so a reservation
// of fewer lets one connection overflow the CQ, which fails every
// connection on it.
// With headers as SENDs a data message's RDMA WRITE is a work request of
// its own, which a flush completes too.
func (l layout) cqEntries() int { return l.recvSlots + l.sendQueue() }

// dataWRs is how many work requests the data messages in flight take.
func (l layout) dataWRs() int {
	if l.headers() {
		return 2 * l.sendSlots
	}
	return l.sendSlots
}

// cqFixed is what a connection's CQ entries add to RecvDepth + SendDepth
// (cqEntries): the control receives and sends on both sides, the
// one-sided operations, the keepalive probe and the drain marker.
const cqFixed = 2*(wire.CtrlDepth+wire.FinSlots) + oneSidedDepth + 2

// sendQueue is the depth of a connection's send queue: the data and
// control messages, the one-sided operations, the keepalive probe and the
// teardown's drain marker.
func (l layout) sendQueue() int { return l.dataWRs() + l.ctrlSlots + oneSidedDepth + 2 }

// recvOff and sendOff are the arena offsets of the two rings, hdrOff that
// of the header slots.
func (l layout) recvOff() int { return 0 }
func (l layout) sendOff() int { return l.ring }
func (l layout) hdrOff() int  { return 2 * l.ring }

// hdrSize is the bytes of the header slots, in whole pages.
func (l layout) hdrSize() int { return (l.hdrs*ibv.HeaderSlot + page - 1) &^ (page - 1) }

// size is the arena size: two rings and the header slots, of whole pages.
func (l layout) size() int { return 2*l.ring + l.hdrSize() }

// oneSidedDepth is the most one-sided operations a connection has in
// flight; more wait for a slot.
const oneSidedDepth = 16

// ringMem is a ring's memory: one of the arena's two rings, or one
// registered apart (reg is then the platform's registration).
type ringMem struct {
	buf        []byte
	base       uint64 // buf's address for the NIC
	lkey, rkey uint32
	reg        any
}
