//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
)

// Compile-time checks that the types fit the interfaces code relies on.
var (
	_ net.Conn     = (*Conn)(nil)
	_ net.Listener = (*Listener)(nil)
	_ net.Addr     = (*Addr)(nil)
)

// Connection states, under Conn.mu.
const (
	stateDialing     = iota // events go to cmEv for the dialing goroutine
	stateAccepting          // events go to the listener
	stateEstablished        // only disconnects matter
	stateDead               // torn down or being torn down
)

// holdDepth is how many unconsumed messages at the peer make small Writes
// gather (see hold): a burst of two Writes (a length, then the payload)
// goes out at once; in a longer one, the third may wait.
const holdDepth = 2

// Timeouts of the teardown: how long Close waits for the fin to be
// acknowledged, and for the QP to flush its work requests once in error.
const (
	lingerTimeout = 3 * time.Second
	drainTimeout  = 3 * time.Second
)

// Conn is an RDMA connection; it implements net.Conn. Reads and Writes may
// be called from several goroutines; concurrent Writes do not interleave.
type Conn struct {
	cm     *cmLoop
	handle uintptr
	id     *rdmacm.ID
	dev    *device
	qp     *ibv.QP
	ar     *arena
	lay    layout
	cqe    int // CQ entries reserved on dev

	laddr, raddr *Addr
	maxMsg       int // payload bytes per message, from both sides' buffer sizes
	maxInline    int // bytes the QP sends inline
	batch        int // receives reposted and credits returned at once
	poll         PollMode
	spinTime     time.Duration
	rdWait       time.Duration // moving average of Read waits, under readMu
	wrWait       time.Duration // moving average of Write waits, under writeMu
	lst          *Listener

	cmEv    chan rdmacm.Event // handshake events, while dialing
	rxReady chan struct{}     // capacity 1: a message or an error arrived
	txReady chan struct{}     // capacity 1: credits or send buffers came back
	drained chan struct{}     // capacity 1: a completion arrived during teardown
	closing chan struct{}     // closed by Close

	readMu  sync.Mutex // one Read at a time: partial messages stay consistent
	writeMu sync.Mutex // one Write at a time: Writes do not interleave
	rdl     deadline
	wdl     deadline

	mu    sync.Mutex // everything below
	state int
	// Receive side. rxq holds received data messages (and the fin) in
	// arrival order; rxOff is how much of the head message was read.
	rxq        []rxMsg
	rxHead     int
	rxLen      int
	rxOff      int
	repost     []ibv.RecvWR // consumed data buffers not yet posted again
	ctrlRepost [1]ibv.RecvWR
	sends      []ibv.SendWR // prepared by queueSend, posted by flush
	sendsSpare []ibv.SendWR // the other half of a double buffer: the batch being posted
	posting    bool         // a goroutine is posting without c.mu; others only queue
	draining   bool         // the teardown owns the send queue: nothing more is posted
	recvPosted int          // receives on the QP
	unreported int          // data receives posted again, not yet reported to the peer
	ctrlOwed   int          // control receives posted again, not yet acknowledged
	wantCredit bool         // a credit message is due but could not be sent
	finRcvd    bool
	rdShut     bool // CloseRead was called
	peerGone   bool // the peer disconnected
	qpGone     bool // the teardown is destroying the QP
	rerr       error
	// Send side. Sequence numbers count posted messages; the done numbers
	// trail them as signaled completions come back.
	credits     int // data messages the peer has receives for
	ctrlCredits int // credit messages the peer has receives for
	dataSeq     uint32
	dataDone    uint32
	lastSig     uint32
	ctrlSeq     uint32
	ctrlDone    uint32
	pendLen     int  // bytes waiting in the send buffer at dataSeq for a credit
	peerWindow  int  // the peer's data receives: credits when none is in use
	holdAt      int  // unconsumed messages at the peer from which hold holds
	noDelay     bool // SetNoDelay(true): hold never holds
	streaming   bool // see hold
	filling     bool // a Write is copying into send buffers without c.mu
	finSent     bool // CloseWrite or Close: no more Writes
	finQueued   bool // the fin waits behind pending data
	werr        error
	closed      bool
}

type rxMsg struct {
	slot int32
	n    int32 // payload bytes; -1 for the fin
}

