package rdma

import (
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
)

// A device's asynchronous events: what the NIC reports outside any work
// completion. A QP or CQ that failed, or a device that died, would
// otherwise leave its connections waiting for completions that never
// come; a port that went down would leave them waiting until the keepalive
// gives up. Soft-RoCE reports only the port's state (and a removed device
// through rdma_cm: see Conn.deviceRemoved); hardware reports them all.

// portDownGrace is how long a device's port may stay down before its
// connections fail: a link that flaps (a cable reseated, a switch port
// reset) comes back within it, and RC retransmits what it lost meanwhile.
var portDownGrace = 10 * time.Second

// asyncError is the error of a connection failed by an asynchronous event.
type asyncError struct {
	event string
	err   error
}

func (e *asyncError) Error() string { return "device event: " + e.event }
func (e *asyncError) Unwrap() error { return e.err }

// asyncEvents applies a device's asynchronous events to the connections
// its poller dispatches to.
type asyncEvents struct {
	conns connIndex

	mu   sync.Mutex
	down *time.Timer // running while the port is down, until the grace ends
	// back is made when the port goes down and closed when it is active
	// again, or when the handling stops (the device is going away); nil
	// while the port is up.
	back    chan struct{}
	stopped bool
}

// handle acts on one event (on the goroutine that reads them).
func (a *asyncEvents) handle(ev ibv.AsyncEvent) {
	name := asyncEventString(ev.Type)
	switch ev.Type {
	case ibv.EventQPFatal, ibv.EventQPReqErr, ibv.EventQPAccessErr, ibv.EventPathMigErr:
		if c := a.conns.conn(ev.QPNum); c != nil {
			c.failAsync(&asyncError{name, syscall.ECONNRESET}, false)
		}
	case ibv.EventCQErr:
		// The shared CQ overflowed or broke: no connection of the device
		// can trust its completions any more.
		for _, c := range a.conns.all() {
			c.failAsync(&asyncError{name, syscall.EIO}, false)
		}
	case ibv.EventDeviceFatal:
		for _, c := range a.conns.all() {
			c.failAsync(&deviceError{syscall.ENODEV}, true)
		}
	case ibv.EventPortErr:
		a.mu.Lock()
		if a.back == nil && !a.stopped {
			a.back = make(chan struct{})
		}
		if a.down == nil && !a.stopped {
			a.down = time.AfterFunc(portDownGrace, a.portStayedDown)
		}
		a.mu.Unlock()
	case ibv.EventPortActive:
		a.mu.Lock()
		a.portBackLocked()
		if a.down != nil {
			a.down.Stop()
			a.down = nil
		}
		a.mu.Unlock()
	}
}

// portStayedDown fails the device's connections: its port has been down
// for portDownGrace.
func (a *asyncEvents) portStayedDown() {
	a.mu.Lock()
	fire := a.down != nil && !a.stopped
	a.down = nil
	a.mu.Unlock()
	if !fire {
		return
	}
	err := &asyncError{"port down for " + portDownGrace.String(), syscall.ENETDOWN}
	for _, c := range a.conns.all() {
		c.failAsync(err, false)
	}
}

// portBack returns, while the device's port is down, a channel closed once
// it is active again or the device goes away; nil while the port is up.
func (a *asyncEvents) portBack() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.back
}

// portBackLocked ends a port's outage for its waiters; mu is held.
func (a *asyncEvents) portBackLocked() {
	if a.back != nil {
		close(a.back)
		a.back = nil
	}
}

// stop ends the handling (the device is going away).
func (a *asyncEvents) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopped = true
	a.portBackLocked()
	if a.down != nil {
		a.down.Stop()
		a.down = nil
	}
}

// connIndex finds the connections of a device: its pollers' (a device
// has one per CQ), or a single poller's in tests.
type connIndex interface {
	conn(qpNum uint32) completer
	all() []completer
}
