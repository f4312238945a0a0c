package wire

import "encoding/binary"

const (
	// RingAlign is where messages start in a ring: each takes a whole
	// number of these, so its successor starts on a cache line.
	RingAlign = 64
	// MinRing and MaxRing bound the ring a peer may announce: room for
	// two of the smallest messages a side takes (256 bytes), and sizes
	// whose sums cannot overflow the arithmetic.
	MinRing = 2 * 256
	MaxRing = 1 << 30
)

// RingGeometry is what both sides of a connection agree on without
// talking: the ring bytes they use (the span: the smaller ring) and the
// largest message (the smaller of the two sides', at most half the ring,
// so that a message always fits an empty ring wherever the last one
// ended).
func RingGeometry(ownRing, ownBuf, peerRing, peerBuf int) (span, maxMsg int) {
	span = min(ownRing, peerRing)
	return span, min(ownBuf, peerBuf, span/2)
}

// RingPlace is the placement rule, the same at both ends: a message whose
// predecessors ended at running byte count t starts at ring offset t mod
// span, unless a message of the largest size would not fit before the
// ring's end; then it starts at offset 0 and the bytes skipped count as
// used. It returns the running count where the message starts (its offset
// is that mod span). The wrap depends on t alone, never on the message's
// length, so a sender may place a message whose length is not final yet,
// and the receiver, who learns the length last, places it alike.
func RingPlace(t uint64, span, maxMsg int) (start uint64) {
	off := t % uint64(span)
	if off+uint64(maxMsg) > uint64(span) {
		return t + uint64(span) - off
	}
	return t
}

// RingEnd is the running count after a message of n bytes that starts at
// start: messages take whole RingAlign units.
func RingEnd(start uint64, n int) uint64 {
	return start + uint64((n+RingAlign-1)&^(RingAlign-1))
}

// RingDesc is a MsgRing's payload: a receive ring offered to the peer.
type RingDesc struct {
	Addr uint64
	RKey uint32
	Size uint32
}

// RingDescLen is the length of a marshaled RingDesc.
const RingDescLen = 16

// Put encodes d into the first RingDescLen bytes of b.
func (d RingDesc) Put(b []byte) {
	binary.BigEndian.PutUint64(b, d.Addr)
	binary.BigEndian.PutUint32(b[8:], d.RKey)
	binary.BigEndian.PutUint32(b[12:], d.Size)
}

// ParseRingDesc validates a peer's ring offer: exactly RingDescLen bytes,
// a size of whole RingAlign units between MinRing and most (the largest
// ring the caller sends into), not wrapping the address space. Its errors
// wrap ErrMalformed.
func ParseRingDesc(b []byte, most int) (RingDesc, error) {
	if len(b) != RingDescLen {
		return RingDesc{}, malformed("ring offer of %d bytes", len(b))
	}
	d := RingDesc{Addr: binary.BigEndian.Uint64(b), RKey: binary.BigEndian.Uint32(b[8:]), Size: binary.BigEndian.Uint32(b[12:])}
	if d.Size < MinRing || int64(d.Size) > int64(most) || d.Size > MaxRing || d.Size%RingAlign != 0 {
		return RingDesc{}, malformed("ring offer of size %d (at most %d)", d.Size, most)
	}
	if d.Addr > ^uint64(0)-uint64(d.Size) {
		return RingDesc{}, malformed("ring offer at %#x of %d bytes wraps the address space", d.Addr, d.Size)
	}
	return d, nil
}