func newConn(cm *cmLoop, state int) *Conn {
	return &Conn{
		cm:      cm,
		state:   state,
		cmEv:    make(chan rdmacm.Event, 8),
		rxReady: make(chan struct{}, 1),
		txReady: make(chan struct{}, 1),
		drained: make(chan struct{}, 1),
		closing: make(chan struct{}),
		rdl:     makeDeadline(),
		wdl:     makeDeadline(),
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// setup creates the data path on the id's device: device reference, arena,
// QP, and every receive posted.
func (c *Conn) setup(opts Options) error {
	verbs := c.id.Verbs()
	if verbs == nil {
		return &deviceError{os.NewSyscallError("rdma_resolve_addr", syscall.ENODEV)}
	}
	c.lay = newLayout(opts)
	c.cqe = c.lay.recvSlots + c.lay.sendSlots + c.lay.ctrlSlots + 1
	dev, err := acquireDevice(verbs, c.cqe)
	if err != nil {
		return err
	}
	c.dev = dev
	if c.ar, err = newArena(dev.pd, c.lay.size()); err != nil {
		return err
	}
	// One send queue entry more than buffers, for the drain marker of the
	// teardown.
	qp, inline, err := c.id.CreateQP(dev.pd.Ptr(), dev.cq.Ptr(), c.lay.sendSlots+c.lay.ctrlSlots+1, c.lay.recvSlots, 256)
	if err != nil {
		return err
	}
	c.qp = ibv.QPFrom(qp)
	c.maxInline = inline
	c.batch = max(1, opts.RecvDepth/4)
	c.poll = opts.Poll
	c.spinTime = opts.SpinTime
	c.rxq = make([]rxMsg, c.lay.recvSlots)
	c.repost = make([]ibv.RecvWR, 0, ibv.MaxRecvBatch)
	// Room for everything that can be queued at once: a message per send
	// buffer and control buffer, so appending never allocates.
	c.sends = make([]ibv.SendWR, 0, c.lay.sendSlots+c.lay.ctrlSlots)
	c.sendsSpare = make([]ibv.SendWR, 0, cap(c.sends))
	dev.addConn(c)

	c.mu.Lock()
	defer c.mu.Unlock()
	for i := 0; i < c.lay.recvSlots; i++ {
		c.queueRepost(i)
		if len(c.repost) == cap(c.repost) || i == c.lay.recvSlots-1 {
			if err := c.postReposts(); err != nil {
				return err
			}
		}
	}
	// The initial receives are granted by the handshake, not by reports.
	c.unreported = 0
	return nil
}

// start records the peer's geometry once the handshake is done.
func (c *Conn) start(peer hello, opts Options) {
	c.laddr = addrFrom(c.id.LocalAddr())
	c.raddr = addrFrom(c.id.PeerAddr())
	c.maxMsg = min(c.lay.bufSize, int(peer.bufSize))
	c.mu.Lock()
	c.credits += int(peer.recvDepth)
	c.peerWindow = int(peer.recvDepth)
	c.holdAt = max(1, min(holdDepth, c.peerWindow/2))
	c.ctrlCredits += int(min(peer.ctrlDepth, ctrlDepth))
	c.mu.Unlock()
	signal(c.txReady)
}

func (c *Conn) hello() hello {
	return hello{recvDepth: uint16(c.lay.recvSlots - ctrlDepth - finSlots), ctrlDepth: ctrlDepth, bufSize: uint32(c.lay.bufSize)}
}

// dial runs the active side of the handshake.
func dial(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options) (*Conn, error) {
	cm, err := acquireCM()
	if err != nil {
		return nil, err
	}
	c := newConn(cm, stateDialing)
	c.handle = cm.register(c)
	if c.id, err = rdmacm.NewID(cm.ch, c.handle); err != nil {
		cm.unregister(c.handle)
		cm.release()
		return nil, err
	}
	if err := c.handshake(ctx, src, dst, opts); err != nil {
		c.teardown(false)
		return nil, err
	}
	return c, nil
}

func (c *Conn) handshake(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options) error {
	ms := 5000
	if dl, ok := ctx.Deadline(); ok {
		ms = max(1, min(ms, int(time.Until(dl)/time.Millisecond)))
	}
	if err := c.id.ResolveAddr(src, dst, ms); err != nil {
		return &deviceError{err}
	}
	ev, err := c.waitCM(ctx)
	if err != nil {
		return err
	}
	if ev.Type != rdmacm.EventAddrResolved {
		return &deviceError{os.NewSyscallError("rdma_resolve_addr", eventErrno(ev, syscall.ENODEV))}
	}
	if err := c.id.ResolveRoute(ms); err != nil {
		if errors.Is(err, syscall.ENODEV) {
			// The address resolved to an interface without RDMA (loopback).
			return &deviceError{err}
		}
		return err
	}
	if ev, err = c.waitCM(ctx); err != nil {
		return err
	}
	if ev.Type != rdmacm.EventRouteResolved {
		err := os.NewSyscallError("rdma_resolve_route", eventErrno(ev, syscall.EHOSTUNREACH))
		if ev.Status == -int(syscall.ENODEV) {
			// The address resolved to an interface without RDMA (loopback).
			return &deviceError{err}
		}
		return err
	}
	if err := c.setup(opts); err != nil {
		return err
	}
	if err := c.id.Connect(c.hello().marshal()); err != nil {
		return err
	}
	if ev, err = c.waitCM(ctx); err != nil {
		return err
	}
	switch ev.Type {
	case rdmacm.EventEstablished:
	case rdmacm.EventRejected:
		return os.NewSyscallError("rdma_connect", syscall.ECONNREFUSED)
	case rdmacm.EventUnreachable:
		return os.NewSyscallError("rdma_connect", eventErrno(ev, syscall.EHOSTUNREACH))
	default:
		return os.NewSyscallError("rdma_connect", eventErrno(ev, syscall.ECONNABORTED))
	}
	peer, err := parseHello(ev.PrivateData)
	if err != nil {
		return err
	}
	c.start(peer, opts)
	return nil
}

// eventErrno turns an event's status (a negative errno for most events)
// into an errno, or def when it carries none.
func eventErrno(ev rdmacm.Event, def syscall.Errno) error {
	if ev.Status < 0 {
		return syscall.Errno(-ev.Status)
	}
	return def
}

func (c *Conn) waitCM(ctx context.Context) (rdmacm.Event, error) {
	select {
	case ev := <-c.cmEv:
		return ev, nil
	case <-ctx.Done():
		return rdmacm.Event{}, ctx.Err()
	}
}

// cmEvent runs on the CM goroutine.
func (c *Conn) cmEvent(ev rdmacm.Event) {
	c.mu.Lock()
	state := c.state
	if state == stateDialing && ev.Type == rdmacm.EventEstablished {
		// From here on a disconnect must reach peerDisconnected even
		// before the dialing goroutine has looked at this event.
		c.state = stateEstablished
	}
	c.mu.Unlock()
	switch state {
	case stateDialing:
		select {
		case c.cmEv <- ev:
		default:
		}
	case stateAccepting:
		if ev.Type == rdmacm.EventEstablished {
			c.mu.Lock()
			c.state = stateEstablished
			c.mu.Unlock()
			c.lst.established(c)
		} else if ev.Type != rdmacm.EventTimewaitExit {
			c.lst.failed(c)
		}
	case stateEstablished, stateDead:
		// While closing too: a disconnect ends the wait for the fin's
		// acknowledgement.
		switch ev.Type {
		case rdmacm.EventDisconnected, rdmacm.EventDeviceRemoval:
			c.peerDisconnected()
		}
	}
}

// peerDisconnected handles the peer's disconnect: acknowledge it (which
// moves our QP to the error state and flushes our receives) and fail
// further writes. Reads still return what already arrived.
func (c *Conn) peerDisconnected() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peerGone = true
	if !c.qpGone {
		c.id.Disconnect()
	}
	if c.werr == nil {
		c.werr = errPeerReset()
	}
	// Reads learn of it from the flushed receives, or, with none posted,
	// from peerGone itself.
	signal(c.rxReady)
	signal(c.txReady)
}

// complete handles one work completion on whichever goroutine polled it,
// with the device's CQ lock held. It only queues what must go out (a credit
// message, a pending buffer that credits now allow); it reports whether
// there is any, and the caller flushes once the CQ lock is released, so a
// post does not hold up the device's other connections.
func (c *Conn) complete(wc *ibv.WC) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if wc.WRID&wrSend != 0 {
		c.sendDone(wc)
	} else {
		c.recvDone(wc)
	}
	if c.wantCredit {
		c.returnCredits(true)
	}
	if c.state == stateDead {
		signal(c.drained)
	}
	return len(c.sends) > 0 || c.pendingGoes()
}

