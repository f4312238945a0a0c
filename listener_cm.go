package rdma

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// The rdma_cm side of a Listener: the listening id, the connection
// requests it answers, the connections it sets up and accepts until they
// are established, and its close. It runs over the cmID and connSys steps,
// so the host tests drive it over a fake connection manager.

// listenerSys is the rdma_cm side of a Listener.
type listenerSys struct {
	cm       *cmLoop
	handle   uintptr
	id       cmID
	opts     Options
	backlog  int
	halfOpen int            // the most connections accepted by us and not yet established
	verbs    unsafe.Pointer // the device's context it is bound to (none for a wildcard)
	idOnce   sync.Once      // the id goes once: by Close, or when the device goes

	mu        sync.Mutex
	closed    bool
	pending   map[*Conn]time.Time // accepted by us, not yet established: since when
	progress  handshakes          // when handshakes last completed, for telling a stale one
	settingUp int                 // requests whose connection is being set up
	wg        sync.WaitGroup      // setups and teardowns started from the CM goroutine
	refusals  handoff             // refusals decided on the CM goroutine, made off it
}

func listen(ap netip.AddrPort, backlog int, opts Options, onRefuse func(net.Addr, error), obs *observer) (*Listener, error) {
	cm, err := acquireCM()
	if err != nil {
		return nil, err
	}
	l := &Listener{
		listenerSys: listenerSys{cm: cm, opts: opts, backlog: backlog, halfOpen: halfOpenLimit(opts, backlog), pending: map[*Conn]time.Time{},
			refusals: handoff{limit: maxQueuedRefusals}},
		onRefuse: onRefuse,
		obs:      obs,
		queue:    make(chan *Conn, backlog),
		closing:  make(chan struct{}),
		gone:     make(chan struct{}),
	}
	l.handle = cm.register(l)
	fail := func(err error) (*Listener, error) {
		if l.id != nil {
			l.destroyID()
		}
		cm.unregister(l.handle)
		cm.release()
		return nil, err
	}
	if l.id, err = cm.ch.newID(l.handle); err != nil {
		return fail(err)
	}
	if err := l.id.Bind(ap); err != nil {
		return fail(noDevice(err))
	}
	if !ap.Addr().IsUnspecified() && l.id.Verbs() == nil {
		// Bound, but to an interface without RDMA.
		return fail(&deviceError{syscall.ENODEV})
	}
	l.mu.Lock()
	l.verbs = l.id.Verbs()
	l.mu.Unlock()
	if l.verbs != nil {
		addListener(l.verbs, 1)
	}
	// The address is known once bound, and must be set before requests
	// come in: their refusals name it.
	l.addr = addrFrom(l.id.LocalAddr())
	if err := l.id.Listen(backlog); err != nil {
		return fail(err)
	}
	return l, nil
}

// cmEvent runs on the CM goroutine.
func (l *Listener) cmEvent(ev rdmacm.Event) {
	switch ev.Type {
	case rdmacm.EventConnectRequest:
		l.request(ev)
	case rdmacm.EventDeviceRemoval:
		l.deviceRemoved()
	}
}

// deviceRemoved handles the removal of the device the listener is bound
// to: Accept fails with ErrNoDevice, and the id goes at once (off the CM
// goroutine), since the kernel cannot finish removing the device while it
// exists. Connections keep going until their own removal events.
func (l *Listener) deviceRemoved() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.err != nil {
		return
	}
	l.err = &deviceError{syscall.ENODEV}
	close(l.gone)
	markRemoved(l.verbs)
	l.wg.Add(1)
	go func(err error) {
		defer l.wg.Done()
		l.destroyID()
		// Here, not on the CM goroutine, which every connection's
		// events wait for.
		l.obs.deviceRemoved(DeviceRemovedInfo{Local: l.addr, Err: err})
	}(l.err)
}

// cmLost runs on the CM goroutine when it can read no more events: no
// request can reach the listener any more, so Accept fails with err, and
// the id goes (off the CM goroutine) as it does when the device goes.
// Connections being accepted are told by their own cmLost.
func (l *Listener) cmLost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.err != nil {
		return
	}
	l.err = err
	close(l.gone)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.destroyID()
		if l.obs != nil {
			l.obs.logf(slog.LevelError, "rdma: the connection manager's events are lost: the listener accepts no more",
				slog.String("local", l.addr.String()), slog.Any("error", err))
		}
	}()
}

// destroyID destroys the listening id, once.
func (l *Listener) destroyID() {
	l.idOnce.Do(func() {
		retryDestroy(l.id.Destroy)
		if l.verbs != nil {
			addListener(l.verbs, -1)
		}
	})
}

