package rdma

import (
	"bytes"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// Two Conns joined by a fake wire: each side's posts are carried out at
// once, as rxe does (an RDMA WRITE copies into the peer's registered
// memory, checked against its keys), and their completions go, in order,
// to a poller goroutine per side. Both data paths, the credits and the ring
// protocol run as they do over a device; only the verbs are fake. The
// race detector then checks that no byte is written where the other side
// may still read.

// wireMem is one registered range of a side's memory.
type wireMem struct {
	base   uint64
	buf    []byte
	rkey   uint32 // 0: local only
	remote bool
}

type wireEnd struct {
	t        testing.TB
	c        *Conn
	peer     *wireEnd
	mu       sync.Mutex
	mems     []*wireMem
	next     uint64 // the next fake address for a ring
	recvs    int    // receives posted and not consumed
	wcs      chan ibv.WC
	failRegs bool // allocRing fails (no memory)
	allocs   int
}

func (e *wireEnd) lookup(addr uint64, n int, remote bool, rkey uint32) []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.mems {
		if addr >= m.base && addr+uint64(n) <= m.base+uint64(len(m.buf)) {
			if remote && (!m.remote || m.rkey != rkey) {
				e.t.Errorf("remote access to %#x (%d bytes) under rkey %d: not allowed", addr, n, rkey)
				return nil
			}
			return m.buf[addr-m.base : addr-m.base+uint64(n)]
		}
	}
	e.t.Errorf("access to %#x (%d bytes): not registered", addr, n)
	return nil
}

func (e *wireEnd) allocRing(size int, remote bool) (*ringMem, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failRegs {
		return nil, syscall.ENOMEM
	}
	e.allocs++
	m := &wireMem{base: e.next, buf: make([]byte, size), remote: remote}
	e.next += 1 << 24
	if remote {
		m.rkey = uint32(m.base >> 24)
	}
	e.mems = append(e.mems, m)
	return &ringMem{buf: m.buf, base: m.base, lkey: 1, rkey: m.rkey, reg: m}, nil
}

func (e *wireEnd) freeRing(r *ringMem) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, m := range e.mems {
		if m == r.reg {
			e.mems = append(e.mems[:i], e.mems[i+1:]...)
			return
		}
	}
	e.t.Errorf("freeRing of a ring not registered")
}

func (e *wireEnd) PostRecvs(wrs []ibv.RecvWR) error {
	e.mu.Lock()
	e.recvs += len(wrs)
	e.mu.Unlock()
	return nil
}

// PostSends carries the work requests out in order: data into the peer's
// memory and a receive completion to it, and a completion of our own for
// each signaled one.
func (e *wireEnd) PostSends(wrs []ibv.SendWR) error {
	for _, wr := range wrs {
		switch {
		case wr.Flags&ibv.SendEmptyWrite != 0:
		case wr.Flags&ibv.SendWriteImm != 0:
			dst := e.peer.lookup(wr.RemoteAddr, int(wr.Len), true, wr.RKey)
			src := e.lookup(wr.Addr, int(wr.Len), false, 0)
			copy(dst, src)
			e.peer.deliver(ibv.WC{WRID: recvWRID, Opcode: ibv.WCOpRecvWriteImm, ByteLen: wr.Len, Imm: wr.Imm, Flags: ibv.WCWithImm})
		default:
			require.Zero(e.t, wr.Len, "SENDs carry no payload")
			e.peer.deliver(ibv.WC{WRID: recvWRID, Opcode: ibv.WCOpRecv, Imm: wr.Imm, Flags: ibv.WCWithImm})
		}
		if wr.Flags&ibv.SendSignaled != 0 {
			e.wcs <- ibv.WC{WRID: wr.ID}
		}
	}
	return nil
}

func (e *wireEnd) deliver(wc ibv.WC) {
	e.mu.Lock()
	if e.recvs == 0 {
		e.t.Errorf("a message with no receive posted (receiver not ready)")
	}
	e.recvs--
	e.mu.Unlock()
	e.wcs <- wc
}

func (e *wireEnd) poll(done *sync.WaitGroup) {
	defer done.Done()
	for wc := range e.wcs {
		if e.c.complete(wc) {
			e.c.lockAndFlush()
		}
	}
}

