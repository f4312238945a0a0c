//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// connSys is the verbs side of a Conn: what the handshake sets up and the
// teardown releases.
type connSys struct {
	cm     *cmLoop
	handle uintptr
	id     *rdmacm.ID
	dev    *device
	cqs    *cqShard // the device's CQ its QP uses
	vqp    *ibv.QP
	ar     *arena
	lay    layout
	cqe    int       // CQ entries reserved on dev
	lst    *Listener // while accepting
	// reqInit and reqResp are the RDMA READ depths a connect request
	// offered (see rdmacm.Event): an accept grants no more.
	reqInit, reqResp uint8
	cmEv             chan rdmacm.Event
	// abandoned: the dial gave up while rdma_connect was still running
	// (see connect), and the call's goroutine tears the connection down
	// when it returns. Only the dialing goroutine touches it.
	abandoned bool
	// freshQP: the dial creates its QP (an earlier try's pooled one was
	// refused as stale).
	freshQP bool
	// dialed: the connection is the active side; only a dial's QP is
	// kept and only a dial adopts one (see reusableQP).
	dialed bool
	inbox  inbox[rdmacm.Event] // see inbox.go
	// qpMu is held across a librdmacm call made off the CM goroutine that
	// moves the QP through its states (rdma_accept on the listener's
	// setup goroutine) and across the QP's destruction, which must not
	// free it under such a call.
	qpMu   sync.Mutex
	qpGone bool // under qpMu: the release has destroyed the QP; the id goes next
}

// disconnect moves the QP to the error state and tells the peer. A Conn
// built on fakes (host tests of the data path) has no id.
//
// While the device's port is down the peer is not told: the message could
// not arrive, and on Soft-RoCE (Linux 6.1) a connection manager message
// sent then can be lost without its send ever completing, after which the
// id's destroy waits for it in the kernel for good (seen as rdma_destroy_id
// hanging in cm_destroy_id after a port that stayed down). The QP still
// moves to the error state, so its work requests flush; the release's
// disconnect, or the id's destroy, tells the peer once the port is back.
func (s *connSys) disconnect() {
	if s.id == nil {
		return
	}
	if s.dev != nil && s.dev.events.portBack() != nil {
		s.id.ErrorQP()
		return
	}
	if s.id.Disconnect() != nil {
		// On iWARP rdma_disconnect first moves the QP to SQD (closing),
		// which fails for a QP that never reached RTS (a dial given up
		// during its setup), and then does nothing more: the QP's
		// receives stayed posted until its destroy flushed them into the
		// device's shared CQ, where the next QP given the same number
		// (siw hands numbers out again at once) took them for its own
		// and failed. Moved to the error state they flush now, and the
		// release's drain sees them.
		s.id.ErrorQP()
	}
}

// wasDialed reports whether the connection is the active side.
func (s *connSys) wasDialed() bool { return s.dialed }

// errorQP moves the QP to the error state, for a drain whose work
// requests did not all flush after the disconnect (see drainDroppingLock).
func (s *connSys) errorQP() {
	if s.id != nil {
		s.id.ErrorQP()
	}
}

func wcStatusString(status uint32) string { return ibv.StatusString(status) }

func asyncEventString(t ibv.AsyncEventType) string { return t.String() }

// The QPs' local ACK timeout, how long the NIC waits for an
// acknowledgement before it retransmits, is 4.096 µs × 2^t. With the 7
// retries internal/rdmacm asks for, a hardware NIC gives a send up
// 8 × 1.07 s ≈ 8.6 s after the peer last answered with t = 18: a network
// partition of 5 s is survived, a vanished peer noticed. Soft-RoCE (rxe)
// takes 7 to mean "retry forever", so there the keepalive alone bounds
// how long a silent peer is waited for, and the timeout can be short:
// rxe repairs a loss in mid-message at once (a NAK), but a lost last
// packet, NAK or retransmission only when the timer fires, so at 1 % loss
// 67 ms (t = 14) instead of rdma_cm's default of 2.1 s (t = 19) is the
// difference between a stalled and a moving transfer.
const (
	ackTimeoutHW  = 18
	ackTimeoutRXE = 14
	rxeVendorID   = 0xffffff // RXE_VENDOR_ID
	siwVendorID   = 0x626d74 // SIW_VENDOR_ID ("bmt")
)

