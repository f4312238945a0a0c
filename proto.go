package rdma

import (
	"encoding/binary"
	"fmt"
)

// The wire protocol.
//
// Handshake: the connect request and the accept reply each carry a hello in
// the rdma_cm private data (IB allows 56 bytes in a request): a magic, a
// version, flags, the sender's receive geometry (how many messages it may
// be sent, how large they may be) and its receive ring: its size, address
// and rkey. The one flag says the sender's Reads are message-oriented
// (Options.Messages): then the other side sends each Write as messages of
// its own, never merged with another Write's bytes.
//
// Each side speaks one version: a listener refuses a request of another
// version (the dialer sees the connection refused), and a dialer fails on a
// reply of another version with ErrProtocol. Version 3 added the flags and
// the fragment type; version 4 the receive ring; version 5 headers as SEND
// payloads (below); version 6 rings that grow and shrink (below); version
// 7 the header's wants flag (below).
//
// Memory: each side has a receive ring, the only memory the protocol lets
// the peer touch (registered for remote write, never read; the regions an
// application registers for one-sided RDMA are its own grants, see
// region.go), and a send ring of the same size that mirrors the peer's
// receive ring: a message goes from offset off of the local send ring to
// offset off of the peer's receive ring. Both sides use the smaller of the two rings' sizes (ringSpan) and
// the same largest message, maxMsg: the smaller BufferSize, and at most
// half the ring. Where a message goes is a pure function of how many ring
// bytes came before it (see ringPlace), so both sides compute it alike
// without exchanging offsets.
//
// Messages: a data message is an RDMA WRITE with immediate data, and the
// 32-bit immediate is its header, so the ring holds payload only: a Write
// of BufferSize bytes is exactly that many bytes on the wire. The
// immediate consumes one of the receiver's receives (all of them
// zero-length), which tells it that the message arrived, and how long it
// is. Credit messages and the fin are SENDs with immediate data and no
// payload. Data messages carry payload (never none). A Write bigger than
// maxMsg travels as several data messages; to a message-oriented reader
// all but the last are fragments (msgDataMore), so the reader knows where
// each Write ends. A stream reader treats both types alike.
// Every header piggybacks the credits the sender has freed since its last
// message, so request/response traffic needs no extra messages. A reader
// that has consumed everything and is about to wait returns its credits
// in a message of their own only when the peer's latest header set the
// wants flag: the peer may then come to wait for them (it holds small
// Writes while it streams, has a quarter of its credits or less left, or
// its next message might not fit the ring) before it sends again. Without
// the flag the peer waits for no credits before its next message (which
// would set the flag if needed) but those that batches bring, so the
// credits wait for a batch or ride on a reply: a reader goroutine parked
// beside request/response traffic (net/http's, gRPC's) costs no message
// per request, and a reader that drains a stream of large Writes faster
// than they come costs one per batch, not one per wait.
//
// Transports without immediate data (iWARP) carry each header as the
// payload of a SEND instead: its HeaderLen bytes are the 32-bit header
// and the data message's length (0 for a control message), big-endian.
// A data message is then its RDMA WRITE into the ring followed by that
// SEND; RC delivers a SEND's completion only after the WRITEs posted
// before it have landed, so the receiver finds the payload in place as
// with the immediate. A data message of at most HeaderData bytes may
// instead follow its header in the SEND itself (one work request, not
// two): the receiver copies it to where the placement rule puts it, so
// both sides' ring arithmetic is the same either way. Such a side posts
// each receive with a slot of HeaderSlot bytes and says so in its hello
// (helloHeaders); the other side sends to it that way. A side that
// cannot send immediate data refuses a peer that wants them.
//
// Credits come in two classes so that returning credits can never wait on
// credits. Data messages spend data credits (the peer's RecvDepth). Credit
// messages spend control credits (ctrlDepth, returned by the ctrlAck field
// of any later message). One more receive at each side is reserved for the
// single fin. A sender therefore never has more messages in flight than the
// peer has receives posted, and the NIC never sees receiver-not-ready.
// Ring bytes need no field of their own: a data credit comes back when the
// receiver has consumed a message (in the order they came), which frees
// the ring bytes up to that message's end; a sender that remembers where
// each message it sent ended (ringTx) knows how much ring is free, and
// sends nothing that would overwrite bytes the peer has not read.
//
// Rings that follow the traffic: each side starts with the small ring its
// hello announces and may move its receive ring to another (bigger while
// the peer streams to it, the small one again once it is idle; see
// resize.go). The receiver offers the new ring in a data message of its
// own (msgRing, whose ringDescLen bytes of payload are the ring's address,
// rkey and size), placed and credited like any data message but never
// given to Read. The sender answers at a message boundary of its own: it
// sends msgSwitched, a control message, and from then on places its
// messages in the new ring, the running counts of both sides starting at
// 0 there; messages sent before it stay in the old ring, and their credits
// come back as before. A sender that cannot follow (no memory for a send
// ring that size, or an offer past the registrations it lets its peer
// cause: ringBudget) answers msgDecline instead, and the receiver keeps the
// ring it had. One offer is outstanding at a time, and the receiver makes
// the next only once the old ring is drained. A ring's size is at most
// what the sender's BufferSize gives (bigRingFor: 16 of its largest
// messages up to 1 MiB, at least two), at least minRing; the largest
// message in it is the smaller BufferSize and at most half the ring, as at
// the handshake.

