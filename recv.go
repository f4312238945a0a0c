package rdma

import (
	"io"
	"net"
	"sync"
	"syscall"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The receive path of a Conn: what each arriving message does (recvDone,
// recvMsg), how Read and WriteTo take messages out of the receive ring,
// and how consumed receives and their credits go back to the peer
// (postReposts, returnCredits). The ring's bookkeeping is recvRing's
// (recvring.go).

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
// (when the peer's latest header wants them: see ledger.header) and waits
// for data (or the deadline, or Close).
func (c *Conn) waitDataDroppingLock() error {
	if err := c.life.readFailed(c.rx.posted); err != nil {
		return err
	}
	c.returnCredits(c.cr.peerWants)
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
	// A small copy costs less than dropping the lock and taking it again.
	held := len(b) <= smallCopy
	if !held {
		c.rx.copying = true
		c.mu.Unlock()
	}
	n, used, off, ended := c.rx.copyOut(b, head, avail, off, c.msgRead)
	if !held {
		c.mu.Lock()
		c.copiedOut()
	}
	c.rx.consume(used, off)
	c.ringDrained()
	if used > 0 {
		c.returnCredits(c.rx.halfUnreported())
		c.flushDroppingLock()
	}
	return n, ended, nil
}

// copiedOut ends a copy out of the receive ring made without the lock
// (rx.copying): a release waiting for it goes on.
func (c *Conn) copiedOut() {
	c.rx.copying = false
	if c.life.phase == phaseDead {
		signal(c.drained)
	}
}

// writeTo hands each message to w from a buffer of the call's own, never
// from the ring: the peer can rewrite its receive ring at any moment (an
// RDMA WRITE needs no credit and completes nothing here), so a Writer
// that reads its argument twice (a file and a hash of it) could otherwise
// see two different contents. The message is consumed once w has taken
// it; what w leaves stays queued for the next Read. readMu is held
// throughout, but the copy is what a release waits for, not w.
func (c *Conn) writeTo(w io.Writer) (int64, error) {
	var total int64
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.life.has(shutClosed) {
			return total, net.ErrClosed
		}
		if c.readDeadlinePassedDroppingLock() {
			return total, errTimeout
		}
		if c.life.has(shutRead) {
			return total, nil
		}
		if c.rx.n > 0 {
			if c.rx.finAtHead() {
				return total, nil
			}
			// The head message is the reader's while readMu is held (see
			// Read): copy it out without the lock.
			src := c.rx.payload(c.rx.q[c.rx.head], c.rx.off)
			b := growBuf(bp, len(src), c.rx.maxMsg)
			c.rx.copying = true
			c.mu.Unlock()
			copy(b, src)
			c.mu.Lock()
			c.copiedOut()
			c.mu.Unlock()
			n, werr := w.Write(b)
			c.mu.Lock()
			if c.life.has(shutQPGone) {
				// A device's removal released the connection while w
				// ran (it does not wait for w): nothing is queued any
				// more.
				total += int64(max(0, min(n, len(b))))
				if err := c.life.readFailed(0); err != nil {
					return total, err
				}
				return total, net.ErrClosed
			}
			if n < 0 || n > len(b) {
				n = 0
				if werr == nil {
					werr = errInvalidWrite
				}
			}
			total += int64(n)
			c.st.BytesRead += uint64(n)
			if n == len(b) {
				c.rx.consume(1, 0)
				c.ringDrained()
				c.returnCredits(c.rx.halfUnreported())
				c.flushDroppingLock()
			} else {
				c.rx.off += n
				if werr == nil {
					werr = io.ErrShortWrite
				}
			}
			if werr != nil {
				return total, werr
			}
			continue
		}
		if err := c.waitDataDroppingLock(); err != nil {
			return total, err
		}
	}
}

// copyBufs holds the buffers WriteTo and ReadFrom move data through, so
// that a call in the steady state allocates none.
var copyBufs = sync.Pool{New: func() any { return new([]byte) }}

// growBuf returns the first n bytes of *bp, growing it (to at least
// hint bytes, the largest message the connection takes now) when it is
// too small.
func growBuf(bp *[]byte, n, hint int) []byte {
	if cap(*bp) < n {
		*bp = make([]byte, max(n, hint))
	}
	return (*bp)[:n]
}

func (c *Conn) recvDone(wc ibv.WC) {
	if c.rx.posted <= 0 {
		// No receive of ours is posted, so this completion is not ours
		// (an earlier QP's of the same number, see retiredQP): it must
		// not fail the connection or upset the count.
		return
	}
	c.rx.posted--
	if wc.Status != ibv.WCSuccess {
		// A failed receive means the QP is in the error state: nothing
		// more goes either way. Both directions fail, and a Write waiting
		// for credit wakes now, not when the CM gives up on a disconnect
		// a broken peer never answers.
		c.countFailed(wc.Status)
		if c.life.has(shutPeerGone) || wc.Status == ibv.WCFlushErr {
			c.fail(syscall.ECONNRESET)
		} else {
			c.fail(&wcError{wc.Status})
		}
		return
	}
	if c.mem == nil {
		// Released (a drain that timed out): the memory is gone, and
		// with it anything this completion could deliver.
		return
	}
	if !c.rx.opened() {
		// The peer was established first and wrote before open has the
		// ring's geometry: open handles it, in order. The peer's credits
		// bound how many can come.
		if len(c.early) < cap(c.early) {
			c.early = append(c.early, wc)
		} else {
			c.fail(&protocolError{"peer overran its credits"})
		}
		return
	}
	c.recvMsg(wc)
}

// recvMsg handles a message that consumed one of our receives.
func (c *Conn) recvMsg(wc ibv.WC) {
	h, n, inline, err := c.rx.message(wc, c.mem)
	if err != nil {
		c.fail(err)
		return
	}
	more, err := c.cr.received(h)
	if err != nil {
		c.fail(err)
		return
	}
	if h.Credits > 0 {
		c.tx.ring.ack(int(h.Credits))
	}
	if more {
		signal(c.txReady)
	}
	if c.life.has(shutFinRcvd) && h.Type != wire.MsgCredit {
		// (Nor does a ring offer or its answer come after the fin: the
		// write side shut, a sender sends neither.)
		// The fin ended what the peer sends; credits may still come.
		c.fail(&protocolError{"message after the fin"})
		return
	}
	if err := c.cr.arrived(h.Type); err != nil {
		c.fail(err)
		return
	}
	switch h.Type {
	case wire.MsgData, wire.MsgDataMore, wire.MsgRing:
		m, err := c.rx.arrived(n, h.Type == wire.MsgDataMore)
		if err != nil {
			c.fail(err)
			return
		}
		if inline != nil {
			// It came in the SEND: into the ring where an RDMA WRITE
			// would have put it.
			copy(c.rx.payload(m, 0), inline)
		}
		if h.Type == wire.MsgRing {
			// Read never sees it; its ring bytes and receive go back in
			// order with the data.
			if err := c.ringOffered(c.rx.payload(m, 0)); err != nil {
				c.fail(err)
				return
			}
			if !c.rx.pushOffer(m) {
				c.fail(&protocolError{"peer overran its credits"})
				return
			}
			c.returnCredits(c.rx.halfUnreported())
			return
		}
		c.noteData(int(n))
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
	case wire.MsgCredit, wire.MsgFin, wire.MsgSwitched, wire.MsgDecline:
		if h.Type == wire.MsgFin {
			if c.push(rxMsg{n: -1}) {
				c.life.set(shutFinRcvd)
			}
			return
		}
		var err error
		switch h.Type {
		case wire.MsgSwitched:
			err = c.ringSwitched()
		case wire.MsgDecline:
			err = c.ringDeclined()
		}
		if err != nil {
			c.fail(err)
			return
		}
		// Post the receive again at once, on its own (queued data
		// receives are reported as data credits); the peer learns of it
		// through ctrlAck on our next message.
		if !c.life.has(shutPeerGone) && !c.tx.draining {
			if err := c.rx.postOne(c.qp); err != nil {
				c.postFailed(err, false)
			} else {
				c.cr.ctrlOwed++
			}
		}
	default:
		c.fail(&protocolError{"unknown message type"})
	}
}

func (c *Conn) push(m rxMsg) bool {
	if !c.rx.push(m) {
		c.fail(&protocolError{"peer overran its credits"})
		return false
	}
	signal(c.rxReady)
	return true
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
		c.postFailed(err, false)
		return
	}
	c.cr.unreported += n
}

// returnCredits posts consumed receives again and tells the peer,
// in a credit message, once a batch of them is ready, or at once when force
// is set (the reader is about to wait while the writer may be waiting for
// them, or the reader gives up the data). Credits still flow after our
// fin: the peer may go on writing.
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
		c.queueSend(wire.MsgCredit, 0)
	}
}
