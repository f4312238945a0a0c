package rdma

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
)

// completionQueue is the device's CQ as the poller uses it: *ibv.CQ, or a
// fake in tests.
type completionQueue interface {
	Poll(wcs []ibv.WC) (int, error)
	ReqNotify() error
}

// eventWaiter parks until the CQ raises a completion event: the device's
// *ibv.CompChannel, or a fake in tests. Wait fails once the device stops.
type eventWaiter interface {
	Wait() error
}

// completer is what completions are dispatched to: a connection, found by
// the QP number the completion carries.
type completer interface {
	// complete handles one completion with the poller's cqMu held: it may
	// post receives (one verb call, no wait) and disconnect, but must not
	// post sends (on rxe a send runs the whole transfer) or wait; it
	// reports whether the connection has sends to post.
	// The completion is passed by value: a pointer into the poll batch
	// would make every batch escape to the heap through the interface.
	complete(wc ibv.WC) bool
	// lockAndFlush posts what complete queued; it is called, for the
	// connections whose complete reported sends, after cqMu is released,
	// so a post does not hold up the other connections.
	lockAndFlush()
	// failAsync fails the connection for an asynchronous event of the
	// device (see async.go); removed says the device is gone.
	failAsync(err error, removed bool)
}

// poller drains one completion queue shared by many connections and hands
// each completion to its connection. Completions are polled either by the
// poller's own goroutine (run) or by a Read or Write that spins while it
// waits (tryPoll); cqMu makes the two take turns, so batches reach
// connections in the order the CQ produced them.
type poller struct {
	cq   completionQueue
	ch   eventWaiter
	done chan struct{} // closed when run returns
	stop atomic.Bool

	// spinners counts Reads and Writes polling the CQ themselves; while
	// there are any, run steps aside (it neither competes for the CPU nor
	// arms the CQ, which would cost an event per completion) and the last
	// one to leave wakes it through wake.
	spinners atomic.Int32
	wake     chan struct{}
	// woke is set when a completion wakes a Read parked on its channel
	// (Conn.wakeReader). The woken goroutine is put to run next on the P
	// of the goroutine that polled, which may be a Read spinning with its
	// lock held: that one then yields at once (spinReadHeld) instead of
	// after its next spinCheck polls, so the woken Read runs now.
	woke atomic.Bool

	cqMu sync.Mutex               // serializes polling (and the device's resizing)
	wcs  [ibv.MaxPollBatch]ibv.WC // the batch being dispatched, under cqMu

	idle idlePhase        // run's idle polls; run's own
	now  func() time.Time // the clock that times them (a fake in tests)
	// idlers counts the pollers in their idle phase, process-wide (a
	// field so that tests can give a poller a count of its own).
	idlers *idleSlots

	connsMu sync.Mutex // serializes changes of conns
	conns   qpTable    // by QP number; read without a lock

	// ring, if set, is the device's CQs, this one among them, which the
	// device's poller goroutines poll in turn (see pollTurn).
	ring *cqRing

	// onLost, if set, is called once the CQ's events are lost for good
	// (see run), after its connections were failed: the device lets no
	// new connection use the CQ.
	onLost func(err error)
}

// eventsLostError fails the connections of a CQ whose completion events
// could not be had any more: arming the CQ or reading its events kept
// failing (see retrier).
type eventsLostError struct{ err error }

func (e *eventsLostError) Error() string {
	return "rdma: completion events lost: " + e.err.Error()
}
func (e *eventsLostError) Unwrap() error { return e.err }

func newPoller(cq completionQueue, ch eventWaiter) *poller {
	procs := runtime.GOMAXPROCS(0)
	processIdlers.follow(procs)
	wokenReads.follow(procs)
	return &poller{cq: cq, ch: ch, done: make(chan struct{}), wake: make(chan struct{}, 1), idle: newIdlePhase(), now: time.Now, idlers: &processIdlers}
}

