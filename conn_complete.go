package rdma

import (
	"syscall"

	"github.com/goverbs/rdma/internal/ibv"
)

// The completion side of a Conn: what the poller (or a spinning Read or
// Write) does with each work completion, how consumed receives and credits
// go back to the peer, and flush, which posts what is queued.

// complete handles one work completion (see completer). It posts consumed
// receives again, but only queues the sends that must go out (a credit
// message, a pending buffer that credits now allow) and reports whether
// there are any.
func (c *Conn) complete(wc ibv.WC) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if wc.Status == ibv.WCSuccess {
		c.heard++ // the peer is alive: the keepalive starts over
	}
	if wc.WRID&wrSend != 0 {
		c.sendDone(wc)
	} else if wc.WRID&wrOneSided != 0 {
		c.oneSidedDone(wc)
	} else {
		c.recvDone(wc)
	}
	if c.cr.wantCredit {
		c.returnCredits(true)
	}
	if c.life.phase == phaseDead {
		signal(c.drained)
	}
	return len(c.tx.sends) > 0 || c.pendingGoes()
}

// lockAndFlush posts what complete queued (see completer).
func (c *Conn) lockAndFlush() {
	c.mu.Lock()
	c.flushDroppingLock()
	c.mu.Unlock()
}

// pendingGoes reports whether flush would post the pending message now:
// it holds data, a credit and the send queue allow it, no Write is filling
// it and hold does not keep it (a message as large as the ring lets it be
// now counts as full).
func (c *Conn) pendingGoes() bool {
	return c.tx.pendLen > 0 && c.cr.credits > 0 && c.tx.free() > 0 && !c.tx.filling &&
		!c.cr.hold(c.tx.pendLen, max(c.tx.pendLen, c.tx.ring.room()), c.tx.finQueued)
}

// wcError is a failed work completion: the connection is broken.
type wcError struct{ status uint32 }

func (e *wcError) Error() string { return "work request failed: " + wcStatusString(e.status) }

// Unwrap says what the failure means to a caller: a connection whose
// peer's NIC stopped acknowledging (the retries ran out: the peer host
// vanished, or the network between is down) timed out, as a TCP
// connection whose retransmissions go unanswered; any other failure broke
// it.
func (e *wcError) Unwrap() error {
	if e.status == ibv.WCRetryExcErr {
		return syscall.ETIMEDOUT
	}
	return syscall.ECONNRESET
}

func (c *Conn) recvDone(wc ibv.WC) {
	c.rx.posted--
	if wc.Status != ibv.WCSuccess {
		// A failed receive means the QP is in the error state: nothing
		// more goes either way. Both directions fail, and a Write waiting
		// for credit wakes now, not when the CM gives up on a disconnect
		// a broken peer never answers.
		c.countFailed(wc.Status)
		if c.life.has(shutPeerGone) || wc.Status == ibv.WCFlushErr {
			c.life.fail(syscall.ECONNRESET)
		} else {
			c.life.fail(&wcError{wc.Status})
		}
		c.brokenQP()
		signal(c.rxReady)
		signal(c.txReady)
		return
	}
	if !c.rx.opened() {
		// The peer was established first and wrote before open has the
		// ring's geometry: open handles it, in order. The peer's credits
		// bound how many can come.
		if len(c.early) < cap(c.early) {
			c.early = append(c.early, wc)
		} else {
			c.protocolViolation(&protocolError{"peer overran its credits"})
		}
		return
	}
	c.recvMsg(wc)
}

