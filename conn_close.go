package rdma

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
)

// Failing and shutting a Conn down, in one place: fail (every failure of
// an established connection), CloseRead, CloseWrite, Close, the peer's
// disconnect, a device's removal, and the teardown (the linger for the
// fin, the drain of the QP, the release). The release's whole order is in
// one function, releaseAll; the verbs objects go through the steps of the
// platform's part (connSys: conn_sys.go and conn_verbs.go; no-ops in
// unsupported.go).

// CloseWrite shuts down the writing side: the peer reads what was written
// and then io.EOF, while this side can still read. Writes fail from then
// on with an error wrapping syscall.EPIPE. It waits for a Write in progress
// to return, so that the fin follows all of that Write's data.
func (c *Conn) CloseWrite() error {
	if !c.ok() {
		return errInvalid("close")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wturn.take(&c.mu)
	defer c.wturn.give()
	if c.life.has(shutClosed) {
		return c.opErr("close", net.ErrClosed)
	}
	return c.opErr("close", c.sendFinDroppingLock())
}

// CloseRead shuts down the reading side: Reads return io.EOF from now on,
// and data that arrives is discarded, its ring bytes returned to the peer so
// that the peer's Writes do not block. Writing continues to work.
func (c *Conn) CloseRead() error {
	if !c.ok() {
		return errInvalid("close")
	}
	c.mu.Lock()
	if c.life.has(shutClosed) {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.life.set(shutRead)
	c.mu.Unlock()
	signal(c.rxReady)
	// A Read in progress returns io.EOF and gives its turn back; then
	// the queued messages are no one's.
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rturn.take(&c.mu)
	defer c.rturn.give()
	if c.life.has(shutClosed) {
		// Close ran meanwhile: the buffers and the QP are gone.
		return c.opErr("close", net.ErrClosed)
	}
	c.rx.discard()
	c.ringDrained() // an old receive ring emptied by the discard goes now
	c.rx.discarding = true
	c.returnCredits(true)
	c.flushDroppingLock()
	return nil
}

// Close closes the connection. Data already written is delivered before the
// peer's Read returns io.EOF; Reads and Writes blocked here return an error
// wrapping net.ErrClosed. Close waits until the peer's NIC has acknowledged
// everything sent (three seconds at most if the peer is unreachable); the
// connection's QP and registered memory are released right after, in the
// background (rdma.Devices shows them until then). If the peer leaves no
// receive free for that long while Writes' data still waits for
// one, the data is discarded and Close returns an error wrapping
// syscall.ETIMEDOUT.
func (c *Conn) Close() error {
	if !c.ok() {
		return errInvalid("close")
	}
	c.mu.Lock()
	if c.life.has(shutClosed) {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.life.set(shutClosed)
	c.closeWakes()
	// No operation starts on its regions from now on: the release, which
	// may run after Close returns, revokes them (their memory stays
	// until each region's Close: see Region).
	for _, r := range c.os.regions {
		r.closed = true
	}
	later := c.releasedLater
	c.mu.Unlock()
	if later {
		// The device's removal failed the connection and is releasing
		// it (see releasedLater): nothing is left for Close to send or
		// wait for.
		c.rdl.stop()
		c.wdl.stop()
		return nil
	}
	// Wait for Reads and Writes to leave: the teardown frees their buffers.
	c.takeTurn(&c.wturn)
	c.takeTurn(&c.rturn)
	err := c.teardown(true)
	c.giveTurn(&c.rturn)
	c.giveTurn(&c.wturn)
	c.rdl.stop()
	c.wdl.stop()
	return c.opErr("close", err)
}

// abortConns closes connections the application never saw (a listener's
// unaccepted ones) without the fin and the linger Close gives the peer,
// as a TCP listener resets the connections left in its queue: their
// peers' Reads fail with ECONNRESET. Nothing was read from them, so
// nothing of the application's waits to be delivered, and a linger each
// would only wait, one after another and lingerTimeout apiece, for
// dialers that may have vanished. They are closed when abortConns
// returns; their releases run in the background like Close's, at most
// abortWorkers at a time, since each holds an OS thread in its system
// calls and a backlog may hold thousands.
func abortConns(conns []*Conn) {
	for _, c := range conns {
		c.mu.Lock()
		if !c.life.has(shutClosed) {
			c.life.set(shutClosed)
			c.closeWakes()
		}
		c.mu.Unlock()
	}
	if len(conns) == 0 {
		return
	}
	releasing.Add(1)
	go func() {
		defer releasing.Done()
		slots := make(chan struct{}, abortWorkers)
		var wg sync.WaitGroup
		for _, c := range conns {
			slots <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A release the device's removal began (releaseLater)
				// is waited for here, not repeated.
				c.release()
				c.rdl.stop()
				c.wdl.stop()
				<-slots
			}()
		}
		wg.Wait()
	}()
}

// abortWorkers bounds the releases abortConns runs at once.
const abortWorkers = 16

// Done retires one.
func (f *inFlight) Done() { f.Add(-1) }

// Wait returns once the count is zero.
func (f *inFlight) Wait() {
	f.mu.Lock()
	if f.cond.L == nil {
		f.cond.L = &f.mu
	}
	for f.n > 0 {
		f.cond.Wait()
	}
	f.mu.Unlock()
}

// undeliveredError is Close's error when data Write accepted could not be
// delivered: the peer left no receive free for the linger time.
type undeliveredError struct{}

func (undeliveredError) Error() string {
	return "written data discarded: the peer granted no receive before the close timeout"
}
func (undeliveredError) Unwrap() error { return syscall.ETIMEDOUT }

// Timeouts of the teardown: how long Close waits for the fin to be
// acknowledged, and for the QP to flush its work requests once in error.
var (
	lingerTimeout = 3 * time.Second
	drainTimeout  = 3 * time.Second
)

// lingerDroppingLock sends the fin behind everything written and waits,
// up to lingerTimeout, until the peer's NIC has acknowledged it. It
// reports data that never got a credit to go out.
func (c *Conn) lingerDroppingLock() error {
	if c.sendFinDroppingLock() == nil {
		c.waitDroppingLock(lingerTimeout, func() bool {
			return (!c.tx.finQueued && c.tx.ctrlDone == c.tx.ctrlSeq) || c.life.werr != nil || c.life.has(shutPeerGone)
		})
	}
	if pend, _ := c.tx.pending(); pend > 0 && c.life.finBlocked() == nil && !c.life.has(shutPeerGone) {
		// The peer left no receive free for the linger time: what
		// Writes left pending is discarded, and Close says so. It is
		// dropped here, fin and all, since credits the peer returns
		// before the release disconnects would otherwise still send it.
		c.tx.dropPending()
		return undeliveredError{}
	}
	return nil
}

// drainDroppingLock takes the QP over for the teardown, once the QP is in
// the error state (disconnected): it waits for a post in progress (on the
// poller, returning credits; a post always returns, and the QP must not be
// destroyed under it), posts nothing more from then on, and waits until
// every posted work request has completed (flushed), up to drainTimeout;
// qpDrained records whether they all did.
func (c *Conn) drainDroppingLock() {
	for c.tx.posting || c.os.posting > 0 {
		c.waitDroppingLock(drainTimeout, func() bool { return !c.tx.posting && c.os.posting == 0 })
	}
	c.tx.draining = true
	if !c.tx.idle() {
		// A signaled marker behind everything posted: its completion
		// retires all earlier sends, signaled or not.
		c.qp.PostSends([]ibv.SendWR{c.tx.marker()})
	}
	// One-sided operations are all signaled: each one's flushed
	// completion comes by itself.
	drained := func() bool { return c.rx.posted == 0 && c.tx.idle() && c.os.idle() }
	c.waitDroppingLock(drainTimeout, drained)
	if c.rx.posted > 0 {
		// The disconnect left the QP out of the error state (on iWARP it
		// only closes the QP, and not one that never reached RTS): move
		// it there, so that the receives flush now, not into the shared
		// CQ at the destroy (see retiredQP). Without mu: it is a system
		// call, and the poller may be waiting for mu with the CQ held.
		// (Sends siw's closing QP had not started stay until the
		// destroy whatever is done: they are not waited for again.)
		c.mu.Unlock()
		c.errorQP()
		c.mu.Lock()
		c.waitDroppingLock(drainTimeout, func() bool { return c.rx.posted == 0 })
	}
	c.qpDrained = drained()
	if c.rx.posted != 0 && c.wasDialed() && !c.cmUp {
		unconnectedRecvsLeft.Add(1)
	}
}

// unconnectedRecvsLeft counts the releases of dials whose QP never got
// connected that left receives posted (tests read it): the case where
// iWARP's rdma_disconnect leaves the QP as it is. Elsewhere siw may keep
// one receive, or a send it had not started, until the destroy flushes it
// (see retiredQP).
var unconnectedRecvsLeft atomic.Int64

// wakeRelease wakes a release waiting in waitDroppingLock for what the
// caller has just changed (a completion, a post or a copy over, the
// disconnect answered); mu is held. Only once the phase is dead: before,
// what those waits look for signals txReady.
func (c *Conn) wakeRelease() {
	if c.life.phase == phaseDead {
		signal(c.drained)
	}
}

// waitDroppingLock waits, with mu held on entry and exit, until cond holds
// or the timeout passes. Before the release (Close's linger), what it
// waits for signals txReady, and Close holds the Write turn, so no Write
// waits there. Once the phase is dead, completions and the disconnect's
// answer signal drained, and it leaves txReady alone: the release after
// a device's removal runs without the turns (see releaseLater), beside
// a Write that may be parked on txReady alone (waiter.alone), whose wakeup
// (Close's, its deadline's) it would otherwise take.
func (c *Conn) waitDroppingLock(timeout time.Duration, cond func() bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for !cond() {
		var tx chan struct{}
		if c.life.phase != phaseDead {
			tx = c.txReady
		}
		c.mu.Unlock()
		select {
		case <-c.drained:
		case <-tx:
		case <-t.C:
			c.mu.Lock()
			return
		}
		c.mu.Lock()
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

// fail fails both directions of the connection with err (the first
// failure of each wins, see lifecycle), disconnects it so that the peer
// learns of it (a NIC-level failure moves the QP to the error state
// without any CM event), and wakes every call waiting on it. Every failure
// of an established connection goes through here: a failed completion, a
// protocol violation, a keepalive that went unanswered, an asynchronous
// event, a refused one-sided operation. mu is held.
func (c *Conn) fail(err error) {
	c.life.fail(err)
	c.brokenQP()
	c.wakeReader()
	signal(c.txReady)
}

// peerDisconnected handles the connection manager's disconnect event,
// the peer's disconnect or its answer to ours: acknowledge it (which
// moves our QP to the error state, flushes our receives and, when the
// peer asked, answers it) and fail further writes. Reads still return
// what already arrived. answered is false when the event reports that
// the peer never answered our disconnect.
func (c *Conn) peerDisconnected(answered bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.life.set(shutPeerGone)
	if !c.life.has(shutQPGone) {
		c.disconnect()
	}
	// Answered, or (the release's disconnect having gone first, see
	// releaseAll) crossed with ours: either way the exchange is over.
	c.cmDown = answered
	c.life.failWrite(syscall.ECONNRESET)
	// Reads learn of it from the flushed receives, or, with none posted,
	// from shutPeerGone itself.
	c.wakeReader()
	signal(c.txReady)
	c.wakeRelease() // a release waiting for the answer (reusableQP)
}

// disconnect moves the QP to the error state and tells the peer (or
// answers the peer's disconnect), without waiting: rdma_disconnect runs on
// a goroutine of its own, the calls of one connection one after another.
// Its callers hold mu, and one of them (a failed completion, see fail)
// runs on the poller with the device's CQ held: on siw rdma_disconnect
// can block for seconds (the iWARP connection's close), and the device's
// every other connection, its dials included, waited behind it. The
// release waits for the calls to return (waitDisconnects) before the QP
// and the id go.
func (c *Conn) disconnect() {
	c.disc.mu.Lock()
	defer c.disc.mu.Unlock()
	c.disc.pending++
	if c.disc.pending > 1 {
		return // the running goroutine makes this call too
	}
	c.disc.idle = make(chan struct{})
	go func() {
		for {
			c.connSys.disconnect()
			c.disc.mu.Lock()
			c.disc.pending--
			if c.disc.pending == 0 {
				close(c.disc.idle)
				c.disc.mu.Unlock()
				return
			}
			c.disc.mu.Unlock()
		}
	}()
}

// waitDisconnects waits until every disconnect call made so far has
// returned. mu must not be held.
func (c *Conn) waitDisconnects() {
	c.disc.mu.Lock()
	idle := c.disc.idle
	c.disc.mu.Unlock()
	if idle != nil {
		<-idle
	}
}

// deviceRemoved handles the removal of the connection's device (rdma
// link delete, a hot-unplugged NIC): the kernel cannot finish removing it
// while anything of it is held, and the data path would go on as if
// nothing happened (posts succeed on rxe), so the connection fails at once
// with ENODEV and gives its verbs objects back without waiting for Close.
// It runs on the connection's CM inbox goroutine or the device's
// asynchronous-event reader; the release waits for completions and
// destroys the id, so it runs on a goroutine of its own.
func (c *Conn) deviceRemoved() {
	c.markDeviceRemoved()
	c.mu.Lock()
	c.life.set(shutPeerGone) // nothing more will come, no fin can go, and nothing to disconnect
	err := &deviceError{syscall.ENODEV}
	c.fail(err)
	dialing := c.dialing
	c.removedDialing = dialing
	o := c.obs
	c.mu.Unlock()
	o.deviceRemoved(DeviceRemovedInfo{Local: addrOrNil(c.laddr), Remote: addrOrNil(c.raddr), Err: err})
	if !dialing {
		c.releaseLater()
	}
}

// releaseLater releases the verbs objects of a connection whose device
// went away, on a goroutine of its own (it waits for completions and
// destroys the id).
func (c *Conn) releaseLater() {
	c.mu.Lock()
	c.releasedLater = true
	c.mu.Unlock()
	// Counted with Close's releases: Close does not wait for this one.
	releasing.Add(1)
	go func() {
		defer releasing.Done()
		// Not behind the Read and Write turns: a WriteTo or ReadFrom
		// holds one while it waits in the application's Writer or Reader (an
		// idle io.Copy(conn, os.Stdin)), for as long as that takes, and
		// the device's removal would wait with it. The release waits
		// only for a copy in or out of the rings (see releaseAll); the
		// calls have been failed, so they leave once they look.
		c.release()
	}()
}

// teardown ends the connection: the fin (if graceful) and its
// acknowledgement, then the release of the verbs objects. Close's
// (graceful) teardown returns once the peer's NIC has acknowledged the fin,
// and the release runs on a goroutine of its own, as a TCP close returns
// while the kernel finishes: disconnecting, flushing the queues and
// destroying the QP and the id take milliseconds (most of a short-lived
// connection's Close), and nothing of them concerns the caller. Reads and
// Writes after Close fail before they touch the memory being released.
func (c *Conn) teardown(graceful bool) error {
	c.mu.Lock()
	c.stopKeepAlive()
	wasEstablished := c.life.phase == phaseEstablished
	c.life.phase = phaseDead
	var lost error
	if c.hasQP() && graceful && wasEstablished && !c.life.has(shutPeerGone) {
		lost = c.lingerDroppingLock()
	}
	c.mu.Unlock()
	if graceful {
		releasing.Add(1)
		go func() {
			defer releasing.Done()
			c.release()
		}()
	} else {
		c.release()
	}
	return lost
}

// release gives everything back, once, in the order the device's removal
// needs (the kernel waits for every object and id on it): disconnect, the
// flush of every work request, then the QP, the memory, the device's
// shared objects, and last the id (librdmacm may close the device's
// context with its last id). Queued data goes with the memory.
func (c *Conn) release() {
	c.releaseOnce.Do(c.releaseAll)
}

// releaseAll is the release, from the disconnect to the id's destroy.
func (c *Conn) releaseAll() {
	defer c.reportClosed()
	c.mu.Lock()
	c.stopKeepAlive()
	c.life.phase = phaseDead
	c.disconnect()
	// The drain's marker, a zero-length RDMA WRITE, must find the QP in
	// the error state, to be flushed here rather than sent: wait for the
	// disconnect (see disconnect), without mu.
	c.mu.Unlock()
	c.waitDisconnects()
	c.mu.Lock()
	if c.hasQP() {
		c.drainDroppingLock()
	}
	// A Read, Write, WriteTo or ReadFrom copying between its buffer and a
	// ring without the lock is using the memory about to go: wait for
	// the copy (none calls into the application meanwhile), and keep the
	// lock from its end to the memory's reset below, so that no copy
	// starts in between (a Read copies out what is queued before it looks
	// at failures).
	for c.rx.copying || c.tx.filling {
		c.waitDroppingLock(drainTimeout, func() bool { return !c.rx.copying && !c.tx.filling })
	}
	// From here on a disconnect event must not touch the QP: destroying
	// it while rdma_disconnect moves it to the error state fails (EBUSY).
	c.life.set(shutQPGone)
	// Nothing queued can be read once the memory is gone.
	c.rx.n = 0
	c.tx.dropPending()
	c.mem = nil
	c.rx.buf = [2][]byte{}
	c.tx.buf = nil
	c.mu.Unlock()
	// No rdma_disconnect may still be moving the QP when it is reset or
	// destroyed, or use the id when it goes.
	c.waitDisconnects()
	// The rings registered apart, before the arena goes back to the pool.
	c.freeRings()
	if c.id == nil {
		return // a Conn built on fakes (host tests) has no verbs objects
	}
	// Neither an rdma_accept in progress (qpMu) nor librdmacm's
	// processing of an event of the id (Quiet, in destroyQP) may find the
	// QP freed, and no rdma_accept may start once it is (qpGone).
	keep := c.reusableQP()
	c.qpMu.Lock()
	c.qpGone = true
	c.retireQP(keep)
	c.qpMu.Unlock()
	// Before the arena (and its PD) may go to another connection.
	c.releaseRegions()
	c.dropArena()
	// Before the device's release: the device must stay open, its
	// asynchronous events with it, until its port is back.
	c.mu.Lock()
	established := c.cmUp && !c.cmDown
	c.mu.Unlock()
	c.waitPortBack(established)
	c.releaseDevice()
	c.closeID()
}

// reportClosed tells the observer that a connection Dial or Accept
// returned is gone, once its release has given everything back.
func (c *Conn) reportClosed() {
	c.mu.Lock()
	o, handed, err := c.obs, c.handed, c.life.rerr
	c.mu.Unlock()
	if o == nil || !handed {
		return
	}
	o.connClosed(ConnClosedInfo{Local: addrOrNil(c.laddr), Remote: addrOrNil(c.raddr), Duration: time.Since(c.born),
		Err: err, Stats: c.Stats()})
}

// disconnectWait bounds how long a release waits for the peer's
// connection manager to answer the disconnect before it decides that the
// QP cannot be kept (see reusableQP).
const disconnectWait = 250 * time.Millisecond

// reusableQP reports whether the QP can serve another connection: the
// connection was dialed; every work request it had has completed (a
// reset drops queued ones without a completion, which would leave their
// buffers' owners waiting), and every RDMA READ of it successfully (see
// readCut); its device is neither iWARP nor gone; and the
// connection manager completed the disconnect exchange, waiting up to
// disconnectWait for that.
//
// Only a dial adopts a kept QP, and so only a dial's QP is kept. The
// peer's connection manager holds the QP's number as that of a live
// connection until it has processed the disconnect's last message, and
// a side cannot learn when that is unless its own request was answered
// (both sides may disconnect at once). A new connection whose QP number
// it still holds is refused: when the number comes in a dial's request,
// with a reject that says so, and the dial tries again with a new QP
// (staleConnError); when it comes in an accept's reply, the dialing side
// drops the reply, and its dial hangs until its request is sent again,
// seconds later. Accepts therefore create their QPs.
func (c *Conn) reusableQP() bool {
	if !c.qpDrained || c.readCut || !c.qpKeepable() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmUp && !c.cmDown {
		c.waitDroppingLock(disconnectWait, func() bool { return c.cmDown })
	}
	return c.cmDown
}

// failAsync fails the connection for an asynchronous event; removed says
// its device is gone, which releases its verbs objects too.
func (c *Conn) failAsync(err error, removed bool) {
	if removed {
		c.deviceRemoved()
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fail(err)
}
