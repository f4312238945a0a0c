//go:build linux && cgo

package rdma

import (
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/goverbs/rdma/internal/rdmacm"
)

// listenerSys is the rdma_cm side of a Listener.
type listenerSys struct {
	cm      *cmLoop
	handle  uintptr
	id      *rdmacm.ID
	opts    Options
	backlog int

	mu      sync.Mutex
	closed  bool
	pending map[*Conn]struct{} // accepted by us, not yet established
	wg      sync.WaitGroup     // teardowns started from the CM goroutine
}

func listen(ap netip.AddrPort, backlog int, opts Options) (*Listener, error) {
	cm, err := acquireCM()
	if err != nil {
		return nil, err
	}
	l := &Listener{
		listenerSys: listenerSys{cm: cm, opts: opts, backlog: backlog, pending: map[*Conn]struct{}{}},
		queue:       make(chan *Conn, backlog),
		closing:     make(chan struct{}),
	}
	l.handle = cm.register(l)
	fail := func(err error) (*Listener, error) {
		if l.id != nil {
			l.id.Destroy()
		}
		cm.unregister(l.handle)
		cm.release()
		return nil, err
	}
	if l.id, err = rdmacm.NewID(cm.ch, l.handle); err != nil {
		return fail(err)
	}
	if err := l.id.Bind(ap); err != nil {
		return fail(noDevice(err))
	}
	if !ap.Addr().IsUnspecified() && l.id.Verbs() == nil {
		// Bound, but to an interface without RDMA.
		return fail(&deviceError{syscall.ENODEV})
	}
	if err := l.id.Listen(backlog); err != nil {
		return fail(err)
	}
	l.addr = addrFrom(l.id.LocalAddr())
	return l, nil
}

// cmEvent runs on the CM goroutine.
func (l *Listener) cmEvent(ev rdmacm.Event) {
	if ev.Type == rdmacm.EventConnectRequest {
		l.request(ev)
	}
}

// request answers a connection request.
func (l *Listener) request(ev rdmacm.Event) {
	id := ev.ID
	peer, err := parseHello(ev.PrivateData)
	l.mu.Lock()
	refuse := err != nil || l.closed || len(l.pending)+len(l.queue) >= l.backlog
	l.mu.Unlock()
	if refuse {
		// A foreign peer (say, a perftest client) or no room: refuse it
		// and keep serving. The request was acknowledged already, so the
		// new id can be destroyed here.
		id.Reject(nil)
		id.Destroy()
		return
	}
	cm, err := acquireCM()
	if err != nil {
		id.Reject(nil)
		id.Destroy()
		return
	}
	c := newVerbsConn(cm, phaseAccepting)
	c.lst = l
	c.id = id
	c.handle = cm.register(c)
	id.SetHandle(c.handle)
	if err := c.setup(l.opts); err != nil {
		id.Reject(nil)
		l.teardownLater(c)
		return
	}
	c.start(peer)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		id.Reject(nil)
		l.teardownLater(c)
		return
	}
	l.pending[c] = struct{}{}
	l.mu.Unlock()
	if err := id.Accept(c.hello().marshal()); err != nil {
		l.failed(c)
	}
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
	if _, ok := l.pending[c]; !ok {
		return
	}
	delete(l.pending, c)
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
	l.id.Destroy()
	l.cm.unregister(l.handle)
	l.mu.Lock()
	pending := l.pending
	l.pending = map[*Conn]struct{}{}
	l.mu.Unlock()
	for c := range pending {
		l.teardownLater(c)
	}
	for {
		select {
		case c := <-l.queue:
			c.Close()
			continue
		default:
		}
		break
	}
	l.wg.Wait()
	l.cm.release()
	return nil
}
