package wire

import "encoding/binary"

const (
	helloMagic = 0x47565244 // "GVRD"
	// Version is the protocol version this package speaks. 1 carried the
	// header in an 8-byte prefix; 2 had no flags; 3 used SEND and receive
	// buffers; 4 had no HelloHeaders; 5 had fixed rings; 6 had no wants
	// flag; 7 let an iWARP responder send before the initiator's first
	// message.
	Version  = 8
	helloLen = 30

	HelloMessages = 1 << 0 // Hello.Flags: the sender's reads are message-oriented
	HelloHeaders  = 1 << 1 // Hello.Flags: the sender takes headers as SEND payloads, not immediate data (iWARP)
)

// Hello is the handshake each side sends in the CM private data.
type Hello struct {
	Flags     uint8  // HelloMessages, HelloHeaders
	RecvDepth uint16 // data credits granted to the peer
	CtrlDepth uint8  // control credits granted to the peer
	BufSize   uint32 // the largest message the sender takes
	RingSize  uint32 // bytes of its receive ring
	RingAddr  uint64 // the ring's address for RDMA WRITE
	RKey      uint32 // the ring's remote key
}

// Marshal returns the hello's encoding, with the magic and Version.
func (h Hello) Marshal() []byte {
	b := make([]byte, helloLen)
	binary.BigEndian.PutUint32(b[0:], helloMagic)
	b[4] = Version
	b[5] = h.Flags
	binary.BigEndian.PutUint16(b[6:], h.RecvDepth)
	b[8] = h.CtrlDepth
	// b[9] is reserved (zero).
	binary.BigEndian.PutUint32(b[10:], h.BufSize)
	binary.BigEndian.PutUint32(b[14:], h.RingSize)
	binary.BigEndian.PutUint64(b[18:], h.RingAddr)
	binary.BigEndian.PutUint32(b[26:], h.RKey)
	return b
}

// ParseHello validates a peer's hello. Providers may pad private data with
// zeros up to their maximum, so only the prefix is read. Its errors wrap
// ErrMalformed.
func ParseHello(b []byte) (Hello, error) {
	if len(b) < helloLen {
		return Hello{}, malformed("handshake of %d bytes", len(b))
	}
	if m := binary.BigEndian.Uint32(b[0:]); m != helloMagic {
		return Hello{}, malformed("bad magic %#x", m)
	}
	if b[4] != Version {
		return Hello{}, malformed("protocol version %d, want %d", b[4], Version)
	}
	h := Hello{
		Flags:     b[5],
		RecvDepth: binary.BigEndian.Uint16(b[6:]),
		CtrlDepth: b[8],
		BufSize:   binary.BigEndian.Uint32(b[10:]),
		RingSize:  binary.BigEndian.Uint32(b[14:]),
		RingAddr:  binary.BigEndian.Uint64(b[18:]),
		RKey:      binary.BigEndian.Uint32(b[26:]),
	}
	if h.RecvDepth < 1 || h.CtrlDepth < 1 || h.BufSize < 1 {
		return Hello{}, malformed("bad geometry %+v", h)
	}
	if h.RingSize < MinRing || h.RingSize > MaxRing || h.RingSize%RingAlign != 0 {
		return Hello{}, malformed("bad ring size %d", h.RingSize)
	}
	if h.RingAddr > ^uint64(0)-uint64(h.RingSize) {
		return Hello{}, malformed("ring at %#x of %d bytes wraps the address space", h.RingAddr, h.RingSize)
	}
	if h.Flags&^(HelloMessages|HelloHeaders) != 0 {
		return Hello{}, malformed("unknown flags %#x", h.Flags)
	}
	return h, nil
}
