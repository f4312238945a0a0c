package rdma

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
)

// Compile-time checks that the types fit the interfaces code relies on.
var (
	_ net.Conn     = (*Conn)(nil)
	_ net.Listener = (*Listener)(nil)
	_ net.Addr     = (*Addr)(nil)
)

// Conn is an RDMA connection; it implements net.Conn. Reads and Writes may
// be called from several goroutines; concurrent Writes do not interleave.
//
// A Conn orchestrates collaborators that each keep one concern: the
// lifecycle (lifecycle.go), the credit ledger (credits.go), the send and
// receive rings (sendring.go, recvring.go) and the waiting policy
// (wait.go), and, for one-sided RDMA, the regions and the slot table of
// operations in flight (region.go). This file holds Read and Write; conn_complete.go what
// completions do; conn_close.go the shutdown. The platform's part
// (connSys: the rdma_cm id, the QP, the registered memory, the device) is
// set up and torn down in conn_verbs.go.
//
// Concurrency. These goroutines run a Conn's code:
//   - the caller's Reads and Writes (one of each at a time, by readMu and
//     writeMu), and Close, CloseRead, CloseWrite and the setters;
//   - the device's poller goroutine, which calls complete for each
//     completion with the device's cqMu held and, once cqMu is released,
//     lockAndFlush for the connections that have sends to post;
//   - a Read or Write of any connection on the same device that spins
//     while it waits (tryPoll): it runs complete and lockAndFlush of this
//     connection exactly as the poller would;
//   - the connection's CM inbox goroutine (inbox.go), which handles the
//     rdma_cm events the CM goroutine hands it (handleCM, conn_verbs.go);
//     the CM goroutine itself never takes mu;
//   - a listener's setup goroutines, which set its connections up;
//   - a listener's teardown goroutines, which tear down connections that
//     were never accepted, and Listener.Close, which closes queued ones.
//
// No goroutine holds mu while it waits, and every loop that holds it makes
// progress each round (copies, queues, posts) or drops it to wait: the
// poller, the keepalive and every call of the connection take mu, so a
// loop that spun with it held would stall them all (and, through the
// poller, every connection on the same CQ).
//
// Everything in life, cr, tx, rx and the keepalive is guarded by mu; the
// keepalive's timer runs keepAliveTick on a goroutine of its own. Helpers whose name
// ends in DroppingLock are entered and left with mu held but release it
// in between (to post sends, which is a system call on rxe, to copy
// payload, or to wait); their callers must re-check what they rely on.
// Two things are touched without mu by design: the payload of queued
// received messages (a Read copies it out while the completion side only
// appends behind it) and the send ring from its tail on, which a Write
// fills while tx.filling is set (flush leaves it alone). Once the teardown owns the send queue
// (tx.draining), it posts its drain marker with mu held: nobody else posts
// then.
type Conn struct {
	connSys

	laddr, raddr *Addr
	maxMsg       int       // payload bytes per message, from both sides' buffer sizes
	msgRead      bool      // Options.Messages: a Read returns at most one of the peer's Writes
	msgWrite     bool      // the peer's Options.Messages: Writes are never merged
	qp           queuePair // posts sends and receives
	mem          []byte    // the registered memory: the receive ring, then the send ring
	early        []ibv.WC  // messages that arrived before open

	w       waiter
	rdWait  time.Duration // moving average of Read waits, under readMu
	wrWait  time.Duration // moving average of Write waits, under writeMu
	rxReady chan struct{} // capacity 1: a message or an error arrived
	txReady chan struct{} // capacity 1: credits, ring room or send queue entries came back
	drained chan struct{} // capacity 1: a completion arrived during teardown
	closing chan struct{} // closed by Close

	readMu  sync.Mutex // one Read at a time: partial messages stay consistent
	writeMu sync.Mutex // one Write at a time: Writes do not interleave
	rdl     *deadline
	wdl     *deadline

	// regMu is held while a region is registered and while the release
	// frees the regions: no region is registered in the arena's PD after
	// the arena went to another connection.
	regMu sync.Mutex

	mu       sync.Mutex
	st       ConnStats
	os       oneSided // regions and one-sided operations (region.go)
	life     lifecycle
	cr       ledger
	tx       sendRing
	rx       recvRing
	heard    uint64 // successful completions: the peer or its NIC answered
	qpBroken bool   // a failed completion disconnected the QP
	ka       keepalive
	kaTimer  *time.Timer // ticks the keepalive while it is on
}

