package rdma

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// This file is the one home of the waiting policy: how a Read or Write that
// cannot go on waits (spin, park, or spin then park), how long it spins,
// and how long the poller goroutine idles (idlePhase) before it parks.

// PollMode is how a waiting Read or Write learns of completions. In every
// mode a poller goroutine per completion queue (one per device, more once
// connections fill it) drains the queue and parks
// in the network poller (no CPU) while nobody spins; a spinning Read or
// Write polls the queue itself, and the poller steps aside meanwhile.
type PollMode int

const (
	// PollAdaptive spins for Options.SpinTime (longer while the
	// connection's recent waits were short, not at all while they were
	// long), then parks: round trips are caught without a wakeup, an idle
	// connection costs nothing. At most
	// GOMAXPROCS-1 waits (at least one) spin at once in the process; the
	// others park at once, and whoever polls wakes them.
	PollAdaptive PollMode = iota
	// PollBusy spins until the call can go on, a deadline passes or the
	// connection closes: the lowest latency, at the price of a CPU per
	// waiting goroutine. For dedicated cores, as perftest runs by default.
	PollBusy
	// PollEvent parks at once and is woken through the completion
	// channel: the least CPU, the most latency.
	PollEvent
)

// String returns the mode's name: "adaptive", "busy" or "event".
func (m PollMode) String() string {
	switch m {
	case PollAdaptive:
		return "adaptive"
	case PollBusy:
		return "busy"
	case PollEvent:
		return "event"
	}
	return fmt.Sprintf("PollMode(%d)", int(m))
}

