package main

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The client opens every connection with a fixed-size header that tells the
// server what to do with it, so one server process serves every test, as
// iperf's does. The server answers with one byte once it is ready: the
// client starts its clock only then, which keeps connection setup (slow
// under rdma_cm) out of the measurement.

const (
	magic      = "rprf"
	version    = 1
	headerLen  = 12
	readyByte  = 'k'
	countLen   = 8 // the sink's reply: bytes received, big-endian
	maxMsgSize = 1 << 30
)

// kind is the server-side behaviour a connection asks for.
type kind byte

const (
	kindEcho      kind = 1 + iota // ping-pong: read size bytes, write them back
	kindSink                      // read to EOF, then report the byte count
	kindIdle                      // like echo; a separate kind so logs tell them apart
	kindCopy                      // io.Copy(io.Discard, conn) to EOF, then report the byte count
	kindCopyPlain                 // the same, hiding the connection's WriteTo
)

func (k kind) String() string {
	switch k {
	case kindEcho:
		return "echo"
	case kindSink:
		return "sink"
	case kindIdle:
		return "idle"
	case kindCopy:
		return "copy"
	case kindCopyPlain:
		return "copy (plain)"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

type header struct {
	kind kind
	size int // message size for echo and idle; write size (informative) for sink
}

func (h header) marshal() []byte {
	b := make([]byte, headerLen)
	copy(b, magic)
	b[4] = version
	b[5] = byte(h.kind)
	binary.BigEndian.PutUint32(b[8:], uint32(h.size))
	return b
}

func readHeader(r io.Reader) (header, error) {
	var b [headerLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return header{}, fmt.Errorf("reading header: %w", err)
	}
	if string(b[:4]) != magic || b[4] != version {
		return header{}, fmt.Errorf("not an rdmaperf client (header % x)", b[:6])
	}
	h := header{kind: kind(b[5]), size: int(binary.BigEndian.Uint32(b[8:]))}
	switch {
	case h.kind < kindEcho || h.kind > kindCopyPlain:
		return h, fmt.Errorf("unknown test kind %d", h.kind)
	case h.size < 1 || h.size > maxMsgSize:
		return h, fmt.Errorf("message size %d outside [1, %d]", h.size, maxMsgSize)
	}
	return h, nil
}