// queuePair posts work requests: the connection's *ibv.QP, or a fake.
type queuePair interface {
	sendPoster
	recvPoster
}

func newConn(ph phase) *Conn {
	return &Conn{
		life:    lifecycle{phase: ph},
		rxReady: make(chan struct{}, 1),
		txReady: make(chan struct{}, 1),
		drained: make(chan struct{}, 1),
		closing: make(chan struct{}),
		rdl:     newDeadline(),
		wdl:     newDeadline(),
	}
}

// initDataPath sets up the rings, the ledger and the waiting policy over
// registered memory laid out by lay, whose send ring is at NIC address
// sendBase under sendLKey, and posts every receive; mu is held. The
// peer's grant and ring come later, with open.
func (c *Conn) initDataPath(qp queuePair, mem []byte, lay layout, sendBase uint64, sendLKey uint32, maxInline int, opts Options, sp spinner) error {
	c.qp, c.mem = qp, mem
	c.msgRead = opts.Messages
	c.w = waiter{mode: opts.Poll, spinTime: opts.SpinTime, sp: sp}
	c.cr = newLedger(opts.RecvDepth)
	c.rx = newRecvRing(lay.recvSlots, lay.recvOff())
	c.tx = newSendRing(lay.sendSlots, lay.ctrlSlots, lay.sendOff(), sendBase, sendLKey, maxInline)
	c.early = make([]ibv.WC, 0, lay.recvSlots)
	c.rx.reposts = lay.recvSlots
	c.postReposts()
	if c.life.rerr != nil {
		return c.life.rerr
	}
	// The initial receives are granted by the handshake, not by reports.
	c.cr.unreported = 0
	return nil
}

// open takes the peer's hello once the handshake is done (mu is held):
// its grant, its Reads' mode, and its receive ring, whose geometry both
// sides derive alike (ringGeometry). Messages that arrived before (a
// listener may write as soon as it is established, before the dialer has
// read the reply) are handled now, in order.
func (c *Conn) open(peer hello, lay layout) {
	span, maxMsg := ringGeometry(lay.ring, lay.bufSize, int(peer.ringSize), int(peer.bufSize))
	c.maxMsg = maxMsg
	c.msgWrite = peer.flags&helloMessages != 0
	c.cr.open(int(peer.recvDepth), int(peer.ctrlDepth))
	c.cr.noMerge = c.msgWrite
	c.tx.open(peer.ringAddr, peer.rkey, span, maxMsg, int(peer.recvDepth))
	c.rx.open(span, maxMsg)
	for _, wc := range c.early {
		c.recvMsg(wc)
	}
	c.early = c.early[:0]
}

// ok reports whether c is a connection (not nil, not a zero Conn).
func (c *Conn) ok() bool { return c != nil && c.closing != nil }

func (c *Conn) opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "rdma", Source: c.laddr, Addr: c.raddr, Err: err}
}

// errMessageCut fails the Writes (and ReadFrom) of a connection whose
// message-oriented peer got part of a Write only (its deadline passed
// midway); Reads and one-sided operations go on (see lifecycle.cut).
var errMessageCut = errors.New("a Write to a message-oriented peer was cut short by its deadline; the connection can send no more")

// errInvalid is the error of a call on a nil or zero Conn, as net's
// syscall.EINVAL for a zero TCPConn.
func errInvalid(op string) error { return &net.OpError{Op: op, Net: "rdma", Err: syscall.EINVAL} }

