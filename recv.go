package rdma

import (
	"io"
	"net"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The receive path of a Conn: what each arriving message does (recvDone,
// or recvMsg for those that came before open: either fails the connection
// with the first check a message fails, which handleMsg and a handler per
// message type under it return), how Read and WriteTo take messages out of
// the receive ring, and how consumed receives and their credits go back to
// the peer (postReposts, returnCredits). The ring's bookkeeping is
// recvRing's (recvring.go).

// read is Read's body; mu and the Read turn are held.
func (c *Conn) read(b []byte) (int, error) {
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
	if c.rx.n > 0 {
		return nil // it came while the flush had let go of mu
	}
	var spun bool
	switch r, start := c.spinReadHeld(); r {
	case heldOver:
		c.countWait(true)
		return nil
	case heldPark:
		c.rxParked = true
		c.mu.Unlock()
		spun = c.w.park(c.rxReady, c.closing, c.rdl, start, &c.rdWait)
	default:
		c.rxParked = true
		c.mu.Unlock()
		spun = c.w.wait(c.rxReady, c.closing, c.rdl, &c.rdWait)
	}
	c.mu.Lock()
	c.rxParked = false
	if c.rxCounted {
		c.rxCounted = false
		wokenReads.add(-1)
	}
	c.countWait(spun)
	return nil
}

// heldSpin is how spinReadHeld ended.
type heldSpin int

const (
	// heldNone: no spin with mu held here (PollEvent, a spinner that is
	// no poller, or another goroutine polling the CQ): the Read waits
	// as a Write does (waiter.wait).
	heldNone heldSpin = iota
	// heldOver: the wait is over (data, a wakeup, the deadline, Close,
	// a change of state): the Read looks again.
	heldOver
	// heldPark: the spin's budget ran out: the Read parks.
	heldPark
)

// spinReadHeld is a Read's spinning wait with mu held: it polls the CQ
// itself, handling its own connection's completions in place
// (poller.tryPollHeld), until data or a wakeup arrives, the deadline
// passes, Close is called or the mode's budget (as waiter.wait spends it)
// runs out. The message a poll delivers is then queued when the poll
// returns: no signal through rxReady, no receive of it, no relock of mu,
// which in a 64 B round trip over the zero-cost provider cost a fifth of
// its time. It lets go of mu at each yield (every spinCheck polls), so
// that Close, a Write, a completion polled by another goroutine, and
// other connections' sends (pollHeld) are not held up longer than that.
//
// On heldPark it returns when the wait started, for the park to fold its
// length into the moving average of Read waits (PollAdaptive's).
func (c *Conn) spinReadHeld() (heldSpin, time.Time) {
	w := &c.w
	if c.pl == nil || w.mode == PollEvent {
		return heldNone, time.Time{}
	}
	c.rxHeld, c.rxWoke = true, false
	defer func() { c.rxHeld = false }()
	// One poll first, before the clock, the spin gate and the budget
	// (see waiter.wait): the reply is often in the CQ already.
	switch c.pollHeld() {
	case heldNone:
		return heldNone, time.Time{}
	case heldOver:
		if w.mode == PollAdaptive {
			c.rdWait = nextAvgWait(c.rdWait, 0)
		}
		return heldOver, time.Time{}
	}
	budget := time.Duration(-1)
	if w.mode == PollAdaptive {
		if budget = w.adaptiveBudget(c.rdWait); budget <= 0 || !adaptiveSpins.enter() {
			return heldPark, time.Now()
		}
		defer adaptiveSpins.leave()
	}
	return c.spinHeld(budget)
}

// spinHeld is spinReadHeld's spin, counted as a spinner, for up to
// budget (negative: no bound). Apart from spinReadHeld so that each
// function's defers stay few enough for the compiler to open-code them:
// with all in one, every return ran the runtime's deferreturn (2 % of a
// 64 B round trip over the zero-cost provider).
func (c *Conn) spinHeld(budget time.Duration) (heldSpin, time.Time) {
	w := &c.w
	w.sp.spinStart()
	defer w.sp.spinEnd()
	// The clock is first read spinCheck polls in: a reply caught before
	// then costs no clock read, and counts as a wait of zero.
	var start time.Time
	for i := 1; ; i++ {
		if r := c.pollHeld(); r != heldPark {
			if r == heldOver && w.mode == PollAdaptive {
				c.rdWait = nextAvgWait(c.rdWait, sinceOrZero(start))
			}
			return r, start
		}
		// A poll that woke a parked Read yields at once (see
		// poller.woke): client and server goroutines' 64 B round trip
		// over the zero-cost provider 0.85-0.92x.
		woke := c.pl.woke.Load() && c.pl.woke.Swap(false)
		if i%spinCheck != 0 && !woke {
			continue
		}
		if start.IsZero() {
			start = time.Now()
		} else if budget >= 0 && time.Since(start) > budget {
			return heldPark, start
		}
		c.mu.Unlock()
		runtime.Gosched()
		c.mu.Lock()
		if c.rx.n > 0 || c.rxWoke || c.readWaitOver() {
			return heldOver, start
		}
	}
}

// sinceOrZero is the time since start, or zero for the zero time (a spin
// that ended before its first look at the clock).
func sinceOrZero(start time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	return time.Since(start)
}

// readWaitOver reports whether a waiting Read must look again for a
// reason other than a message: Close, CloseRead, a failure, the peer
// gone, the deadline (what read checks); mu is held.
func (c *Conn) readWaitOver() bool {
	return c.life.has(shutClosed) || c.life.has(shutRead) || isClosed(c.closing) ||
		c.life.readFailed(c.rx.posted) != nil || c.rdl.expired()
}

// pollHeld makes one poll of spinReadHeld: heldOver if it delivered data
// or a wakeup to this connection, heldPark if not, heldNone if another
// goroutine is polling (the Read then lets go of mu and waits as a Write
// does: that goroutine may be waiting for mu to hand it a completion).
func (c *Conn) pollHeld() heldSpin {
	var buf [spinBatch]completer
	polled, others, own := c.pl.tryPollHeld(c, buf[:0])
	if !polled {
		return heldNone
	}
	if own {
		c.flushDroppingLock()
	}
	if len(others) > 0 {
		// Other connections' sends: posted without this one's lock (see
		// tryPollHeld); this connection's state may change meanwhile.
		c.mu.Unlock()
		for _, o := range others {
			o.lockAndFlush()
		}
		c.mu.Lock()
		if c.readWaitOver() {
			return heldOver
		}
	}
	if c.rx.n > 0 || c.rxWoke {
		return heldOver
	}
	return heldPark
}

// copyOutDroppingLock copies queued messages into b. The queued messages
// are the reader's while it holds the Read turn (the completion side only appends
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
	c.wakeRelease()
}

// writeTo hands each message to w from a buffer of the call's own, never
// from the ring: the peer can rewrite its receive ring at any moment (an
// RDMA WRITE needs no credit and completes nothing here), so a Writer
// that reads its argument twice (a file and a hash of it) could otherwise
// see two different contents. The message is consumed once w has taken
// it; what w leaves stays queued for the next Read. The Read turn is held
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
			// The head message is the reader's while the Read turn is held (see
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

// recvDone handles a receive's completion. It reports whether the receive
// was one of ours (complete counts the failed ones that were).
func (c *Conn) recvDone(wc ibv.WC) bool {
	if c.rx.posted <= 0 {
		// No receive of ours is posted, so this completion is not ours
		// (an earlier QP's of the same number, see retiredQP): it must
		// not fail the connection or upset the count.
		return false
	}
	c.rx.posted--
	if wc.Status != ibv.WCSuccess {
		// A failed receive means the QP is in the error state: nothing
		// more goes either way. Both directions fail, and a Write waiting
		// for credit wakes now, not when the CM gives up on a disconnect
		// a broken peer never answers.
		if c.life.has(shutPeerGone) || wc.Status == ibv.WCFlushErr {
			c.fail(syscall.ECONNRESET)
		} else {
			c.fail(&wcError{wc.Status})
		}
		return true
	}
	if c.mem == nil {
		// Released (a drain that timed out): the memory is gone, and
		// with it anything this completion could deliver.
		return true
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
		return true
	}
	// Every byte of the message is the peer's: one that breaks the
	// protocol fails the connection here, with the error of the first
	// check it fails (handleMsg and the handler of its type return it).
	// Not through recvMsg: a call more per message costs the round trip
	// of small messages 0.5 % of its instructions.
	if err := c.handleMsg(wc); err != nil {
		c.fail(err)
	}
	return true
}

// recvMsg handles, as recvDone does, a message that consumed one of our
// receives before open had the ring's geometry (open takes them up in
// order).
func (c *Conn) recvMsg(wc ibv.WC) {
	if err := c.handleMsg(wc); err != nil {
		c.fail(err)
	}
}

// handleMsg checks a message's header against what the peer may send,
// takes the credits it returns, and hands the message to its type's
// handler.
func (c *Conn) handleMsg(wc ibv.WC) error {
	h, n, inline, err := c.rx.message(wc, c.mem)
	if err != nil {
		return err
	}
	more, err := c.cr.received(h)
	if err != nil {
		return err
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
		return &protocolError{"message after the fin"}
	}
	if err := c.cr.arrived(h.Type); err != nil {
		return err
	}
	switch h.Type {
	case wire.MsgData:
		return c.recvData(n, inline, false)
	case wire.MsgDataMore:
		return c.recvData(n, inline, true)
	case wire.MsgRing:
		return c.recvRing(n, inline)
	case wire.MsgFin:
		return c.recvFin()
	case wire.MsgCredit:
		return c.recvCredit()
	case wire.MsgSwitched:
		return c.recvSwitched()
	case wire.MsgDecline:
		return c.recvDecline()
	default:
		return &protocolError{"unknown message type"}
	}
}

// recvData queues a data message of n bytes for the reader (more: the
// peer's Write goes on in the next message).
func (c *Conn) recvData(n uint32, inline []byte, more bool) error {
	m, err := c.rx.arrived(n, more)
	if err != nil {
		return err
	}
	if inline != nil {
		// It came in the SEND: into the ring where an RDMA WRITE
		// would have put it.
		copy(c.rx.payload(m, 0), inline)
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
		return nil
	}
	if err := c.push(m); err != nil {
		return err
	}
	c.st.MessagesReceived++
	return nil
}

// recvRing takes the peer's offer of a receive ring (wire.MsgRing).
func (c *Conn) recvRing(n uint32, inline []byte) error {
	m, err := c.rx.arrived(n, false)
	if err != nil {
		return err
	}
	if inline != nil {
		copy(c.rx.payload(m, 0), inline) // as a data message's (recvData)
	}
	// Read never sees it; its ring bytes and receive go back in
	// order with the data.
	if err := c.ringOffered(c.rx.payload(m, 0)); err != nil {
		return err
	}
	if !c.rx.pushOffer(m) {
		return &protocolError{"peer overran its credits"}
	}
	c.returnCredits(c.rx.halfUnreported())
	return nil
}

// recvFin queues the peer's fin behind its data: Read returns io.EOF
// there.
func (c *Conn) recvFin() error {
	if err := c.push(rxMsg{n: -1}); err != nil {
		return err
	}
	c.life.set(shutFinRcvd)
	return nil
}

// recvCredit takes a credit message: its header (handleMsg) was all of
// it.
func (c *Conn) recvCredit() error {
	c.repostCtrl()
	return nil
}

// recvSwitched takes the peer's wire.MsgSwitched (see ringSwitched).
func (c *Conn) recvSwitched() error {
	if err := c.ringSwitched(); err != nil {
		return err
	}
	c.repostCtrl()
	return nil
}

// recvDecline takes the peer's wire.MsgDecline (see ringDeclined).
func (c *Conn) recvDecline() error {
	if err := c.ringDeclined(); err != nil {
		return err
	}
	c.repostCtrl()
	return nil
}

// repostCtrl posts a control message's receive again at once, on its own
// (queued data receives are reported as data credits); the peer learns of
// it through ctrlAck on our next message.
func (c *Conn) repostCtrl() {
	if !c.life.has(shutPeerGone) && !c.tx.draining {
		if err := c.rx.postOne(c.qp); err != nil {
			c.postFailed(err, false)
		} else {
			c.cr.ctrlOwed++
		}
	}
}

// push queues m for the reader and wakes it. A full queue means the peer
// sent more than its credits allow.
func (c *Conn) push(m rxMsg) error {
	if !c.rx.push(m) {
		return &protocolError{"peer overran its credits"}
	}
	c.wakeReader()
	return nil
}

// wakeReader wakes a Read waiting for data or for a change of the
// connection's state; mu is held. A Read spinning with mu held (rxHeld)
// finds rxWoke at its next look, with no channel operation on either
// side.
func (c *Conn) wakeReader() {
	if c.rxHeld {
		c.rxWoke = true
		return
	}
	signal(c.rxReady)
	if c.rxParked && !c.rxCounted {
		c.rxCounted = true
		wokenReads.add(1)
	}
	if c.rxParked && c.pl != nil {
		c.pl.woke.Store(true)
	}
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