// recvMsg handles a message that consumed one of our receives.
func (c *Conn) recvMsg(wc ibv.WC) {
	if wc.WRID != recvWRID || wc.Flags&ibv.WCWithImm == 0 {
		c.protocolViolation(&protocolError{"message without immediate data (its header)"})
		return
	}
	h := headerOf(wc.Imm)
	more, err := c.cr.received(h)
	if err != nil {
		c.protocolViolation(err)
		return
	}
	if h.credits > 0 {
		c.tx.ring.ack(int(h.credits))
	}
	if more {
		signal(c.txReady)
	}
	if c.life.has(shutFinRcvd) && h.typ != msgCredit {
		// The fin ended what the peer sends; credits may still come.
		c.protocolViolation(&protocolError{"message after the fin"})
		return
	}
	if err := c.cr.arrived(h.typ); err != nil {
		c.protocolViolation(err)
		return
	}
	switch h.typ {
	case msgData, msgDataMore:
		if wc.Opcode != ibv.WCOpRecvWriteImm {
			// Data comes as RDMA WRITE with immediate into the ring,
			// where the placement rule says; a SEND has no place there.
			c.protocolViolation(&protocolError{"data message that is not an RDMA WRITE with immediate data"})
			return
		}
		m, err := c.rx.arrived(wc.ByteLen, h.typ == msgDataMore)
		if err != nil {
			c.protocolViolation(err)
			return
		}
		if c.rx.discarding {
			// CloseRead has taken the queue from the reader: discard,
			// and give the ring bytes and the receive back to the peer.
			// Until then a Read or WriteTo may still hold the head
			// message (its payload is in the ring without mu), so what
			// arrives is queued like any message: freeing ring bytes
			// past it would let the peer overwrite it, and the reader's
			// consume would set the read position back.
			c.rx.read = m.end
			c.rx.queueRepost()
			c.returnCredits(c.rx.halfUnreported())
			return
		}
		if c.push(m) {
			c.st.MessagesReceived++
		}
	case msgCredit, msgFin:
		if wc.Opcode != ibv.WCOpRecv || wc.ByteLen != 0 {
			c.protocolViolation(&protocolError{"control message with payload or not a SEND"})
			return
		}
		if h.typ == msgFin {
			if c.push(rxMsg{n: -1}) {
				c.life.set(shutFinRcvd)
			}
			return
		}
		// Post the receive again at once, on its own (queued data
		// receives are reported as data credits); the peer learns of it
		// through ctrlAck on our next message.
		if !c.life.has(shutPeerGone) && !c.tx.draining {
			if err := c.rx.postOne(c.qp); err != nil {
				c.life.failRead(err)
			} else {
				c.cr.ctrlOwed++
			}
		}
	default:
		c.protocolViolation(&protocolError{"unknown message type"})
	}
}

// brokenQP disconnects a connection that failed while established: a
// NIC-level error (the peer's RDMA WRITE refused, say) moves the QP to the
// error state without any CM event, so neither side would otherwise learn
// that the connection is over; a protocol violation or a keepalive
// failure ends it too. Once is enough.
func (c *Conn) brokenQP() {
	if c.life.phase != phaseDead && !c.life.has(shutPeerGone|shutQPGone) && !c.qpBroken {
		c.qpBroken = true
		c.disconnect()
	}
}

// countFailed counts a failed completion, but not the flushes of a
// teardown.
func (c *Conn) countFailed(status uint32) {
	if status != ibv.WCFlushErr {
		c.st.CompletionErrors++
	}
}

func (c *Conn) push(m rxMsg) bool {
	if !c.rx.push(m) {
		c.protocolViolation(&protocolError{"peer overran its credits"})
		return false
	}
	signal(c.rxReady)
	return true
}

// protocolViolation fails the connection of a peer that broke the
// protocol, and disconnects it.
func (c *Conn) protocolViolation(err error) {
	c.life.fail(err)
	c.brokenQP()
	signal(c.rxReady)
	signal(c.txReady)
}

func (c *Conn) sendDone(wc ibv.WC) {
	c.tx.completed(wc.WRID)
	if wc.Status != ibv.WCSuccess {
		c.countFailed(wc.Status)
	}
	if wc.Status != ibv.WCSuccess && c.life.werr == nil {
		if c.life.has(shutPeerGone) || wc.Status == ibv.WCFlushErr {
			c.life.failWrite(syscall.ECONNRESET)
		} else {
			c.life.fail(&wcError{wc.Status})
			signal(c.rxReady)
		}
		c.brokenQP()
	}
	signal(c.txReady)
}

