package rdma

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// Fuzz targets for the message header with the completion it arrives in,
// through a connection; the parsers of the peer's other bytes (the hello,
// the ring offer, the reject) are fuzzed in internal/wire, the region key
// (its bytes and its text) in remotekey_test.go. make test runs each for a bounded time (make
// fuzz for longer).

// FuzzConnCompletions feeds a connection (over a fake QP, the fuzzer
// playing the peer's NIC) a stream of completions built from arbitrary
// bytes: headers, lengths, opcodes, flags, statuses and ids a broken or
// hostile peer could cause, interleaved with Reads. Whatever arrives, the
// connection must not panic, must keep its accounting within bounds (its
// credits, and the unread bytes of its receive ring within the ring), and
// once it has failed must keep failing.
func FuzzConnCompletions(f *testing.F) {
	rec := func(typ, ctrlAck uint8, credits uint16, n uint16, op uint8) []byte {
		b := make([]byte, 8)
		binary.BigEndian.PutUint32(b, wire.Header{Type: typ, CtrlAck: ctrlAck, Credits: credits}.Imm())
		binary.BigEndian.PutUint16(b[4:], n)
		b[6] = op
		return b
	}
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	f.Add(cat(rec(wire.MsgData, 0, 0, 5, 0), rec(0, 0, 0, 0, 1)))
	f.Add(cat(rec(wire.MsgData, 0, 0, 64, 0), rec(wire.MsgData, 0, 0, 64, 0), rec(wire.MsgData, 0, 0, 64, 0), rec(wire.MsgData, 0, 0, 64, 0), rec(0, 0, 0, 0, 1)))
	f.Add(cat(rec(wire.MsgData, 0, 0, 65, 0)))
	f.Add(cat(rec(wire.MsgData, 0, 0, 5, 6), rec(wire.MsgCredit, 0, 0, 0, 0)))
	f.Add(cat(rec(wire.MsgDataMore, 0, 0, 64, 0), rec(wire.MsgData, 0, 0, 1, 0), rec(0, 0, 0, 0, 1)))
	f.Add(cat(rec(wire.MsgCredit, 1, 0, 0, 0), rec(wire.MsgFin, 0, 0, 0, 0), rec(0, 0, 0, 0, 1)))
	f.Add(cat(rec(wire.MsgData, 0, 3, 5, 0)))
	f.Add(cat(rec(9, 0, 0, 5, 0)))
	f.Add(cat(rec(wire.MsgData, 0, 0, 5, 2), rec(wire.MsgData, 0, 0, 5, 3)))
	f.Add(cat(rec(wire.MsgFin, 0, 0, 0, 0), rec(wire.MsgData, 0, 0, 1, 0)))
	// A stream of largest messages, read as they come: this side grows
	// its receive ring and offers it.
	read256 := rec(0, 0, 0, 0, 1)
	read256[7] = 255
	var stream [][]byte
	for range 12 {
		stream = append(stream, rec(wire.MsgData, 0, 0, 2048, 0))
		for range 8 {
			stream = append(stream, read256)
		}
	}
	f.Add(cat(stream...))
	// The peer offers a ring of 16 KiB (the record after the offer is its
	// descriptor: address, key, size), then another before the answer.
	desc := make([]byte, wire.RingDescLen)
	wire.RingDesc{Addr: 1 << 40, RKey: 9, Size: 16 << 10}.Put(desc)
	f.Add(cat(rec(wire.MsgRing, 0, 0, wire.RingDescLen, 0), desc, rec(0, 0, 0, 0, 5), rec(wire.MsgData, 0, 1, 64, 0), rec(wire.MsgRing, 0, 0, wire.RingDescLen, 0), desc))
	f.Fuzz(func(t *testing.T, data []byte) { fuzzConn(t, data, false) })
}

// FuzzConnHeaders is FuzzConnCompletions on a transport without immediate
// data (iWARP): the headers and lengths arrive in the receives' header
// slots, beside whatever else the completions say.
func FuzzConnHeaders(f *testing.F) {
	rec := func(typ uint8, credits uint16, n uint16, op uint8) []byte {
		b := make([]byte, 8)
		binary.BigEndian.PutUint32(b, wire.Header{Type: typ, Credits: credits}.Imm())
		binary.BigEndian.PutUint16(b[4:], n)
		b[6] = op
		return b
	}
	f.Add(append(rec(wire.MsgData, 0, 5, 0), rec(0, 0, 0, 1)...))
	f.Add(append(rec(wire.MsgCredit, 0, 0, 0), rec(wire.MsgFin, 0, 0, 0)...))
	f.Add(append(rec(wire.MsgDataMore, 0, 64, 0), rec(wire.MsgData, 0, 1, 0)...))
	f.Add(append(rec(wire.MsgCredit, 0, 3, 0), rec(wire.MsgData, 0, 9, 6)...))
	f.Add(rec(wire.MsgData, 0, 4097, 2))
	f.Add(append(rec(wire.MsgData, 0, 5, 4), rec(wire.MsgData, 0, 72, 4)...))
	f.Fuzz(func(t *testing.T, data []byte) { fuzzConn(t, data, true) })
}