func newVerbsConn(cm *cmLoop, ph phase) *Conn {
	c := newConn(ph)
	c.cm = cm
	c.cmEv = make(chan rdmacm.Event, 8)
	return c
}

// setup creates the data path on the id's device: device reference, arena,
// QP, and every receive posted.
func (c *Conn) setup(opts Options) error {
	verbs := c.id.Verbs()
	if verbs == nil {
		// The address resolved, but to an interface without RDMA.
		return &deviceError{syscall.ENODEV}
	}
	c.lay = newLayout(opts)
	if ibv.ContextFrom(verbs).IWARP() {
		// No immediate data: headers travel as SEND payloads.
		c.lay = c.lay.withHeaders()
	}
	c.cqe = c.lay.cqEntries()
	dev, cqs, ar, err := acquireDevice(verbs, c.cqe, c.lay, c.dialed)
	if err != nil {
		return err
	}
	c.dev, c.cqs = dev, cqs
	if ar == nil {
		if ar, err = dev.newArena(c.lay); err != nil {
			return err
		}
	}
	c.useArena(ar)
	if ar.qp != nil {
		// A pooled QP, on cqs: the id takes it as it would a new one.
		qp := ar.qp
		ar.qp, ar.qpShard = nil, nil
		if c.freshQP {
			destroyQP(qp)
		} else if err := c.id.AdoptQP(qp.Ptr()); err != nil {
			destroyQP(qp)
		} else {
			c.vqp = qp
		}
	}
	if c.vqp == nil {
		// In the arena's PD: its receive ring's rkey works for this QP only.
		qp, inline, err := c.id.CreateQP(c.ar.pd.Ptr(), cqs.cq.Ptr(), c.lay.sendQueue(), c.lay.recvSlots, 256)
		if err != nil {
			return err
		}
		c.vqp, ar.inline = ibv.QPFrom(qp), inline
	}
	inline := ar.inline
	if err := checkInline(c.lay, inline); err != nil {
		return err
	}
	c.vqp.SerialPosts = dev.serialPosts
	cqs.add(c.vqp.Num, c)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.initDataPath(c.vqp, c.ar.mem, c.lay, c.ar.base+uint64(c.lay.sendOff()), c.ar.sendMR.LKey, inline, opts, cqs); err != nil {
		return err
	}
	c.rs.arenaRx.rkey, c.rs.arenaRx.lkey = c.ar.recvMR.RKey, c.ar.recvMR.LKey
	c.w.postAside = dev.postAside
	c.postHeld = !dev.kernelPosts || forcePostHeld
	c.rs.alloc = verbsRings{ar: c.ar, dev: dev}
	return nil
}

// start records the peer's geometry once the handshake is done.
func (c *Conn) start(peer wire.Hello) {
	c.laddr = addrFrom(c.id.LocalAddr())
	c.raddr = addrFrom(c.id.PeerAddr())
	c.mu.Lock()
	c.open(peer, c.lay)
	c.mu.Unlock()
	signal(c.txReady)
}

func (c *Conn) hello() wire.Hello {
	var flags uint8
	if c.msgRead {
		flags = wire.HelloMessages
	}
	if c.lay.headers() {
		flags |= wire.HelloHeaders
	}
	return wire.Hello{Flags: flags, RecvDepth: uint16(c.lay.recvSlots - wire.CtrlDepth - wire.FinSlots), CtrlDepth: wire.CtrlDepth, BufSize: uint32(c.lay.bufSize),
		RingSize: uint32(c.lay.ring), RingAddr: c.ar.base + uint64(c.lay.recvOff()), RKey: c.ar.recvMR.RKey}
}

