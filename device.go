//go:build linux && cgo

package rdma

import (
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
)

// device holds what all connections on one ibv_context share: a protection
// domain, completion queues (each with its completion channel and the
// poller that drains it and hands completions to connections: see
// cqplace.go), and the registered memory of closed connections kept for
// the next ones. It exists
// while connections use it, and lingers for deviceLinger after the last
// one: setting it up (a CQ of thousands of entries, a goroutine) and
// registering a connection's memory take most of a Dial's time, and a
// client that dials, asks and hangs up, or a server that serves such
// clients, would otherwise pay for them on every connection.
type device struct {
	ctx *ibv.Context
	cqs []*cqShard // under devMu; only ever appended to while the device lives
	// ring is the CQs' pollers, which each poller goroutine polls in
	// turn (see cqRing).
	ring cqRing

	async     *ibv.AsyncChannel // the context's asynchronous events
	events    asyncEvents       // what they do to connections
	asyncDone chan struct{}     // closed when the reader returns
	asyncStop chan struct{}     // closed when the device goes: the reader stops

	// detached: the device's events were lost (see lose); it serves its
	// connections until they go, but no new one, and is out of the map.
	// Under devMu.
	detached bool

	ackTimeout uint8 // for its QPs (see ackTimeoutHW)
	maxCQE     int   // the most entries a CQ may have
	// initDepth and respDepth are the RDMA READs a QP issues and serves
	// at once (see readDepth).
	initDepth, respDepth uint8
	// atomics: what it offers of remote atomics.
	atomics atomicCaps
	// iwarp: the transport has no immediate data (headers go as SEND
	// payloads, see layout.withHeaders), and an RDMA READ's response is a
	// tagged write into the reader's memory, which must allow remote
	// writes.
	iwarp bool
	// noResize: the device cannot resize a CQ (known for siw, else
	// found on the first try); under devMu.
	noResize bool
	// serialPosts: its QPs' posts take turns (see ibv.QP.SerialPosts).
	serialPosts bool
	// postAside: the poller steps aside while a connection posts (see
	// waiter.postAside).
	postAside bool
	// kernelPosts: a post is a system call that does the transfer (the
	// software providers, rxe and siw), so a connection posts with its
	// lock dropped. A NIC's post is a few stores to its doorbell, shorter
	// than dropping and taking the lock again: there sends are posted
	// with the lock held (Conn.postHeld).
	kernelPosts bool

	refs int // under devMu
	// registered is the bytes connections registered, and those whose
	// deregistration failed; atomic, so that an arena freed with devMu
	// held can count what it leaves registered (see keepArena).
	registered atomic.Int64
	idle       *time.Timer // while it lingers with no reference, under devMu

	// pool keeps closed connections' arenas and QPs (see pool.go); keepQPs
	// says whether this device's QPs may be kept (not on iWARP, see
	// newDevice).
	pool    readyPool[*arena]
	keepQPs bool
	// rings keeps the mappings of closed connections' big rings (see
	// ringMaps), within the pool's byte bound.
	rings ringMaps
}

// deviceLinger is how long a device stays set up after its last
// connection is gone. Short enough that a process that stops using RDMA
// gives everything back at once for any practical purpose (and goleak's
// default patience covers it); long enough for dial-and-hang-up loops.
var deviceLinger = 500 * time.Millisecond

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

// cqShard is one of a device's completion queues and what drains it.
type cqShard struct {
	*poller
	ch       *ibv.CompChannel
	cq       *ibv.CQ
	reserved int // entries promised to its connections, under devMu
}

// initialCQE is the first size of a CQ; it grows as connections are
// added.
const initialCQE = 8192

