package rdma

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// Connection requests arrive on the CM goroutine, which decides at once
// on those it refuses (no handshake of this package's, a full backlog)
// and hands the refusal to the listener's handoff goroutine; each of the
// others is given its resources and accepted on a setup goroutine of its
// own, and queued for Accept once established (listener_cm.go).

// Listener is an RDMA network listener; it implements net.Listener. Listen
// and ListenConfig.Listen return one. It refuses dialers that do not speak
// this package's protocol, and those it has no room for, with a reason the
// dialer's error carries (see RefusedError).
type Listener struct {
	listenerSys // the rdma_cm side (listener_cm.go)

	addr      *Addr
	queue     chan *Conn // established, waiting for Accept
	closing   chan struct{}
	gone      chan struct{} // closed when the listener can take no more (err says why)
	err       error
	keepAlive net.KeepAliveConfig // for accepted connections
	onRefuse  func(net.Addr, error)
	obs       *observer // ListenConfig.Tracer and Logger, for the listener and its connections; nil for none

	// The TCP side of a listener with ListenConfig.FallbackTCP (see
	// fallback.go); tcpOnly when no RDMA device serves its address.
	tcp       net.Listener
	tcpQueue  chan net.Conn
	tcpDone   chan struct{} // closed when the TCP accept goroutine returns
	tcpFailed chan struct{} // closed when the TCP side failed for good (tcpErr)
	tcpErr    error
	tcpOnly   bool
	tcpMu     sync.Mutex
	tcpClosed bool // a TCP-only listener was closed

	statsMu sync.Mutex
	st      ListenerStats
}

func (l *Listener) count(f func(*ListenerStats)) {
	l.statsMu.Lock()
	f(&l.st)
	l.statsMu.Unlock()
}

// refused counts a refused request and reports it to the Refused hook.
func (l *Listener) refused(remote *Addr, reason RefuseReason, cause error) {
	l.count(func(s *ListenerStats) { s.Refused[reason]++ })
	if l.onRefuse == nil && l.obs == nil {
		return
	}
	err := error(&RefusedError{Reason: reason})
	if cause != nil {
		err = &refusedCause{RefusedError{reason}, cause}
	}
	opErr := &net.OpError{Op: "accept", Net: "rdma", Source: l.addr, Addr: remote, Err: err}
	if l.onRefuse != nil {
		l.onRefuse(remote, opErr)
	}
	l.obs.refused(remote, opErr)
}

func (l *Listener) ok() bool { return l != nil && l.closing != nil }

// Accept waits for and returns the next established connection: a *Conn,
// or, on a listener with ListenConfig.FallbackTCP, a *net.TCPConn for a
// dialer that came over TCP. Once the listener's RDMA device is gone, it
// returns an error wrapping ErrNoDevice (and the listener stops
// listening: Close it).
func (l *Listener) Accept() (net.Conn, error) {
	if !l.ok() {
		return nil, &net.OpError{Op: "accept", Net: "rdma", Err: syscall.EINVAL}
	}
	select {
	case c := <-l.queue:
		c.mu.Lock()
		c.setKeepAlive(l.keepAlive)
		c.handed = true
		c.mu.Unlock()
		return c, nil
	case c := <-l.tcpQueue:
		return c, nil
	case <-l.tcpFailed:
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: l.tcpErr}
	case <-l.closing:
		return nil, &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: net.ErrClosed}
	case <-l.gone:
		return nil, &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: l.err}
	}
}

// Close stops listening, closes established connections not yet accepted,
// and unblocks Accept, which returns an error wrapping net.ErrClosed. As a
// TCP listener resets the connections left in its queue, those are closed
// without a linger (their peers' Reads fail with ECONNRESET), so Close
// does not wait on dialers that vanished; their QPs and registered memory
// are released right after, in the background, as after Conn.Close.
func (l *Listener) Close() error {
	if !l.ok() {
		return &net.OpError{Op: "close", Net: "rdma", Err: syscall.EINVAL}
	}
	var err error
	if l.tcpOnly {
		err = l.closeTCPOnly()
	} else {
		err = l.close()
	}
	l.closeTCP()
	if err != nil {
		return &net.OpError{Op: "close", Net: "rdma", Addr: l.Addr(), Err: err}
	}
	return nil
}

// Addr returns the listener's address, an *Addr with the real port; a
// listener whose FallbackTCP found no RDMA device for its address returns
// its TCP address.
func (l *Listener) Addr() net.Addr {
	if !l.ok() {
		return nil
	}
	if l.tcpOnly {
		return l.tcp.Addr()
	}
	return l.addr
}

// Half-open connections (accepted by us, the dialer's confirmation not yet
// in) hold a whole connection's registered memory and QP, because the
// dialer may send as soon as it is established. A dialer that sends the
// request and goes silent (a flood of them, say) would otherwise pin that
// memory until the CM gives up, minutes later, and fill the backlog.
// So at most halfOpenMemory of them are kept, or minHalfOpen connections'
// worth if that is more (never more than the backlog: a burst of dials,
// an HTTP client opening 20 connections at once, must fit while their
// setups run); a request that finds
// them all taken evicts the oldest one if it is stale (see handshakes.stale:
// a handshake that is not coming), and is refused as RefusedBusy
// otherwise, which its dialer tries again.
const (
	halfOpenMemory = 32 << 20
	minHalfOpen    = 32
	halfOpenGrace  = time.Second
	halfOpenStale  = 30 * time.Second
)

// halfOpenLimit is how many half-open connections a listener with these
// options and backlog keeps.
func halfOpenLimit(opts Options, backlog int) int {
	return min(backlog, max(minHalfOpen, halfOpenMemory/newLayout(opts).size()))
}

// maxQueuedRefusals bounds the refusals a listener's handoff holds: each
// holds a new id (kernel memory) until refused. Past it a flood of bad
// requests is refused on the CM goroutine, as every refusal once was
// (ListenConfig.Refused's doc quotes it).
const maxQueuedRefusals = 256