// dial runs the active side of the handshake.
func dial(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options) (*Conn, error) {
	fresh := false
	for attempt := 1; ; attempt++ {
		c, err := dialOnce(ctx, src, dst, opts, fresh)
		if err == nil || attempt == dialAttempts || ctx.Err() != nil {
			return c, err
		}
		if fresh = errors.As(err, new(staleConnError)); !fresh && !portTaken(err) {
			return c, err
		}
	}
}

// dialAttempts bounds the tries of a dial whose port TCP still held (see
// portTaken), or whose pooled QP was refused as stale (the next try
// creates its QP).
const dialAttempts = 3

// portTaken reports whether rdma_connect failed for want of its local
// port. On iWARP without the port mapper (iwpmd), iw_cm gives TCP the port
// rdma_cm chose, which TCP may still hold (a closed connection in
// TIME_WAIT): connect(2) then fails with EADDRNOTAVAIL, where for a port
// of its own choosing TCP would have taken another. A new id gets another
// port, so the dial tries again.
func portTaken(err error) bool {
	var se *os.SyscallError
	return errors.As(err, &se) && se.Syscall == "rdma_connect" && errors.Is(se.Err, syscall.EADDRNOTAVAIL)
}

func dialOnce(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options, freshQP bool) (*Conn, error) {
	cm, err := acquireCM()
	if err != nil {
		return nil, err
	}
	c := newVerbsConn(cm, phaseDialing)
	c.dialing = true
	c.dialed = true
	c.freshQP = freshQP
	c.handle = cm.register(c)
	if c.id, err = rdmacm.NewID(cm.ch, c.handle); err != nil {
		cm.unregister(c.handle)
		cm.release()
		return nil, err
	}
	if err := c.handshake(ctx, src, dst, opts); err != nil {
		if !c.abandoned {
			c.teardown(false)
		}
		return nil, err
	}
	c.mu.Lock()
	c.dialing = false
	removed := c.removedDialing
	c.mu.Unlock()
	if removed {
		c.releaseLater()
	}
	return c, nil
}

