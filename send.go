package rdma

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The send path of a Conn: Write and ReadFrom fill the send ring (asking
// sendRing what to do next: planWrite, planReadFrom), queueSend and
// queuePending turn ring bytes and control messages into work requests,
// flushDroppingLock posts them, sendDone retires them, and the fin goes
// behind everything (sendFinDroppingLock). The credit policy they follow is
// the ledger's (credits.go); the ring arithmetic and the pending message
// are sendRing's (sendring.go).

// write is Write's body; mu and the Write turn are held.
func (c *Conn) write(b []byte) (int, error) {
	n := 0
	waited := false // for credit: counted once per Write
	c.cr.short = len(b) < c.tx.ring.maxMsg
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
		plan := c.tx.planWrite(c.cr.credits, len(b)-n, n > 0, c.msgWrite)
		switch plan.step {
		case stepSendPending:
			c.queuePending()
			c.flushDroppingLock()
			continue
		case stepWait:
			// Messages a Write left queued (cork) go before anyone
			// waits: the peer's answer to them is what ends the wait.
			c.flushDroppingLock()
			c.waitSendRoomDroppingLock(plan.noRoom, &waited)
			continue
		}
		n = c.fillDroppingLock(b, n, plan.slots)
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

// smallCopy is the most bytes a Read or Write copies between its buffer
// and a ring with the connection's lock held; larger copies run without
// it, so that the poller and the other direction go on meanwhile.
const smallCopy = 512

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
	buf := c.tx.buf
	pend, _ := c.tx.pending()
	t, acked := ring.tail, ring.acked
	// A small copy costs less than dropping the lock and taking it again.
	held := len(b)-n <= smallCopy
	if !held {
		c.tx.filling = true
		c.mu.Unlock()
	}
	off := n
	for i := 0; i < slots && off < len(b); i++ {
		start, room := ring.at(t, acked)
		chunk := min(len(b)-off, room-pend)
		if chunk <= 0 || (i > 0 && room < min(len(b)-off, ring.maxMsg)) {
			// No room, or (past the first, which write checked)
			// not enough for a whole message: see write.
			break
		}
		dst := ring.offset(start) + pend
		copy(buf[dst:dst+chunk], b[off:off+chunk])
		off += chunk
		t = wire.RingEnd(start, pend+chunk)
		pend = 0
	}
	if !held {
		c.mu.Lock()
		c.filled()
	}
	if c.life.has(shutClosed) || c.life.werr != nil {
		return n
	}
	// (A cut Write cannot be: the Write turn keeps the next Write out until this
	// one returns.)
	c.st.BytesWritten += uint64(off - n)
	// Credits only grow while the lock is dropped (this writer is the
	// only one spending them), and so does the send queue's room, so
	// every message planned with credits goes out, but for a last, partly
	// filled one that hold keeps; without credits the one message stays
	// pending.
	before := c.cr.outstanding()
	pend, _ = c.tx.pending() // as it was: flush leaves it alone while filling
	queued := pend + off - n
	for queued > 0 && c.cr.credits > 0 && c.tx.free() > 0 {
		_, room := ring.at(ring.tail, acked)
		m := min(queued, room)
		if c.cr.hold(m, room, c.tx.finQueued) {
			break
		}
		c.cr.spend()
		typ := uint8(wire.MsgData)
		if c.msgWrite && (queued > m || off < len(b)) {
			typ = wire.MsgDataMore // the Write goes on in the next message
		}
		c.queueSend(typ, m)
		queued -= m
	}
	c.tx.setPending(queued, c.msgWrite && queued > 0 && off < len(b))
	// Corking shares one post among back-to-back Writes: it pays where a
	// post is a system call (rxe, siw), and where it is not (postHeld: a
	// NIC's doorbell) it only costs a signaled send and its completion
	// per corked batch (2.04 completions per message against C's 1.22 in
	// the zero-cost provider's message rate).
	cork := !c.postHeld && c.cr.cork(before, len(c.tx.sends), c.tx.carries)
	sigOut := c.tx.sigOut()
	if off < len(b) || !cork || !sigOut {
		if cork && !sigOut {
			// The peer is behind: what goes now is signaled, so that
			// the Writes after it may cork until its completion.
			c.tx.signalLast()
		}
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
// one is posted signaled and those after it are queued unposted until its
// completion, then posted together (one ibv_post_send, each Write still a
// message of its own), where a post is a system call (Soft-RoCE,
// soft-iWARP); with noDelay true, or where a post is not (a NIC), each is
// posted at once.
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

// readFrom reads r into a buffer of the call's own, never into the send
// ring: r.Read may block for as long as it likes (an idle os.Stdin), and
// the ring is registered memory that a device's release takes away
// without waiting for the connection's calls to return. What each Read
// of r returned is then copied into the ring and sent, as Write's fill
// does.
func (c *Conn) readFrom(r io.Reader) (int64, error) {
	var total int64
	waited := false
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	var (
		buf  []byte // what r returned, not yet in the ring
		rerr error  // and the error r returned with it
	)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if err := c.life.writeEnded(); err != nil {
			return total, err
		}
		// Before r.Read is called, what is pending goes, and a whole
		// message's room is there for what it returns: only this call
		// (the Write turn) spends room, so the room stays while r.Read runs
		// (see planReadFrom).
		step, noCredit := c.tx.planReadFrom(c.cr.credits)
		// The deadline ends the call before r.Read, or while it waits;
		// what r.Read returned goes once there is room, whenever the
		// deadline passed: r cannot take it back, and a caller who
		// counts what went (and a message-oriented peer) must not lose
		// bytes that r already gave.
		if (len(buf) == 0 || step == stepWait) && c.wdl.expired() {
			return total, errTimeout
		}
		switch step {
		case stepSendPending:
			c.queuePending()
			c.flushDroppingLock()
			continue
		case stepWait:
			c.waitSendRoomDroppingLock(noCredit, &waited)
			continue
		}
		if len(buf) == 0 {
			if rerr == io.EOF {
				return total, nil
			}
			if rerr != nil {
				return total, rerr
			}
			b := growBuf(bp, c.tx.ring.maxMsg, 0)
			c.mu.Unlock()
			n, err := r.Read(b)
			c.mu.Lock()
			buf, rerr = b[:max(0, min(n, len(b)))], err
			// Again from the top: the ring may have moved meanwhile
			// (resize.go), and the connection failed or closed.
			continue
		}
		// One message per Read of r, but for a ring that moved to
		// smaller messages while r.Read ran.
		k := min(len(buf), c.tx.ring.maxMsg)
		start := c.tx.pendOff()
		dst := c.tx.buf[start : start+k]
		c.tx.filling = true
		c.mu.Unlock()
		copy(dst, buf[:k])
		c.mu.Lock()
		c.filled()
		if err := c.life.writeEnded(); err != nil {
			return total, err
		}
		buf = buf[k:]
		c.cr.short = k < c.tx.ring.maxMsg
		total += int64(k)
		c.st.BytesWritten += uint64(k)
		c.tx.setPending(k, false)
		if c.cr.credits > 0 && c.tx.free() > 0 {
			c.queuePending()
		}
		c.flushDroppingLock()
	}
}

// filled ends a copy into the send ring made without the lock
// (tx.filling): a release waiting for it goes on.
func (c *Conn) filled() {
	c.tx.filling = false
	c.wakeRelease()
}

// queueSend prepares a message for flush (see sendRing.queue); its header
// piggybacks every credit owed to the peer, including the receives
// posted again on the way.
func (c *Conn) queueSend(typ uint8, n int) {
	switch typ {
	case wire.MsgData, wire.MsgDataMore:
		c.st.MessagesSent++
	case wire.MsgCredit:
		c.st.CreditMessagesSent++
	}
	if c.rsp != nil && c.postHeld {
		c.repostWithSend()
	} else {
		c.postReposts()
	}
	c.tx.queue(c.cr.header(typ, c.tx.ring.tightAfter(n)), n, c.life.has(shutWrite))
	// Every message consumed so far has its receive posted again, and
	// this header reports them all: the peer knows the ring is free up to
	// here.
	c.rx.reported = c.rx.read
}

// queuePending queues the pending message, spending a credit the caller
// checked for (and room in the send queue).
func (c *Conn) queuePending() {
	typ := uint8(wire.MsgData)
	pend, more := c.tx.pending()
	if more {
		typ = wire.MsgDataMore
	}
	c.cr.spend()
	c.queueSend(typ, pend)
	c.tx.setPending(0, false)
	if c.msgWrite {
		// A Write for a message-oriented peer may be waiting for the
		// pending buffer to go (see write).
		signal(c.txReady)
	}
}

// pendingGoes reports whether flush would post the pending message now:
// it holds data, a credit and the send queue allow it, no Write is filling
// it and hold does not keep it (a message as large as the ring lets it be
// now counts as full).
func (c *Conn) pendingGoes() bool {
	pend, _ := c.tx.pending()
	return pend > 0 && c.cr.credits > 0 && c.tx.free() > 0 && !c.tx.filling &&
		!c.cr.hold(pend, max(pend, c.tx.ring.room()), c.tx.finQueued)
}

// flushDroppingLock posts what is queued: prepared messages, then the
// pending message once a credit allows, then a fin that waited behind
// it. mu is held on entry and exit but, unless postHeld, not across
// ibv_post_send (on rxe a system call that runs the whole transfer), so
// completions, Reads and other connections' work go on meanwhile. One
// goroutine posts at a time, which keeps the send queue in sequence
// order; whoever finds another posting only queues, and the poster picks
// that up before it leaves.
func (c *Conn) flushDroppingLock() {
	if c.tx.posting || c.tx.draining {
		return
	}
	c.tx.posting = true
	for {
		if c.pendingGoes() {
			c.queuePending()
		}
		if c.rs.due() {
			c.ringTurn()
		}
		if pend, _ := c.tx.pending(); c.tx.finQueued && pend == 0 && !c.tx.filling {
			c.tx.finQueued = false
			c.queueSend(wire.MsgFin, 0)
		}
		if len(c.tx.sends) == 0 {
			break
		}
		batch := c.tx.take()
		held := c.postHeld && sendBytes(batch) <= heldPostBytes
		k := c.rx.withSend
		together := k > 0 && held && k <= ibv.MaxRecvBatch && len(batch) <= ibv.MaxSendBatch
		// The receives the batch's headers report go before it, with mu
		// held (the receive ring's work requests are mu's): in the same
		// call, or on their own before mu is let go for the post.
		if !together && !c.postWithSendAlone() {
			// Nothing goes that reports receives never posted; the
			// connection has failed (postFailed).
			c.tx.sends = c.tx.sends[:0]
			signal(c.txReady)
			break
		}
		if !held {
			c.mu.Unlock()
			c.w.posting(true)
		}
		var posts int
		var err error
		if together {
			posts, err = c.postWithReposts(batch)
		} else {
			posts, err = postChain(c.qp, batch)
		}
		if !held {
			c.w.posting(false)
			c.mu.Lock()
		}
		c.st.SendPosts += uint64(posts)
		if err != nil {
			// Post nothing more (the teardown's marker retires what
			// never went out).
			c.tx.sends = c.tx.sends[:0]
			c.postFailed(err, true)
			signal(c.txReady)
			break
		}
	}
	c.tx.posting = false
	c.wakeRelease()
}

// repostWithSend is postReposts for a message being queued (queueSend):
// the consumed receives are reported in its header, and posted before it
// in the same call into C (postWithReposts). A Read leaves the receive it
// consumed queued until a batch of them is ready or it waits, and in
// request-response traffic the next Write comes first: over the
// zero-cost provider a 64 B round trip then makes 4 crossings instead of
// 6. Only where posts are made with mu held (postHeld): the receive
// ring's work requests are mu's until the post returns.
func (c *Conn) repostWithSend() {
	if c.life.has(shutPeerGone) {
		c.rx.dropReposts()
		return
	}
	c.rx.withSend += c.rx.reposts
	c.cr.unreported += c.rx.reposts
	c.rx.reposts = 0
}

// postWithReposts posts the receives repostWithSend kept (rx.withSend)
// and batch in one call.
func (c *Conn) postWithReposts(batch []ibv.SendWR) (int, error) {
	k := c.rx.withSend
	c.rx.withSend = 0
	recvErr, err := c.rsp.PostRecvsSends(c.rx.prepare(k), batch)
	if recvErr != nil {
		// No send was posted: the batch reports receives that are not.
		return 0, recvErr
	}
	c.rx.posted += k
	if err != nil {
		return 0, err
	}
	return 1, nil
}

// postWithSendAlone posts the receives repostWithSend kept, if any, on
// their own (mu held): the batch going out is too large to share the call,
// or is posted without mu. It reports false, having failed the connection,
// when the post failed.
func (c *Conn) postWithSendAlone() bool {
	for c.rx.withSend > 0 {
		k := min(c.rx.withSend, ibv.MaxRecvBatch)
		c.rx.withSend -= k
		if err := c.qp.PostRecvs(c.rx.prepare(k)); err != nil {
			c.rx.withSend = 0
			c.postFailed(err, false)
			return false
		}
		c.rx.posted += k
	}
	return true
}

// recvSendPoster posts receives and sends in one call (*ibv.QP).
type recvSendPoster interface {
	PostRecvsSends(recvs []ibv.RecvWR, sends []ibv.SendWR) (recvErr, sendErr error)
}

// heldPostBytes bounds the payload of a post made with the lock held
// (Conn.postHeld). A NIC's post costs the same whatever the size, but a
// provider that moves the data in the call (the zero-cost provider of the
// benchmarks copies it) would hold the lock for the copy: with 4 KiB and
// 64 KiB messages its streams lost 6-10 % with every post held.
const heldPostBytes = 2048

// forcePostHeld makes connections post with their lock held on the
// software providers too: a test runs the path NICs take on them.
var forcePostHeld bool

// sendBytes is the payload of wrs.
func sendBytes(wrs []ibv.SendWR) int {
	n := 0
	for i := range wrs {
		n += int(wrs[i].Len)
	}
	return n
}

// lockAndFlush posts what complete queued (see completer).
func (c *Conn) lockAndFlush() {
	c.mu.Lock()
	c.flushDroppingLock()
	c.mu.Unlock()
}

func (c *Conn) sendDone(wc ibv.WC) {
	c.tx.completed(wc.WRID)
	c.retireSent()
	if wc.Status != ibv.WCSuccess && c.life.werr == nil {
		if c.life.has(shutPeerGone) || wc.Status == ibv.WCFlushErr {
			c.life.failWrite(syscall.ECONNRESET)
			c.brokenQP()
		} else {
			c.fail(&wcError{wc.Status})
		}
	}
	signal(c.txReady)
}

// sendFinDroppingLock queues the fin behind pending data and flushes,
// unless the fin was already sent.
func (c *Conn) sendFinDroppingLock() error {
	if c.life.has(shutWrite) {
		return nil
	}
	if err := c.life.finBlocked(); err != nil {
		return err
	}
	c.life.set(shutWrite)
	c.tx.finQueued = true
	// Not life.werr afterwards: while flush posts without the lock, the
	// peer may read the fin, close, and have its disconnect recorded here.
	c.flushDroppingLock()
	return nil
}

// postFailed handles a post that failed, of sends (send) or of receives;
// mu is held. siw refuses work (its doorbell fails with ENOTCONN) once its
// QP has left RTS, the iWARP connection closing under it before this side
// has heard: on rxe the same work would be flushed and the connection
// read as reset, so that direction fails with ECONNRESET here, and the
// connection manager's disconnect follows. Any other failure (ENOMEM, EIO,
// EINVAL) leaves the QP's state unknown: work may have been lost on the
// way, so the connection fails both ways with the post's error and the
// peer is told (see fail), as a TCP connection is reset.
func (c *Conn) postFailed(err error, send bool) {
	if errors.Is(err, syscall.ENOTCONN) {
		if send {
			c.life.failWrite(syscall.ECONNRESET)
		} else {
			c.life.failRead(syscall.ECONNRESET)
		}
		return
	}
	c.fail(err)
}