// ParsePollMode returns the mode named by s, as String names it.
func ParsePollMode(s string) (PollMode, error) {
	for m := PollAdaptive; m <= PollEvent; m++ {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("rdma: unknown poll mode %q (want adaptive, busy or event)", s)
}

// maxAdaptiveSpin bounds the recent waits that stretch a spin (to twice
// their average): long enough to cover a round trip on a slow (emulated)
// device, short enough that a connection whose traffic dries up wastes
// little CPU. (A quarter of it, tried across the test bed's two hosts,
// where a round trip's wait is about this long and a spin holds the one
// CPU that rxe's receive work needs, took the round trip's p99 down by a
// sixth but the 4 KiB stream within one host down by 3 %.)
const maxAdaptiveSpin = time.Millisecond

// spinCheck is how many polls a spin makes between looks at the clock:
// reading the clock costs about as much as a poll (more under emulation),
// and yielding as much again.
const spinCheck = 8

// idlePolls is the most empty polls the poller goroutine makes, yielding
// between them, before it arms the CQ and parks: a completion that follows
// soon (the reply of a ping-pong) is then picked up without a wakeup. How
// many it makes is idlePhase's to say.
const idlePolls = 64

// idlePhase sizes the poller's idle phase: how many empty polls, yielding
// between them, it makes before it arms the CQ and parks (idlePolls at
// most). Polling on pays when the next completion follows soon (the reply
// of a ping-pong whose peer answers within microseconds: it is then picked
// up without a wakeup). It does not pay when completions come further
// apart than the phase lasts, and there it costs more than its CPU: where
// the provider does a message's receive work on the receiving host's CPUs
// (rxe on a host with one CPU, whose round trips across the network take a
// millisecond or more), a poller that polls on delays the very completion
// it waits for. A phase that finds a completion, or a park that ended
// sooner than a full phase lasts (which the phase would have caught),
// restores the full phase; a park that lasted longer halves it, down to
// none. Without one, every probeEvery-th phase is a full one all the same,
// so that traffic whose completions come close again is noticed even where
// a park's wakeup takes longer than a phase.
type idlePhase struct {
	polls   int           // empty polls of a phase
	perPoll time.Duration // moving average of one empty poll and its yield
	skipped int           // phases skipped in a row, polls being 0
}

// probeEvery is how often a poller whose idle phase has shrunk to nothing
// makes a full one: often enough to notice a change of traffic within a
// few dozen round trips, rarely enough to cost a sixteenth of the phase.
const probeEvery = 16

func newIdlePhase() idlePhase { return idlePhase{polls: idlePolls} }

// next returns the empty polls of the phase starting now.
func (s *idlePhase) next() int {
	if s.polls > 0 {
		return s.polls
	}
	if s.skipped++; s.skipped%probeEvery == 0 {
		return idlePolls
	}
	return 0
}

// caught records a phase that found a completion.
func (s *idlePhase) caught() { s.polls, s.skipped = idlePolls, 0 }

// spent records a phase of n empty polls that took d and ended in arming.
func (s *idlePhase) spent(n int, d time.Duration) {
	per := d / time.Duration(n)
	if s.perPoll == 0 {
		s.perPoll = per
	} else {
		s.perPoll += (per - s.perPoll) / 8
	}
}

// parked records a park that lasted d.
func (s *idlePhase) parked(d time.Duration) {
	if d < idlePolls*s.perPoll {
		s.caught()
	} else {
		s.polls /= 2
	}
}

// spinner is what a spinning wait polls: the device's poller.
type spinner interface {
	spinStart()
	spinEnd()
	tryPoll()
}

// posting brackets a post (begin true, then false) where postAside says
// the poller should step aside meanwhile, as it does for a spin; the
// poster then polls nothing itself: the poller resumes once the last
// spinner or poster leaves.
func (w *waiter) posting(begin bool) {
	switch {
	case !w.postAside:
	case begin:
		w.sp.spinStart()
	default:
		w.sp.spinEnd()
	}
}

// waiter is a connection's waiting policy, fixed at setup.
type waiter struct {
	mode     PollMode
	spinTime time.Duration
	sp       spinner
	// postAside makes a post count as a spin (see posting): the
	// device's poller steps aside until it returns. On siw a post is a
	// system call that transmits the data (and, to a peer on the same
	// host, runs its receive too): 0.6 ms for 64 KiB in the test bed. The
	// poller's idle polls meanwhile only took CPU from that transmit, and
	// the CQ it armed then cost an event per completion. Measured on siw
	// (interleaved, pinned): the 64 KiB stream 74-79 -> 85-87 MB/s, 4 KiB
	// 67-68 -> 69-74 MB/s. On rxe it cost the streams 1-6 % and 20 HTTP
	// clients 8-13 %: there a poller that keeps polling during the
	// (shorter) posts dispatches other connections' completions sooner.
	postAside bool
	// alone says that whatever ends a wait (Close, the deadline) also
	// signals its ready channel, so that a park waits on that channel
	// alone: a select over it, closing and the deadline's channel locks
	// all three, twice, and cost a parked Read about a tenth of a 64 B
	// round trip between a client and a server goroutine over the
	// zero-cost provider.
	alone bool
	// skipped counts the adaptive waits that parked at once for the
	// recent waits' length (see adaptiveBudget); both directions and
	// one-sided waits share it.
	skipped atomic.Uint32
}

// adaptiveBudget is how long an adaptive wait spins, given avg, the
// moving average of its kind's recent waits: SpinTime, or, when those
// waits were shorter than maxAdaptiveSpin, twice their average if that is
// longer. When they were longer than both, a spin would not have caught
// them, and where the provider does a message's receive work on this
// host's CPUs a spin delays it (see idlePhase): the wait parks at once.
// Every probeEvery-th such wait spins all the same: a parked wait counts
// its wakeup too, and where wakeups are slow (the process's CPUs busy)
// parked waits alone might never bring the average down again once the
// peer answers quickly.
func (w *waiter) adaptiveBudget(avg time.Duration) time.Duration {
	budget := w.spinTime
	if avg < maxAdaptiveSpin {
		return max(budget, 2*avg)
	}
	if avg > max(budget, maxAdaptiveSpin) && w.skipped.Add(1)%probeEvery != 0 {
		return 0
	}
	return budget
}

// nextAvgWait returns avg, a moving average of waits, with a wait that
// took d folded in (an eighth of the difference). A wait that ended in a
// park counts its wakeup too. Clipped at twice maxAdaptiveSpin, the
// average comes back under maxAdaptiveSpin within six short waits however
// long the waits before them were.
func nextAvgWait(avg, d time.Duration) time.Duration {
	return avg + (min(d, 2*maxAdaptiveSpin)-avg)/8
}

// wait blocks until ready is signaled, closing is closed or the deadline
// passes. With PollBusy it spins (see spin) all along. With PollAdaptive it
// first spins for adaptiveBudget: a stream whose messages come every few
// hundred microseconds is then caught without parking, while a quiet
// connection parks after SpinTime, and one whose waits are long parks at
// once. avg is the direction's moving average, guarded by the caller
// (Conn's Read or Write turn). The caller holds no lock besides that
// one. It reports whether the wait ended while spinning, not parked.
func (w *waiter) wait(ready, closing chan struct{}, dl *deadline, avg *time.Duration) (spun bool) {
	if w.mode == PollAdaptive {
		// The completion waited for is often in the CQ already (a reply
		// that came while this side was sending): one poll first, before
		// the clock, the spin gate and the budget, which cost together a
		// fifth of a 64 B round trip over the zero-cost provider. Such a
		// wait took next to nothing, and counts as a wait of zero.
		if w.sp.tryPoll(); len(ready) > 0 {
			select {
			case <-ready:
				*avg = nextAvgWait(*avg, 0)
				return true
			default:
			}
		}
	}
	start := w.clock()
	switch w.mode {
	case PollBusy:
		// In slices, so that a deadline is noticed.
		for w.spin(ready, closing, time.Millisecond, time.Time{}) && !dl.expired() {
		}
		spun = true
	case PollAdaptive:
		budget := w.adaptiveBudget(*avg)
		if budget > 0 && adaptiveSpins.enter() {
			spun = !w.spin(ready, closing, budget, start)
			adaptiveSpins.leave()
		}
	}
	// A spin usually ends with ready signaled: take it without the
	// select below, which locks all three channels (a tenth of a 64 B
	// round trip's CPU over the zero-cost provider).
	select {
	case <-ready:
		w.noteWait(start, avg)
		return spun
	default:
	}
	w.park(ready, closing, dl, start, avg)
	return spun
}

// park blocks without spinning until ready is signaled, closing is
// closed or the deadline passes, for a wait whose spin is over (wait's
// own, or Conn.spinReadHeld's); a wait that ends with ready is folded
// into avg from start. It reports false: the wait ended parked.
func (w *waiter) park(ready, closing chan struct{}, dl *deadline, start time.Time, avg *time.Duration) bool {
	if w.alone {
		<-ready
		if !isClosed(closing) && !dl.expired() {
			w.noteWait(start, avg)
		}
		return false
	}
	select {
	case <-ready:
		w.noteWait(start, avg)
	case <-closing:
	case <-dl.wait():
	}
	return false
}

// noteWait folds a wait that started at start and ended with ready into
// avg, for the modes that keep one (see clock).
func (w *waiter) noteWait(start time.Time, avg *time.Duration) {
	if !start.IsZero() {
		*avg = nextAvgWait(*avg, time.Since(start))
	}
}

// clock returns the time a wait starts, for the moving average of waits,
// which only PollAdaptive reads (adaptiveBudget); the zero time in the
// other modes, which read no clock for it. A clock read costs about as
// much as a poll: on the development machine the three a wait made were a
// fifth of the CPU of a 64 B round trip over the zero-cost provider.
func (w *waiter) clock() time.Time {
	if w.mode != PollAdaptive {
		return time.Time{}
	}
	return time.Now()
}

// spin polls the CQ from the waiting goroutine for up to budget from
// start, or until ready is signaled or closing is closed: a reply that
// comes soon (the other half of a round trip) then costs no goroutine
// handoff and no wakeup. It reports whether it stopped for the budget.
// With a zero start the budget runs from the first look at the clock,
// spinCheck polls in: a reply caught before then costs no clock read.
func (w *waiter) spin(ready, closing chan struct{}, budget time.Duration, start time.Time) bool {
	// One poll before counting as a spinner: the completion waited for
	// is often in the CQ already (a reply that came while this side was
	// sending), and then the poller need not step aside, and two atomic
	// updates of the count (an eighth of the poll's cost) are saved.
	if w.sp.tryPoll(); len(ready) > 0 {
		return false
	}
	w.sp.spinStart()
	defer w.sp.spinEnd()
	for i := 1; len(ready) == 0 && !isClosed(closing); i++ {
		w.sp.tryPoll()
		if len(ready) > 0 {
			return false
		}
		if i%spinCheck == 0 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > budget {
				return true
			}
			runtime.Gosched()
		}
	}
	return false
}

