package rdma

import (
	"time"

	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// A connection's reactions to its rdma_cm events, beside its other
// failures (conn_close.go): what a dial in progress, an accept in progress
// and an established connection each do with an event, and the first
// messages of an iWARP connection.

// cmEvent runs on the CM goroutine: it hands the event to the
// connection (see inbox.go) and returns without taking any of the
// connection's locks.
func (c *Conn) cmEvent(ev rdmacm.Event) { c.inbox.post(ev, c.handleCM) }

// cmLost runs on the CM goroutine when it can read no more events: a
// dial in progress fails, a connection being accepted is torn down, and
// an established connection fails, since neither its peer's disconnect
// nor its device's removal could reach it any more.
func (c *Conn) cmLost(error) { c.inbox.post(rdmacm.Event{Type: eventLost}, c.handleCM) }

// handleCM handles one of the connection's CM events, in order, on the
// inbox's goroutine.
func (c *Conn) handleCM(ev rdmacm.Event) {
	c.mu.Lock()
	ph := c.life.phase
	if ph == phaseDialing && ev.Type == rdmacm.EventEstablished {
		// From here on a disconnect must reach peerDisconnected even
		// before the dialing goroutine has looked at this event.
		c.life.phase = phaseEstablished
		c.cmUp = true
	}
	c.mu.Unlock()
	switch ph {
	case phaseDialing:
		c.dialingEvent(ev)
	case phaseAccepting:
		c.acceptingEvent(ev)
	case phaseEstablished, phaseDead:
		c.establishedEvent(ev)
	}
}

// dialingEvent hands an event to the dialing goroutine (waitCM).
func (c *Conn) dialingEvent(ev rdmacm.Event) {
	if ev.Type == rdmacm.EventDeviceRemoval {
		// Here, not only where the dialing goroutine reads it: a dial
		// that gave up during rdma_connect (see connect) reads no more
		// events, and the kernel waits until the device is let go.
		// Marking twice is harmless.
		c.markIDRemoved()
	}
	select {
	case c.cmEv <- ev:
	default:
	}
}

// acceptingEvent ends an accept's handshake: established, the connection
// goes to the listener's queue; anything else but TIMEWAIT_EXIT drops it.
func (c *Conn) acceptingEvent(ev rdmacm.Event) {
	switch ev.Type {
	case rdmacm.EventEstablished:
		c.mu.Lock()
		// Unless the listener evicted it meanwhile (its teardown has
		// begun).
		ok := c.life.phase == phaseAccepting
		if ok {
			c.life.phase = phaseEstablished
			c.cmUp = true
			// iWARP: not before the dialing side's first message (see
			// initiatorFirst), which the poller may have taken already.
			if c.lay.headers() {
				c.awaitFirst = true
				if c.heardFirst {
					c.firstArrived(true)
					c.flushDroppingLock()
				}
				ok = false
			}
		}
		c.mu.Unlock()
		if ok {
			c.lst.established(c)
		}
	case rdmacm.EventTimewaitExit:
	case rdmacm.EventDeviceRemoval:
		c.markIDRemoved()
		c.lst.failed(c)
	default:
		c.lst.failed(c)
	}
}

// establishedEvent is what an established connection (or one closing)
// does with an event: a disconnect, a removal, the loss of the events.
func (c *Conn) establishedEvent(ev rdmacm.Event) {
	c.mu.Lock()
	awaiting := c.awaitFirst && (ev.Type == rdmacm.EventDisconnected || ev.Type == rdmacm.EventDeviceRemoval || ev.Type == eventLost)
	if awaiting {
		// Gone before its first message: never accepted (see
		// firstArrived).
		c.firstArrived(false)
	}
	c.mu.Unlock()
	if awaiting {
		if ev.Type == rdmacm.EventDeviceRemoval {
			c.markIDRemoved()
		}
		return
	}
	// While closing too: a disconnect ends the wait for the fin's
	// acknowledgement.
	switch ev.Type {
	case rdmacm.EventDisconnected:
		// A status (-ETIMEDOUT) says our disconnect went unanswered.
		c.peerDisconnected(ev.Status == 0)
	case rdmacm.EventDeviceRemoval:
		c.deviceRemoved()
	case eventLost:
		c.mu.Lock()
		c.fail(c.cm.lostErr())
		c.mu.Unlock()
	}
}

// On iWARP the initiator of a connection sends first, and siw, without
// MPA version 2's ready-to-receive exchange, has two races around the
// first messages (docs/providers.md):
//   - Its accepting side reports the connection established as soon as
//     its MPA reply is sent, and a message posted then can reach the
//     dialing side right behind that reply, before the dialing side's
//     connection manager has taken it: siw reads the reply, finds more
//     bytes behind it, and fails the connect (CONNECT_ERROR) while the
//     server holds the connection as established. A server that writes
//     first lost 1 dial in 26 that way in the test bed
//     (TestDialServerWritesFirst).
//   - Its accepting side moves the socket under the QP only after the
//     MPA reply is sent: a message from the dialing side that arrives in
//     between stays in the socket's buffer, unprocessed, until more
//     bytes arrive (1 dial in about 60 there, once the dialing side sent
//     first).
//
// So on a transport of header SENDs (iWARP) the dialing side sends a
// credit message as soon as it is connected (initiatorFirst) and repeats
// it, a few times with growing pauses, until it hears from its peer
// (nudgeFirst: a message stranded in the socket goes up with the next
// one); the accepting side is handed to Accept, and so may send, only
// once a message of the peer's has arrived, and at once answers it with
// a credit message of its own (firstArrived). Everything the library
// sends by itself answers something the peer sent, or starts after
// Accept.

// initiatorFirst sends the dialing side's first message on iWARP: a credit
// message returning nothing, which spends one of the peer's control
// credits as any credit message does (the peer's answer returns it).
func (c *Conn) initiatorFirst() {
	if !c.lay.headers() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sendFirst()
	c.nudge = time.AfterFunc(nudgeFirstAfter, c.nudgeFirst)
}

// sendFirst sends a credit message (queueFirst) and posts it; mu is held.
func (c *Conn) sendFirst() {
	if c.queueFirst() {
		c.flushDroppingLock()
	}
}

// queueFirst queues a credit message, the first message of either side
// on iWARP, if the connection can still send and a control credit
// allows, and reports whether it did; mu is held.
func (c *Conn) queueFirst() bool {
	if c.life.phase != phaseEstablished || c.life.werr != nil || c.tx.draining || !c.cr.ctrlFree(c.tx.ctrlInFlight()) {
		return false
	}
	c.queueSend(wire.MsgCredit, 0)
	return true
}

// nudgeFirstAfter is the pause before the first repeat of the dialing
// side's first message; each next pause is eight times longer (5, 40 and
// 320 ms), and there are nudgeFirstRepeats of them, as many as the
// control credits left. Past them, the keepalive's first probe (an RDMA
// WRITE, which needs no credit) is the next message to bring a stranded
// one up.
const (
	nudgeFirstAfter   = 5 * time.Millisecond
	nudgeFirstRepeats = wire.CtrlDepth - 1
)

// nudgeFirst repeats the first message while nothing was heard from the
// peer; it runs on the timer's goroutine.
func (c *Conn) nudgeFirst() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.heardFirst || c.life.phase != phaseEstablished || c.nudges >= nudgeFirstRepeats {
		return
	}
	c.nudges++
	c.sendFirst()
	c.nudge.Reset(nudgeFirstAfter << (3 * c.nudges))
}

// firstArrived ends an accepted connection's wait for its peer's first
// message (awaitFirst): it arrived (ok), and the listener queues the
// connection for Accept and the peer is answered (its repeats end); or
// the connection failed first, and the listener drops it. mu is held.
func (c *Conn) firstArrived(ok bool) {
	c.awaitFirst = false
	if !ok {
		c.lst.failed(c)
		return
	}
	c.lst.established(c)
	// Queued: a completion's sends are posted by the poller's flush (see
	// complete), the event's by handleCM.
	c.queueFirst()
}
