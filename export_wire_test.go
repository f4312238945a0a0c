package rdma

// The wire protocol (proto.go) for the device tests of hostile peers
// (hostile_test.go, package rdma_test), which speak it by hand over
// internal/rdmacm and internal/ibv: they build what proto.go builds, so
// they follow the protocol when it changes.

// Message types, the top byte of a header.
const (
	MsgData     = msgData
	MsgCredit   = msgCredit
	MsgFin      = msgFin
	MsgDataMore = msgDataMore
)

// CtrlDepth and FinSlots are the control credits each side grants and the
// receives it keeps for the fin, besides its RecvDepth.
const (
	CtrlDepth = ctrlDepth
	FinSlots  = finSlots
)

// WireHello is a hello's content: the handshake in the CM private data.
type WireHello struct {
	Flags     uint8
	RecvDepth uint16 // data credits granted to the peer
	CtrlDepth uint8  // control credits granted to the peer
	BufSize   uint32 // the largest message the sender receives
	RingSize  uint32 // its receive ring: size, address and rkey
	RingAddr  uint64
	RKey      uint32
}

// MarshalHello returns h as the private data of a connect request or
// reply, with this package's magic and version.
func MarshalHello(h WireHello) []byte {
	return hello{flags: h.Flags, recvDepth: h.RecvDepth, ctrlDepth: h.CtrlDepth, bufSize: h.BufSize,
		ringSize: h.RingSize, ringAddr: h.RingAddr, rkey: h.RKey}.marshal()
}

// ParseHello validates a hello as a listener or dialer does.
func ParseHello(b []byte) (WireHello, error) {
	h, err := parseHello(b)
	return WireHello{Flags: h.flags, RecvDepth: h.recvDepth, CtrlDepth: h.ctrlDepth, BufSize: h.bufSize,
		RingSize: h.ringSize, RingAddr: h.ringAddr, RKey: h.rkey}, err
}

// RingGeometry is the ring span and largest message both sides of a
// connection use, from their rings' sizes and BufferSizes.
func RingGeometry(ownRing, ownBuf, peerRing, peerBuf int) (span, maxMsg int) {
	return ringGeometry(ownRing, ownBuf, peerRing, peerBuf)
}

// RingPlace is the placement rule: where a message that follows running
// byte count t starts (a running count; its ring offset is that mod span).
func RingPlace(t uint64, span, maxMsg int) uint64 { return ringPlace(t, span, maxMsg) }

// RingEnd is the running count after a message of n bytes at start.
func RingEnd(start uint64, n int) uint64 { return ringEnd(start, n) }

// HelloHeaders is the hello flag of a side that takes headers as SEND
// payloads (a transport without immediate data).
const HelloHeaders = helloHeaders

// HeaderImm returns the immediate data of a message: its header.
func HeaderImm(typ, ctrlAck uint8, credits uint16) uint32 {
	return header{typ: typ, ctrlAck: ctrlAck, credits: credits}.imm()
}

// ParseHeader splits a message's immediate data into its header's fields.
func ParseHeader(imm uint32) (typ, ctrlAck uint8, credits uint16) {
	h := headerOf(imm)
	return h.typ, h.ctrlAck, h.credits
}