const (
	helloMagic   = 0x47565244 // "GVRD"
	helloVersion = 7          // 1 carried the header in an 8-byte prefix; 2 had no flags; 3 used SEND and receive buffers; 4 had no helloHeaders; 5 had fixed rings; 6 had no wants flag
	helloLen     = 30

	helloMessages = 1 << 0 // flags: the sender's Reads are message-oriented
	helloHeaders  = 1 << 1 // flags: the sender takes headers as SEND payloads, not immediate data (iWARP)

	ctrlDepth = 4 // control credits; small because credit messages are rare
	finSlots  = 1 // receives reserved for the fin

	msgData     = 1 // data: the last (or only) message of a Write
	msgCredit   = 2
	msgFin      = 3
	msgDataMore = 4 // data: a fragment; the Write goes on in the next data message
	msgRing     = 5 // data: the receiver offers a new receive ring (its payload is a ringDesc)
	msgSwitched = 6 // control: the sender writes into the offered ring from the next message on
	msgDecline  = 7 // control: the sender cannot follow the offer; the old ring stays

	// ringAlign is where messages start in a ring: each takes a whole
	// number of these, so its successor starts on a cache line.
	ringAlign = 64
	// minRing and maxRing bound the ring a peer may announce: room for
	// two of the smallest messages a side accepts, and sizes whose sums
	// cannot overflow the arithmetic.
	minRing = 2 * minBufferSize
	maxRing = 1 << 30
)

// isData reports whether messages of type typ are data messages: placed
// in the ring, spending a data credit.
func isData(typ uint8) bool { return typ == msgData || typ == msgDataMore || typ == msgRing }

// isControl reports whether messages of type typ are control messages:
// no payload, spending a control credit (the fin has its own receive).
func isControl(typ uint8) bool { return typ == msgCredit || typ == msgSwitched || typ == msgDecline }

// ringDesc is a msgRing's payload: a receive ring offered to the peer.
type ringDesc struct {
	addr uint64
	rkey uint32
	size uint32
}

// ringDescLen is the length of a marshaled ringDesc.
const ringDescLen = 16

func (d ringDesc) put(b []byte) {
	binary.BigEndian.PutUint64(b, d.addr)
	binary.BigEndian.PutUint32(b[8:], d.rkey)
	binary.BigEndian.PutUint32(b[12:], d.size)
}

// parseRingDesc validates a peer's ring offer: exactly ringDescLen bytes, a
// size of whole ringAlign units between minRing and most (the largest ring
// this side sends into), not wrapping the address space.
func parseRingDesc(b []byte, most int) (ringDesc, error) {
	if len(b) != ringDescLen {
		return ringDesc{}, &protocolError{fmt.Sprintf("ring offer of %d bytes", len(b))}
	}
	d := ringDesc{addr: binary.BigEndian.Uint64(b), rkey: binary.BigEndian.Uint32(b[8:]), size: binary.BigEndian.Uint32(b[12:])}
	if d.size < minRing || int64(d.size) > int64(most) || d.size > maxRing || d.size%ringAlign != 0 {
		return ringDesc{}, &protocolError{fmt.Sprintf("ring offer of size %d (at most %d)", d.size, most)}
	}
	if d.addr > ^uint64(0)-uint64(d.size) {
		return ringDesc{}, &protocolError{fmt.Sprintf("ring offer at %#x of %d bytes wraps the address space", d.addr, d.size)}
	}
	return d, nil
}

// hello is the handshake each side sends in the CM private data.
type hello struct {
	flags     uint8  // helloMessages, helloHeaders
	recvDepth uint16 // data credits granted to the peer
	ctrlDepth uint8  // control credits granted to the peer
	bufSize   uint32 // the largest message the sender takes
	ringSize  uint32 // bytes of its receive ring
	ringAddr  uint64 // the ring's address for RDMA WRITE
	rkey      uint32 // the ring's remote key
}

