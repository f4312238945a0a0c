package wire

import "encoding/binary"

// Message types, the header's Type.
const (
	MsgData     = 1 // data: the last (or only) message of a write
	MsgCredit   = 2
	MsgFin      = 3
	MsgDataMore = 4 // data: a fragment; the write goes on in the next data message
	MsgRing     = 5 // data: the receiver offers a new receive ring (its payload is a RingDesc)
	MsgSwitched = 6 // control: the sender writes into the offered ring from the next message on
	MsgDecline  = 7 // control: the sender cannot follow the offer; the old ring stays
)

// CtrlDepth is the control credits a side grants in its hello: few,
// because credit messages are rare. FinSlots is the receives a side keeps
// for the fin besides, which no credit pays for.
const (
	CtrlDepth = 4
	FinSlots  = 1
)

// IsData reports whether messages of type typ are data messages: placed
// in the ring, spending a data credit.
func IsData(typ uint8) bool { return typ == MsgData || typ == MsgDataMore || typ == MsgRing }

// IsControl reports whether messages of type typ are control messages:
// no payload, spending a control credit (the fin has its own receive).
func IsControl(typ uint8) bool { return typ == MsgCredit || typ == MsgSwitched || typ == MsgDecline }

// Header is every message's immediate data: the wants flag in the top
// bit, the type in the other 7 bits of the top byte, then CtrlAck, then
// Credits in the low 16 bits. (The verbs layer moves it to and from
// network byte order.)
type Header struct {
	Type    uint8
	Wants   bool   // the sender may come to wait for credits: return them when about to wait
	CtrlAck uint8  // control messages received and reposted since the last report
	Credits uint16 // data receives reposted since the last report
}

// hdrWants is the wants flag's bit in the immediate.
const hdrWants = 1 << 31

// Imm returns the header as immediate data.
func (h Header) Imm() uint32 {
	imm := uint32(h.Type&0x7f)<<24 | uint32(h.CtrlAck)<<16 | uint32(h.Credits)
	if h.Wants {
		imm |= hdrWants
	}
	return imm
}

// HeaderOf decodes immediate data. Any immediate is a header; a type this
// version does not know is the receiver's to refuse.
func HeaderOf(imm uint32) Header {
	return Header{Type: uint8(imm>>24) & 0x7f, Wants: imm&hdrWants != 0, CtrlAck: uint8(imm >> 16), Credits: uint16(imm)}
}

// A header as a SEND's payload (transports without immediate data): the
// header's immediate and the data message's length, HeaderLen bytes, then,
// for a data message small enough, its payload, at most HeaderData bytes.
// Each receive takes such a SEND into a slot of HeaderSlot bytes.
const (
	HeaderLen  = 8
	HeaderData = 72
	HeaderSlot = HeaderLen + HeaderData
)

// PutHeaderSlot encodes h and the length n of its data message (0 for a
// control message) into the first HeaderLen bytes of b.
func PutHeaderSlot(b []byte, h Header, n uint32) {
	binary.BigEndian.PutUint32(b, h.Imm())
	binary.BigEndian.PutUint32(b[4:], n)
}

// ParseHeaderSlot decodes the first HeaderLen bytes of b: the header and
// the length of its data message.
func ParseHeaderSlot(b []byte) (h Header, n uint32) {
	return HeaderOf(binary.BigEndian.Uint32(b)), binary.BigEndian.Uint32(b[4:])
}