// pendingGoes reports whether flush would post the pending buffer now: it
// holds data, a credit allows it, no Write is filling it and hold does not
// keep it.
func (c *Conn) pendingGoes() bool {
	return c.pendLen > 0 && c.credits > 0 && !c.filling && !c.hold(c.pendLen)
}

// lockAndFlush is flush for a caller without c.mu.
func (c *Conn) lockAndFlush() {
	c.mu.Lock()
	c.flush()
	c.mu.Unlock()
}

// errPeerReset is the error of a connection the peer dropped without a
// fin: its disconnect arrives as an rdma_cm event.
func errPeerReset() error { return os.NewSyscallError("rdma_get_cm_event", syscall.ECONNRESET) }

// wcError is a failed work completion.
type wcError struct{ status uint32 }

func (e *wcError) Error() string { return ibv.StatusString(e.status) }
func (e *wcError) Unwrap() error { return syscall.ECONNRESET }

func (c *Conn) recvDone(wc *ibv.WC) {
	c.recvPosted--
	if wc.Status != ibv.WCSuccess {
		if !c.finRcvd && c.rerr == nil {
			if c.peerGone || wc.Status == ibv.WCFlushErr {
				c.rerr = errPeerReset()
			} else {
				c.rerr = os.NewSyscallError("ibv_poll_cq", &wcError{wc.Status})
			}
		}
		signal(c.rxReady)
		return
	}
	slot := int(wc.WRID)
	if slot >= c.lay.recvSlots || wc.Flags&ibv.WCWithImm == 0 {
		c.protocolViolation("message without immediate data (its header)")
		return
	}
	h := headerOf(wc.Imm)
	if h.credits > 0 || h.ctrlAck > 0 {
		c.credits += int(h.credits)
		c.ctrlCredits += int(h.ctrlAck)
		signal(c.txReady)
	}
	switch h.typ {
	case msgData:
		if c.rdShut {
			// CloseRead: discard, and give the buffer back to the peer.
			c.queueRepost(slot)
			c.returnCredits(false)
			return
		}
		c.push(rxMsg{slot: int32(slot), n: int32(wc.ByteLen)})
	case msgCredit:
		// Post the buffer again at once, on its own (queued data buffers
		// are reported as data credits); the peer learns of it through
		// ctrlAck on our next message.
		if !c.peerGone && !c.draining {
			c.ctrlRepost[0] = c.recvWR(slot)
			if err := c.qp.PostRecvs(c.ctrlRepost[:]); err == nil {
				c.recvPosted++
				c.ctrlOwed++
			} else if c.rerr == nil {
				c.rerr = err
			}
		}
	case msgFin:
		c.finRcvd = true
		c.push(rxMsg{slot: int32(slot), n: -1})
	default:
		c.protocolViolation("unknown message type")
	}
}