// postReposts posts the consumed receives queued so far as one chain;
// each becomes a data credit to report to the peer.
func (c *Conn) postReposts() {
	if c.life.has(shutPeerGone) {
		c.rx.dropReposts()
		return
	}
	n, err := c.rx.postReposts(c.qp)
	if err != nil {
		c.life.failRead(err)
		return
	}
	c.cr.unreported += n
}

// returnCredits posts consumed receives again and tells the peer,
// in a credit message, once a batch of them is ready, or at once when force
// is set (the reader is about to wait, so the writer must not be left
// without credits). Credits still flow after our fin: the peer may go on
// writing.
func (c *Conn) returnCredits(force bool) {
	if c.tx.draining {
		// The teardown owns the QP: nothing is posted or owed any more.
		c.rx.dropReposts()
		c.cr.wantCredit = false
		return
	}
	if c.cr.repostNow(c.rx.reposts, force) {
		c.postReposts()
	}
	open := !c.life.has(shutPeerGone) && c.life.werr == nil
	if c.cr.creditDue(force, open, c.tx.ctrlInFlight()) {
		c.queueSend(msgCredit, 0)
	}
}

// queueSend prepares a message for flush (see sendRing.queue); its header
// piggybacks every credit owed to the peer, including the receives
// posted again on the way.
func (c *Conn) queueSend(typ uint8, n int) {
	switch typ {
	case msgData, msgDataMore:
		c.st.MessagesSent++
	case msgCredit:
		c.st.CreditMessagesSent++
	}
	c.postReposts()
	c.tx.queue(c.cr.header(typ), n, c.life.has(shutWrite))
	// Every message consumed so far has its receive posted again, and
	// this header reports them all: the peer knows the ring is free up to
	// here.
	c.rx.reported = c.rx.read
}

// queuePending queues the pending message, spending a credit the caller
// checked for (and room in the send queue).
func (c *Conn) queuePending() {
	typ := uint8(msgData)
	if c.tx.pendMore {
		typ = msgDataMore
	}
	c.cr.spend()
	c.queueSend(typ, c.tx.pendLen)
	c.tx.pendLen, c.tx.pendMore = 0, false
	if c.msgWrite {
		// A Write for a message-oriented peer may be waiting for the
		// pending buffer to go (see write).
		signal(c.txReady)
	}
}

// flushDroppingLock posts what is queued: prepared messages, then the
// pending message once a credit allows, then a fin that waited behind
// it. mu is held on entry and exit but not across ibv_post_send (on rxe a
// system call that runs the whole transfer), so completions, Reads and
// other connections' work go on meanwhile. One goroutine posts at a time,
// which keeps the send queue in sequence order; whoever finds another
// posting only queues, and the poster picks that up before it leaves.
func (c *Conn) flushDroppingLock() {
	if c.tx.posting || c.tx.draining {
		return
	}
	c.tx.posting = true
	for {
		if c.pendingGoes() {
			c.queuePending()
		}
		if c.tx.finQueued && c.tx.pendLen == 0 && !c.tx.filling {
			c.tx.finQueued = false
			c.queueSend(msgFin, 0)
		}
		if len(c.tx.sends) == 0 {
			break
		}
		batch := c.tx.take()
		c.mu.Unlock()
		posts, err := postChain(c.qp, batch)
		c.mu.Lock()
		c.st.SendPosts += uint64(posts)
		if err != nil {
			// The connection has failed: post nothing more (the
			// teardown's marker retires what never went out).
			c.life.failWrite(err)
			c.tx.sends = c.tx.sends[:0]
			signal(c.txReady)
			break
		}
	}
	c.tx.posting = false
	if c.life.phase == phaseDead {
		signal(c.drained)
	}
}