// handshake resolves, connects and exchanges hellos. The outcome of each
// asynchronous step (rdma_resolve_addr, rdma_resolve_route, rdma_connect)
// arrives as a CM event; a failed outcome is reported as that call's
// error, as net reports a refused non-blocking connect as connect's.
func (c *Conn) handshake(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options) error {
	ms := 5000
	if dl, ok := ctx.Deadline(); ok {
		ms = max(1, min(ms, int(time.Until(dl)/time.Millisecond)))
	}
	if err := c.id.ResolveAddr(src, dst, ms); err != nil {
		return noDeviceAddr(err)
	}
	ev, err := c.waitCM(ctx)
	if err != nil {
		return err
	}
	if ev.Type != rdmacm.EventAddrResolved {
		return noDeviceAddr(os.NewSyscallError("rdma_resolve_addr", eventErrno(ev, syscall.EHOSTUNREACH)))
	}
	if err := c.id.ResolveRoute(ms); err != nil {
		return noDevice(err)
	}
	// The id has its device once the address is resolved, and the data
	// path (memory, QP, receives) needs nothing of the route: it is set
	// up while the kernel resolves the route. (Binding the id to the
	// source address first would give it the device before the address
	// is resolved, but finding that address and binding cost about what
	// an earlier setup saves.)
	if err := c.setup(opts); err != nil {
		return err
	}
	if ev, err = c.waitCM(ctx); err != nil {
		return err
	}
	if ev.Type != rdmacm.EventRouteResolved {
		return noDevice(os.NewSyscallError("rdma_resolve_route", eventErrno(ev, syscall.EHOSTUNREACH)))
	}
	if err := c.id.SetAckTimeout(c.dev.ackTimeout); err != nil {
		return err
	}
	if err := c.connect(ctx); err != nil {
		// siw connects its TCP stream within rdma_connect: a reset of
		// its SYN comes back from the call itself, and so does a reset
		// during the MPA exchange.
		if errors.Is(err, syscall.ECONNREFUSED) {
			return os.NewSyscallError("rdma_connect", &RefusedError{RefusedNoListener})
		}
		if errors.Is(err, syscall.ECONNRESET) {
			return os.NewSyscallError("rdma_connect", handshakeAbortedError{"rdma_connect: the TCP connection was reset"})
		}
		return err
	}
	if ev, err = c.waitCM(ctx); err != nil {
		return err
	}
	switch ev.Type {
	case rdmacm.EventEstablished:
	case rdmacm.EventRejected:
		reason := parseReject(ev.PrivateData)
		if reason == RefusedUnknown {
			switch ev.Status {
			case ibRejStaleConn:
				// See reusableQP: a new QP takes another try.
				return os.NewSyscallError("rdma_connect", staleConnError{})
			case ibRejInvalidServiceID, -int(syscall.ECONNREFUSED):
				// IB's reject of an unknown service; on iWARP, where
				// the connection is TCP's, a reset of its SYN.
				reason = RefusedNoListener
			case -int(syscall.ECONNRESET):
				// iWARP: the TCP connection was reset during the MPA
				// exchange, the server's listener closing say.
				return os.NewSyscallError("rdma_connect", handshakeAbortedError{"REJECTED: the TCP connection was reset"})
			}
		}
		return os.NewSyscallError("rdma_connect", &RefusedError{reason})
	case rdmacm.EventUnreachable:
		return os.NewSyscallError("rdma_connect", &noRDMAPeerError{eventErrno(ev, syscall.EHOSTUNREACH)})
	case rdmacm.EventConnectError:
		// The server's reply came, but completing the handshake failed:
		// the server dropped the connection meanwhile (its listener
		// closed, say). librdmacm reports that with a status of -1 and
		// the errno lost on its way, which would read as EPERM.
		return os.NewSyscallError("rdma_connect", handshakeAbortedError{"CONNECT_ERROR"})
	default:
		if err := eventErrno(ev, syscall.ECONNABORTED); err != syscall.ECONNRESET {
			return os.NewSyscallError("rdma_connect", err)
		}
		return os.NewSyscallError("rdma_connect", handshakeAbortedError{ev.Type.String()})
	}
	peer, err := parseHello(ev.PrivateData)
	if err == nil {
		err = sendable(peer, c.lay.headers())
	}
	if err != nil {
		return err
	}
	c.start(peer)
	c.initiatorFirst()
	return nil
}

// ibRejStaleConn is the reject reason of a connection request from a QP
// whose number the peer's connection manager still holds as a live
// connection's (IB_CM_REJ_STALE_CONN).
const ibRejStaleConn = 10

// staleConnError is the error of a connect refused as stale.
type staleConnError struct{}

func (staleConnError) Error() string {
	return "connection refused as stale: the peer still holds the QP's number as a live connection's"
}
func (staleConnError) Unwrap() error { return syscall.ECONNREFUSED }

// ibRejInvalidServiceID is the reject reason of a connection request
// that no listener took (IB_CM_REJ_INVALID_SERVICE_ID: rdma_cm found no
// listener on the port).
const ibRejInvalidServiceID = 8

// noDevice marks the errors that mean no RDMA device serves the address
// (it resolved to an interface without RDMA, loopback say) as ErrNoDevice;
// others (an unreachable host) stay as they are.
func noDevice(err error) error {
	if errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.EADDRNOTAVAIL) {
		return &deviceError{err}
	}
	return err
}

// noDeviceAddr is noDevice for address resolution, where EINVAL means no
// device too: iWARP's rdma_cm refuses an address no iWARP device serves
// (loopback, say) that way, where RoCE's says ENODEV.
func noDeviceAddr(err error) error {
	if errors.Is(err, syscall.EINVAL) {
		return &deviceError{err}
	}
	return noDevice(err)
}

// eventErrno turns an event's status (a negative errno for most events)
// into an errno, or def when it carries none.
func eventErrno(ev rdmacm.Event, def syscall.Errno) error {
	if ev.Status == -1 {
		// librdmacm's own processing of the event failed (a query of
		// the id's addresses, say) and left -1 with the errno lost:
		// read as an errno it would say EPERM.
		return errEventLost
	}
	if ev.Status < 0 {
		return syscall.Errno(-ev.Status)
	}
	return def
}

