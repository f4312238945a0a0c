package rdma

// layout places a connection's memory in one arena of two rings:
//
//	[ receive ring: ring bytes ]  registered for remote write: the peer's RDMA WRITEs land here
//	[ send ring:    ring bytes ]  local access only: messages are written from here
//
// The ring is twice BufferSize (the largest message), rounded up to whole
// pages, so that a message of any size up to BufferSize fits an empty ring
// wherever the last one ended (see ringPlace). Receives are zero-length:
// a data message's payload goes where the sender put it in the ring, and
// control messages (credits, the fin) carry none, only their header in
// the immediate data. So the receives (RecvDepth for data, the control
// and fin ones besides) and the send queue's depth cost no memory;
// recvSlots counts the receives, sendSlots the data messages and
// ctrlSlots the control messages that may be in flight, for the queues'
// depths.
type layout struct {
	bufSize   int
	ring      int
	recvSlots int
	sendSlots int
	ctrlSlots int
}

const page = 4096

func newLayout(o Options) layout {
	return layout{
		bufSize:   o.BufferSize, // payload only: the header travels as immediate data
		ring:      (2*o.BufferSize + page - 1) &^ (page - 1),
		recvSlots: o.RecvDepth + ctrlDepth + finSlots,
		sendSlots: o.SendDepth,
		ctrlSlots: ctrlDepth + finSlots,
	}
}

// cqEntries is what a connection reserves on its device's shared CQ: one
// entry per receive, data message, control message and one-sided
// operation it may have outstanding, and one for the teardown's drain
// marker.
func (l layout) cqEntries() int { return l.recvSlots + l.sendSlots + l.ctrlSlots + oneSidedDepth + 1 }

// cqFixed is what a connection's CQ entries add to RecvDepth + SendDepth
// (cqEntries): the control receives and sends on both sides, the
// one-sided operations and the drain marker.
const cqFixed = 2*(ctrlDepth+finSlots) + oneSidedDepth + 1

// sendQueue is the depth of a connection's send queue: the data and
// control messages, the one-sided operations, the keepalive probe and the
// teardown's drain marker.
func (l layout) sendQueue() int { return l.sendSlots + l.ctrlSlots + oneSidedDepth + 2 }

// recvOff and sendOff are the arena offsets of the two rings.
func (l layout) recvOff() int { return 0 }
func (l layout) sendOff() int { return l.ring }

// size is the arena size: two rings of whole pages.
func (l layout) size() int { return 2 * l.ring }

// oneSidedDepth is the most one-sided operations a connection has in
// flight; more wait for a slot.
const oneSidedDepth = 16
