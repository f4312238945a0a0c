package rdma

import (
	"sync"
	"time"

	"github.com/goverbs/rdma/internal/wire"
)

// Rings that follow the traffic (the protocol is in internal/wire). A
// connection starts with the arena's small rings (initRing). While the
// peer streams to it, the receiver registers a big ring and offers it; the
// sender registers a send ring to match and switches at a message
// boundary. Once no data has come for shrinkIdle the receiver offers the
// arena's ring again, the sender switches back to its own arena ring, and
// both give the big rings back. So an idle connection end registers its
// arena only (32 KiB by default), and a streaming one the rings its
// bandwidth needs, as TCP grows a socket's buffers while it streams.
//
// Registering and deregistering memory are system calls of milliseconds,
// so neither the poller nor a caller's Read or Write makes them: a
// connection's ring worker (a goroutine that runs while it has such work,
// ringWorker) does, and hands the result back under mu. Everything else is
// bookkeeping under mu, done where the protocol asks for it: offers and
// answers go out when the send path is at a message boundary (ringTurn,
// from every flush).

// ringAllocator registers rings apart from the arena, in the connection's
// protection domain: the verbs (buffers.go), or a fake in host tests.
type ringAllocator interface {
	allocRing(size int, remote bool) (*ringMem, error)
	freeRing(m *ringMem)
}

// growAfter is how many rings' worth of bytes in large messages (at least
// half the largest) a connection receives before it grows its receive
// ring: a request and its reply of a few large messages stay in the small
// ring, a stream does not.
const growAfter = 4

// shrinkIdle is how long a grown connection receives no data before it
// gives its big rings back. A variable for the tests.
var shrinkIdle = 2 * time.Second

// resizer is a connection's ring state beyond the rings themselves. Conn.mu
// guards it, but for workMu. Its methods are the bookkeeping, called with
// mu held: they register nothing and start no worker, but report when the
// worker has work (Conn.kickRingWork starts it).
type resizer struct {
	alloc            ringAllocator
	arenaRx, arenaTx ringMem // the arena's rings
	ownBuf, peerBuf  int     // the two sides' BufferSize
	initSpan         int     // the ring bytes agreed at the handshake: a shrink goes back to them
	bigSpan          int     // the ring bytes a grown connection uses
	ownBig           int     // the biggest ring this side registers (layout.bigRing)

	// The receive side.
	rxCur     *ringMem // the ring the peer writes into
	rxOld     *ringMem // the one before, while messages in it are queued
	offer     *ringMem // offered, or to be offered (offerSize bytes of it)
	offerSize int
	offerSent bool
	wantGrow  bool       // the worker is to register a big receive ring
	noGrow    bool       // a big ring could not be had, or the peer could not follow: stay small
	budget    ringBudget // registrations the peer may still cause (receive and send rings alike)
	large     int        // bytes of large messages received in the current ring
	active    bool       // data came since the idle timer's last tick
	idle      *time.Timer

	// The send side.
	txCur     *ringMem      // the send ring
	peerOffer wire.RingDesc // the peer's offer, while offered
	offered   bool
	txNext    *ringMem // the send ring ready for the offer
	wantTx    int      // the worker is to register a send ring of this size
	decline   bool     // the offer is to be declined
	retired   []retiredRing

	free    []*ringMem // registered rings to deregister (the worker)
	owned   []*ringMem // every ring registered apart and not yet freed
	working bool       // the worker runs
	closed  bool       // the release has begun: nothing more is registered
	workMu  sync.Mutex // held by the worker while it runs
}

// retiredRing is a send ring the NIC may still read from: until the
// signaled switch that left it (ctrlSeq) completes.
type retiredRing struct {
	m       *ringMem
	ctrlSeq uint32
}

// init sets up the ring state over the arena's two rings.
func (rs *resizer) init(rx, tx ringMem, lay layout) {
	rs.arenaRx, rs.arenaTx = rx, tx
	rs.rxCur, rs.txCur = &rs.arenaRx, &rs.arenaTx
	rs.ownBuf = lay.bufSize
	rs.bigSpan, rs.ownBig = lay.bigRing, lay.bigRing
}

// open takes the geometry agreed at the handshake.
func (rs *resizer) open(span int, peer wire.Hello) {
	rs.initSpan = span
	rs.peerBuf = int(peer.BufSize)
	// The peer sends from a ring no bigger than its own BufferSize gives.
	rs.bigSpan = min(rs.bigSpan, bigRingFor(rs.peerBuf))
}

