package rdma

// layout places a connection's buffers in one registered arena:
//
//	[ receive buffers: recvSlots × bufSize ]
//	[ send buffers:    sendSlots × bufSize ]
//
// Every receive buffer is full size because RC consumes receives in posted
// order whatever the message, so any posted receive may get a data message.
// Control messages (credits, the fin) carry no payload, only their header
// in the immediate data, so they need no buffers; ctrlSlots counts the ones
// that may be in flight, for the send queue's depth.
type layout struct {
	bufSize   int
	recvSlots int
	sendSlots int
	ctrlSlots int
}

func newLayout(o Options) layout {
	return layout{
		bufSize:   o.BufferSize, // payload only: the header travels as immediate data
		recvSlots: o.RecvDepth + ctrlDepth + finSlots,
		sendSlots: o.SendDepth,
		ctrlSlots: ctrlDepth + finSlots,
	}
}

// cqEntries is what a connection reserves on its device's shared CQ: one
// entry per receive, send buffer and control message it may have
// outstanding, and one for the teardown's drain marker.
func (l layout) cqEntries() int { return l.recvSlots + l.sendSlots + l.ctrlSlots + 1 }

func (l layout) recvOff(i int) int { return i * l.bufSize }
func (l layout) sendOff(i int) int { return (l.recvSlots + i) * l.bufSize }

// size is the arena size, rounded up to whole pages.
func (l layout) size() int {
	n := (l.recvSlots + l.sendSlots) * l.bufSize
	const page = 4096
	return (n + page - 1) &^ (page - 1)
}
