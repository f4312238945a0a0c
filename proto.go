package rdma

import (
	"fmt"

	"github.com/goverbs/rdma/internal/wire"
)

// The wire protocol's codec is internal/wire, whose package comment
// describes the protocol. Here: what this package makes of a peer's bytes
// that break it, and the ids of its own work requests. The region key's
// encoding is in remotekey.go, beside the public type.

// parseHello is wire.ParseHello for a hello from the peer: a malformed
// one is a protocol error.
// A buffer size over the largest the Options allow is one too: no side
// announces it, and as an int on a 32-bit platform a size of 2 GiB or
// more would be negative.
func parseHello(b []byte) (wire.Hello, error) {
	h, err := wire.ParseHello(b)
	if err != nil {
		return h, peerError(err)
	}
	if h.BufSize > maxBufferSize {
		return wire.Hello{}, &protocolError{fmt.Sprintf("buffer size %d over the largest, %d", h.BufSize, maxBufferSize)}
	}
	return h, nil
}

// parseRingDesc is wire.ParseRingDesc for the peer's ring offer: a
// malformed one is a protocol error.
func parseRingDesc(b []byte, most int) (wire.RingDesc, error) {
	d, err := wire.ParseRingDesc(b, most)
	if err != nil {
		return d, peerError(err)
	}
	return d, nil
}

// peerError reports a wire error in what the peer sent as ErrProtocol,
// with the wire's detail.
func peerError(err error) error { return &protocolError{err.Error()} }

// sendable reports whether a side whose transport carries immediate data
// (or not: headers) can send the way peer takes its headers: every
// transport sends SENDs, not every one immediate data.
func sendable(peer wire.Hello, headers bool) error {
	if headers && peer.Flags&wire.HelloHeaders == 0 {
		return &protocolError{"the peer takes headers as immediate data, which this device's transport (iWARP) cannot send"}
	}
	return nil
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
