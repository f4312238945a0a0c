package rdma

import (
	"encoding/binary"
	"fmt"
)

// The wire protocol.
//
// Handshake: the connect request and the accept reply each carry a hello in
// the rdma_cm private data (IB allows 56 bytes in a request): a magic, a
// version, flags, and the sender's receive geometry, so each side knows how
// many messages it may send and how large they may be. The one flag says
// the sender's Reads are message-oriented (Options.Messages): then the
// other side sends each Write as messages of its own, never merged with
// another Write's bytes.
//
// Each side speaks one version: a listener refuses a request of another
// version (the dialer sees the connection refused), and a dialer fails on a
// reply of another version with ErrProtocol. Version 3 added the flags and
// the fragment type.
//
// Messages: every message is a SEND with immediate data, and the 32-bit
// immediate is its header, so a buffer holds payload only: a Write of
// BufferSize bytes is exactly that many bytes on the wire (64 packets for
// 64 KiB at a 1 KiB MTU, not 65) and every buffer starts on a page.
// Data messages carry payload (never none); credit messages and the fin
// carry none. A Write bigger than a buffer travels as several data
// messages; to a message-oriented reader all but the last are fragments
// (msgDataMore), so the reader knows where each Write ends. A stream
// reader treats both types alike.
// Every header piggybacks the credits the sender has freed since its last
// message, so request/response traffic needs no extra messages.
//
// Credits come in two classes so that returning credits can never wait on
// credits. Data messages spend data credits (the peer's RecvDepth). Credit
// messages spend control credits (ctrlDepth, returned by the ctrlAck field
// of any later message). One more receive at each side is reserved for the
// single fin. A sender therefore never has more messages in flight than the
// peer has receives posted, and the NIC never sees receiver-not-ready.

const (
	helloMagic   = 0x47565244 // "GVRD"
	helloVersion = 3          // 1 carried the header in an 8-byte prefix; 2 had no flags
	helloLen     = 16

	helloMessages = 1 << 0 // flags: the sender's Reads are message-oriented

	ctrlDepth = 4 // control credits; small because credit messages are rare
	finSlots  = 1 // receives reserved for the fin

	msgData     = 1 // data: the last (or only) message of a Write
	msgCredit   = 2
	msgFin      = 3
	msgDataMore = 4 // data: a fragment; the Write goes on in the next data message
)

// hello is the handshake each side sends in the CM private data.
type hello struct {
	flags     uint8  // helloMessages
	recvDepth uint16 // data credits granted to the peer
	ctrlDepth uint8  // control credits granted to the peer
	bufSize   uint32 // bytes per receive buffer: the largest message
}

func (h hello) marshal() []byte {
	b := make([]byte, helloLen)
	binary.BigEndian.PutUint32(b[0:], helloMagic)
	b[4] = helloVersion
	b[5] = h.flags
	binary.BigEndian.PutUint16(b[6:], h.recvDepth)
	b[8] = h.ctrlDepth
	binary.BigEndian.PutUint32(b[10:], h.bufSize)
	return b
}

// parseHello validates a peer's hello. Providers may pad private data with
// zeros up to their maximum, so only the prefix is read.
func parseHello(b []byte) (hello, error) {
	if len(b) < helloLen {
		return hello{}, &protocolError{fmt.Sprintf("handshake of %d bytes", len(b))}
	}
	if m := binary.BigEndian.Uint32(b[0:]); m != helloMagic {
		return hello{}, &protocolError{fmt.Sprintf("bad magic %#x", m)}
	}
	if b[4] != helloVersion {
		return hello{}, &protocolError{fmt.Sprintf("protocol version %d, want %d", b[4], helloVersion)}
	}
	h := hello{
		flags:     b[5],
		recvDepth: binary.BigEndian.Uint16(b[6:]),
		ctrlDepth: b[8],
		bufSize:   binary.BigEndian.Uint32(b[10:]),
	}
	if h.recvDepth < 1 || h.ctrlDepth < 1 || h.bufSize < 1 {
		return hello{}, &protocolError{fmt.Sprintf("bad geometry %+v", h)}
	}
	if h.flags&^helloMessages != 0 {
		return hello{}, &protocolError{fmt.Sprintf("unknown flags %#x", h.flags)}
	}
	return h, nil
}

// header is every message's immediate data: type in the top byte, then
// ctrlAck, then credits in the low 16 bits. (The C layer moves it to and
// from network byte order.)
type header struct {
	typ     uint8
	ctrlAck uint8  // control messages received and reposted since the last report
	credits uint16 // data receives reposted since the last report
}

func (h header) imm() uint32 {
	return uint32(h.typ)<<24 | uint32(h.ctrlAck)<<16 | uint32(h.credits)
}

func headerOf(imm uint32) header {
	return header{typ: uint8(imm >> 24), ctrlAck: uint8(imm >> 16), credits: uint16(imm)}
}

// Work request ids. A receive's id is its buffer index. A send's id has the
// top bit set and carries the data and control sequence numbers reached by
// that send: RC completes sends in order, so a signaled completion also
// retires every unsignaled send posted before it.
const wrSend = 1 << 63

func sendWRID(dataSeq, ctrlSeq uint32) uint64 {
	return wrSend | uint64(ctrlSeq&0x7fffffff)<<32 | uint64(dataSeq)
}

func parseSendWRID(id uint64) (dataSeq, ctrlSeq uint32) {
	return uint32(id), uint32(id>>32) & 0x7fffffff
}