// maxMsg is the largest message in a ring of span bytes.
func (rs *resizer) maxMsg(span int) int { return min(rs.ownBuf, rs.peerBuf, span/2) }

// noteData accounts for a data message of n bytes received, in a
// receive ring of span bytes whose largest message is maxMsg; it reports
// whether it is time to grow: the worker is to register a big ring.
func (rs *resizer) noteData(n, maxMsg, span int) bool {
	rs.active = true
	if 2*n < maxMsg {
		return false
	}
	return rs.noteLarge(n, span)
}

// noteLarge accounts for a large message (at least half the largest) of n
// bytes received in a receive ring of span bytes (see noteData): in the
// arena's ring, it counts toward growing.
func (rs *resizer) noteLarge(n, span int) bool {
	if rs.rxCur != &rs.arenaRx || rs.noGrow || rs.alloc == nil {
		return false
	}
	rs.large += n
	// Without a token in the budget (ringBudget) the ring stays small for
	// now; a later large message asks again.
	if rs.large >= growAfter*span && rs.bigSpan > span && rs.offer == nil && rs.rxOld == nil && !rs.wantGrow &&
		rs.budget.take(time.Now()) {
		rs.wantGrow = true
		return true
	}
	return false
}

// due reports whether an offer or an answer waits to go (flush sends it
// when it can: Conn.ringTurn).
func (rs *resizer) due() bool {
	return (rs.offer != nil && !rs.offerSent) || (rs.offered && (rs.txNext != nil || rs.decline))
}

// takeOffer takes the peer's offer of a new receive ring, from a
// wire.MsgRing whose payload is b: the send ring to match is the arena's
// if that is big enough (and the NIC is done with it), or one the worker
// registers (it reports whether the worker is to).
func (rs *resizer) takeOffer(b []byte) (bool, error) {
	d, err := parseRingDesc(b, rs.ownBig)
	if err != nil {
		return false, err
	}
	if rs.offered {
		return false, &protocolError{"ring offer while another is unanswered"}
	}
	rs.offered, rs.peerOffer = true, d
	if int(d.Size) <= len(rs.arenaTx.buf) {
		rs.txNext = &rs.arenaTx
		rs.txReady()
		return false, nil
	}
	// Past its budget (ringBudget) the offer is declined. That is an
	// answer the protocol already has, for a sender short of memory: the
	// peer keeps its old ring, which it has kept writing into meanwhile,
	// and waits for nothing more. Failing the connection instead would
	// punish a burst the budget merely caps; ignoring the offer would
	// leave the peer's offer outstanding forever, and with it its rings.
	if rs.alloc == nil || !rs.budget.take(time.Now()) {
		rs.decline = true
		return false, nil
	}
	rs.wantTx = int(d.Size)
	return true, nil
}

// txReady checks that the NIC is done with the send ring txNext (it may
// have left it by a switch not yet complete): if not, the switch waits
// for that completion (retire).
func (rs *resizer) txReady() {
	for _, r := range rs.retired {
		if r.m == rs.txNext {
			rs.txNext = nil
			return
		}
	}
}

// retire lets go of the send rings the NIC is done with, once the
// signaled sends up to ctrlDone have completed: registered ones go to the
// worker (it reports whether any did); the arena's becomes usable again
// for an offer that waits for it.
func (rs *resizer) retire(ctrlDone uint32) bool {
	work := false
	k := 0
	for _, r := range rs.retired {
		if int32(ctrlDone-r.ctrlSeq) < 0 {
			rs.retired[k] = r
			k++
			continue
		}
		if r.m.reg != nil {
			rs.free = append(rs.free, r.m)
			work = true
		} else if rs.offered && rs.txNext == nil && !rs.decline && rs.wantTx == 0 && int(rs.peerOffer.Size) <= len(r.m.buf) {
			rs.txNext = r.m
		}
	}
	clear(rs.retired[k:])
	rs.retired = rs.retired[:k]
	return work
}

// declined takes the peer's wire.MsgDecline: the offered ring goes (to
// the worker, if registered: it reports whether), and the connection
// stays as it is.
func (rs *resizer) declined() (bool, error) {
	if rs.offer == nil || !rs.offerSent {
		return false, &protocolError{"ring decline without an offer"}
	}
	work := false
	if rs.offer.reg != nil {
		rs.free = append(rs.free, rs.offer)
		work = true
		rs.noGrow = true
	}
	rs.offer, rs.offerSent = nil, false
	return work, nil
}