func (h hello) marshal() []byte {
	b := make([]byte, helloLen)
	binary.BigEndian.PutUint32(b[0:], helloMagic)
	b[4] = helloVersion
	b[5] = h.flags
	binary.BigEndian.PutUint16(b[6:], h.recvDepth)
	b[8] = h.ctrlDepth
	// b[9] is reserved (zero).
	binary.BigEndian.PutUint32(b[10:], h.bufSize)
	binary.BigEndian.PutUint32(b[14:], h.ringSize)
	binary.BigEndian.PutUint64(b[18:], h.ringAddr)
	binary.BigEndian.PutUint32(b[26:], h.rkey)
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
		ringSize:  binary.BigEndian.Uint32(b[14:]),
		ringAddr:  binary.BigEndian.Uint64(b[18:]),
		rkey:      binary.BigEndian.Uint32(b[26:]),
	}
	if h.recvDepth < 1 || h.ctrlDepth < 1 || h.bufSize < 1 {
		return hello{}, &protocolError{fmt.Sprintf("bad geometry %+v", h)}
	}
	if h.bufSize > maxBufferSize {
		// No Options announce more; as an int on a 32-bit platform a
		// size of 2 GiB or more would be negative.
		return hello{}, &protocolError{fmt.Sprintf("buffer size %d over the largest, %d", h.bufSize, maxBufferSize)}
	}
	if h.ringSize < minRing || h.ringSize > maxRing || h.ringSize%ringAlign != 0 {
		return hello{}, &protocolError{fmt.Sprintf("bad ring size %d", h.ringSize)}
	}
	if h.ringAddr > ^uint64(0)-uint64(h.ringSize) {
		return hello{}, &protocolError{fmt.Sprintf("ring at %#x of %d bytes wraps the address space", h.ringAddr, h.ringSize)}
	}
	if h.flags&^(helloMessages|helloHeaders) != 0 {
		return hello{}, &protocolError{fmt.Sprintf("unknown flags %#x", h.flags)}
	}
	return h, nil
}

// sendable reports whether a side whose transport carries immediate data
// (or not: headers) can send the way peer takes its headers: every
// transport sends SENDs, not every one immediate data.
func (h hello) sendable(headers bool) error {
	if headers && h.flags&helloHeaders == 0 {
		return &protocolError{"the peer takes headers as immediate data, which this device's transport (iWARP) cannot send"}
	}
	return nil
}

// ringGeometry is what both sides of a connection agree on without
// talking: the ring bytes they use (the smaller ring) and the largest
// message (the smaller BufferSize, at most half the ring, so that a
// message always fits an empty ring wherever the last one ended).
func ringGeometry(ownRing, ownBuf, peerRing, peerBuf int) (span, maxMsg int) {
	span = min(ownRing, peerRing)
	return span, min(ownBuf, peerBuf, span/2)
}

// ringPlace is the placement rule, the same at both ends: a message whose
// predecessors ended at running byte count t starts at ring offset t mod
// span, unless a message of the largest size would not fit before the
// ring's end; then it starts at offset 0 and the bytes skipped count as
// used. It returns the running count where the message starts (off is
// that mod span). The wrap depends on t alone, never on the message's
// length, so a sender may place a message whose length is not final yet
// (the pending buffer), and the receiver, who learns the length last,
// places it alike.
func ringPlace(t uint64, span, maxMsg int) (start uint64) {
	off := t % uint64(span)
	if off+uint64(maxMsg) > uint64(span) {
		return t + uint64(span) - off
	}
	return t
}

// ringEnd is the running count after a message of n bytes that starts at
// start: messages take whole ringAlign units.
func ringEnd(start uint64, n int) uint64 {
	return start + uint64((n+ringAlign-1)&^(ringAlign-1))
}

// header is every message's immediate data: the wants flag in the top
// bit, the type in the other 7 bits of the top byte, then ctrlAck, then
// credits in the low 16 bits. (The C layer moves it to and from network
// byte order.)
type header struct {
	typ     uint8
	wants   bool   // the sender may come to wait for credits (see ledger.header)
	ctrlAck uint8  // control messages received and reposted since the last report
	credits uint16 // data receives reposted since the last report
}

// hdrWants is the wants flag's bit in the immediate.
const hdrWants = 1 << 31

func (h header) imm() uint32 {
	imm := uint32(h.typ&0x7f)<<24 | uint32(h.ctrlAck)<<16 | uint32(h.credits)
	if h.wants {
		imm |= hdrWants
	}
	return imm
}

func headerOf(imm uint32) header {
	return header{typ: uint8(imm>>24) & 0x7f, wants: imm&hdrWants != 0, ctrlAck: uint8(imm >> 16), credits: uint16(imm)}
}

// Work request ids. A receive's id is recvWRID (receives are all alike:
// zero-length). A send's id has the
// top bit set and carries the data and control sequence numbers reached by
// that send: RC completes sends in order, so a signaled completion also
// retires every unsignaled send posted before it.
const (
	wrSend   = 1 << 63
	recvWRID = 0
)

func sendWRID(dataSeq, ctrlSeq uint32) uint64 {
	return wrSend | uint64(ctrlSeq&0x7fffffff)<<32 | uint64(dataSeq)
}

func parseSendWRID(id uint64) (dataSeq, ctrlSeq uint32) {
	return uint32(id), uint32(id>>32) & 0x7fffffff
}