// idleSlots bounds how many pollers spin in their idle phase at once.
//
// A poller's idle phase polls its CQ between runtime.Gosched calls. With
// more pollers than Ps (a device with thousands of connections has several
// CQs, each with its poller), pollers spinning that way fill the run queue
// and take turns with the connections' goroutines: a CQ whose connections'
// goroutines do not get to post their requests stays empty, its poller
// keeps finding nothing, and the connections on it starve for seconds
// (bench/README.md, "Why connections starve"). A poller that finds no slot
// skips the idle phase: it arms its CQ and
// parks on its completion channel and is woken through the netpoller; the
// spinning stays with at most half the Ps, so the rest run the
// connections.
type idleSlots struct {
	n   atomic.Int32
	max atomic.Int32
}

// processIdlers is the bound of every poller of the process: the Ps they
// compete for are the process's. Its bound follows GOMAXPROCS as it is
// when a poller starts (reading it takes the scheduler's lock, too dear
// for every idle phase).
var processIdlers idleSlots

func (s *idleSlots) follow(procs int) { s.max.Store(int32(max(1, procs/2))) }

// take reports whether a poller may start an idle phase; if so, it must
// give the slot back with give.
func (s *idleSlots) take() bool {
	if s.n.Add(1) <= s.max.Load() {
		return true
	}
	s.n.Add(-1)
	return false
}

func (s *idleSlots) give() { s.n.Add(-1) }

func (p *poller) add(qpNum uint32, c completer) {
	if _, retired := p.conns.get(qpNum).(retiredQP); retired {
		// The QP that had this number was destroyed a moment ago (see
		// retire): its last completions may still be in the CQ, and
		// they are not c's.
		p.pollStale()
	}
	p.connsMu.Lock()
	p.conns.set(qpNum, c)
	p.connsMu.Unlock()
}

// retiredQP holds a QP's place in the poller while the QP is destroyed,
// and drops its completions. A destroy may complete work requests (siw
// flushes, into the CQ, those its QP still had), and the provider may
// give the number to a new QP at once (siw does): dispatched by number,
// such completions would reach the new QP's connection, which would take
// flushed receives for its own and fail.
type retiredQP struct{}

func (retiredQP) complete(ibv.WC) bool  { return false }
func (retiredQP) lockAndFlush()         {}
func (retiredQP) failAsync(error, bool) {}

// retire stops dispatch to a QP's connection before the QP is destroyed;
// forget ends it once the destroy has returned. Between the two, and
// until every completion the CQ held when the destroy returned has been
// polled, the QP's completions are dropped, and a new QP given its number
// is added only after them.
func (p *poller) retire(qpNum uint32) {
	p.connsMu.Lock()
	p.conns.set(qpNum, retiredQP{})
	p.connsMu.Unlock()
	p.waitDispatch()
}

func (p *poller) forget(qpNum uint32) {
	p.pollStale()
	p.connsMu.Lock()
	if _, ok := p.conns.get(qpNum).(retiredQP); ok {
		p.conns.del(qpNum)
	}
	p.connsMu.Unlock()
}

// pollStale polls and dispatches until a poll comes back short of a full
// batch: every completion the CQ held when it was called has then been
// dispatched (a CQ hands them out in order). It relies on the provider
// adding nothing of a QP to the CQ once its destroy has returned (siw
// flushes within the call). A CQ that other connections keep full gets
// staleBatches polls at most, a CQ's worth of completions. Once the
// poller is stopped it polls nothing (see tryPoll).
func (p *poller) pollStale() {
	var fl [ibv.MaxPollBatch]completer
	for range staleBatches {
		p.cqMu.Lock()
		if p.stop.Load() {
			p.cqMu.Unlock()
			return
		}
		if p.pollUnlock(len(p.wcs), fl[:0]) < len(p.wcs) {
			return
		}
	}
}

// staleBatches bounds pollStale: 32,768 completions, the CQ size on siw,
// the provider that hands QP numbers out again at once.
const staleBatches = 32768 / ibv.MaxPollBatch

// remove stops dispatch to a QP's connection. It waits out a dispatch in
// progress; only the lockAndFlush that batch collected may still reach the
// connection (harmless: its teardown no longer posts).
func (p *poller) remove(qpNum uint32) {
	p.connsMu.Lock()
	p.conns.del(qpNum)
	p.connsMu.Unlock()
	p.waitDispatch()
}