func (c *Conn) push(m rxMsg) {
	if c.rxLen == len(c.rxq) {
		c.protocolViolation("peer overran its credits")
		return
	}
	c.rxq[(c.rxHead+c.rxLen)%len(c.rxq)] = m
	c.rxLen++
	signal(c.rxReady)
}

func (c *Conn) protocolViolation(what string) {
	err := os.NewSyscallError("ibv_poll_cq", &protocolError{what})
	if c.rerr == nil {
		c.rerr = err
	}
	if c.werr == nil {
		c.werr = err
	}
	c.id.Disconnect()
	signal(c.rxReady)
	signal(c.txReady)
}

func (c *Conn) sendDone(wc *ibv.WC) {
	data, ctrl := parseSendWRID(wc.WRID)
	c.dataDone = data
	c.ctrlDone = c.ctrlSeq - (c.ctrlSeq-ctrl)&0x7fffffff
	if wc.Status != ibv.WCSuccess && c.werr == nil {
		if c.peerGone || wc.Status == ibv.WCFlushErr {
			c.werr = errPeerReset()
		} else {
			c.werr = os.NewSyscallError("ibv_poll_cq", &wcError{wc.Status})
			if c.rerr == nil && !c.finRcvd {
				c.rerr = c.werr
			}
			signal(c.rxReady)
		}
	}
	signal(c.txReady)
}

func (c *Conn) recvWR(slot int) ibv.RecvWR {
	return ibv.RecvWR{
		ID:   uint64(slot),
		Addr: c.ar.base + uint64(c.lay.recvOff(slot)),
		Len:  uint32(c.lay.bufSize),
		LKey: c.ar.mr.LKey,
	}
}

// queueRepost queues a consumed data buffer to be posted again.
func (c *Conn) queueRepost(slot int) { c.repost = append(c.repost, c.recvWR(slot)) }

// postReposts posts the queued data buffers as one chain; each becomes a
// data credit to report to the peer.
func (c *Conn) postReposts() error {
	n := len(c.repost)
	if n == 0 {
		return nil
	}
	if c.peerGone {
		c.repost = c.repost[:0]
		return nil
	}
	err := c.qp.PostRecvs(c.repost)
	c.repost = c.repost[:0]
	if err != nil {
		if c.rerr == nil {
			c.rerr = err
		}
		return err
	}
	c.recvPosted += n
	c.unreported += n
	return nil
}

// returnCredits posts consumed data buffers again and tells the peer, in a
// credit message, once a batch of them is ready, or at once when force is
// set (the reader is about to wait, so the writer must not be left without
// credits).
func (c *Conn) returnCredits(force bool) {
	if c.draining {
		// The teardown owns the QP: nothing is posted or owed any more.
		c.repost = c.repost[:0]
		c.wantCredit = false
		return
	}
	if n := len(c.repost); n >= c.batch || (force && n > 0) {
		c.postReposts()
	}
	if c.unreported == 0 || (!force && c.unreported < c.batch) {
		c.wantCredit = false
		return
	}
	// Credits still flow after our fin: the peer may go on writing.
	if c.peerGone || c.werr != nil {
		c.wantCredit = false
		return
	}
	// A credit message spends a control credit, and one control buffer of
	// ours is kept for the fin.
	if c.ctrlCredits == 0 || int(c.ctrlSeq-c.ctrlDone) >= ctrlDepth {
		c.wantCredit = true
		return
	}
	c.wantCredit = false
	c.ctrlCredits--
	c.queueSend(msgCredit, 0)
}

