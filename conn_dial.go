package rdma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

func newVerbsConn(cm *cmLoop, ph phase) *Conn {
	c := newConn(ph)
	c.born = time.Now()
	c.cm = cm
	c.cmEv = make(chan rdmacm.Event, 8)
	return c
}

// fakeDataPath, set only by host tests, builds the data path in place of
// the device's (openPath): over it and a fake connection manager (see
// eventChannel) the dial, accept and release sequences run without a
// device.
var fakeDataPath func(opts Options, comp completer) (layout, dataPath, error)

// setupSlots bounds the data paths being set up at once in the process
// (2×GOMAXPROCS as the package starts, at least 4),
// dialed and accepted alike. A setup is CPU work, most of it in the
// kernel (registering the arena, creating the QP, posting receives), so
// more at once only share the CPUs; and each holds a thread in cgo and
// returns to the run queue, where a burst of thousands queued the
// goroutine that reads the CM events behind them: a dialer that answered
// its servers' replies seconds late had those handshakes given up. A
// setup waiting for a slot is parked and costs nothing.
var setupSlots = make(chan struct{}, max(4, 2*runtime.GOMAXPROCS(0)))

// setup creates the data path on the id's device (openPath: device
// reference, arena, QP) and posts every receive, once a slot is free
// (setupSlots); stop ends the wait with stopped's error.
func (c *Conn) setup(opts Options, stop <-chan struct{}, stopped func() error) error {
	select {
	case setupSlots <- struct{}{}:
	case <-stop:
		return stopped()
	}
	defer func() { <-setupSlots }()
	var p dataPath
	var err error
	if fakeDataPath != nil {
		c.lay, p, err = fakeDataPath(opts, c)
	} else {
		p, err = c.openPath(opts, c)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.initDataPath(p.qp, p.mem, c.lay, p.sendBase, p.sendLKey, p.inline, opts, p.sp); err != nil {
		return err
	}
	c.rs.arenaRx.rkey, c.rs.arenaRx.lkey = p.recvRKey, p.recvLKey
	c.w.postAside = p.postAside
	c.postHeld = !p.kernelPosts || forcePostHeld
	c.atomics = p.atomics
	c.rs.alloc = p.rings
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

// hello is what the connection announces in its connect request or reply:
// its geometry, and where (and under which key) the peer writes into its
// receive ring, the arena's as the data path was set up over it.
func (c *Conn) hello() wire.Hello {
	var flags uint8
	if c.msgRead {
		flags = wire.HelloMessages
	}
	if c.lay.headers() {
		flags |= wire.HelloHeaders
	}
	return wire.Hello{Flags: flags, RecvDepth: uint16(c.lay.recvSlots - wire.CtrlDepth - wire.FinSlots), CtrlDepth: wire.CtrlDepth, BufSize: uint32(c.lay.bufSize),
		RingSize: uint32(c.lay.ring), RingAddr: c.rs.arenaRx.base, RKey: c.rs.arenaRx.rkey}
}

// dial runs the active side of the handshake.
func dial(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options, info *DialDoneInfo) (*Conn, error) {
	fresh := false
	var busy busyBackoff
	var refused error // the last busy refusal
	for attempt := 1; ; attempt++ {
		release, err := dialSlots.acquire(ctx, dst)
		if err != nil {
			return nil, busyUntil(ctx, refused, err)
		}
		began := time.Now()
		c, err := func() (*Conn, error) {
			defer release()
			return dialOnce(ctx, src, dst, opts, fresh, info)
		}()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, busyUntil(ctx, refused, err)
		}
		if refusedBusy(err) {
			// Not counted against dialAttempts: the listener is busy,
			// not broken, and the context bounds the tries.
			refused = err
			busy.refused(time.Since(began))
			left := time.Duration(-1)
			if dl, ok := ctx.Deadline(); ok {
				left = max(time.Until(dl), 0)
			}
			pause, fits := busy.pause(left)
			if !fits {
				return nil, err
			}
			if err := sleepCtx(ctx, pause); err != nil {
				return nil, busyUntil(ctx, refused, err)
			}
			attempt--
			continue
		}
		if attempt == dialAttempts {
			return c, err
		}
		if fresh = errors.As(err, new(staleConnError)); !fresh && !portTaken(err) {
			return c, err
		}
	}
}

// maxDialsInFlight bounds the handshakes in progress from this process to
// one address. A burst of thousands of dials at once otherwise has more
// handshakes in progress than the listener keeps (it refuses the rest as
// RefusedBusy, and each refused try costs the dialer a data path set up
// and torn down for nothing), and more CM replies arrive than the
// process answers in time. A dial waiting for its turn is parked. A turn
// is given back when the dial's try ends, or after turnHold if that comes
// first: a server that does not answer (stopped, or a host without RDMA
// whose "unreachable" takes seconds) must not hold every later dial to
// its address until their deadlines.
const (
	maxDialsInFlight = 128
	turnHold         = 2 * time.Second
)

// dialSlots holds, per address dialed, the turns of dials in progress.
var dialSlots = slotsByAddr{m: map[netip.AddrPort]*addrSlots{}}

type slotsByAddr struct {
	mu      sync.Mutex
	m       map[netip.AddrPort]*addrSlots
	holdFor time.Duration // if set, in place of turnHold (tests)
}

type addrSlots struct {
	turns chan struct{}
	users int // dials holding or waiting for a turn: the entry goes at 0
}

// acquire waits for a turn to dial dst, or for ctx to end (its error);
// release gives the turn back.
func (s *slotsByAddr) acquire(ctx context.Context, dst netip.AddrPort) (release func(), err error) {
	s.mu.Lock()
	a := s.m[dst]
	if a == nil {
		a = &addrSlots{turns: make(chan struct{}, maxDialsInFlight)}
		s.m[dst] = a
	}
	a.users++
	s.mu.Unlock()
	done := func() {
		s.mu.Lock()
		if a.users--; a.users == 0 {
			delete(s.m, dst)
		}
		s.mu.Unlock()
	}
	select {
	case a.turns <- struct{}{}:
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
	var once sync.Once
	give := func() { once.Do(func() { <-a.turns }) }
	t := time.AfterFunc(s.hold(), give)
	return func() { t.Stop(); give(); done() }, nil
}

// hold is how long a turn is held at most: turnHold, or the test's.
func (s *slotsByAddr) hold() time.Duration {
	if s.holdFor > 0 {
		return s.holdFor
	}
	return turnHold
}

// busyUntil is the error of a dial that ended with its context (err): a
// dial that the listener refused as busy until its deadline passed, in a
// pause or in the try after it, returns that refusal, as it does when it
// stops before a pause that leaves no time for another try. Which of the
// two ends a dial meets depends on how long its tries take; what it
// tells the caller (the listener is there, and busy) does not. A try
// that ended with an answer of its own (another refusal, say) as the
// deadline passed returns that answer, and a cancellation is the
// caller's own: both return as they are.
func busyUntil(ctx context.Context, refused, err error) error {
	if refused != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && errors.Is(err, context.DeadlineExceeded) {
		return refused
	}
	return err
}

// refusedBusy reports whether err is a listener's RefusedBusy.
func refusedBusy(err error) bool {
	var re *RefusedError
	return errors.As(err, &re) && re.Reason == RefusedBusy
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

func dialOnce(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options, freshQP bool, info *DialDoneInfo) (*Conn, error) {
	cm, err := acquireCM()
	if err != nil {
		return nil, err
	}
	c := newVerbsConn(cm, phaseDialing)
	c.dialing = true
	c.dialed = true
	c.freshQP = freshQP
	c.handle = cm.register(c)
	if c.id, err = cm.ch.newID(c.handle); err != nil {
		cm.unregister(c.handle)
		cm.release()
		return nil, err
	}
	if err := c.handshake(ctx, src, dst, opts, info); err != nil {
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
// info, if not nil, gets each phase's duration (the last attempt's).
func (c *Conn) handshake(ctx context.Context, src netip.Addr, dst netip.AddrPort, opts Options, info *DialDoneInfo) error {
	ph := dialPhases{info: info, mark: time.Now()}
	defer ph.connected()
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
	if err := addrResolved(ev); err != nil {
		return err
	}
	ph.resolved()
	if err := c.id.ResolveRoute(ms); err != nil {
		return noDevice(err)
	}
	// The id has its device once the address is resolved, and the data
	// path (memory, QP, receives) needs nothing of the route: it is set
	// up while the kernel resolves the route. (Binding the id to the
	// source address first would give it the device before the address
	// is resolved, but finding that address and binding cost about what
	// an earlier setup saves.)
	if err := c.setup(opts, ctx.Done(), ctx.Err); err != nil {
		return err
	}
	ph.setUp()
	if ev, err = c.waitCM(ctx); err != nil {
		return err
	}
	if err := routeResolved(ev); err != nil {
		return err
	}
	ph.routed()
	if err := c.id.SetAckTimeout(c.ackTimeout()); err != nil {
		return err
	}
	if err := c.connect(ctx); err != nil {
		return connectCallError(err)
	}
	if ev, err = c.waitCM(ctx); err != nil {
		return err
	}
	if err := connectOutcome(ev); err != nil {
		return err
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

// What the connection manager's answers to a dial mean, as errors. Each
// takes the event that ended a step (or the step's call's error) and says
// what the dial returns: nil when the step succeeded.

// addrResolved classifies the outcome of rdma_resolve_addr.
func addrResolved(ev rdmacm.Event) error {
	if ev.Type != rdmacm.EventAddrResolved {
		return noDeviceAddr(os.NewSyscallError("rdma_resolve_addr", eventErrno(ev, syscall.EHOSTUNREACH)))
	}
	return nil
}

// routeResolved classifies the outcome of rdma_resolve_route.
func routeResolved(ev rdmacm.Event) error {
	if ev.Type != rdmacm.EventRouteResolved {
		return noDevice(os.NewSyscallError("rdma_resolve_route", eventErrno(ev, syscall.EHOSTUNREACH)))
	}
	return nil
}

// connectCallError classifies rdma_connect's own failure. siw connects its
// TCP stream within rdma_connect: a reset of its SYN comes back from the
// call itself, and so does a reset during the MPA exchange.
func connectCallError(err error) error {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return os.NewSyscallError("rdma_connect", &RefusedError{RefusedNoListener})
	}
	if errors.Is(err, syscall.ECONNRESET) {
		return os.NewSyscallError("rdma_connect", handshakeAbortedError{"rdma_connect: the TCP connection was reset"})
	}
	return err
}

// connectOutcome classifies the event that answered rdma_connect.
func connectOutcome(ev rdmacm.Event) error {
	switch ev.Type {
	case rdmacm.EventEstablished:
		return nil
	case rdmacm.EventRejected:
		reason := parseReject(ev.PrivateData)
		if _, ours := wire.ParseReject(ev.PrivateData); !ours {
			// Not a listener of this package (a reason of a newer
			// version stays RefusedUnknown): what the status says.
			switch ev.Status {
			case rdmacm.RejectStaleConn:
				// See reusableQP: a new QP takes another try.
				return os.NewSyscallError("rdma_connect", staleConnError{})
			case rdmacm.RejectInvalidServiceID, -int(syscall.ECONNREFUSED):
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
}

// staleConnError is the error of a connect refused as stale.
type staleConnError struct{}

func (staleConnError) Error() string {
	return "connection refused as stale: the peer still holds the QP's number as a live connection's"
}
func (staleConnError) Unwrap() error { return syscall.ECONNREFUSED }

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
	initDepth, respDepth := c.readDepths()
	call := func() error { return c.id.ConnectRead(c.hello().Marshal(), initDepth, respDepth) }
	if !c.blockingConnect() {
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

// waitCM waits for the dial's next CM event.
func (c *Conn) waitCM(ctx context.Context) (rdmacm.Event, error) {
	select {
	case ev := <-c.cmEv:
		if ev.Type == rdmacm.EventDeviceRemoval {
			c.markIDRemoved()
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

// dialPhases times a dial's phases into a DialDoneInfo (none if nil);
// mark is when the current phase began. The route's resolution runs while
// the data path is set up, so Route includes what Setup does not overlap.
type dialPhases struct {
	info      *DialDoneInfo
	mark      time.Time
	inConnect bool
}

func (p *dialPhases) resolved() {
	if p.info != nil {
		now := time.Now()
		p.info.Resolve, p.mark = now.Sub(p.mark), now
	}
}

func (p *dialPhases) setUp() {
	if p.info != nil {
		p.info.Setup = time.Since(p.mark)
	}
}

func (p *dialPhases) routed() {
	if p.info != nil {
		now := time.Now()
		p.info.Route, p.mark, p.inConnect = now.Sub(p.mark), now, true
	}
}

// connected ends the last phase, the connection's request, however it
// ended.
func (p *dialPhases) connected() {
	if p.info != nil && p.inConnect {
		p.info.Connect = time.Since(p.mark)
	}
}