// errEventLost is what a CM event says that librdmacm failed to process.
var errEventLost = fmt.Errorf("librdmacm could not process the event: %w", syscall.EIO)

// connect calls rdma_connect. siw connects its TCP stream inside that
// call, blocking for as long as TCP tries: about two minutes for an
// address nobody answers (the kernel's SYN retries), whatever the Dial's
// deadline. So on iWARP the call runs on a goroutine of its own, and a
// Dial whose ctx ends first returns then with ctx's error, leaving the
// connection to that goroutine, which tears it down once the call has
// returned (the id cannot go while the call uses it).
// At most maxAbandoned such calls are left running at once (each holds
// an OS thread, a QP and its registered memory until it returns); past
// that a Dial waits for its call, as it would without the goroutine.
func (c *Conn) connect(ctx context.Context) error {
	call := func() error { return c.id.ConnectRead(c.hello().Marshal(), c.dev.initDepth, c.dev.respDepth) }
	if !c.dev.iwarp {
		return call() // returns at once: the outcome comes as an event
	}
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case abandonSlots <- struct{}{}:
	default:
		<-done // too many left running: wait for this one
		return ctx.Err()
	}
	c.abandoned = true
	releasing.Add(1) // ReleaseIdleDevices and the tests wait for it
	go func() {
		defer releasing.Done()
		<-done
		c.teardown(false)
		<-abandonSlots
	}()
	return ctx.Err()
}

// maxAbandoned bounds the rdma_connect calls that dials which gave up
// leave running (see connect).
const maxAbandoned = 64

var abandonSlots = make(chan struct{}, maxAbandoned)