// hold reports whether a send buffer holding n bytes should wait for more
// Writes rather than go out now. A buffer that is not full waits while the
// connection streams: from the moment holdAt earlier messages are
// unconsumed at the peer until the peer has consumed all of them. The peer
// is behind, so its credits (and with them the flush) will come, and
// meanwhile small Writes gather into one message instead of costing a post
// each. A peer that drains everything and waits for more returns its
// credits at once, so a held buffer costs at most that exchange, and
// bursts of fewer than holdAt Writes (a request in a few pieces) never
// wait. This is Nagle's rule with credits for acknowledgements;
// SetNoDelay turns it off. It never holds once half the peer's control
// credits await our acknowledgement (ctrlOwed): the peer may need them to
// return the very credits that would end the hold.
func (c *Conn) hold(n int) bool {
	out := c.peerWindow - c.credits
	switch {
	case out == 0:
		c.streaming = false
	case out >= c.holdAt:
		c.streaming = true
	}
	return c.streaming && n < c.maxMsg && !c.noDelay && !c.finQueued && c.ctrlOwed < ctrlDepth/2
}

// SetNoDelay controls whether a small Write goes out at once even while
// the peer is behind (noDelay true), or may wait, while earlier messages
// are unconsumed at the peer, to be sent with the Writes that follow (the
// default). Like TCP's option of that name, it trades message rate for the
// latency of back-to-back small Writes; request-response traffic, where
// the peer has consumed what was sent before each Write, never waits.
func (c *Conn) SetNoDelay(noDelay bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.noDelay = noDelay
	c.flush()
	return nil
}

// queueSend prepares a message for flush: a data message whose payload (n
// bytes) is already in the next send buffer, or a control message, which
// has none. The header, in the immediate data, piggybacks every credit owed
// to the peer.
func (c *Conn) queueSend(typ uint8, n int) {
	var addr uint64
	data := typ == msgData
	if data {
		addr = c.ar.base + uint64(c.lay.sendOff(int(c.dataSeq%uint32(c.lay.sendSlots))))
	}
	c.postReposts()
	imm := header{typ: typ, ctrlAck: uint8(c.ctrlOwed), credits: uint16(c.unreported)}.imm()
	c.unreported, c.ctrlOwed, c.wantCredit = 0, 0, false

	// Signal every half ring (so buffers come back while the rest are in
	// flight) and whenever a ring becomes full (so a waiting writer is
	// always woken); a signaled completion retires all sends before it.
	flags := 0
	if data {
		c.dataSeq++
		if c.dataSeq-c.lastSig >= uint32(max(1, c.lay.sendSlots/2)) || int(c.dataSeq-c.dataDone) == c.lay.sendSlots {
			flags |= ibv.SendSignaled
		}
	} else {
		c.ctrlSeq++
		// After the fin every control message is signaled: Close waits for
		// all of them to complete.
		if typ == msgFin || c.finSent || int(c.ctrlSeq-c.ctrlDone) >= ctrlDepth/2 {
			flags |= ibv.SendSignaled
		}
	}
	if flags&ibv.SendSignaled != 0 {
		c.lastSig = c.dataSeq
	}
	if n > 0 && n <= c.maxInline {
		flags |= ibv.SendInline
	}
	c.sends = append(c.sends, ibv.SendWR{
		ID:    sendWRID(c.dataSeq, c.ctrlSeq),
		Addr:  addr,
		Len:   uint32(n),
		LKey:  c.ar.mr.LKey,
		Flags: int32(flags),
		Imm:   imm,
	})
}

// flush posts what is queued: prepared messages, then the pending send
// buffer once a credit allows, then a fin that waited behind it. c.mu is
// held on entry and exit but not across ibv_post_send (on rxe a system
// call that runs the whole transfer), so completions, Reads and other
// connections' work go on meanwhile. One goroutine posts at a time, which
// keeps the send queue in sequence order; whoever finds another posting
// only queues, and the poster picks that up before it leaves.
func (c *Conn) flush() {
	if c.posting || c.draining {
		return
	}
	c.posting = true
	for {
		if c.pendingGoes() {
			c.credits--
			c.queueSend(msgData, c.pendLen)
			c.pendLen = 0
		}
		if c.finQueued && c.pendLen == 0 && !c.filling {
			c.finQueued = false
			c.queueSend(msgFin, 0)
		}
		if len(c.sends) == 0 {
			break
		}
		batch := c.sends
		c.sends, c.sendsSpare = c.sendsSpare[:0], batch
		c.mu.Unlock()
		var err error
		for len(batch) > 0 && err == nil {
			k := min(len(batch), ibv.MaxSendBatch)
			err = c.qp.PostSends(batch[:k])
			batch = batch[k:]
		}
		c.mu.Lock()
		if err != nil {
			// The connection has failed: post nothing more (the
			// teardown's marker retires what never went out).
			if c.werr == nil {
				c.werr = err
			}
			c.sends = c.sends[:0]
			signal(c.txReady)
			break
		}
	}
	c.posting = false
	if c.state == stateDead {
		signal(c.drained)
	}
}