// dropOld lets the old receive ring go, its last queued message
// consumed: to the worker, if registered (it reports whether).
func (rs *resizer) dropOld() bool {
	if rs.rxOld == nil {
		return false
	}
	work := rs.rxOld.reg != nil
	if work {
		rs.free = append(rs.free, rs.rxOld)
	}
	rs.rxOld = nil
	return work
}

// idleTick is a tick of the idle timer of a grown connection: with no
// data since the last, it reports that the arena's ring is to be offered
// again, and sets the offer up.
func (rs *resizer) idleTick() bool {
	if rs.closed || rs.rxCur == &rs.arenaRx {
		return false
	}
	if rs.active || rs.offer != nil || rs.rxOld != nil || rs.wantGrow {
		rs.active = false
		rs.idle.Reset(shrinkIdle)
		return false
	}
	rs.offer, rs.offerSize = &rs.arenaRx, rs.initSpan
	return true
}

// dropOwned forgets m, about to be freed.
func (rs *resizer) dropOwned(m *ringMem) {
	for i, o := range rs.owned {
		if o == m {
			rs.owned = append(rs.owned[:i], rs.owned[i+1:]...)
			return
		}
	}
}

// ownedBytes is the memory of the rings registered apart from the arena.
func (rs *resizer) ownedBytes() int {
	n := 0
	for _, m := range rs.owned {
		n += len(m.buf)
	}
	return n
}

// The connection's side of the resizing: what needs its lock, its
// receive ring and send path, or its worker.

// noteData accounts for a data message of n bytes received: it may be
// time to grow.
func (c *Conn) noteData(n int) {
	if c.rs.noteData(n, c.rx.maxMsg, c.rx.span) {
		c.kickRingWork()
	}
}

// ringTurn sends what the ring protocol has waiting, where the send path
// allows: the offer of a receive ring (a data message: a credit, room in
// the send ring and the send queue, and no message pending or filling at
// the tail, whose place it would take), and the answer to the peer's
// offer (a control message, at a message boundary of ours: nothing
// pending or filling, so every message from the next on goes to the new
// ring). Nothing goes once the write side is shut: the fin is the last
// message.
func (c *Conn) ringTurn() {
	rs := &c.rs
	if c.life.has(shutWrite) || c.life.werr != nil || c.tx.draining || c.tx.pendLen > 0 || c.tx.filling {
		return
	}
	if rs.offer != nil && !rs.offerSent && c.cr.credits > 0 && c.tx.free() > 0 && c.tx.ring.room() >= wire.RingDescLen {
		off := c.tx.pendOff()
		wire.RingDesc{Addr: rs.offer.base, RKey: rs.offer.rkey, Size: uint32(rs.offerSize)}.Put(c.tx.buf[off:])
		c.cr.spend()
		c.queueSend(wire.MsgRing, wire.RingDescLen)
		rs.offerSent = true
	}
	if !rs.offered || (rs.txNext == nil && !rs.decline) || !c.cr.ctrlFree(c.tx.ctrlInFlight()) {
		return
	}
	rs.offered = false
	if rs.decline {
		rs.decline = false
		c.queueSend(wire.MsgDecline, 0)
		return
	}
	c.queueSend(wire.MsgSwitched, 0)
	rs.retired = append(rs.retired, retiredRing{rs.txCur, c.tx.ctrlSeq})
	d := rs.peerOffer
	c.tx.switchTo(rs.txNext, d, rs.maxMsg(int(d.Size)), c.cr.peerWindow)
	rs.txCur, rs.txNext = rs.txNext, nil
	// A Write waiting for room in the old ring finds the new one empty.
	signal(c.txReady)
}

// ringOffered takes the peer's offer of a new receive ring (see
// resizer.takeOffer).
func (c *Conn) ringOffered(b []byte) error {
	work, err := c.rs.takeOffer(b)
	if work {
		c.kickRingWork()
	}
	return err
}

// retireSent lets go of the send rings the NIC is done with, after a
// signaled completion (see resizer.retire).
func (c *Conn) retireSent() {
	if len(c.rs.retired) == 0 {
		return
	}
	if c.rs.retire(c.tx.ctrlDone) {
		c.kickRingWork()
	}
}