func (c *Conn) waitCM(ctx context.Context) (rdmacm.Event, error) {
	select {
	case ev := <-c.cmEv:
		if ev.Type == rdmacm.EventDeviceRemoval {
			markRemoved(c.id.Verbs())
			return ev, &deviceError{syscall.ENODEV}
		}
		if ev.Type == eventLost {
			return ev, c.cm.lostErr()
		}
		return ev, nil
	case <-ctx.Done():
		return rdmacm.Event{}, ctx.Err()
	}
}

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
		if ev.Type == rdmacm.EventDeviceRemoval {
			// Here, not only where the dialing goroutine reads it: a
			// dial that gave up during rdma_connect (see connect) reads
			// no more events, and the kernel waits until the device is
			// let go. Marking twice is harmless.
			markRemoved(c.id.Verbs())
		}
		select {
		case c.cmEv <- ev:
		default:
		}
	case phaseAccepting:
		switch ev.Type {
		case rdmacm.EventEstablished:
			c.mu.Lock()
			// Unless the listener evicted it meanwhile (its teardown
			// has begun).
			ok := c.life.phase == phaseAccepting
			if ok {
				c.life.phase = phaseEstablished
				c.cmUp = true
				// iWARP: not before the dialing side's first message
				// (see initiatorFirst), which the poller may have
				// taken already.
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
			markRemoved(c.id.Verbs())
			c.lst.failed(c)
		default:
			c.lst.failed(c)
		}
	case phaseEstablished, phaseDead:
		c.mu.Lock()
		awaiting := c.awaitFirst && (ev.Type == rdmacm.EventDisconnected || ev.Type == rdmacm.EventDeviceRemoval || ev.Type == eventLost)
		if awaiting {
			// Gone before its first message: never accepted (see
			// firstArrived).
			c.firstArrived(false)
		}
		c.mu.Unlock()
		if awaiting && ev.Type == rdmacm.EventDeviceRemoval {
			markRemoved(c.id.Verbs())
		}
		if awaiting {
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

// destroyQP destroys the id's QP while no CM event is being processed.
func (c *Conn) destroyQP() error {
	var err error
	c.cm.ch.Quiet(func() { err = c.id.DestroyQP() })
	return err
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
	if !c.dialed || !c.qpDrained || c.readCut || c.ar == nil || !c.dev.keepQPs || c.dev.isRemoved() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmUp && !c.cmDown {
		c.waitDroppingLock(disconnectWait, func() bool { return c.cmDown })
	}
	return c.cmDown
}

// keepQP takes the QP from the id, reset, for the arena to keep in the
// pool (which rekeys the arena: see keepArena), or destroys it when the
// reset fails.
func (c *Conn) keepQP() {
	var err error
	c.cm.ch.Quiet(func() { err = c.id.ReleaseQP() })
	if err != nil {
		destroyQP(c.vqp)
		return
	}
	c.ar.qp, c.ar.qpShard = c.vqp, c.cqs
}

// useArena makes ar the connection's arena and counts its memory in the
// device's registered bytes; dropArena, on every path from here on
// (setup's failures too, before the data path has the memory), takes the
// same count back.
func (c *Conn) useArena(ar *arena) {
	c.ar = ar
	c.dev.addRegistered(len(ar.mem))
}

// dropArena takes back what useArena counted and gives the arena to the
// device's pool (or frees it).
func (c *Conn) dropArena() {
	if c.ar == nil {
		return
	}
	c.dev.addRegistered(-len(c.ar.mem))
	c.dev.keepArena(c.ar)
}

// freeVerbs destroys the QP and the id and gives the memory, the regions
// and the device's shared objects back, in the order the device's
// removal needs (see release). The QP has been drained.
func (c *Conn) freeVerbs() {
	if c.id == nil {
		return // a Conn built on fakes (host tests) has no verbs objects
	}
	// Neither an rdma_accept in progress (qpMu) nor librdmacm's
	// processing of an event of the id (Quiet) may find the QP freed, and
	// no rdma_accept may start once it is (qpGone).
	reusable := c.vqp != nil && c.reusableQP()
	c.qpMu.Lock()
	c.qpGone = true
	if c.vqp != nil {
		if reusable {
			// Drained: nothing of it is left to complete.
			c.cqs.remove(c.vqp.Num)
			c.keepQP()
		} else {
			c.cqs.retire(c.vqp.Num)
			retryDestroy(c.destroyQP)
			c.cqs.forget(c.vqp.Num)
		}
	}
	c.qpMu.Unlock()
	// Before the arena (and its PD) may go to another connection.
	c.releaseRegions()
	c.dropArena()
	// Before the device's release: the device must stay open, its
	// asynchronous events with it, until its port is back.
	c.waitPortBack()
	if c.dev != nil {
		c.dev.release(c.cqs, c.cqe)
	}
	// Unregister first: it waits out an event being delivered, and then
	// the inbox's goroutine finishes the events it holds, which may still
	// use the id.
	c.cm.unregister(c.handle)
	c.inbox.wait()
	retryDestroy(c.id.Destroy)
	c.cm.release()
}

// portBackWait bounds how long a release waits for its device's port to
// come back before it destroys the id anyway.
const portBackWait = time.Minute

// waitPortBack waits, while the device's port is down, until it is back
// (or the device goes away, or portBackWait passes), when the connection
// manager still holds the connection as established: the id's destroy
// then sends the peer a disconnect request, which must not go while the
// port is down (see connSys.disconnect). A Close after an outage's
// ENETDOWN, as an application would do at once, otherwise sent it: on
// Soft-RoCE the device then answered no connection request after the
// outage, and the destroy could hang. It runs on the release's goroutine,
// not in Close.
func (c *Conn) waitPortBack() {
	if c.dev == nil {
		return
	}
	c.mu.Lock()
	established := c.cmUp && !c.cmDown
	c.mu.Unlock()
	back := c.dev.events.portBack()
	if !established || back == nil {
		return
	}
	t := time.NewTimer(portBackWait)
	defer t.Stop()
	select {
	case <-back:
	case <-t.C:
	}
}

// markDeviceRemoved marks the connection's device removed: nothing new
// is set up on it.
func (c *Conn) markDeviceRemoved() {
	if c.dev != nil {
		markRemoved(c.dev.ctx.Ptr())
	}
}