func (c *Conn) opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "rdma", Source: c.laddr, Addr: c.raddr, Err: err}
}

// Read reads data into b: whatever has arrived, up to len(b), or, when
// nothing has, waits for the next data. It returns io.EOF once the peer
// has closed its side and everything it sent has been read.
func (c *Conn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	n, err := c.read(b)
	return n, c.opErr("read", err)
}

func (c *Conn) read(b []byte) (int, error) {
	c.mu.Lock()
	for {
		if c.closed {
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		if c.rdl.expired() {
			// A reader that polls with a past deadline must still give
			// credits back, or a writer holding data for them would wait
			// for a Read that never blocks.
			if c.rxLen == 0 {
				c.returnCredits(true)
				c.flush()
			}
			c.mu.Unlock()
			return 0, errTimeout
		}
		if c.rdShut {
			c.mu.Unlock()
			return 0, io.EOF
		}
		if c.rxLen > 0 {
			if c.rxq[c.rxHead].n < 0 {
				c.mu.Unlock()
				return 0, io.EOF
			}
			if len(b) == 0 {
				c.mu.Unlock()
				return 0, nil
			}
			if len(c.repost) == cap(c.repost) {
				c.postReposts()
			}
			// The queued messages are the reader's while readMu is held
			// (the poller only appends behind them): copy as many as fit
			// without blocking the poller, stopping at a fin.
			head, avail, off := c.rxHead, min(c.rxLen, cap(c.repost)-len(c.repost)), c.rxOff
			c.mu.Unlock()
			n, used := 0, 0
			for used < avail && n < len(b) {
				m := c.rxq[(head+used)%len(c.rxq)]
				if m.n < 0 {
					break
				}
				start := c.lay.recvOff(int(m.slot))
				k := copy(b[n:], c.ar.mem[start+off:start+int(m.n)])
				n += k
				if off += k; off < int(m.n) {
					break
				}
				off = 0
				used++
			}
			c.mu.Lock()
			for range used {
				c.queueRepost(int(c.rxq[c.rxHead].slot))
				c.rxHead = (c.rxHead + 1) % len(c.rxq)
				c.rxLen--
			}
			c.rxOff = off
			if used > 0 {
				c.returnCredits(false)
				c.flush()
			}
			c.mu.Unlock()
			return n, nil
		}
		if c.rerr != nil {
			c.mu.Unlock()
			return 0, c.rerr
		}
		if c.peerGone && c.recvPosted == 0 {
			c.mu.Unlock()
			return 0, errPeerReset()
		}
		c.returnCredits(true)
		c.flush()
		c.mu.Unlock()
		c.wait(c.rxReady, &c.rdl, &c.rdWait)
		c.mu.Lock()
	}
}

// Write writes b and returns once all of it is in the connection's
// registered send buffers; b may be reused at once. The data goes out in
// order as the peer has receive buffers free: at once when it has, and
// otherwise Writes gather in a pending buffer that goes out as one message
// when the peer returns credit (so a fast writer of small messages is not
// held to one message per peer receive). Write blocks only while every send
// buffer is in flight or full. Close delivers what Write accepted, unless
// the peer leaves no receive buffer free for the few seconds Close waits;
// then Close reports the loss.
func (c *Conn) Write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	n, err := c.write(b)
	return n, c.opErr("write", err)
}