// spinGate bounds the goroutines that spin at once. A spinner polls the
// CQ for everyone (tryPoll dispatches every completion it finds), so a
// second one adds little; and each takes a CPU from the process's other
// goroutines, which, with twenty connections waiting for their round
// trips on one or two CPUs, are the ones that would send the next request.
// Waits past the bound park at once and are woken by whoever polls.
type spinGate struct {
	n     atomic.Int32
	limit func() int32 // the bound (GOMAXPROCS may change: see bound)
	// cached is limit's last answer, entries the entries since: reading
	// GOMAXPROCS takes the scheduler's global lock, so the bound is read
	// again only every gateRefresh entries.
	cached  atomic.Int32
	entries atomic.Uint32
}

// gateRefresh is how many entries of a gate use one reading of its bound.
const gateRefresh = 1024

// bound is the gate's bound, read again every gateRefresh entries.
func (g *spinGate) bound() int32 {
	if g.entries.Add(1)%gateRefresh == 1 {
		g.cached.Store(g.limit())
	}
	return g.cached.Load()
}

// adaptiveSpins is the gate of PollAdaptive's spins: all but one of the
// process's Ps (at least one), so that a spinner never holds the last P.
// PollBusy spins are not gated: that mode asks for a CPU per waiter.
var adaptiveSpins = spinGate{limit: func() int32 { return int32(max(1, runtime.GOMAXPROCS(0)-1)) }}

