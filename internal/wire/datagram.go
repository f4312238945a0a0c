package wire

import "encoding/binary"

// The datagram header: a magic, the version and flags, the sender's port,
// and for a fragment where it goes in which datagram.
const (
	DgramMagic   = 0xD7
	DgramVersion = 1

	// DgramHeaderLen is a whole datagram's header, DgramFragHeaderLen a
	// fragment's.
	DgramHeaderLen     = 4
	DgramFragHeaderLen = 16

	// MaxDatagram is the largest datagram, UDP's over IPv4, so that what
	// fits one fits the other. MinFragSize is the smallest fragment a
	// sender may cut a datagram into: smaller ones would only let a peer
	// make the receiver track a thousand fragments per datagram and more.
	MaxDatagram = 65507
	MinFragSize = 64

	// dgramFragment is the flag (the low nibble of byte 1) of a fragment.
	dgramFragment = 1 << 0
)

// DgramHeader is what precedes a datagram's payload in a UD message. ID,
// Total, Offset and FragSize are a fragment's only, zero in a whole
// datagram.
type DgramHeader struct {
	Port     uint16 // the sender's port
	Fragment bool
	ID       uint32 // the datagram's, the same in all its fragments
	Total    int    // the whole datagram's length
	Offset   int    // where this fragment's payload goes in the datagram
	FragSize int    // the payload of every fragment but the last
}

// Len is the header's length on the wire: DgramHeaderLen or
// DgramFragHeaderLen.
func (h DgramHeader) Len() int {
	if h.Fragment {
		return DgramFragHeaderLen
	}
	return DgramHeaderLen
}

// PutDgramHeader encodes h into the first h.Len() bytes of b and returns
// h.Len(). A fragment's fields must be within the limits ParseDatagram
// checks: the sender cuts datagrams of at most MaxDatagram bytes into
// fragments of FragSize bytes at multiples of FragSize. A b shorter than
// the header is the caller's bug, and panics.
func PutDgramHeader(b []byte, h DgramHeader) int {
	n := h.Len()
	if len(b) < n {
		panic("wire: datagram header does not fit the buffer")
	}
	b[0] = DgramMagic
	b[1] = DgramVersion << 4
	binary.BigEndian.PutUint16(b[2:], h.Port)
	if !h.Fragment {
		return n
	}
	b[1] |= dgramFragment
	binary.BigEndian.PutUint32(b[4:], h.ID)
	binary.BigEndian.PutUint16(b[8:], uint16(h.Total))
	binary.BigEndian.PutUint16(b[10:], uint16(h.Offset))
	binary.BigEndian.PutUint16(b[12:], uint16(h.FragSize))
	b[14], b[15] = 0, 0
	return n
}

// ParseDatagram reads a UD message: its header, and its payload (a
// subslice of b). A whole datagram's payload may be empty (a datagram of
// no bytes is legal, as in UDP). A fragment is accepted only where a
// sender following the rule of PutDgramHeader puts one: its payload is
// exactly FragSize bytes, or the rest of the datagram if that is less, at
// an offset that is a multiple of FragSize, in a datagram too large to
// travel whole. So a receiver may trust a fragment's geometry once it
// agrees with the first fragment of its datagram. Its errors wrap
// ErrMalformed.
func ParseDatagram(b []byte) (DgramHeader, []byte, error) {
	if len(b) < DgramHeaderLen {
		return DgramHeader{}, nil, malformed("datagram of %d bytes", len(b))
	}
	if b[0] != DgramMagic {
		return DgramHeader{}, nil, malformed("datagram with bad magic %#x", b[0])
	}
	if v := b[1] >> 4; v != DgramVersion {
		return DgramHeader{}, nil, malformed("datagram version %d, want %d", v, DgramVersion)
	}
	if f := b[1] & 0x0f &^ dgramFragment; f != 0 {
		return DgramHeader{}, nil, malformed("datagram with unknown flags %#x", f)
	}
	h := DgramHeader{Port: binary.BigEndian.Uint16(b[2:])}
	if b[1]&dgramFragment == 0 {
		p := b[DgramHeaderLen:]
		if len(p) > MaxDatagram {
			return DgramHeader{}, nil, malformed("datagram of %d bytes (at most %d)", len(p), MaxDatagram)
		}
		return h, p, nil
	}
	if len(b) < DgramFragHeaderLen {
		return DgramHeader{}, nil, malformed("fragment of %d bytes", len(b))
	}
	h.Fragment = true
	h.ID = binary.BigEndian.Uint32(b[4:])
	h.Total = int(binary.BigEndian.Uint16(b[8:]))
	h.Offset = int(binary.BigEndian.Uint16(b[10:]))
	h.FragSize = int(binary.BigEndian.Uint16(b[12:]))
	if b[14] != 0 || b[15] != 0 {
		return DgramHeader{}, nil, malformed("fragment with reserved bytes %#x", b[14:16])
	}
	p := b[DgramFragHeaderLen:]
	switch {
	case h.Total > MaxDatagram:
		return DgramHeader{}, nil, malformed("fragment of a datagram of %d bytes (at most %d)", h.Total, MaxDatagram)
	case h.FragSize < MinFragSize:
		return DgramHeader{}, nil, malformed("fragment size %d (at least %d)", h.FragSize, MinFragSize)
	case h.Total <= h.FragSize:
		return DgramHeader{}, nil, malformed("fragment of a datagram of %d bytes that fits one of %d", h.Total, h.FragSize)
	case h.Offset%h.FragSize != 0:
		return DgramHeader{}, nil, malformed("fragment at offset %d, not a multiple of %d", h.Offset, h.FragSize)
	case h.Offset >= h.Total:
		return DgramHeader{}, nil, malformed("fragment at offset %d of a datagram of %d bytes", h.Offset, h.Total)
	case len(p) == 0:
		return DgramHeader{}, nil, malformed("empty fragment at offset %d", h.Offset)
	case len(p) > h.FragSize:
		return DgramHeader{}, nil, malformed("fragment of %d bytes, more than its size %d", len(p), h.FragSize)
	case h.Offset+len(p) > h.Total:
		return DgramHeader{}, nil, malformed("fragment of %d bytes at offset %d past the datagram's end %d", len(p), h.Offset, h.Total)
	case h.Offset+len(p) < h.Total && len(p) != h.FragSize:
		return DgramHeader{}, nil, malformed("fragment of %d bytes at offset %d short of its size %d", len(p), h.Offset, h.FragSize)
	}
	return h, p, nil
}

// DgramFragments is how many fragments of fragSize bytes (more than 0) a
// datagram of total bytes takes.
func DgramFragments(total, fragSize int) int {
	return (total + fragSize - 1) / fragSize
}