func (c *Conn) write(b []byte) (int, error) {
	n := 0
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case c.closed:
			return n, net.ErrClosed
		case c.finSent:
			return n, os.NewSyscallError("ibv_post_send", syscall.EPIPE)
		case c.werr != nil:
			return n, c.werr
		case c.wdl.expired():
			return n, errTimeout
		case n == len(b):
			return n, nil
		}
		// The buffers from dataSeq on are free up to the ring's end; the
		// first may already hold pending bytes. With credits, fill as many
		// as credits allow and post them as one chain (one ibv_post_send,
		// one system call on rxe); without, add to the pending buffer.
		free := c.lay.sendSlots - int(c.dataSeq-c.dataDone)
		if free == 0 || (c.credits == 0 && c.pendLen == c.maxMsg) {
			c.mu.Unlock()
			c.wait(c.txReady, &c.wdl, &c.wrWait)
			c.mu.Lock()
			continue
		}
		slots := 1
		if c.credits > 0 {
			slots = min(c.credits, free, ibv.MaxSendBatch, (c.pendLen+len(b)-n+c.maxMsg-1)/c.maxMsg)
		}
		// The buffers are the writer's until queued (flush leaves a pending
		// buffer alone while filling is set): copy without the lock.
		seq, pend := c.dataSeq, c.pendLen
		c.filling = true
		c.mu.Unlock()
		off := n
		for i := 0; i < slots && off < len(b); i++ {
			start := c.lay.sendOff(int((seq+uint32(i))%uint32(c.lay.sendSlots))) + pend
			chunk := min(len(b)-off, c.maxMsg-pend)
			copy(c.ar.mem[start:start+chunk], b[off:off+chunk])
			off += chunk
			pend = 0
		}
		c.mu.Lock()
		c.filling = false
		if c.closed || c.werr != nil {
			continue
		}
		// Credits only grow while the lock is dropped (this writer is the
		// only one spending them), so every buffer planned with credits
		// goes out, but for a last, partly filled one that hold keeps;
		// without credits the one buffer stays pending.
		queued := c.pendLen + off - n
		n = off
		for queued > 0 && c.credits > 0 {
			m := min(queued, c.maxMsg)
			if c.hold(m) {
				break
			}
			c.credits--
			c.queueSend(msgData, m)
			queued -= m
		}
		c.pendLen = queued
		c.flush()
		if n == len(b) {
			// Accepted, whatever happened while flush had the lock
			// dropped (the peer may have answered and closed).
			return n, nil
		}
	}
}

// CloseWrite shuts down the writing side: the peer reads what was written
// and then io.EOF, while this side can still read.
func (c *Conn) CloseWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("close", net.ErrClosed)
	}
	return c.opErr("close", c.sendFin())
}

// CloseRead shuts down the reading side: Reads return io.EOF from now on,
// and data that arrives is discarded, its buffers returned to the peer so
// that the peer's Writes do not block. Writing continues to work.
func (c *Conn) CloseRead() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.rdShut = true
	c.mu.Unlock()
	signal(c.rxReady)
	// A Read in progress returns io.EOF and releases readMu; then the
	// queued messages are no one's.
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		// Close ran meanwhile: the buffers and the QP are gone.
		return c.opErr("close", net.ErrClosed)
	}
	for ; c.rxLen > 0; c.rxLen-- {
		if m := c.rxq[c.rxHead]; m.n >= 0 {
			c.queueRepost(int(m.slot))
		}
		c.rxHead = (c.rxHead + 1) % len(c.rxq)
	}
	c.rxOff = 0
	c.returnCredits(true)
	c.flush()
	return nil
}

// sendFin posts the fin unless it was already sent; c.mu is held.
func (c *Conn) sendFin() error {
	if c.finSent {
		return nil
	}
	if c.werr != nil {
		return c.werr
	}
	c.finSent = true
	c.finQueued = true
	// Not c.werr afterwards: while flush posts without the lock, the peer
	// may read the fin, close, and have its disconnect recorded here.
	c.flush()
	return nil
}

// Close closes the connection. Data already written is delivered before the
// peer's Read returns io.EOF; Reads and Writes blocked here return an error
// wrapping net.ErrClosed. Close waits until the peer's NIC has acknowledged
// everything sent (a few seconds at most if the peer is unreachable) and
// every buffer is released. If the peer leaves no receive buffer free for
// that long while Writes' data still waits for one, the data is discarded
// and Close returns an error wrapping syscall.ETIMEDOUT.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	close(c.closing)
	c.mu.Unlock()
	// Wait for Reads and Writes to leave: the teardown frees their buffers.
	c.writeMu.Lock()
	c.readMu.Lock()
	err := c.teardown(true)
	c.readMu.Unlock()
	c.writeMu.Unlock()
	c.rdl.stop()
	c.wdl.stop()
	return c.opErr("close", err)
}