// waitDispatch waits for a dispatch in progress, which may have looked up
// a completer just before it was changed (lookups take no lock), to
// return. Dispatch runs with cqMu held, and the completer it calls never
// waits for a connection's release (the caller here), so this cannot
// wait for itself.
func (p *poller) waitDispatch() {
	p.cqMu.Lock()
	//lint:ignore SA2001 waiting for the holder is the point
	p.cqMu.Unlock()
}

// conn returns the completer of a QP, if any.
func (p *poller) conn(qpNum uint32) completer { return p.conns.get(qpNum) }

// all returns every completer, collected so that none is called with
// connsMu held (failing one may remove it).
func (p *poller) all() []completer {
	p.connsMu.Lock()
	defer p.connsMu.Unlock()
	cs := make([]completer, 0, p.conns.n)
	p.conns.each(func(c completer) { cs = append(cs, c) })
	return cs
}

// pollUnlock polls up to max completions and dispatches them with cqMu
// held, which the caller took; then it releases cqMu and flushes the
// connections that have something to post. flush, a slice with room for
// max, holds them meanwhile. It returns how many completions it polled.
func (p *poller) pollUnlock(max int, flush []completer) int {
	wcs := p.pollBatch(max)
	n := len(wcs)
	if n > 0 {
		flush = p.dispatch(wcs, flush)
	}
	p.cqMu.Unlock()
	for _, c := range flush {
		c.lockAndFlush()
	}
	return n
}

// pollBatch polls up to max completions into the batch (cqMu held).
func (p *poller) pollBatch(max int) []ibv.WC {
	n, err := p.cq.Poll(p.wcs[:max])
	if err != nil {
		n = 0
	}
	return p.wcs[:n]
}

// dispatch hands each completion to its connection and collects, once
// each, the connections that have something to post. Completions of a QP
// no connection owns any more (a teardown finished) are dropped.
func (p *poller) dispatch(wcs []ibv.WC, flush []completer) []completer {
	var last completer
	var lastQP uint32
	for _, wc := range wcs {
		c := last
		if c == nil || wc.QPNum != lastQP {
			c = p.conns.get(wc.QPNum)
			last, lastQP = c, wc.QPNum
		}
		if c != nil && c.complete(wc) && !contains(flush, c) {
			flush = append(flush, c)
		}
	}
	return flush
}

// dispatchHeld is dispatch for tryPollHeld: self's completions go to
// completeLocked (self's mu is held), and own reports whether it has
// sends to post; the other connections with sends to post are collected
// in others, once each. (One dispatch serving both, with a nil self for
// the poller's, made the poll batch's flush slice escape: an allocation
// per poll.)
func (p *poller) dispatchHeld(wcs []ibv.WC, others []completer, self *Conn) (_ []completer, own bool) {
	var me completer = self
	for _, wc := range wcs {
		c := p.conns.get(wc.QPNum)
		switch {
		case c == nil:
		case c == me:
			own = self.completeLocked(wc) || own
		case c.complete(wc) && !contains(others, c):
			others = append(others, c)
		}
	}
	return others, own
}

func contains(cs []completer, c completer) bool {
	for _, x := range cs {
		if x == c {
			return true
		}
	}
	return false
}

func (p *poller) spinStart() { p.spinners.Add(1) }

func (p *poller) spinEnd() {
	if p.spinners.Add(-1) == 0 {
		signal(p.wake)
	}
}

// tryPoll polls and dispatches one batch on the caller's goroutine unless
// another goroutine is polling: a Read waiting for a reply picks it up
// without the hop through the poller goroutine. Once the poller is
// stopped it polls nothing: the device destroys the CQ after shutdown
// (with cqMu held), and a Read or one-sided wait still spinning on a
// connection of a device being removed must not poll freed memory.
func (p *poller) tryPoll() { p.tryPollN() }

// tryPollN is tryPoll, reporting how many completions it polled.
func (p *poller) tryPollN() int {
	if !p.tryLock() {
		return 0
	}
	var fl [spinBatch]completer
	return p.pollUnlock(spinBatch, fl[:0])
}

// tryLock takes cqMu for a poll unless another goroutine holds it, the
// poller is stopped (see tryPoll), or Reads woken by earlier polls are
// still waiting to run (see wokenReads): a spinning Read or Write then
// leaves the CQs to the pollers, which take them in turn.
func (p *poller) tryLock() bool {
	if wokenReads.spinnersFull() {
		return false
	}
	if !p.cqMu.TryLock() {
		return false
	}
	if p.stop.Load() {
		p.cqMu.Unlock()
		return false
	}
	return true
}