// Read reads data into b. On a stream connection (the default) it returns
// whatever has arrived, up to len(b), copied from as many of the peer's
// messages as fit (Write boundaries are not kept), or, when nothing has
// arrived, waits for data. With Options.Messages it returns bytes of one
// of the peer's Writes at most: all of the Write when b is large enough
// (waiting for the rest of a large one), otherwise as much as fits, the
// rest coming with the next Reads. If a deadline passes or the connection
// fails midway, it returns what it has with the error. It returns io.EOF
// once the peer has closed its side and everything it sent has been read.
func (c *Conn) Read(b []byte) (int, error) {
	if !c.ok() {
		return 0, errInvalid("read")
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	n, err := c.read(b)
	return n, c.opErr("read", err)
}

func (c *Conn) read(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// n counts what a message-oriented Read has copied of a message whose
	// fragments are still arriving; a stream Read returns at once.
	n := 0
	for {
		if c.life.has(shutClosed) {
			return n, net.ErrClosed
		}
		if c.readDeadlinePassedDroppingLock() {
			return n, errTimeout
		}
		if c.life.has(shutRead) {
			return n, io.EOF
		}
		if c.rx.n > 0 {
			k, ended, err := c.copyOutDroppingLock(b[n:])
			n += k
			c.st.BytesRead += uint64(k)
			if err != nil {
				// The fin: what was copied first (the fragments of a
				// Write its writer's Close cut short, say), and the
				// next Read gets io.EOF.
				if n > 0 {
					return n, nil
				}
				return 0, err
			}
			if !c.msgRead || ended || n == len(b) || k == 0 {
				// k == 0 cannot happen with a message queued and room in
				// b, but a loop that holds mu must make progress every
				// round or return: every call that takes mu, and the
				// teardown behind them, would wait on it.
				return n, nil
			}
			// A message-oriented Read with room for more waits for the
			// rest of the message, giving the fragments' ring bytes back
			// meanwhile (a message may be bigger than all of them).
			continue
		}
		if err := c.waitDataDroppingLock(); err != nil {
			return n, err
		}
	}
}

// readDeadlinePassedDroppingLock reports whether the read deadline has
// passed. A reader that polls with a past deadline must still give credits
// back, or a writer holding data for them would wait for a Read that never
// blocks.
func (c *Conn) readDeadlinePassedDroppingLock() bool {
	if !c.rdl.expired() {
		return false
	}
	if c.rx.n == 0 {
		c.returnCredits(true)
		c.flushDroppingLock()
	}
	return true
}

// waitDataDroppingLock is what a Read or WriteTo does when nothing is
// queued: it returns why no data will come, or gives every credit back
// and waits for data (or the deadline, or Close).
func (c *Conn) waitDataDroppingLock() error {
	if err := c.life.readFailed(c.rx.posted); err != nil {
		return err
	}
	c.returnCredits(true)
	c.flushDroppingLock()
	c.mu.Unlock()
	spun := c.w.wait(c.rxReady, c.closing, c.rdl, &c.rdWait)
	c.mu.Lock()
	c.countWait(spun)
	return nil
}

// copyOutDroppingLock copies queued messages into b. The queued messages
// are the reader's while readMu is held (the completion side only appends
// behind them), so the copy runs without mu and does not block the poller.
// It reports whether the copy ended at the end of one of the peer's Writes
// (which matters to message-oriented Reads only: they stop there).
func (c *Conn) copyOutDroppingLock(b []byte) (int, bool, error) {
	if c.rx.finAtHead() {
		return 0, false, io.EOF
	}
	if len(b) == 0 {
		return 0, false, nil
	}
	head, avail, off := c.rx.readable()
	c.mu.Unlock()
	n, used, off, ended := c.rx.copyOut(b, c.mem, head, avail, off, c.msgRead)
	c.mu.Lock()
	c.rx.consume(used, off)
	if used > 0 {
		c.returnCredits(c.rx.halfUnreported())
		c.flushDroppingLock()
	}
	return n, ended, nil
}

// Write writes b and returns once all of it is in the connection's
// registered send ring; b may be reused at once. The data goes out in
// order, cut into messages of at most the smaller BufferSize, as the peer
// has receives free and room in its receive ring: at once when it has,
// and otherwise Writes gather in a pending message that goes out when the
// peer returns credit (so a fast writer of small messages is not held to
// one message per peer receive). While the peer is behind, a small Write
// may also gather with the next ones (see SetNoDelay). Write blocks while
// SendDepth messages are in the send queue, while the peer's ring has no
// room for the next message (the peer has not read what is there), or
// while the peer has no receive free and the pending message is full.
// Close delivers what Write accepted, unless the peer leaves no receive
// free for the few seconds Close waits; then Close reports the loss. If the peer's Reads
// are message-oriented (its Options.Messages), a Write is never merged
// with another: it travels as messages of its own, the last marked, and a
// Write waits while an earlier one's last bytes are still pending; a Write
// that its deadline cuts short after part of it went fails the Writes (and
// ReadFrom) of the connection from then on, since the next bytes would
// continue that message at the reader. Reads, one-sided operations and
// regions go on; Close then sends no fin, so the peer sees the connection
// reset rather than the cut message followed by io.EOF as if it were
// whole. A zero-length Write sends nothing.
func (c *Conn) Write(b []byte) (int, error) {
	if !c.ok() {
		return 0, errInvalid("write")
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	n, err := c.write(b)
	return n, c.opErr("write", err)
}

func (c *Conn) write(b []byte) (int, error) {
	n := 0
	waited := false // for credit: counted once per Write
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if err := c.life.writeEnded(); err != nil {
			return n, err
		}
		if c.wdl.expired() {
			if c.msgWrite && n > 0 {
				// Part of a message went (or waits) as fragments; the
				// next Write would continue it at the reader. Nothing
				// more can be sent on this connection.
				c.life.cut = true
			}
			return n, errTimeout
		}
		if n == len(b) {
			return n, nil
		}
		// The pending message at the ring's tail may already hold bytes.
		// With credits, fill as many messages as credits, the send queue
		// and the ring allow and post them as one chain (one
		// ibv_post_send, one system call on rxe); without, add to the
		// pending message. For a message-oriented peer, a Write's bytes
		// never share a message with an earlier Write's still pending.
		free := c.tx.free()
		room := c.tx.ring.room()
		grow := max(0, room-c.tx.pendLen)
		waitMsg := c.msgWrite && n == 0 && c.tx.pendLen > 0
		if grow == 0 && c.tx.pendLen > 0 && c.cr.credits > 0 && free > 0 && !waitMsg {
			// The pending message is as large as the ring lets it be
			// now: it goes, whatever hold would say.
			c.queuePending()
			c.flushDroppingLock()
			continue
		}
		// With credits, a message is not cut short because the peer has
		// yet to read part of the ring: more, smaller messages cost more
		// than waiting, and the room comes (an empty ring has room for a
		// largest message). Without, the pending message gathers in
		// whatever room there is. Either way the peer is what the Write
		// waits for.
		short := c.cr.credits > 0 && room < min(c.tx.pendLen+len(b)-n, c.maxMsg)
		noRoom := grow == 0 || short || (c.cr.credits == 0 && waitMsg)
		if free == 0 || noRoom || waitMsg {
			// Messages a Write left queued (cork) go before anyone
			// waits: the peer's answer to them is what ends the wait.
			c.flushDroppingLock()
			c.waitSendRoomDroppingLock(noRoom, &waited)
			continue
		}
		slots := 1
		if c.cr.credits > 0 {
			slots = min(c.cr.credits, free, ibv.MaxSendBatch, (c.tx.pendLen+len(b)-n+c.maxMsg-1)/c.maxMsg)
		}
		n = c.fillDroppingLock(b, n, slots)
		if n == len(b) {
			// Accepted, whatever happened while flush had the lock
			// dropped (the peer may have answered and closed).
			return n, nil
		}
	}
}

// waitSendRoomDroppingLock waits, for a Write or ReadFrom, until
// completions or credits come back (or the deadline or Close). noCredit
// says it waits because the peer has no receive free: that counts in the
// stats, once per call (waited) and for all the time it takes.
func (c *Conn) waitSendRoomDroppingLock(noCredit bool, waited *bool) {
	var start time.Time
	if noCredit {
		start = time.Now()
	}
	c.mu.Unlock()
	spun := c.w.wait(c.txReady, c.closing, c.wdl, &c.wrWait)
	c.mu.Lock()
	c.countWait(spun)
	if noCredit {
		if !*waited {
			c.st.CreditWaits++
			*waited = true
		}
		c.st.CreditWaitTime += time.Since(start)
	}
}

// fillDroppingLock copies b[n:] into up to slots messages from the ring's
// tail on, the first of which may hold pending bytes, and queues what
// credits allow. The ring from the tail on is the writer's until queued
// (flush leaves a pending message alone while tx.filling is set), so the
// copy runs without mu. Where each message goes and how large it may be
// is planned from the tail and what the peer had consumed (acked) when
// the lock was dropped: queueing follows the same plan, whatever credits
// came back meanwhile. It returns how much of b is accepted.
func (c *Conn) fillDroppingLock(b []byte, n, slots int) int {
	ring := &c.tx.ring
	t, pend, acked := ring.tail, c.tx.pendLen, ring.acked
	c.tx.filling = true
	c.mu.Unlock()
	off := n
	for i := 0; i < slots && off < len(b); i++ {
		start, room := ring.at(t, acked)
		chunk := min(len(b)-off, room-pend)
		if chunk <= 0 || (i > 0 && room < min(len(b)-off, c.maxMsg)) {
			// No room, or (past the first, which write checked)
			// not enough for a whole message: see write.
			break
		}
		dst := c.tx.memOff + ring.offset(start) + pend
		copy(c.mem[dst:dst+chunk], b[off:off+chunk])
		off += chunk
		t = ringEnd(start, pend+chunk)
		pend = 0
	}
	c.mu.Lock()
	c.tx.filling = false
	if c.life.has(shutClosed) || c.life.werr != nil {
		return n
	}
	// (A cut Write cannot be: writeMu keeps the next Write out until this
	// one returns.)
	c.st.BytesWritten += uint64(off - n)
	// Credits only grow while the lock is dropped (this writer is the
	// only one spending them), and so does the send queue's room, so
	// every message planned with credits goes out, but for a last, partly
	// filled one that hold keeps; without credits the one message stays
	// pending.
	before := c.cr.outstanding()
	queued := c.tx.pendLen + off - n
	for queued > 0 && c.cr.credits > 0 && c.tx.free() > 0 {
		_, room := ring.at(ring.tail, acked)
		m := min(queued, room)
		if c.cr.hold(m, room, c.tx.finQueued) {
			break
		}
		c.cr.spend()
		typ := uint8(msgData)
		if c.msgWrite && (queued > m || off < len(b)) {
			typ = msgDataMore // the Write goes on in the next message
		}
		c.queueSend(typ, m)
		queued -= m
	}
	c.tx.pendLen = queued
	c.tx.pendMore = c.msgWrite && queued > 0 && off < len(b)
	if off < len(b) || !c.cr.cork(before, len(c.tx.sends), c.tx.carries) {
		c.flushDroppingLock()
	}
	return off
}

// SetNoDelay controls whether a small Write goes out as soon as the peer
// has a receive free even while it is behind (noDelay true), or may wait,
// while earlier messages are unconsumed at the peer, to be sent with the
// Writes that follow (the default). Like TCP's option of that name, it
// trades message rate for the latency of back-to-back small Writes;
// request-response traffic, where the peer has consumed what was sent
// before each Write, never waits. With no receive free at the peer,
// Writes gather whatever the setting. To a message-oriented peer
// (Options.Messages) Writes never gather: by default, while it is behind,
// they are queued unposted until its answer comes and then posted
// together (one ibv_post_send, each Write still a message of its own);
// with noDelay true each is posted at once.
func (c *Conn) SetNoDelay(noDelay bool) error {
	if !c.ok() {
		return errInvalid("set")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life.has(shutClosed) {
		return c.opErr("set", net.ErrClosed)
	}
	c.cr.noDelay = noDelay
	c.flushDroppingLock()
	return nil
}

// LocalAddr returns the local address, an *Addr.
func (c *Conn) LocalAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.laddr
}

// RemoteAddr returns the peer's address, an *Addr.
func (c *Conn) RemoteAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.raddr
}

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
	if !c.ok() {
		return errInvalid("set")
	}
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for Writes, including one in progress.
// A zero t clears it.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if !c.ok() {
		return errInvalid("set")
	}
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl.set(t)
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.life.has(shutClosed)
}