// newWire returns two established Conns joined by a fake wire; the test's
// cleanup closes them and checks that every ring registered apart was
// given back.
func newWire(t *testing.T, oa, ob Options) (a, b *wireEnd) {
	a, b = &wireEnd{t: t, next: 0x1000000000}, &wireEnd{t: t, next: 0x2000000000}
	a.peer, b.peer = b, a
	var hellos [2]wire.Hello
	var lays [2]layout
	for i, e := range []*wireEnd{a, b} {
		o, err := []Options{oa, ob}[i].normalized()
		require.NoError(t, err)
		o.Poll = PollEvent
		lay := newLayout(o)
		mem := make([]byte, lay.size())
		base := e.next
		e.next += 1 << 24
		e.mems = append(e.mems, &wireMem{base: base, buf: mem[:lay.ring], rkey: 7, remote: true},
			&wireMem{base: base + uint64(lay.sendOff()), buf: mem[lay.sendOff():]})
		e.wcs = make(chan ibv.WC, 1<<16)
		c := newConn(phaseEstablished)
		c.mu.Lock()
		require.NoError(t, c.initDataPath(e, mem, lay, base+uint64(lay.sendOff()), 1, 0, o, nopSpinner{}))
		c.rs.arenaRx.rkey = 7
		c.rs.alloc = e
		c.mu.Unlock()
		e.c = c
		var flags uint8
		if o.Messages {
			flags = wire.HelloMessages
		}
		hellos[i] = wire.Hello{Flags: flags, RecvDepth: uint16(o.RecvDepth), CtrlDepth: wire.CtrlDepth, BufSize: uint32(o.BufferSize),
			RingSize: uint32(lay.ring), RingAddr: base, RKey: 7}
		lays[i] = lay
	}
	var polls sync.WaitGroup
	for i, e := range []*wireEnd{a, b} {
		e.c.mu.Lock()
		e.c.open(hellos[1-i], lays[i])
		e.c.mu.Unlock()
		polls.Add(1)
		go e.poll(&polls)
	}
	t.Cleanup(func() {
		// The fake wire never flushes receives: the drain waits for
		// nothing.
		defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
		drainTimeout = time.Millisecond
		var closes sync.WaitGroup
		for _, e := range []*wireEnd{a, b} {
			closes.Add(1)
			go func() {
				defer closes.Done()
				e.c.Close()
			}()
		}
		closes.Wait()
		releasing.Wait()
		close(a.wcs)
		close(b.wcs)
		polls.Wait()
		for _, e := range []*wireEnd{a, b} {
			e.mu.Lock()
			require.Len(t, e.mems, 2, "only the arena is left registered")
			e.mu.Unlock()
		}
	})
	return a, b
}

// pattern is n bytes that tell where they are in a stream from seed on.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((seed + i) * 7 / 5)
	}
	return b
}

// stream writes total bytes from w to r in Writes of size bytes, and
// checks what r reads.
func stream(t *testing.T, w, r *Conn, total, size int) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < total; off += size {
			if _, err := w.Write(pattern(off, min(size, total-off))); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	got := make([]byte, total)
	_, err := io.ReadFull(r, got)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	want := pattern(0, total)
	for i := range got {
		if got[i] != want[i] {
			src := bytes.Index(want, got[i:min(total, i+64)])
			t.Fatalf("the stream differs from byte %d of %d on (%d-byte Writes): the bytes there are those at %d", i, total, size, src)
		}
	}
}

func registered(c *Conn) int { return c.Stats().RegisteredBytes }

// noShrink keeps grown rings for the test (until it says otherwise): a
// test slowed down, by the race detector say, must not find a connection
// idle and shrunk between two of its streams.
func noShrink(t *testing.T) {
	old := shrinkIdle
	shrinkIdle = time.Hour
	t.Cleanup(func() { shrinkIdle = old })
}

func TestRingGrowsWhileStreamingAndShrinksWhenIdle(t *testing.T) {
	noShrink(t) // until the test says
	a, b := newWire(t, Options{}, Options{})
	idle := 32 << 10
	require.Equal(t, idle, registered(a.c), "a connection starts with the arena's small rings")
	require.Equal(t, 8<<10, a.c.tx.ring.maxMsg, "messages of half the small ring")

	stream(t, a.c, b.c, 4<<20, 64<<10)
	sb := b.c.Stats()
	require.Equal(t, uint64(1), sb.RingGrowths, "the receiver grew its ring while the stream came")
	require.Equal(t, idle+1<<20, sb.RegisteredBytes, "the arena and the big receive ring")
	require.Equal(t, idle+1<<20, registered(a.c), "the arena and the big send ring")
	a.c.mu.Lock()
	require.Equal(t, 64<<10, a.c.tx.ring.maxMsg, "messages of BufferSize in the big ring")
	a.c.mu.Unlock()

	// Idle: both give the big rings back. (The idle timer's next tick,
	// now: it finds the connection active and ticks again shortly.)
	shrinkIdle = 10 * time.Millisecond
	b.c.ringIdle()
	require.Eventually(t, func() bool {
		return b.c.Stats().RingShrinks == 1 && registered(a.c) == idle && registered(b.c) == idle
	}, 5*time.Second, time.Millisecond, "the big rings go once the connection is idle")
	shrinkIdle = time.Hour

	// A new stream grows it again, and data flows both ways meanwhile.
	var both sync.WaitGroup
	both.Add(1)
	go func() {
		defer both.Done()
		stream(t, b.c, a.c, 2<<20, 5000)
	}()
	stream(t, a.c, b.c, 4<<20, 100<<10)
	both.Wait()
	require.Equal(t, uint64(2), b.c.Stats().RingGrowths)
	require.Equal(t, uint64(1), a.c.Stats().RingGrowths, "a, streamed to by Writes of 5000 bytes, grows too")
}