// acquireDevice returns the device for an ibv_context with one more
// reference, the CQ on which cqe entries were reserved for the
// connection, and, if the pool has one, an arena laid out as lay, setting
// the device or a CQ up on first use. For a dial (dialed), a pooled arena
// comes with its reset QP when the QP was made for lay and its CQ has
// room: the CQ returned is then the QP's. An accept gets memory only.
func acquireDevice(verbs unsafe.Pointer, cqe int, lay layout, dialed bool) (*device, *cqShard, *arena, error) {
	devMu.Lock()
	d := devices[verbs]
	if d == nil {
		var err error
		if d, err = newDevice(ibv.ContextFrom(verbs)); err != nil {
			devMu.Unlock()
			return nil, nil, nil, err
		}
		devices[verbs] = d
	} else if d.idle != nil {
		d.idle.Stop()
		d.idle = nil
	}
	var a *arena
	var qpFits bool
	if dialed {
		a, qpFits, _ = d.pool.take(arenaKey(lay))
	} else {
		a, _ = d.pool.takeMemory(arenaKey(lay))
	}
	var stale *ibv.QP // a pooled QP not to be used: destroyed without devMu
	var s *cqShard
	if a != nil && a.qp != nil {
		if qpFits {
			s = d.reserveOn(a.qpShard, cqe)
		}
		if s == nil {
			stale = a.qp
			a.qp, a.qpShard = nil, nil
		}
	}
	var err error
	if s == nil {
		s, err = d.reserve(cqe)
	}
	dropStale := func() {
		if stale != nil {
			destroyQP(stale)
		}
	}
	if err == nil {
		d.refs++
		devMu.Unlock()
		dropStale()
		return d, s, a, nil
	}
	if a != nil {
		// Back for another connection: the arena has no QP here.
		d.keepArena(a)
	}
	if d.refs > 0 {
		devMu.Unlock()
		dropStale()
		return nil, nil, nil, err
	}
	// A device set up for this connection alone goes again; the stale QP
	// first, since it uses one of the device's CQs.
	dropStale()
	d.retireUnlocking()
	return nil, nil, nil, err
}

// acquireDeviceCQ returns the device for an ibv_context with one more
// reference and the CQ on which cqe entries were reserved, setting the
// device up on first use: acquireDevice for a user without an arena (a
// PacketConn).
func acquireDeviceCQ(verbs unsafe.Pointer, cqe int) (*device, *cqShard, error) {
	devMu.Lock()
	d := devices[verbs]
	if d == nil {
		var err error
		if d, err = newDevice(ibv.ContextFrom(verbs)); err != nil {
			devMu.Unlock()
			return nil, nil, err
		}
		devices[verbs] = d
	} else if d.idle != nil {
		d.idle.Stop()
		d.idle = nil
	}
	s, err := d.reserve(cqe)
	if err == nil {
		d.refs++
		devMu.Unlock()
		return d, s, nil
	}
	if d.refs > 0 {
		devMu.Unlock()
		return nil, nil, err
	}
	d.retireUnlocking()
	return nil, nil, err
}

// reserveOn promises cqe entries of the CQ s, growing it if it may, or
// returns nil; devMu is held.
func (d *device) reserveOn(s *cqShard, cqe int) *cqShard {
	p, err := placeCQ([]cqLoad{{cap: s.cq.Cap, reserved: s.reserved}}, cqe, d.maxCQE, initialCQE, !d.noResize)
	if err != nil || p.index != 0 {
		return nil
	}
	if p.size > s.cq.Cap {
		s.cqMu.Lock()
		err := s.cq.Resize(p.size)
		s.cqMu.Unlock()
		if err != nil {
			return nil
		}
	}
	s.reserved += cqe
	return s
}

// reserve promises cqe entries of one of the device's CQs, growing one or
// creating one as placeCQ decides; devMu is held.
func (d *device) reserve(cqe int) (*cqShard, error) {
	loads := make([]cqLoad, len(d.cqs))
	for i, s := range d.cqs {
		loads[i] = cqLoad{cap: s.cq.Cap, reserved: s.reserved}
	}
	p, err := placeCQ(loads, cqe, d.maxCQE, initialCQE, !d.noResize)
	if err != nil {
		return nil, err
	}
	var s *cqShard
	if p.index < 0 {
		if s, err = d.newCQ(p.size); err != nil {
			return nil, err
		}
	} else if s = d.cqs[p.index]; p.size > s.cq.Cap {
		s.cqMu.Lock()
		err := s.cq.Resize(p.size)
		s.cqMu.Unlock()
		if errors.Is(err, syscall.EOPNOTSUPP) {
			// siw has no ibv_resize_cq: place it again without growth.
			d.noResize = true
			return d.reserve(cqe)
		}
		if err != nil {
			return nil, err
		}
	}
	s.reserved += cqe
	return s, nil
}

// newCQ adds a CQ of size entries, with its channel and poller goroutine;
// devMu is held.
func (d *device) newCQ(size int) (*cqShard, error) {
	ch, err := d.ctx.CreateCompChannel()
	if err != nil {
		return nil, err
	}
	cq, err := d.ctx.CreateCQ(size, ch)
	if err != nil {
		ch.Interrupt()
		retryDestroy(ch.Destroy)
		return nil, err
	}
	s := &cqShard{poller: newPoller(cq, ch), ch: ch, cq: cq}
	s.onLost = func(error) { d.detach() }
	s.ring = &d.ring
	d.cqs = append(d.cqs, s)
	ps := make([]*poller, len(d.cqs))
	for i, c := range d.cqs {
		ps[i] = c.poller
	}
	d.ring.set(ps)
	go s.run()
	return s, nil
}

