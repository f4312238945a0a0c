//go:build linux && cgo

package rdma

import (
	"sync"
	"unsafe"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
)

// device holds what all connections on one ibv_context share: a protection
// domain, one completion queue with its completion channel, and the poller
// that drains the queue and hands completions to connections. It exists
// while connections use it.
type device struct {
	*poller
	ctx *ibv.Context
	pd  *ibv.PD
	ch  *ibv.CompChannel
	cq  *ibv.CQ

	async     *ibv.AsyncChannel // the context's asynchronous events
	events    asyncEvents       // what they do to connections
	asyncDone chan struct{}     // closed when the reader returns

	ackTimeout uint8 // for its QPs (see ackTimeoutHW)
	maxCQE     int   // the most entries its CQ may have

	reserved   int // CQ entries promised to connections, under devMu
	refs       int // under devMu
	registered int // bytes connections registered, under devMu
}

var (
	devMu   sync.Mutex
	devices = map[unsafe.Pointer]*device{}
	// listeners counts the listeners bound to each device's context (a
	// wildcard listener is bound to none); removed holds the contexts
	// whose device went away, until this process holds nothing of them.
	listeners  = map[unsafe.Pointer]int{}
	removed    = map[unsafe.Pointer]bool{}
	destroying = map[unsafe.Pointer]int{} // devices out of the map, objects not yet destroyed
)

// initialCQE is the first size of a device's CQ; it grows as connections
// are added.
const initialCQE = 8192

// acquireDevice returns the device for an ibv_context with one more
// reference and cqe more CQ entries reserved, setting it up on first use.
func acquireDevice(verbs unsafe.Pointer, cqe int) (*device, error) {
	devMu.Lock()
	d := devices[verbs]
	if d == nil {
		var err error
		if d, err = newDevice(ibv.ContextFrom(verbs)); err != nil {
			devMu.Unlock()
			return nil, err
		}
		devices[verbs] = d
	}
	err := d.reserve(cqe)
	if err == nil {
		d.refs++
		devMu.Unlock()
		return d, nil
	}
	if d.refs > 0 {
		devMu.Unlock()
		return nil, err
	}
	// A device set up for this connection alone goes again.
	d.retireUnlocking()
	return nil, err
}

// reserve promises cqe more entries of the shared CQ, growing it (to
// twice its size, but never past the device's max_cqe) when they do not
// fit; devMu is held.
func (d *device) reserve(cqe int) error {
	need := d.reserved + cqe
	if need > d.maxCQE {
		return &cqLimitError{need: need, max: d.maxCQE, perConn: cqe, conns: d.refs}
	}
	if need > d.cq.Cap {
		d.cqMu.Lock()
		err := d.cq.Resize(min(max(need, 2*d.cq.Cap), d.maxCQE))
		d.cqMu.Unlock()
		if err != nil {
			return err
		}
	}
	d.reserved = need
	return nil
}

func newDevice(ctx *ibv.Context) (*device, error) {
	pd, err := ctx.AllocPD()
	if err != nil {
		return nil, err
	}
	ch, err := ctx.CreateCompChannel()
	if err != nil {
		pd.Dealloc()
		return nil, err
	}
	cq, err := ctx.CreateCQ(initialCQE, ch)
	if err != nil {
		ch.Interrupt()
		ch.Destroy()
		pd.Dealloc()
		return nil, err
	}
	async, err := ctx.OpenAsync()
	if err != nil {
		cq.Destroy()
		ch.Interrupt()
		ch.Destroy()
		pd.Dealloc()
		return nil, err
	}
	d := &device{poller: newPoller(cq, ch), ctx: ctx, pd: pd, ch: ch, cq: cq, ackTimeout: ackTimeoutHW,
		async: async, asyncDone: make(chan struct{})}
	d.events.p = d.poller
	go func() {
		defer close(d.asyncDone)
		async.Run(d.events.handle)
	}()
	d.maxCQE = max(initialCQE, cq.Cap)
	if a, err := ctx.Query(); err == nil {
		if a.VendorID == rxeVendorID {
			d.ackTimeout = ackTimeoutRXE
		}
		d.maxCQE = max(a.MaxCQE, cq.Cap)
	}
	go d.run()
	return d, nil
}

// release returns cqe reserved entries and a reference; the last reference
// stops the poller and destroys the device's objects.
func (d *device) release(cqe int) {
	devMu.Lock()
	d.reserved -= cqe
	d.refs--
	if d.refs != 0 {
		devMu.Unlock()
		return
	}
	d.retireUnlocking()
}

// retireUnlocking takes a device nobody uses out of the map and destroys
// it; it is entered with devMu held and releases it. The destruction runs
// without devMu: it waits for the asynchronous events' reader, which may be
// failing connections (markRemoved takes devMu); meanwhile the context
// counts as in use (destroying), so a removed device is forgotten only
// once its objects are gone.
func (d *device) retireUnlocking() {
	verbs := d.ctx.Ptr()
	delete(devices, verbs)
	destroying[verbs]++
	devMu.Unlock()
	d.destroy()
	devMu.Lock()
	if destroying[verbs]--; destroying[verbs] == 0 {
		delete(destroying, verbs)
	}
	forgetRemovedLocked(verbs)
	devMu.Unlock()
}

// addListener counts a listener bound to a device's context (n = 1), or
// one that let it go (n = -1).
func addListener(verbs unsafe.Pointer, n int) {
	devMu.Lock()
	defer devMu.Unlock()
	listeners[verbs] += n
	if listeners[verbs] == 0 {
		delete(listeners, verbs)
		forgetRemovedLocked(verbs)
	}
}

// markRemoved records that the device of a context went away (rdma_cm
// said so); what holds it is being released.
func markRemoved(verbs unsafe.Pointer) {
	if verbs == nil {
		return
	}
	devMu.Lock()
	defer devMu.Unlock()
	removed[verbs] = true
	forgetRemovedLocked(verbs)
}

// forgetRemovedLocked lets the kernel finish removing a device once this
// process holds nothing of it: no connection (the device's PD, CQ and
// channel are gone with the last one) and no listener bound to it. The
// kernel waits until every file of the device is closed, and the context
// (its command and event descriptors) belongs to librdmacm, which closes
// it after a rescan has found the device missing, when no id uses it any
// more; but not when no device is left at all: then its files are
// released here (ibv.Context.ReleaseFiles). devMu is held.
func forgetRemovedLocked(verbs unsafe.Pointer) {
	if verbs == nil || !removed[verbs] || devices[verbs] != nil || destroying[verbs] > 0 || listeners[verbs] > 0 {
		return
	}
	delete(removed, verbs)
	if n, err := rdmacm.Rescan(); err != nil || n == 0 {
		ibv.ContextFrom(verbs).ReleaseFiles()
	}
}

// addRegistered counts memory a connection registered (or, negative,
// released).
func (d *device) addRegistered(n int) {
	devMu.Lock()
	d.registered += n
	devMu.Unlock()
}

func devicesStats() []DeviceStats {
	devMu.Lock()
	defer devMu.Unlock()
	var s []DeviceStats
	for _, d := range devices {
		s = append(s, DeviceStats{Name: d.ctx.Name(), Connections: d.refs, CQEntries: d.cq.Cap, RegisteredBytes: d.registered})
	}
	return s
}

func (d *device) destroy() {
	// The reader goes first: its descriptor (a duplicate of the
	// context's) would keep the device's file open.
	d.async.Interrupt()
	<-d.asyncDone
	d.events.stop()
	d.shutdown(d.ch.Interrupt)
	d.cq.Destroy()
	d.ch.Destroy()
	d.pd.Dealloc()
}
