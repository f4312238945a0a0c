package rdma

import (
	"net/netip"
	"sync"
	"unsafe"

	"github.com/goverbs/rdma/internal/rdmacm"
)

// cmHandler receives the rdma_cm events of one id. Handlers run on the
// event goroutine, one at a time. They may make system calls and take
// short locks (a listener sets a connection's resources up there), but must
// never wait for CM events or for goroutines that wait on them: in
// particular never call rdmacm.ID.Destroy on an id that may still have
// events.
type cmHandler interface {
	cmEvent(ev rdmacm.Event)
	// cmLost is called, on the event goroutine and once, when the loop
	// can read no more events (err, a *cmLostError, says why): what waits
	// for an event of the handler's id must fail instead. The same rules
	// hold as for cmEvent.
	cmLost(err error)
}

// cmLostError is the error of everything that depended on a CM event
// channel that could not be read any more.
type cmLostError struct{ err error }

func (e *cmLostError) Error() string {
	return "rdma: connection manager events lost: " + e.err.Error()
}
func (e *cmLostError) Unwrap() error { return e.err }

// eventChannel is what the loop needs of an rdma_cm event channel: the
// real one (cm_verbs.go), or the host tests' fake, which plays the
// connection manager so that the dial, accept and event sequences run
// without a device.
type eventChannel interface {
	// Run passes each event to handle until Interrupt; see
	// rdmacm.EventChannel.Run.
	Run(handle func(rdmacm.Event)) error
	Interrupt()
	Destroy()
	// Quiet runs f while no event is being processed (see
	// rdmacm.EventChannel.Quiet).
	Quiet(f func())
	// newID creates an RC id whose events carry handle; requestID is
	// the new id of a connect request.
	newID(handle uintptr) (cmID, error)
	requestID(ev rdmacm.Event) cmID
	// newUDPID creates an id of the UDP port space, for a PacketConn.
	newUDPID(handle uintptr) (udID, error)
}

// cmID is what a Conn and a Listener ask of their rdma_cm id
// (*rdmacm.ID, or the host tests' fake): the connection manager's steps,
// and the QP's life under the id.
type cmID interface {
	Bind(ap netip.AddrPort) error
	Listen(backlog int) error
	ResolveAddr(src netip.Addr, dst netip.AddrPort, timeoutMs int) error
	ResolveRoute(timeoutMs int) error
	SetAckTimeout(t uint8) error
	ConnectRead(private []byte, initiator, responder uint8) error
	AcceptRead(private []byte, initiator, responder uint8) error
	// AcceptUD answers a service ID resolution of a PacketConn's port.
	AcceptUD(qpNum uint32) error
	Reject(private []byte) error
	Disconnect() error
	ErrorQP() error
	SetHandle(h uintptr)
	CreateQP(pd, cq unsafe.Pointer, sendWR, recvWR, inline int) (unsafe.Pointer, int, error)
	AdoptQP(qp unsafe.Pointer) error
	DestroyQP() error
	ReleaseQP() error
	// Verbs is the ibv_context of the id's device, nil before it has one.
	Verbs() unsafe.Pointer
	LocalAddr() netip.AddrPort
	PeerAddr() netip.AddrPort
	Destroy() error
}

// udID is what a PacketConn asks of an id of the UDP port space: its
// own (bound, listening, answering resolutions), its multicast id's, and
// a resolution's.
type udID interface {
	Bind(ap netip.AddrPort) error
	Listen(backlog int) error
	ResolveAddr(src netip.Addr, dst netip.AddrPort, timeoutMs int) error
	ResolveRoute(timeoutMs int) error
	// ConnectUD starts the service ID resolution of the destination's
	// port; its outcome is an event.
	ConnectUD() error
	JoinMulticast(group netip.Addr) error
	PortNum() uint8
	Verbs() unsafe.Pointer
	LocalAddr() netip.AddrPort
	Destroy() error
}

// openEventChannel opens the process's event channel (cm_verbs.go; a
// build without verbs has none).
var openEventChannel = newEventChannel