// ringSwitched takes the peer's wire.MsgSwitched: its next message goes to the
// ring offered. The old ring's queued messages are read first; it goes
// once they are (ringDrained). A grown ring starts the idle timer, the
// arena's stops it.
func (c *Conn) ringSwitched() error {
	rs := &c.rs
	if rs.offer == nil || !rs.offerSent {
		return &protocolError{"ring switch without an offer"}
	}
	rs.rxOld, rs.rxCur = rs.rxCur, rs.offer
	rs.offer, rs.offerSent = nil, false
	c.rx.switchTo(rs.rxCur.buf[:rs.offerSize], rs.offerSize, rs.maxMsg(rs.offerSize))
	rs.large = 0
	if rs.rxCur == &rs.arenaRx {
		c.st.RingShrinks++
		if rs.idle != nil {
			rs.idle.Stop()
		}
	} else {
		c.st.RingGrowths++
		rs.active = false
		if rs.idle == nil {
			rs.idle = time.AfterFunc(shrinkIdle, c.ringIdle)
		} else {
			rs.idle.Reset(shrinkIdle)
		}
	}
	if c.obs != nil {
		// mu is held here, on the completion path: the callback runs
		// without it, on a goroutine of its own (a ring moves seldom).
		o, info := c.obs, RingResizedInfo{Local: addrOrNil(c.laddr), Remote: addrOrNil(c.raddr),
			Grew: rs.rxCur != &rs.arenaRx, Size: c.rx.span}
		go o.ringResized(info)
	}
	c.ringDrained()
	return nil
}

// ringDeclined takes the peer's wire.MsgDecline (see resizer.declined).
func (c *Conn) ringDeclined() error {
	work, err := c.rs.declined()
	if work {
		c.kickRingWork()
	}
	return err
}

// ringDrained lets the old receive ring go once its last queued message
// was consumed.
func (c *Conn) ringDrained() {
	if c.rx.takeDrained() && c.rs.dropOld() {
		c.kickRingWork()
	}
}

// ringIdle is the idle timer of a grown connection: with no data since
// its last tick, the connection offers the arena's ring again.
func (c *Conn) ringIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rs.idleTick() {
		c.flushDroppingLock()
	}
}

// kickRingWork starts the ring worker if it is not running.
func (c *Conn) kickRingWork() {
	rs := &c.rs
	if rs.working || rs.closed {
		return
	}
	rs.working = true
	go c.ringWorker()
}

// ringWorker registers and deregisters rings for the connection until
// none is wanted, without mu across the system calls.
func (c *Conn) ringWorker() {
	rs := &c.rs
	rs.workMu.Lock()
	defer rs.workMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for !rs.closed {
		switch {
		case len(rs.free) > 0:
			m := rs.free[len(rs.free)-1]
			rs.free = rs.free[:len(rs.free)-1]
			rs.dropOwned(m)
			c.mu.Unlock()
			rs.alloc.freeRing(m)
			c.mu.Lock()
		case rs.wantGrow:
			// wantGrow stays set while the ring is registered: no second
			// one is wanted meanwhile, nor an offer of the arena's.
			size := rs.bigSpan
			m := c.allocRingDroppingLock(size, true)
			rs.wantGrow = false
			if m == nil {
				rs.noGrow = true
				continue
			}
			rs.offer, rs.offerSize = m, size
			c.flushDroppingLock()
		case rs.wantTx > 0:
			size := rs.wantTx
			rs.wantTx = 0
			if rs.txNext = c.allocRingDroppingLock(size, false); rs.txNext == nil {
				rs.decline = true
			}
			c.flushDroppingLock()
		default:
			rs.working = false
			return
		}
	}
	rs.working = false
}

// allocRingDroppingLock registers a ring of size bytes (remote: for the
// peer to write into) without mu, and returns it owned by the connection,
// or nil if it could not be had or the release began meanwhile.
func (c *Conn) allocRingDroppingLock(size int, remote bool) *ringMem {
	rs := &c.rs
	c.mu.Unlock()
	m, err := rs.alloc.allocRing(size, remote)
	c.mu.Lock()
	if err != nil {
		return nil
	}
	rs.owned = append(rs.owned, m)
	if rs.closed {
		return nil // the release frees it with the rest
	}
	return m
}

// freeRings gives back every ring registered apart from the arena, once
// the QP is drained (the NIC touches none of them any more): it stops the
// idle timer and waits for the worker first. mu is not held.
func (c *Conn) freeRings() {
	rs := &c.rs
	c.mu.Lock()
	rs.closed = true
	if rs.idle != nil {
		rs.idle.Stop()
	}
	c.mu.Unlock()
	rs.workMu.Lock()
	defer rs.workMu.Unlock()
	c.mu.Lock()
	owned := rs.owned
	rs.owned, rs.free, rs.retired = nil, nil, nil
	rs.rxCur, rs.rxOld, rs.offer, rs.txCur, rs.txNext = nil, nil, nil, nil, nil
	c.mu.Unlock()
	for _, m := range owned {
		rs.alloc.freeRing(m)
	}
}