// enter takes a spinning slot, if one is free.
func (g *spinGate) enter() bool {
	if g.n.Add(1) > g.bound() {
		g.n.Add(-1)
		return false
	}
	return true
}

// leave gives a slot of enter back.
func (g *spinGate) leave() { g.n.Add(-1) }

// signal wakes the waiter of a capacity-1 channel, if it is not already
// signaled.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// doneFlag is a one-sided operation's completion as its waiter sees it:
// a flag a spinning wait reads, and a channel the completion signals only
// once the waiter has said it parks. A signal through the channel at every
// completion, and its receive, cost a fifth of a 64 B READ over the
// zero-cost provider. The completion sets fin, then looks at parked; the
// waiter sets parked, then looks at fin (both sequentially consistent):
// at least one of them sees the other's store, so a parked waiter is
// always signaled.
type doneFlag struct {
	fin    atomic.Bool
	parked atomic.Bool
	ch     chan struct{} // capacity 1
}

// set records the completion and wakes a parked waiter; the caller holds
// the lock that orders the slot's uses (Conn.mu), so that the slot's next
// reset comes after the signal.
func (d *doneFlag) set() {
	d.fin.Store(true)
	if d.parked.Load() {
		signal(d.ch)
	}
}

// isSet reports whether the completion arrived.
func (d *doneFlag) isSet() bool { return d.fin.Load() }

// reset makes the flag ready for the slot's next operation, taking back a
// signal its last waiter did not receive (it saw fin first); the caller
// holds the lock that orders the slot's uses.
func (d *doneFlag) reset() {
	d.fin.Store(false)
	d.parked.Store(false)
	select {
	case <-d.ch:
	default:
	}
}

// waitDone waits, for a one-sided operation, until done is set or ctx is
// done, as the connection's Reads and Writes wait (the mode): an
// operation takes about a round trip, which spinning catches without a
// wakeup. avg is the moving average of such waits, which stretches an
// adaptive spin as a Read's average does; start is when the wait began
// (clock).
func (w *waiter) waitDone(ctx context.Context, done *doneFlag, closing chan struct{}, avg time.Duration, start time.Time) {
	switch w.mode {
	case PollBusy:
		w.spinUntil(ctx, done, closing, -1, start)
	case PollAdaptive:
		budget := w.adaptiveBudget(avg)
		if budget > 0 && adaptiveSpins.enter() {
			w.spinUntil(ctx, done, closing, budget, start)
			adaptiveSpins.leave()
		}
	}
	if done.isSet() {
		return
	}
	done.parked.Store(true)
	if done.isSet() {
		return
	}
	select {
	case <-done.ch:
	case <-ctx.Done():
	}
}

// spinUntil polls the completion queue until done is set, ctx is done,
// closing is closed or, with a budget of zero or more, the budget from
// start passes. It looks at the clock and yields to the process's other
// goroutines less often than spin: an operation's completion follows its
// post within a round trip, which polls in a tighter loop catch sooner
// (in the test bed, 4 KiB READs' median fell by 10-40 %).
func (w *waiter) spinUntil(ctx context.Context, done *doneFlag, closing chan struct{}, budget time.Duration, start time.Time) {
	// One poll first, as in spin.
	if w.sp.tryPoll(); done.isSet() {
		return
	}
	w.sp.spinStart()
	defer w.sp.spinEnd()
	if budget >= 0 && start.IsZero() {
		start = time.Now()
	}
	for i := 1; !done.isSet(); i++ {
		w.sp.tryPoll()
		if i%oneSidedSpinCheck == 0 {
			if (budget >= 0 && time.Since(start) > budget) || ctx.Err() != nil || isClosed(closing) {
				return
			}
			runtime.Gosched()
		}
	}
}

// oneSidedSpinCheck is how many polls a one-sided wait makes between looks
// at the clock and yields.
const oneSidedSpinCheck = 64
