//go:build linux && cgo

package rdma

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/rdma/internal/ibv"
)

// device holds what all connections on one ibv_context share: a protection
// domain, one completion queue with its completion channel, and the poller
// goroutine that drains the queue and hands completions to connections. It
// exists while connections use it.
type device struct {
	ctx  *ibv.Context
	pd   *ibv.PD
	ch   *ibv.CompChannel
	done chan struct{}
	stop atomic.Bool

	// spinners counts Reads and Writes polling the CQ themselves; while
	// there are any, the poller steps aside (it neither competes for the
	// CPU nor arms the CQ, which would cost an event per completion) and
	// the last one to leave wakes it through wake.
	spinners atomic.Int32
	wake     chan struct{}

	cqMu     sync.Mutex // serializes Poll and Resize
	cq       *ibv.CQ
	reserved int // CQ entries promised to connections, under devMu

	connsMu sync.RWMutex
	conns   map[uint32]*Conn // by QP number

	refs int // under devMu
}

var (
	devMu   sync.Mutex
	devices = map[unsafe.Pointer]*device{}
)

// initialCQE is the first size of a device's CQ; it grows as connections
// are added.
const initialCQE = 8192

// spinPolls is how many empty polls the poller makes, yielding between
// them, before it arms the CQ and parks: a completion that follows soon
// (the reply of a ping-pong) is then picked up without a wakeup.
const spinPolls = 64

// acquireDevice returns the device for an ibv_context with one more
// reference and cqe more CQ entries reserved, setting it up on first use.
func acquireDevice(verbs unsafe.Pointer, cqe int) (*device, error) {
	devMu.Lock()
	defer devMu.Unlock()
	d := devices[verbs]
	if d == nil {
		var err error
		if d, err = newDevice(ibv.ContextFrom(verbs)); err != nil {
			return nil, err
		}
		devices[verbs] = d
	}
	need := d.reserved + cqe
	if need > d.cq.Cap {
		grow := max(need, 2*d.cq.Cap)
		d.cqMu.Lock()
		err := d.cq.Resize(grow)
		d.cqMu.Unlock()
		if err != nil {
			if d.refs == 0 {
				d.destroy()
				delete(devices, verbs)
			}
			return nil, err
		}
	}
	d.reserved = need
	d.refs++
	return d, nil
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
	d := &device{ctx: ctx, pd: pd, ch: ch, cq: cq, done: make(chan struct{}), wake: make(chan struct{}, 1), conns: map[uint32]*Conn{}}
	go d.run()
	return d, nil
}

// release returns cqe reserved entries and a reference; the last reference
// stops the poller and destroys the device's objects.
func (d *device) release(cqe int) {
	devMu.Lock()
	defer devMu.Unlock()
	d.reserved -= cqe
	d.refs--
	if d.refs == 0 {
		delete(devices, d.ctx.Ptr())
		d.destroy()
	}
}

func (d *device) destroy() {
	d.stop.Store(true)
	signal(d.wake)
	d.ch.Interrupt()
	<-d.done
	d.cq.Destroy()
	d.ch.Destroy()
	d.pd.Dealloc()
}

func (d *device) addConn(c *Conn) {
	d.connsMu.Lock()
	d.conns[c.qp.Num] = c
	d.connsMu.Unlock()
}

func (d *device) removeConn(c *Conn) {
	d.connsMu.Lock()
	delete(d.conns, c.qp.Num)
	d.connsMu.Unlock()
}

// poll polls a batch and dispatches it (see pollUnlock).
func (d *device) poll(wcs []ibv.WC, flush []*Conn) int {
	d.cqMu.Lock()
	return d.pollUnlock(wcs, flush)
}

// pollUnlock polls a batch and dispatches it with cqMu held, so that
// batches reach connections in the order the CQ produced them even when a
// waiting Read or Write polls beside the poller goroutine; then it
// releases cqMu and flushes the connections that have something to post
// (see Conn.complete). flush, a slice as long as wcs, holds them meanwhile.
func (d *device) pollUnlock(wcs []ibv.WC, flush []*Conn) int {
	n, err := d.cq.Poll(wcs)
	if err != nil {
		n = 0
	}
	if n > 0 {
		flush = d.dispatch(wcs[:n], flush)
	}
	d.cqMu.Unlock()
	for _, c := range flush {
		c.lockAndFlush()
	}
	return n
}

func (d *device) spinStart() { d.spinners.Add(1) }

func (d *device) spinEnd() {
	if d.spinners.Add(-1) == 0 {
		signal(d.wake)
	}
}

// tryPoll polls and dispatches one batch on the caller's goroutine unless
// another goroutine is polling: a Read waiting for a reply picks it up
// without the hop through the poller goroutine.
func (d *device) tryPoll() {
	if !d.cqMu.TryLock() {
		return
	}
	var wcs [16]ibv.WC
	var fl [16]*Conn
	d.pollUnlock(wcs[:], fl[:0])
}

// run is the poller: poll in batches while completions come, spin a little
// when they stop, then arm the CQ, poll once more (a completion that landed
// before arming raises no event) and park on the completion channel.
func (d *device) run() {
	defer close(d.done)
	var wcs [32]ibv.WC
	var fl [32]*Conn
	idle := 0
	for {
		if d.poll(wcs[:], fl[:0]) > 0 {
			idle = 0
			continue
		}
		if d.stop.Load() {
			return
		}
		if d.spinners.Load() > 0 {
			<-d.wake
			idle = 0
			continue
		}
		if idle < spinPolls {
			idle++
			runtime.Gosched()
			continue
		}
		if err := d.cq.ReqNotify(); err != nil {
			return
		}
		if d.poll(wcs[:], fl[:0]) > 0 {
			idle = 0
			continue
		}
		if err := d.ch.Wait(); err != nil {
			return
		}
		idle = 0
	}
}

func (d *device) dispatch(wcs []ibv.WC, flush []*Conn) []*Conn {
	d.connsMu.RLock()
	defer d.connsMu.RUnlock()
	var last *Conn
	var lastQP uint32
	for i := range wcs {
		wc := &wcs[i]
		c := last
		if c == nil || wc.QPNum != lastQP {
			c = d.conns[wc.QPNum]
			last, lastQP = c, wc.QPNum
		}
		if c != nil && c.complete(wc) && (len(flush) == 0 || flush[len(flush)-1] != c) {
			flush = append(flush, c)
		}
	}
	return flush
}