// fuzzConn is the body of the completion fuzzers: 8 bytes of data per
// event; headers says the transport has no immediate data.
func fuzzConn(t *testing.T, data []byte, headers bool) {
	const depth, bufSize = 4, 2048 // four largest messages overrun the 4 KiB ring
	p := newFakeConnMode(t, Options{BufferSize: bufSize, SendDepth: depth, RecvDepth: depth, Poll: PollEvent}, false, headers)
	// Rings registered apart, as the real connection has (resize.go): the
	// peer's offers, switches and declines, and this side's growth, meet
	// the hostile stream too.
	rings := &fuzzRings{t: t, live: map[*ringMem]bool{}}
	p.c.mu.Lock()
	p.c.rs.alloc = rings
	p.c.mu.Unlock()
	defer func() {
		// The release's part: every ring registered apart goes back.
		p.c.freeRings()
		rings.mu.Lock()
		defer rings.mu.Unlock()
		if len(rings.live) > 0 {
			t.Fatalf("%d rings registered apart never freed", len(rings.live))
		}
	}()
	failed := false
	for ; len(data) >= 8; data = data[8:] {
		imm := binary.BigEndian.Uint32(data)
		n := uint32(binary.BigEndian.Uint16(data[4:])) % (2*bufSize + 1)
		switch data[6] % 8 {
		case 1: // the application reads what is queued
			p.c.mu.Lock()
			queued := p.c.rx.n > 0
			p.c.mu.Unlock()
			if queued {
				p.c.Read(make([]byte, int(data[7])+1))
			}
		case 2: // a completion without immediate data
			p.deliverRaw(ibv.WC{ByteLen: n})
		case 3: // a failed completion
			p.deliverRaw(ibv.WC{ByteLen: n, Status: uint32(data[7] % 22), Flags: ibv.WCWithImm, Imm: imm})
		case 5: // a send completion (the ids are ours: the NIC only
			// completes what we posted, so the peer forges none)
			if all := p.q.posted(); len(all) > 0 {
				p.complete(ibv.WC{WRID: all[int(data[7])%len(all)].ID})
			}
		case 6: // a SEND into the next posted receive
			p.deliverRaw(ibv.WC{Opcode: ibv.WCOpRecv, ByteLen: n, Flags: ibv.WCWithImm, Imm: imm})
		default:
			if headers {
				// A header SEND into the next receive's slot,
				// announcing n payload bytes (in the ring, or not).
				if wr, ok := p.q.recvAt(p.nextRx); ok {
					p.nextRx++
					if data[6]%8 == 4 { // with up to HeaderData bytes of data inline
						p.sendHeaderData(wr, imm, n, make([]byte, int(data[7])%(ibv.HeaderData+1)))
					} else {
						p.sendHeader(wr, imm, n)
					}
				}
			} else { // an RDMA WRITE with immediate into the ring
				// Its payload, where the placement rule puts it, is
				// the input's next bytes: a ring offer the peer forged.
				p.c.mu.Lock()
				if rx := &p.c.rx; rx.opened() {
					buf := rx.buf[rx.ep]
					if off := int(wire.RingPlace(rx.tail, rx.span, rx.maxMsg) % uint64(rx.span)); off < len(buf) {
						copy(buf[off:min(len(buf), off+int(n))], data[8:])
					}
				}
				p.c.mu.Unlock()
				p.deliverRaw(ibv.WC{Opcode: ibv.WCOpRecvWriteImm, ByteLen: n, Flags: ibv.WCWithImm, Imm: imm})
			}
		}
		// The ring worker registers what the event asked for before the
		// next one: each input runs the same way every time.
		require.Eventually(t, func() bool {
			p.c.mu.Lock()
			defer p.c.mu.Unlock()
			return !p.c.rs.working
		}, 10*time.Second, 10*time.Microsecond)
		p.c.mu.Lock()
		c := p.c
		if c.rx.posted < 0 || c.rx.posted > p.lay.recvSlots {
			t.Fatalf("receives posted: %d of %d", c.rx.posted, p.lay.recvSlots)
		}
		if c.cr.credits < 0 || c.cr.credits > c.cr.peerWindow || c.cr.ctrlCredits > c.cr.ctrlWindow {
			t.Fatalf("credits out of bounds: %+v", c.cr)
		}
		if c.rx.tail-c.rx.read > uint64(c.rx.span) || c.rx.read > c.rx.tail {
			t.Fatalf("receive ring: %d unread bytes of %d", c.rx.tail-c.rx.read, c.rx.span)
		}
		if c.tx.ring.tail-c.tx.ring.acked > uint64(c.tx.ring.span) || c.tx.ring.n > c.cr.peerWindow {
			t.Fatalf("send ring: %+v", c.tx.ring)
		}
		if failed && c.life.rerr == nil && c.life.werr == nil {
			t.Fatal("a failed connection recovered")
		}
		failed = c.life.rerr != nil || c.life.werr != nil
		c.mu.Unlock()
	}
}

// deliverRaw completes the next posted receive with wc (its id filled
// in), if one is posted: the fuzzer's peer never sends without one, since
// the NIC would not deliver it.
func (p *fakePeer) deliverRaw(wc ibv.WC) {
	wr, ok := p.q.recvAt(p.nextRx)
	if !ok {
		return
	}
	p.nextRx++
	wc.WRID = wr.ID
	p.complete(wc)
}

// fuzzRings registers rings apart for the fuzzed connection: plain memory
// at made-up addresses, each freed once.
type fuzzRings struct {
	t    *testing.T
	mu   sync.Mutex
	live map[*ringMem]bool
	next uint64
}

func (r *fuzzRings) allocRing(size int, remote bool) (*ringMem, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next += 1 << 32
	m := &ringMem{buf: make([]byte, size), base: r.next, lkey: 3}
	if remote {
		m.rkey = uint32(r.next >> 32)
	}
	m.reg = m
	r.live[m] = true
	return m, nil
}

func (r *fuzzRings) freeRing(m *ringMem) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.live[m] {
		r.t.Errorf("freeRing of a ring not registered (or freed twice): %#x", m.base)
	}
	delete(r.live, m)
}