// Message boundaries survive a ring switch between and inside messages
// (fragments in the old ring, the rest in the new).
func TestRingSwitchKeepsMessages(t *testing.T) {
	noShrink(t)
	a, b := newWire(t, Options{}, Options{Messages: true})
	sizes := []int{1, 70 << 10, 5000, 200 << 10, 64 << 10, 8 << 10, 3, 1 << 20, 100}
	errc := make(chan error, 1)
	go func() {
		for i, n := range sizes {
			if _, err := a.c.Write(pattern(i, n)); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 2<<20)
	for i, n := range sizes {
		got, err := b.c.Read(buf)
		require.NoError(t, err)
		require.Equal(t, n, got, "message %d is one Read", i)
		require.True(t, bytes.Equal(pattern(i, n), buf[:got]), "message %d intact", i)
	}
	require.NoError(t, <-errc)
	require.Equal(t, uint64(1), b.c.Stats().RingGrowths)
}

// A sender that cannot register a send ring declines the offer: the
// receiver gives its big ring back, stays small, and the data flows.
func TestRingOfferDeclined(t *testing.T) {
	noShrink(t)
	a, b := newWire(t, Options{}, Options{})
	a.failRegs = true
	stream(t, a.c, b.c, 2<<20, 64<<10)
	require.Zero(t, b.c.Stats().RingGrowths)
	require.Eventually(t, func() bool { return registered(b.c) == 32<<10 }, 5*time.Second, time.Millisecond,
		"the declined ring goes")
	stream(t, a.c, b.c, 2<<20, 64<<10)
	require.Equal(t, 1, b.allocs, "no second offer after a decline")
}

// Sides with different BufferSize agree on the rings: the big ring is the
// smaller side's.
func TestRingGrowthUnevenBuffers(t *testing.T) {
	noShrink(t)
	a, b := newWire(t, Options{BufferSize: 16 << 10}, Options{BufferSize: 1 << 20})
	stream(t, a.c, b.c, 4<<20, 64<<10)
	require.Equal(t, uint64(1), b.c.Stats().RingGrowths)
	require.Equal(t, 32<<10+256<<10, registered(b.c), "a big ring of 16 × 16 KiB, the smaller BufferSize")
	stream(t, b.c, a.c, 4<<20, 64<<10)
	require.Equal(t, uint64(1), a.c.Stats().RingGrowths)
	require.Equal(t, 32<<10+2*(256<<10), registered(a.c), "its receive ring and its send ring, 256 KiB each")
	a.c.mu.Lock()
	require.Equal(t, 16<<10, a.c.tx.ring.maxMsg, "messages of the smaller BufferSize")
	a.c.mu.Unlock()
}

// A peer that lies about rings fails its own connection.
func TestRingProtocolViolations(t *testing.T) {
	offer := func(d wire.RingDesc) []byte {
		b := make([]byte, wire.RingDescLen)
		d.Put(b)
		return b
	}
	for _, tc := range []struct {
		name string
		send func(p *fakePeer)
		want string
	}{
		{"offer too big", func(p *fakePeer) {
			p.deliver(wire.Header{Type: wire.MsgRing}, offer(wire.RingDesc{Addr: 0x1000, RKey: 1, Size: 1 << 20}))
		}, "ring offer of size"},
		{"offer too small", func(p *fakePeer) {
			p.deliver(wire.Header{Type: wire.MsgRing}, offer(wire.RingDesc{Addr: 0x1000, RKey: 1, Size: 64}))
		}, "ring offer of size"},
		{"offer of odd length", func(p *fakePeer) { p.deliver(wire.Header{Type: wire.MsgRing}, []byte("short")) }, "ring offer of 5 bytes"},
		{"second offer unanswered", func(p *fakePeer) {
			p.c.mu.Lock()
			p.c.cr.ctrlCredits = 0 // no control credit: the answer waits
			p.c.mu.Unlock()
			p.deliver(wire.Header{Type: wire.MsgRing}, offer(wire.RingDesc{Addr: 0x1000, RKey: 1, Size: 4096}))
			p.deliver(wire.Header{Type: wire.MsgRing}, offer(wire.RingDesc{Addr: 0x2000, RKey: 1, Size: 4096}))
		}, "another is unanswered"},
		{"switch without offer", func(p *fakePeer) { p.deliver(wire.Header{Type: wire.MsgSwitched}, nil) }, "switch without an offer"},
		{"decline without offer", func(p *fakePeer) { p.deliver(wire.Header{Type: wire.MsgDecline}, nil) }, "decline without an offer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakeConn(t, 8, 4096)
			tc.send(p)
			_, err := p.c.Read(make([]byte, 10))
			require.ErrorIs(t, err, ErrProtocol)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