func newDevice(ctx *ibv.Context) (*device, error) {
	// What the device is and allows decides how its QPs are made and
	// used (a READ with an initiator depth of 0 is refused; siw's CQs
	// cannot be resized): without it no connection can be set up right.
	a, err := ctx.Query()
	if err != nil {
		return nil, err
	}
	// No protection domain: each connection's arena has its own (see
	// arena).
	async, err := ctx.OpenAsync()
	if err != nil {
		return nil, err
	}
	d := &device{ctx: ctx, ackTimeout: ackTimeoutHW, maxCQE: initialCQE, iwarp: ctx.IWARP(),
		async: async, asyncDone: make(chan struct{}), asyncStop: make(chan struct{}),
		pool: newReadyPool[*arena](poolLimits, qpCooling)}
	// On iWARP the connection manager binds a QP to the TCP connection it
	// was connected over; a QP is not kept for another one there.
	d.keepQPs = !d.iwarp
	d.events.conns = d
	switch a.VendorID {
	case rxeVendorID:
		d.ackTimeout = ackTimeoutRXE
		d.kernelPosts = true
	case siwVendorID:
		// No ibv_resize_cq; knowing it before the first CQ makes
		// that CQ fixedCQE entries, which keeps libsiw's bad
		// mmap key away (see fixedCQE).
		d.noResize = true
		d.serialPosts = true
		d.postAside = true
		d.kernelPosts = true
	}
	d.maxCQE = a.MaxCQE
	d.initDepth, d.respDepth = readDepth(a.MaxQPInitRdAtom), readDepth(a.MaxQPRdAtom)
	d.atomics = atomicCaps{device: ctx.Name(), level: a.AtomicCap, replyBE: replyBigEndian(a.VendorID, a.VendorPartID)}
	go d.readAsync()
	return d, nil
}

// readAsync reads the device's asynchronous events until it goes. A
// failed read (ibv_get_async_event) is tried again after a pause (see
// retrier); once it has failed too long, the device's connections fail
// (a QP's or the port's failure could not reach them any more) and the
// device is detached: new connections get a device of their own.
func (d *device) readAsync() {
	defer close(d.asyncDone)
	err := readEvents(func(ok func()) error {
		return d.async.Run(func(ev ibv.AsyncEvent) {
			ok()
			d.events.handle(ev)
		})
	}, d.asyncStop)
	if err != nil {
		lost := &asyncLostError{err}
		for _, c := range d.all() {
			c.failAsync(lost, false)
		}
		d.detach()
	}
}

// asyncLostError fails the connections of a device whose asynchronous
// events could not be read any more.
type asyncLostError struct{ err error }

func (e *asyncLostError) Error() string {
	return "rdma: device events lost: " + e.err.Error()
}
func (e *asyncLostError) Unwrap() error { return e.err }

// detach takes a device whose events were lost out of the map: its
// connections keep it until they are released (they have been failed),
// and the next connection on the same context sets a device up afresh.
// A device that only lingers goes at once.
func (d *device) detach() {
	devMu.Lock()
	if d.detached || devices[d.ctx.Ptr()] != d {
		devMu.Unlock()
		return
	}
	verbs := d.ctx.Ptr()
	delete(devices, verbs)
	destroying[verbs]++ // until it is destroyed: see retireUnlocking
	d.detached = true
	if d.refs != 0 {
		devMu.Unlock()
		return
	}
	if d.idle != nil {
		d.idle.Stop()
		d.idle = nil
	}
	devMu.Unlock()
	// Not on this goroutine: it may be one that the destruction waits
	// for (the poller, the asynchronous events' reader).
	go func() {
		devMu.Lock()
		d.retireUnlocking()
	}()
}

// maxReadDepth bounds the RDMA READs a connection issues, and serves, at
// once: as many as one-sided operations in flight (oneSidedDepth), which
// a NIC's default usually allows; each costs the responder's NIC state.
const maxReadDepth = oneSidedDepth

// readDepth is min(maxReadDepth, what the device allows).
func readDepth(dev int) uint8 { return uint8(max(0, min(maxReadDepth, dev))) }

// conn returns the completer of a QP of the device, if any.
func (d *device) conn(qpNum uint32) completer {
	for _, s := range d.shards() {
		if c := s.conn(qpNum); c != nil {
			return c
		}
	}
	return nil
}

// all returns the completers of every QP of the device.
func (d *device) all() []completer {
	var cs []completer
	for _, s := range d.shards() {
		cs = append(cs, s.all()...)
	}
	return cs
}