// tryPollHeld is tryPoll for a Read that holds its connection's lock
// (self's mu) while it spins (see Conn.spinReadHeld): self's completions
// are handled in place, with that lock, so that the Read finds its message
// queued without a signal through rxReady and without taking mu again.
// It reports false, having polled nothing, when another goroutine is
// polling: that one may be dispatching a completion of self and waiting
// for self's mu, which the caller must then let go of. The other
// connections with sends to post are returned in others (appended to the
// slice given, which has room for spinBatch), for the caller to post
// once it has let go of self's mu (Conn.pollHeld): a connection's
// goroutine never waits for another's lock while it holds its own, except
// in dispatch, which only the holder of cqMu runs. own reports whether
// self has sends to post, which the caller posts with its lock.
func (p *poller) tryPollHeld(self *Conn, others []completer) (polled bool, _ []completer, own bool) {
	if !p.tryLock() {
		return false, others, false
	}
	if wcs := p.pollBatch(spinBatch); len(wcs) > 0 {
		others, own = p.dispatchHeld(wcs, others, self)
	}
	p.cqMu.Unlock()
	return true, others, own
}

// cqRing is a device's CQs, polled in turn by its poller goroutines.
//
// A device with thousands of connections has several CQs, each with its
// poller goroutine. A poller that polled only its own CQ kept it served
// while it ran, and a parked one is woken through the netpoller, which a
// scheduler with every P busy checks only every few milliseconds, and then
// waits behind the runnable goroutines: the CQs whose pollers happened to
// run were served while the others' connections waited for seconds
// (bench/README.md, "Why connections starve"). Taking the next CQ of the
// ring instead, whichever poller runs, serves every CQ as often.
type cqRing struct {
	pollers atomic.Pointer[[]*poller] // replaced, never changed, as CQs are added
	next    atomic.Uint32
}

// set makes ps the ring's CQs.
func (r *cqRing) set(ps []*poller) { r.pollers.Store(&ps) }

// pollTurn polls the ring's CQs in turn, a batch each, starting at the
// ring's next one, until one yields completions or every CQ has been
// tried; it reports how many completions it polled. A CQ that another
// goroutine is polling is skipped: that one serves it. A poller without a
// ring polls its own CQ.
func (p *poller) pollTurn(flush []completer) int {
	if p.ring == nil {
		return p.poll(flush)
	}
	all := *p.ring.pollers.Load()
	for range len(all) {
		o := all[int(p.ring.next.Add(1)%uint32(len(all)))]
		if !o.cqMu.TryLock() {
			continue
		}
		if o.stop.Load() {
			o.cqMu.Unlock()
			continue
		}
		if n := o.pollUnlock(len(o.wcs), flush); n > 0 {
			return n
		}
	}
	return 0
}

// wokenReads counts the Reads that a completion woke and that have not
// run yet, process-wide (Conn.wakeReader counts them, the Read uncounts
// itself when it runs).
//
// A completion wakes its Read onto the run queue of the goroutine that
// polled it. The Go scheduler gives each P a local queue of 256, moves
// half of it to the global queue when it overflows, and takes from the
// global queue once in 61 turns while the local one is not empty: with
// thousands of connections, pollers that wake every Read their batches
// hold keep the local queues full, and the Reads pushed to the global
// queue wait for seconds while others are served again and again. While
// pollerMax Reads wait to run, the pollers poll no more: they yield, and
// the requests wait in the CQs, which hand them out in the order they
// came. Past spinnerMax, spinning Reads and Writes do not poll either: a
// spinner polls its own connection's CQ, which favors the CQs whose
// connections happen to run.
var wokenReads wokenCount

type wokenCount struct {
	n          atomic.Int32
	spinnerMax atomic.Int32
}

// pollerMax keeps the Reads the pollers wake within half a P's local run
// queue (256), whichever P they land on.
const pollerMax = 128

// follow sets the spinners' bound from GOMAXPROCS: one Read waiting per P
// means the Ps are busy.
func (w *wokenCount) follow(procs int) { w.spinnerMax.Store(int32(max(2, procs))) }