// cmLoop owns the process's rdma_cm event channel and the goroutine that
// reads it. It exists while anything (a listener, a connection, a dial in
// progress) holds a reference, so an idle process has no goroutine left.
type cmLoop struct {
	ch       eventChannel
	done     chan struct{}
	stop     chan struct{}         // closed by the last release
	handlers map[uintptr]cmHandler // under cmMu
	lost     error                 // why no more events are read (see lose), under cmMu
	next     uintptr
	refs     int
	// dispatchMu is held while a handler runs, so unregister can wait out
	// an event being handled: after it returns, the handler is never
	// called again.
	dispatchMu sync.Mutex
}

var (
	cmMu  sync.Mutex
	theCM *cmLoop
)

// acquireCM returns the running loop with one more reference, starting it
// if needed.
func acquireCM() (*cmLoop, error) {
	cmMu.Lock()
	defer cmMu.Unlock()
	if theCM == nil {
		ch, err := openEventChannel()
		if err != nil {
			return nil, hostDeviceError(err)
		}
		theCM = &cmLoop{ch: ch, done: make(chan struct{}), stop: make(chan struct{}), handlers: make(map[uintptr]cmHandler)}
		go theCM.run()
	}
	theCM.refs++
	return theCM, nil
}

// release drops a reference; the last one stops the goroutine and destroys
// the channel. Every id created on it must have been destroyed.
func (l *cmLoop) release() {
	cmMu.Lock()
	l.refs--
	last := l.refs == 0
	if last && theCM == l {
		theCM = nil
	}
	cmMu.Unlock()
	if last {
		close(l.stop)
		l.ch.Interrupt()
		<-l.done
		l.ch.Destroy()
	}
}

// register returns a new handle for an id's events.
func (l *cmLoop) register(h cmHandler) uintptr {
	cmMu.Lock()
	defer cmMu.Unlock()
	l.next++
	l.handlers[l.next] = h
	return l.next
}

// unregister stops delivery to handle's handler, waiting for a delivery in
// progress. It must not be called from a handler.
func (l *cmLoop) unregister(handle uintptr) {
	l.dispatchMu.Lock()
	defer l.dispatchMu.Unlock()
	cmMu.Lock()
	delete(l.handlers, handle)
	cmMu.Unlock()
}

// run reads and dispatches events until the last release. A failed
// rdma_get_cm_event leaves its event queued in the kernel (it is taken off
// only once copied out), so the read is tried again after a pause (see
// retrier); one that keeps failing loses the loop: every handler is told
// (cmLost), and the next acquireCM starts a new loop on a new channel,
// while this one goes with its last reference.
func (l *cmLoop) run() {
	defer close(l.done)
	err := readEvents(func(ok func()) error {
		return l.ch.Run(func(ev rdmacm.Event) {
			ok()
			l.dispatch(ev)
		})
	}, l.stop)
	if err != nil {
		l.lose(&cmLostError{err})
	}
}

func (l *cmLoop) dispatch(ev rdmacm.Event) {
	handle := ev.Handle
	if ev.Type == rdmacm.EventConnectRequest {
		handle = ev.ListenHandle
	}
	l.dispatchMu.Lock()
	defer l.dispatchMu.Unlock()
	cmMu.Lock()
	h := l.handlers[handle]
	cmMu.Unlock()
	if h != nil {
		h.cmEvent(ev)
	} else if ev.Type == rdmacm.EventConnectRequest {
		// The listener is going away: refuse and drop the new id. Its
		// only event has been acknowledged, so destroying it here
		// cannot wait on this goroutine.
		id := l.ch.requestID(ev)
		id.Reject(marshalReject(RefusedShutdown))
		retryDestroy(id.Destroy)
	}
}

// lose tells every handler that no more events will come, and makes the
// next acquireCM start afresh.
func (l *cmLoop) lose(err error) {
	l.dispatchMu.Lock()
	defer l.dispatchMu.Unlock()
	cmMu.Lock()
	if theCM == l {
		theCM = nil
	}
	l.lost = err
	hs := make([]cmHandler, 0, len(l.handlers))
	for _, h := range l.handlers {
		hs = append(hs, h)
	}
	cmMu.Unlock()
	for _, h := range hs {
		h.cmLost(err)
	}
}

// lostErr is why the loop reads no more events, or nil.
func (l *cmLoop) lostErr() error {
	cmMu.Lock()
	defer cmMu.Unlock()
	return l.lost
}

// eventLost is no rdma_cm event: a connection's inbox gets it when its
// loop lost the event channel (see cmLoop.lose).
const eventLost rdmacm.EventType = -1