// request answers a connection request.
func (l *Listener) request(ev rdmacm.Event) {
	id := l.cm.ch.requestID(ev)
	// A refusal says why, in the reject's private data, and is counted
	// and reported. It is decided here and made on the listener's
	// handoff goroutine: the Refused hook is the application's code, and
	// rdma_reject and rdma_destroy_id are system calls, and here a flood
	// of bad requests, or a slow hook, would hold up every connection
	// request and event of the process. Events are acknowledged before
	// they are dispatched, so the new id's destroy, wherever it runs,
	// waits for nothing of this goroutine (an event of the id that comes
	// meanwhile goes to the listener's handler, as during a setup); Close
	// waits for the handoff before the CM goes.
	remote := addrFrom(id.PeerAddr())
	// It is counted before the reject goes out, so that a dialer that
	// has seen its refusal finds it in the listener's Stats.
	refuse := func(reason RefuseReason, cause error) {
		l.refusals.do(func() {
			l.refused(remote, reason, cause)
			id.Reject(marshalReject(reason))
			retryDestroy(id.Destroy)
		})
	}
	peer, err := parseHello(ev.PrivateData)
	if err != nil {
		// A foreign peer (say, a perftest client): refuse it and keep
		// serving.
		refuse(RefusedProtocol, err)
		return
	}
	if reason := l.admit(); reason != RefusedUnknown {
		refuse(reason, nil)
		return
	}
	cm, err := acquireCM()
	if err != nil {
		refuse(RefusedResources, err)
		return
	}
	c := newVerbsConn(cm, phaseAccepting)
	c.lst = l
	c.obs = l.obs
	c.id = id
	c.reqInit, c.reqResp = ev.Initiator, ev.Responder
	c.handle = cm.register(c)
	id.SetHandle(c.handle)
	// The connection's memory, QP and receives are set up on a goroutine
	// of its own: that takes milliseconds (more when the memory is not
	// pooled yet), and on this goroutine it would serialize every dialer
	// of the process behind it. Until then the new id has no event of its
	// own to deliver but a failure, which finds it not pending and is
	// left to the failing accept.
	l.mu.Lock()
	l.settingUp++
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		l.accept(c, peer, remote)
	}()
}

// accept sets up the data path of a requested connection and accepts it,
// or refuses it with the reason its setup failed.
func (l *Listener) accept(c *Conn, peer wire.Hello, remote *Addr) {
	// From here on the connection's teardown destroys the id.
	refuse := func(reason RefuseReason, cause error) {
		l.refused(remote, reason, cause)
		c.id.Reject(marshalReject(reason))
		c.teardown(false)
	}
	err := c.setup(l.opts, l.closing, func() error { return net.ErrClosed })
	if err == nil {
		// A peer of another transport (it wants immediate data, which
		// this device cannot send) is refused as one of another protocol.
		err = sendable(peer, c.lay.headers())
	}
	if err == nil {
		c.start(peer)
	}
	l.mu.Lock()
	l.settingUp--
	closed := l.closed
	if err == nil && !closed {
		l.pending[c] = time.Now()
	}
	l.mu.Unlock()
	switch {
	case closed && (err == nil || errors.Is(err, net.ErrClosed)):
		// Closed before the setup or during its wait for a slot.
		refuse(RefusedShutdown, nil)
		return
	case err != nil:
		refuse(refuseReasonOf(err), err)
		return
	}
	// rdma_accept moves the QP to RTR and RTS: a teardown started
	// meanwhile (Listener.Close, an eviction) waits for it, and once the
	// teardown has the QP the id is not touched here any more.
	c.qpMu.Lock()
	if c.qpGone {
		c.qpMu.Unlock()
		return
	}
	err = c.id.SetAckTimeout(c.ackTimeout())
	if err == nil {
		initDepth, respDepth := c.readDepths()
		err = c.id.AcceptRead(c.hello().Marshal(), min(initDepth, c.reqInit), min(respDepth, c.reqResp))
	}
	c.qpMu.Unlock()
	if err != nil {
		l.failed(c)
	}
}

// admit decides whether a request may be set up: RefusedUnknown if so,
// else why not.
func (l *Listener) admit() RefuseReason {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	switch {
	case l.closed:
		return RefusedShutdown
	case len(l.queue) >= l.backlog:
		return RefusedBacklog
	case l.settingUp+len(l.pending)+len(l.queue) >= l.backlog && !l.evictStale(now):
		// Half-open connections may fill the backlog (they are bounded
		// by memory, which small rings make plentiful): a stale one
		// makes room as it does below. Until then the room may yet
		// come free: the dialer is told to try again.
		return RefusedBusy
	case l.settingUp+len(l.pending) >= l.halfOpen && !l.evictStale(now):
		return RefusedBusy
	}
	return RefusedUnknown
}