func (w *wokenCount) add(n int32)        { w.n.Add(n) }
func (w *wokenCount) pollersFull() bool  { return w.n.Load() >= pollerMax }
func (w *wokenCount) spinnersFull() bool { return w.n.Load() >= w.spinnerMax.Load() }

// spinBatch is how many completions a spinning Read or Write polls at
// once: it wants its own soon, and dispatches the others meanwhile.
const spinBatch = 16

func (p *poller) poll(flush []completer) int {
	p.cqMu.Lock()
	return p.pollUnlock(len(p.wcs), flush)
}

// run is the poller goroutine: poll in batches while completions come,
// the device's CQs in turn (pollTurn), spin a little when they stop (as
// long as p.idle says it pays), then arm its own CQ, poll it once more (a
// completion that landed before arming raises no event) and park on its
// completion channel. While many Reads it woke wait to run, it yields
// instead of polling (see wokenReads). It returns once stopped.
//
// Arming the CQ and reading its events are calls into the kernel that may
// fail for a moment: run polls, pauses and tries again (see retrier).
// Once they have failed for too long, the CQ's connections fail with the
// error (nothing would wake their waits any more), and run goes on polling
// at short intervals without events, so that their teardowns still see
// their work requests flushed, until it is stopped.
func (p *poller) run() {
	defer close(p.done)
	var fl [ibv.MaxPollBatch]completer
	idle, limit := 0, 0
	var idleStart time.Time
	var r retrier
	lost := false
	// slot says run holds one of p.idlers during an idle phase; every
	// way out of the phase gives it back.
	slot := false
	leave := func() {
		if slot {
			p.idlers.give()
			slot = false
		}
	}
	defer leave()
	for {
		if wokenReads.pollersFull() && !p.stop.Load() {
			// The Reads polled so far run first (see wokenReads).
			leave()
			idle = 0
			runtime.Gosched()
			continue
		}
		if p.pollTurn(fl[:0]) > 0 {
			if idle > 0 {
				p.idle.caught()
			}
			idle = 0
			leave()
			continue
		}
		if p.stop.Load() {
			return
		}
		if lost {
			p.pause(lostPollInterval)
			continue
		}
		if p.spinners.Load() > 0 {
			leave()
			<-p.wake
			idle = 0
			continue
		}
		if idle == 0 {
			if limit = p.idle.next(); limit > 0 {
				if slot = p.idlers.take(); slot {
					idleStart = p.now()
				} else {
					limit = 0
				}
			}
		}
		if idle < limit {
			idle++
			runtime.Gosched()
			continue
		}
		if idle > 0 {
			p.idle.spent(idle, p.now().Sub(idleStart))
		}
		idle = 0
		leave()
		if err := p.cq.ReqNotify(); err != nil {
			lost = p.failed(&r, err)
			continue
		}
		if p.poll(fl[:0]) > 0 {
			// It came just after the phase: polling on would have
			// caught it.
			p.idle.caught()
			continue
		}
		parked := p.now()
		if err := p.ch.Wait(); err != nil {
			if p.stop.Load() {
				return
			}
			lost = p.failed(&r, err)
			continue
		}
		r.ok()
		p.idle.parked(p.now().Sub(parked))
	}
}

// lostPollInterval is how often a poller whose CQ raises no events any
// more polls it.
const lostPollInterval = time.Millisecond

// failed handles a failure to arm the CQ or to wait for its events: it
// pauses before the next try, or, once they failed too often, fails the
// CQ's connections and reports true.
func (p *poller) failed(r *retrier, err error) bool {
	pause, again := r.failed()
	if again {
		p.pause(pause)
		return false
	}
	lost := &eventsLostError{err}
	for _, c := range p.all() {
		c.failAsync(lost, false)
	}
	if p.onLost != nil {
		p.onLost(lost)
	}
	return true
}

// pause waits for d, or until shutdown wakes it.
func (p *poller) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.wake:
	}
}

// shutdown makes run return: the caller has made the event channel's Wait
// fail (interrupted it) or will; shutdown waits for run to finish.
func (p *poller) shutdown(interrupt func()) {
	p.stop.Store(true)
	signal(p.wake)
	interrupt()
	<-p.done
}
