//go:build linux && cgo

package rdma

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
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
	inbox            inbox[rdmacm.Event] // see inbox.go
	// qpMu is held across a librdmacm call made off the CM goroutine that
	// moves the QP through its states (rdma_accept on the listener's
	// setup goroutine) and across the QP's destruction, which must not
	// free it under such a call.
	qpMu   sync.Mutex
	qpGone bool // under qpMu: the release has destroyed the QP; the id goes next

	releaseOnce sync.Once // the verbs objects go once: by Close, or when the device goes
	// dialing is set while dial has not returned the connection (under
	// mu): the dialing goroutine still uses the id, so a device removal
	// meanwhile leaves the release to dial (removedDialing).
	dialing, removedDialing bool
}

// disconnect moves the QP to the error state and tells the peer. A Conn
// built on fakes (host tests of the data path) has no id.
func (s *connSys) disconnect() {
	if s.id != nil {
		s.id.Disconnect()
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
	c.cqe = c.lay.cqEntries()
	dev, cqs, err := acquireDevice(verbs, c.cqe)
	if err != nil {
		return err
	}
	c.dev, c.cqs = dev, cqs
	if c.ar, err = dev.pool.get(dev.ctx, c.lay); err != nil {
		return err
	}
	dev.addRegistered(len(c.ar.mem))
	// In the arena's PD: its receive ring's rkey works for this QP only.
	qp, inline, err := c.id.CreateQP(c.ar.pd.Ptr(), cqs.cq.Ptr(), c.lay.sendQueue(), c.lay.recvSlots, 256)
	if err != nil {
		return err
	}
	c.vqp = ibv.QPFrom(qp)
	cqs.add(c.vqp.Num, c)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.initDataPath(c.vqp, c.ar.mem, c.lay, c.ar.base+uint64(c.lay.sendOff()), c.ar.sendMR.LKey, inline, opts, cqs)
}

// start records the peer's geometry once the handshake is done.
func (c *Conn) start(peer hello) {
	c.laddr = addrFrom(c.id.LocalAddr())
	c.raddr = addrFrom(c.id.PeerAddr())
	c.mu.Lock()
	c.open(peer, c.lay)
	c.mu.Unlock()
	signal(c.txReady)
}

func (c *Conn) hello() hello {
	var flags uint8
	if c.msgRead {
		flags = helloMessages
	}
	return hello{flags: flags, recvDepth: uint16(c.lay.recvSlots - ctrlDepth - finSlots), ctrlDepth: ctrlDepth, bufSize: uint32(c.lay.bufSize),
		ringSize: uint32(c.lay.ring), ringAddr: c.ar.base + uint64(c.lay.recvOff()), rkey: c.ar.recvMR.RKey}
}

// dial runs the active side of the handshake.
func dial(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options) (*Conn, error) {
	cm, err := acquireCM()
	if err != nil {
		return nil, err
	}
	c := newVerbsConn(cm, phaseDialing)
	c.dialing = true
	c.handle = cm.register(c)
	if c.id, err = rdmacm.NewID(cm.ch, c.handle); err != nil {
		cm.unregister(c.handle)
		cm.release()
		return nil, err
	}
	if err := c.handshake(ctx, src, dst, opts); err != nil {
		c.teardown(false)
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
		return noDevice(err)
	}
	ev, err := c.waitCM(ctx)
	if err != nil {
		return err
	}
	if ev.Type != rdmacm.EventAddrResolved {
		return noDevice(os.NewSyscallError("rdma_resolve_addr", eventErrno(ev, syscall.EHOSTUNREACH)))
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
	if err := c.id.ConnectRead(c.hello().marshal(), c.dev.initDepth, c.dev.respDepth); err != nil {
		return err
	}
	if ev, err = c.waitCM(ctx); err != nil {
		return err
	}
	switch ev.Type {
	case rdmacm.EventEstablished:
	case rdmacm.EventRejected:
		reason := parseReject(ev.PrivateData)
		if reason == RefusedUnknown && ev.Status == ibRejInvalidServiceID {
			reason = RefusedNoListener
		}
		return os.NewSyscallError("rdma_connect", &RefusedError{reason})
	case rdmacm.EventUnreachable:
		return os.NewSyscallError("rdma_connect", &noRDMAPeerError{eventErrno(ev, syscall.EHOSTUNREACH)})
	case rdmacm.EventConnectError:
		// The server's reply came, but completing the handshake failed:
		// the server dropped the connection meanwhile (its listener
		// closed, say). librdmacm reports that with a status of -1 and
		// the errno lost on its way, which would read as EPERM.
		return os.NewSyscallError("rdma_connect", errHandshakeAborted)
	default:
		return os.NewSyscallError("rdma_connect", eventErrno(ev, syscall.ECONNABORTED))
	}
	peer, err := parseHello(ev.PrivateData)
	if err != nil {
		return err
	}
	c.start(peer)
	return nil
}

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

// eventErrno turns an event's status (a negative errno for most events)
// into an errno, or def when it carries none.
func eventErrno(ev rdmacm.Event, def syscall.Errno) error {
	if ev.Status < 0 {
		return syscall.Errno(-ev.Status)
	}
	return def
}

func (c *Conn) waitCM(ctx context.Context) (rdmacm.Event, error) {
	select {
	case ev := <-c.cmEv:
		if ev.Type == rdmacm.EventDeviceRemoval {
			markRemoved(c.id.Verbs())
			return ev, &deviceError{syscall.ENODEV}
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

// handleCM handles one of the connection's CM events, in order, on the
// inbox's goroutine.
func (c *Conn) handleCM(ev rdmacm.Event) {
	c.mu.Lock()
	ph := c.life.phase
	if ph == phaseDialing && ev.Type == rdmacm.EventEstablished {
		// From here on a disconnect must reach peerDisconnected even
		// before the dialing goroutine has looked at this event.
		c.life.phase = phaseEstablished
	}
	c.mu.Unlock()
	switch ph {
	case phaseDialing:
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
		// While closing too: a disconnect ends the wait for the fin's
		// acknowledgement.
		switch ev.Type {
		case rdmacm.EventDisconnected:
			c.peerDisconnected()
		case rdmacm.EventDeviceRemoval:
			c.deviceRemoved()
		}
	}
}

// peerDisconnected handles the peer's disconnect: acknowledge it (which
// moves our QP to the error state and flushes our receives) and fail
// further writes. Reads still return what already arrived.
func (c *Conn) peerDisconnected() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.life.set(shutPeerGone)
	if !c.life.has(shutQPGone) {
		c.id.Disconnect()
	}
	c.life.failWrite(syscall.ECONNRESET)
	// Reads learn of it from the flushed receives, or, with none posted,
	// from shutPeerGone itself.
	signal(c.rxReady)
	signal(c.txReady)
}

// deviceRemoved handles the removal of the connection's device (rdma
// link delete, a hot-unplugged NIC): the kernel cannot finish removing it
// while anything of it is held, and the data path would go on as if
// nothing happened (posts succeed on rxe), so the connection fails at once
// with ENODEV and gives its verbs objects back without waiting for Close.
// It runs on the CM goroutine; the release waits for completions and
// destroys the id, so it runs on a goroutine of its own.
func (c *Conn) deviceRemoved() {
	if c.dev != nil {
		markRemoved(c.dev.ctx.Ptr())
	}
	c.mu.Lock()
	c.life.fail(&deviceError{syscall.ENODEV})
	c.life.set(shutPeerGone) // nothing more will come, and no fin can go
	signal(c.rxReady)
	signal(c.txReady)
	dialing := c.dialing
	c.removedDialing = dialing
	c.mu.Unlock()
	if !dialing {
		c.releaseLater()
	}
}

// releaseLater releases the verbs objects of a connection whose device
// went away, on a goroutine of its own (it waits for completions and
// destroys the id).
func (c *Conn) releaseLater() {
	go func() {
		// Reads and Writes in progress use the registered memory: they
		// have been failed, so they leave soon.
		c.writeMu.Lock()
		c.readMu.Lock()
		c.release()
		c.readMu.Unlock()
		c.writeMu.Unlock()
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
	if c.vqp != nil && graceful && wasEstablished && !c.life.has(shutPeerGone) {
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
	c.releaseOnce.Do(c.releaseVerbs)
}

func (c *Conn) releaseVerbs() {
	c.mu.Lock()
	c.stopKeepAlive()
	c.life.phase = phaseDead
	c.id.Disconnect()
	if c.vqp != nil {
		c.drainDroppingLock()
	}
	// From here on a disconnect event must not touch the QP: destroying
	// it while rdma_disconnect moves it to the error state fails (EBUSY).
	c.life.set(shutQPGone)
	// Nothing queued can be read once the memory is gone.
	c.rx.n, c.tx.pendLen = 0, 0
	mem := c.mem
	c.mem = nil
	c.mu.Unlock()

	// Neither an rdma_accept in progress (qpMu) nor librdmacm's
	// processing of an event of the id (Quiet) may find the QP freed, and
	// no rdma_accept may start once it is (qpGone).
	c.qpMu.Lock()
	c.qpGone = true
	if c.vqp != nil {
		c.cqs.remove(c.vqp.Num)
		// The kernel refuses (EBUSY) to destroy a QP another verb is
		// using at that moment; nothing of ours should be, but a bounded
		// retry beats leaking the QP and, with it, the device.
		for i := 0; !c.destroyQP() && i < 100; i++ {
			time.Sleep(time.Millisecond)
		}
	}
	c.qpMu.Unlock()
	// Before the arena (and its PD) may go to another connection.
	c.releaseRegions()
	if c.ar != nil {
		c.dev.addRegistered(-len(mem))
		c.dev.pool.put(c.ar)
	}
	if c.dev != nil {
		c.dev.release(c.cqs, c.cqe)
	}
	// Unregister first: it waits out an event being delivered, and then
	// the inbox's goroutine finishes the events it holds, which may still
	// use the id.
	c.cm.unregister(c.handle)
	c.inbox.wait()
	c.id.Destroy()
	c.cm.release()
}

// destroyQP destroys the QP while no CM event is being processed, and
// reports whether it is gone.
func (c *Conn) destroyQP() bool {
	var err error
	c.cm.ch.Quiet(func() { err = c.id.DestroyQP() })
	return err == nil
}
