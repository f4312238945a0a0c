package rdma

// layout places a connection's buffers in one registered arena:
//
//	[ receive buffers: recvSlots × bufSize ]
//	[ send buffers:    sendSlots × bufSize ]
//	[ control sends:   ctrlSlots × ctrlSize ]
//
// Every receive buffer is full size because RC consumes receives in posted
// order whatever the message, so any posted receive may get a data message.
type layout struct {
	bufSize   int
	recvSlots int
	sendSlots int
	ctrlSlots int
}

// ctrlSize is the size of a control send buffer: a header, kept on its own
// cache line.
const ctrlSize = 64

func newLayout(o Options) layout {
	return layout{
		bufSize:   o.BufferSize + hdrLen, // a Write of BufferSize bytes is one message
		recvSlots: o.RecvDepth + ctrlDepth + finSlots,
		sendSlots: o.SendDepth,
		ctrlSlots: ctrlDepth + finSlots,
	}
}

func (l layout) recvOff(i int) int { return i * l.bufSize }
func (l layout) sendOff(i int) int { return (l.recvSlots + i) * l.bufSize }
func (l layout) ctrlOff(i int) int { return (l.recvSlots+l.sendSlots)*l.bufSize + i*ctrlSize }

// size is the arena size, rounded up to whole pages.
func (l layout) size() int {
	n := (l.recvSlots+l.sendSlots)*l.bufSize + l.ctrlSlots*ctrlSize
	const page = 4096
	return (n + page - 1) &^ (page - 1)
}