// teardown releases everything in order: fin (if graceful) and its
// acknowledgement, disconnect, flush of every work request, then QP,
// memory, id, device and CM references.
func (c *Conn) teardown(graceful bool) error {
	c.mu.Lock()
	wasEstablished := c.state == stateEstablished
	c.state = stateDead
	var lost error
	if c.qp != nil && graceful && wasEstablished && !c.peerGone {
		if c.sendFin() == nil {
			c.waitLocked(lingerTimeout, func() bool {
				return (!c.finQueued && c.ctrlDone == c.ctrlSeq) || c.werr != nil || c.peerGone
			})
		}
		if c.pendLen > 0 && c.werr == nil && !c.peerGone {
			// The peer left no receive free for the linger time: what
			// Writes left pending is discarded, and Close says so.
			lost = os.NewSyscallError("ibv_post_send", syscall.ETIMEDOUT)
		}
	}
	c.id.Disconnect()
	if c.qp != nil {
		// The send queue becomes the teardown's once a post in progress
		// (on the poller, returning credits) is done; a post always
		// returns, and the QP must not be destroyed under it.
		for c.posting {
			c.waitLocked(drainTimeout, func() bool { return !c.posting })
		}
		c.draining = true
		if c.dataDone != c.dataSeq || c.ctrlDone != c.ctrlSeq {
			// A signaled marker behind everything posted: its (flushed)
			// completion retires all earlier sends, signaled or not.
			c.qp.PostSends([]ibv.SendWR{{
				ID: sendWRID(c.dataSeq, c.ctrlSeq), Addr: c.ar.base, LKey: c.ar.mr.LKey, Flags: ibv.SendSignaled,
			}})
		}
		c.waitLocked(drainTimeout, func() bool {
			return c.recvPosted == 0 && c.dataDone == c.dataSeq && c.ctrlDone == c.ctrlSeq
		})
	}
	// From here on a disconnect event must not touch the QP: destroying
	// it while rdma_disconnect moves it to the error state fails (EBUSY).
	c.qpGone = true
	c.mu.Unlock()

	if c.qp != nil {
		c.dev.removeConn(c)
		// The kernel refuses (EBUSY) to destroy a QP another verb is
		// using at that moment; nothing of ours should be, but a bounded
		// retry beats leaking the QP and, with it, the device.
		for i := 0; c.id.DestroyQP() != nil && i < 100; i++ {
			time.Sleep(time.Millisecond)
		}
	}
	if c.ar != nil {
		c.ar.free()
	}
	// Unregister first: it waits out an event being handled, which may
	// still use the id.
	c.cm.unregister(c.handle)
	c.id.Destroy()
	if c.dev != nil {
		c.dev.release(c.cqe)
	}
	c.cm.release()
	return lost
}

// waitLocked waits, with c.mu held on entry and exit, until cond holds or
// the timeout passes; completions signal c.drained while the state is dead.
func (c *Conn) waitLocked(timeout time.Duration, cond func() bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for !cond() {
		c.mu.Unlock()
		select {
		case <-c.drained:
		case <-c.txReady:
		case <-t.C:
			c.mu.Lock()
			return
		}
		c.mu.Lock()
	}
}

// maxAdaptiveSpin bounds how long a wait spins when recent waits were
// short: long enough to cover a round trip on a slow (emulated) device, short
// enough that a connection whose traffic dries up wastes little CPU.
const maxAdaptiveSpin = time.Millisecond

// wait blocks until ready is signaled, the connection closes or the
// deadline passes; c.mu is not held. With PollBusy it spins (see spin) all
// along. With PollAdaptive it first spins for the configured SpinTime or,
// when the recent waits of this direction were shorter than
// maxAdaptiveSpin, for twice their average: a stream whose messages come
// every few hundred microseconds is then caught without parking, while a
// quiet connection parks after SpinTime. avg is the direction's moving
// average, guarded by its readMu or writeMu.
func (c *Conn) wait(ready chan struct{}, dl *deadline, avg *time.Duration) {
	start := time.Now()
	switch c.poll {
	case PollBusy:
		// In slices, so that a deadline is noticed.
		for c.spin(ready, time.Millisecond) && !dl.expired() {
		}
	case PollAdaptive:
		budget := c.spinTime
		if *avg < maxAdaptiveSpin {
			budget = max(budget, 2**avg)
		}
		c.spin(ready, budget)
	}
	select {
	case <-ready:
		// A wait that ended in a park also counts the wakeup; unclipped,
		// a few of those would lift the average over maxAdaptiveSpin, and
		// then every wait would park, which keeps the average there.
		*avg += (min(time.Since(start), 2*maxAdaptiveSpin) - *avg) / 8
	case <-c.closing:
	case <-dl.wait():
	}
}

// spin polls the CQ from the waiting goroutine for up to budget, or until
// ready is signaled or the connection closes: a reply that comes soon (the
// other half of a round trip) then costs no goroutine handoff and no
// wakeup. It reports whether it stopped for the budget. c.mu is not held.
func (c *Conn) spin(ready chan struct{}, budget time.Duration) bool {
	c.dev.spinStart()
	defer c.dev.spinEnd()
	start := time.Now()
	for i := 1; len(ready) == 0 && !isClosed(c.closing); i++ {
		c.dev.tryPoll()
		if len(ready) > 0 {
			return false
		}
		// Reading the clock costs about as much as a poll (more under
		// emulation), and yielding as much again: both every few polls.
		if i%spinCheck == 0 {
			if time.Since(start) > budget {
				return true
			}
			runtime.Gosched()
		}
	}
	return false
}

// spinCheck is how many polls a spin makes between looks at the clock.
const spinCheck = 8

// LocalAddr returns the local address, an *Addr.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the peer's address, an *Addr.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline for Reads, including one in progress.
// A zero t clears it.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for Writes, including one in progress.
// A zero t clears it.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl.set(t)
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