// handshakes records the listener's completed handshakes: when the last
// one completed, the latest accept among those completed, and how long
// they have been taking (a moving average over about the last eight).
type handshakes struct {
	doneAt, doneStarted time.Time
	typical             time.Duration
}

// done records a handshake accepted at started that completed at now.
func (h *handshakes) done(started, now time.Time) {
	h.doneAt = now
	if started.After(h.doneStarted) {
		h.doneStarted = started
	}
	if took := now.Sub(started); h.typical == 0 {
		h.typical = took
	} else {
		h.typical += (took - h.typical) / 8
	}
}

// quiet is how long no handshake may complete before the half-open ones
// are taken for a flood's: halfOpenGrace, or four times the typical
// handshake if that is longer (at most halfOpenStale). A dialer that
// sets up thousands of connections at once answers none of its servers'
// replies for seconds at a time, and its handshakes take that long.
func (h *handshakes) quiet() time.Duration {
	return min(max(halfOpenGrace, 4*h.typical), halfOpenStale)
}

// stale reports whether a half-open connection accepted at started is not
// coming, at now: older than halfOpenStale; or older than halfOpenGrace
// and either no handshake completed for quiet() (the listener makes no
// progress: a flood holds it) or one accepted halfOpenGrace after it has
// completed (its dialer, which answers in order, passed it by). Age alone
// would not do: in a burst of dials on a slow host, a handshake waits
// seconds for its dialer to answer, and evicting it fails a dial that was
// coming.
func (h *handshakes) stale(started, now time.Time) bool {
	age := now.Sub(started)
	switch {
	case age > halfOpenStale:
		return true
	case age <= halfOpenGrace:
		return false
	}
	return now.Sub(h.doneAt) > h.quiet() || h.doneStarted.Sub(started) > halfOpenGrace
}

// evictStale drops the oldest half-open connection if it is stale, and
// reports whether it did; l.mu is held.
func (l *Listener) evictStale(now time.Time) bool {
	var oldest *Conn
	for c, t := range l.pending {
		if oldest == nil || t.Before(l.pending[oldest]) {
			oldest = c
		}
	}
	if oldest == nil || !l.progress.stale(l.pending[oldest], now) {
		return false
	}
	delete(l.pending, oldest)
	l.teardownLater(oldest)
	l.count(func(s *ListenerStats) { s.Evicted++ })
	return true
}

// halfOpenNow is how many handshakes are in progress.
func (l *Listener) halfOpenNow() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.settingUp + len(l.pending)
}

// teardownLater tears c down off the CM goroutine: the teardown waits for
// completions and destroys the id, neither of which may block event
// delivery.
func (l *Listener) teardownLater(c *Conn) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		c.teardown(false)
	}()
}

// established queues a connection whose handshake completed.
func (l *Listener) established(c *Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	since, ok := l.pending[c]
	if !ok {
		return
	}
	delete(l.pending, c)
	l.progress.done(since, time.Now())
	// Counted first: once queued, the connection may be accepted and
	// used, and its dialer may look at the listener's Stats.
	l.count(func(s *ListenerStats) { s.Accepted++ })
	l.queue <- c // room is reserved: pending+queued never exceed the backlog
}

// failed drops a connection whose handshake failed. The teardown starts
// under l.mu so that Close, which waits for teardowns, sees it.
func (l *Listener) failed(c *Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.pending[c]; ok {
		delete(l.pending, c)
		l.teardownLater(c)
	}
}

// close stops listening and tears down what was not accepted.
func (l *Listener) close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return net.ErrClosed
	}
	l.closed = true
	close(l.closing)
	l.mu.Unlock()

	// After unregister no request is being answered, so every teardown
	// started for one has been added to wg.
	l.destroyID()
	l.cm.unregister(l.handle)
	l.mu.Lock()
	pending := l.pending
	l.pending = map[*Conn]time.Time{}
	l.mu.Unlock()
	for c := range pending {
		l.teardownLater(c)
	}
	var queued []*Conn
	for {
		select {
		case c := <-l.queue:
			queued = append(queued, c)
			continue
		default:
		}
		break
	}
	abortConns(queued)
	l.wg.Wait()
	// Every refusal was handed over before unregister returned; their
	// ids must be gone before the CM's channel may go.
	l.refusals.wait()
	l.cm.release()
	return nil
}
