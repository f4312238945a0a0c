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
// under rdma_cm) out of the measurement; the dial and http tests, which
// measure setup, time it with the header and the ready byte included.
//
// Reverse tests (-R) added kindSource without a new version: its header is
// followed by 8 more bytes, the number of writes the server makes (0: until
// the client half-closes), and after the ready byte the server waits for
// the client's start byte before it sends. An older server refuses the
// unknown kind (it closes the connection), and an older client never asks
// for it, so both pairs of versions go on working for every other test.
// HTTP tests added kindHTTP the same way: after the ready byte the
// connection carries HTTP/1.1 (the client's requests, the server's
// responses of size bytes), and an older server refuses it as it refuses
// kindSource.
// The one-sided tests' kinds (kindRegion, kindRegionPong, after kindHTTP)
// came the same way: after the ready byte the server sends its region's
// key (rdma.RemoteKeyLen bytes), and for the ping-pong the client answers
// with its own; an older server, one without HTTP tests included, refuses
// them too.
// The datagram tests' kinds (kindDgramEcho, kindDgramSink) came the same
// way: after the ready byte the server sends the port of its datagram end
// point (see dgram.go), which an older server never does.

const (
	magic      = "rprf"
	version    = 1
	headerLen  = 12
	readyByte  = 'k'
	startByte  = 'g' // reverse: the client's clock has started, send
	countExt   = 8   // kindSource: the writes to make, big-endian, after the header
	countLen   = 8   // the sink's reply: bytes received, big-endian
	maxMsgSize = 1 << 30
)

// kind is the server-side behaviour a connection asks for.
type kind byte

const (
	kindEcho       kind = 1 + iota // ping-pong: read size bytes, write them back
	kindSink                       // read to EOF, then report the byte count
	kindIdle                       // like echo; a separate kind so logs tell them apart
	kindCopy                       // io.Copy(io.Discard, conn) to EOF, then report the byte count
	kindCopyPlain                  // the same, hiding the connection's WriteTo
	kindSource                     // reverse: write size-byte messages to the client
	kindHTTP                       // hand the connection to an HTTP/1.1 server answering with size bytes
	kindRegion                     // one-sided: expose a region of size bytes, send its key
	kindRegionPong                 // one-sided ping-pong: regions both ways, answer each WRITE with one
	kindDgramEcho                  // datagrams: send the datagram end's port, echo each datagram to its sender
	kindDgramSink                  // datagrams: send the port, count datagrams until EOF, then report the counts
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
	case kindSource:
		return "source"
	case kindHTTP:
		return "http"
	case kindRegion:
		return "region"
	case kindRegionPong:
		return "region ping-pong"
	case kindDgramEcho:
		return "datagram echo"
	case kindDgramSink:
		return "datagram sink"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

type header struct {
	kind  kind
	size  int    // message size for echo, idle and source; response body for http; write size (informative) for sink; datagram size
	count uint64 // source: writes to make; 0: until the client half-closes
}

func (h header) marshal() []byte {
	b := make([]byte, headerLen, headerLen+countExt)
	copy(b, magic)
	b[4] = version
	b[5] = byte(h.kind)
	binary.BigEndian.PutUint32(b[8:], uint32(h.size))
	if h.kind == kindSource {
		b = binary.BigEndian.AppendUint64(b, h.count)
	}
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
	case h.kind < kindEcho || h.kind > kindDgramSink:
		return h, fmt.Errorf("unknown test kind %d", h.kind)
	case h.size < 1 || h.size > maxMsgSize:
		return h, fmt.Errorf("message size %d outside [1, %d]", h.size, maxMsgSize)
	}
	if h.kind == kindSource {
		var c [countExt]byte
		if _, err := io.ReadFull(r, c[:]); err != nil {
			return h, fmt.Errorf("reading the write count: %w", err)
		}
		h.count = binary.BigEndian.Uint64(c[:])
	}
	return h, nil
}