func (d *device) shards() []*cqShard {
	devMu.Lock()
	defer devMu.Unlock()
	return d.cqs
}

// release returns cqe reserved entries and a reference. After the last
// reference the device lingers (deviceLinger), then its poller stops and
// its objects are destroyed; a removed device goes at once.
func (d *device) release(s *cqShard, cqe int) {
	devMu.Lock()
	s.reserved -= cqe
	d.refs--
	if d.refs != 0 {
		devMu.Unlock()
		return
	}
	if removed[d.ctx.Ptr()] || d.detached {
		d.retireUnlocking()
		return
	}
	var t *time.Timer
	t = time.AfterFunc(deviceLinger, func() {
		devMu.Lock()
		if d.idle != t {
			// Acquired again meanwhile (or retired).
			devMu.Unlock()
			return
		}
		d.idle = nil
		d.retireUnlocking()
	})
	d.idle = t
	devMu.Unlock()
}

// releaseIdleDevices waits for the releases Close left running, then
// retires at once every device that only lingers.
func releaseIdleDevices() {
	releasing.Wait()
	for {
		devMu.Lock()
		var idle *device
		for _, d := range devices {
			if d.refs == 0 {
				idle = d
				break
			}
		}
		if idle == nil {
			devMu.Unlock()
			return
		}
		idle.idle.Stop()
		idle.idle = nil
		idle.retireUnlocking()
	}
}

// retireUnlocking takes a device nobody uses out of the map and destroys
// it; it is entered with devMu held and releases it. The destruction runs
// without devMu: it waits for the asynchronous events' reader, which may be
// failing connections (markRemoved takes devMu); meanwhile the context
// counts as in use (destroying), so a removed device is forgotten only
// once its objects are gone.
func (d *device) retireUnlocking() {
	verbs := d.ctx.Ptr()
	if !d.detached {
		// (A detached device is out of the map and counted already.)
		delete(devices, verbs)
		destroying[verbs]++
	}
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
	d := devices[verbs]
	if d != nil {
		// A release waiting for the port to come back (see
		// Conn.waitPortBack) goes on: the device will not.
		d.events.stop()
	}
	if d != nil && d.refs == 0 {
		// Only lingering: it goes now, since the kernel waits for it. Not
		// on this goroutine, which may be the one its destruction waits
		// for (the device's asynchronous events).
		if d.idle != nil {
			d.idle.Stop()
			d.idle = nil
		}
		go func() {
			devMu.Lock()
			if devices[verbs] != d || d.refs != 0 {
				devMu.Unlock()
				return
			}
			d.retireUnlocking()
		}()
		return
	}
	forgetRemovedLocked(verbs)
}

// forgetRemovedLocked lets the kernel finish removing a device once this
// process holds nothing of it: no connection (the device's CQs and
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
	if noDeviceLeft(rdmacm.Rescan()) {
		ibv.ContextFrom(verbs).ReleaseFiles()
	}
}

// isRemoved reports whether rdma_cm said the device went away.
func (d *device) isRemoved() bool {
	devMu.Lock()
	defer devMu.Unlock()
	return removed[d.ctx.Ptr()]
}

// addRegistered counts memory a connection registered (or, negative,
// released).
func (d *device) addRegistered(n int) { d.registered.Add(int64(n)) }

func devicesStats() []DeviceStats {
	devMu.Lock()
	defer devMu.Unlock()
	var s []DeviceStats
	for _, d := range devices {
		st := DeviceStats{Name: d.ctx.Name(), Connections: d.refs, CompletionQueues: len(d.cqs), RegisteredBytes: int(d.registered.Load()),
			ActiveMTU: d.ctx.ActiveMTU(1)}
		st.PooledBytes, st.PooledQPs = d.pool.counts()
		st.PooledBytes += d.rings.kept()
		for _, q := range d.cqs {
			st.CQEntries += q.cq.Cap
		}
		s = append(s, st)
	}
	return s
}

func (d *device) destroy() {
	// The reader goes first: its descriptor (a duplicate of the
	// context's) would keep the device's file open.
	close(d.asyncStop)
	d.async.Interrupt()
	<-d.asyncDone
	d.events.stop()
	// The pooled QPs before the CQs they use.
	d.dropPool()
	for _, s := range d.cqs {
		// shutdown marks the poller stopped; taking cqMu then waits out
		// a spinning Read's or one-sided wait's poll in progress, and
		// every later one sees the mark and polls nothing (tryPoll).
		s.shutdown(s.ch.Interrupt)
		s.cqMu.Lock()
		retryDestroy(s.cq.Destroy)
		s.cqMu.Unlock()
		retryDestroy(s.ch.Destroy)
	}
}
