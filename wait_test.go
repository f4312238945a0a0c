package rdma

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeSpinner counts polls; its tryPoll signals ready after a number of
// polls, as a completion found by the spinning goroutine would.
type fakeSpinner struct {
	polls, starts, ends atomic.Int32
	readyAfter          int32 // 0: never
	ready               chan struct{}
	done                *doneFlag // set with ready, for waitDone
}

func (s *fakeSpinner) spinStart() { s.starts.Add(1) }
func (s *fakeSpinner) spinEnd()   { s.ends.Add(1) }
func (s *fakeSpinner) tryPoll() {
	if n := s.polls.Add(1); n == s.readyAfter {
		signal(s.ready)
		if s.done != nil {
			s.done.set()
		}
	}
}

func TestParsePollMode(t *testing.T) {
	for _, m := range []PollMode{PollAdaptive, PollBusy, PollEvent} {
		got, err := ParsePollMode(m.String())
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	_, err := ParsePollMode("spin")
	require.ErrorContains(t, err, `unknown poll mode "spin"`)
	require.Equal(t, "PollMode(7)", PollMode(7).String())
}

func TestWaitBusySpinsUntilReady(t *testing.T) {
	ready := make(chan struct{}, 1)
	sp := &fakeSpinner{readyAfter: 3 * spinCheck, ready: ready}
	w := waiter{mode: PollBusy, sp: sp}
	dl := newDeadline()
	var avg time.Duration
	w.wait(ready, make(chan struct{}), dl, &avg)
	require.Equal(t, 3*spinCheck, int(sp.polls.Load()), "the completion was found by the waiter's own polls")
	require.Equal(t, sp.starts.Load(), sp.ends.Load(), "every spin tells the poller when it ends")
	require.Zero(t, avg, "only an adaptive wait keeps the average it reads")
}

func TestWaitBusyStopsAtDeadlineAndClose(t *testing.T) {
	ready := make(chan struct{}, 1)
	w := waiter{mode: PollBusy, sp: &fakeSpinner{ready: ready}}
	dl := newDeadline()
	dl.set(time.Now().Add(5 * time.Millisecond))
	var avg time.Duration
	w.wait(ready, make(chan struct{}), dl, &avg)
	// It returned because the deadline passed (its timer closed the
	// channel), not on its own. (Elapsed wall time would say the same on a
	// host, but the test bed's guest reads the TSC of whichever vCPU it
	// runs on, and those may disagree by milliseconds.)
	require.True(t, dl.expired(), "the busy wait ended at the deadline")
	require.Zero(t, avg, "a wait that ended without ready does not count")

	closing := make(chan struct{})
	close(closing)
	dl = newDeadline()
	w.wait(ready, closing, dl, &avg)
}

func TestWaitEventParksAtOnce(t *testing.T) {
	ready := make(chan struct{}, 1)
	sp := &fakeSpinner{ready: ready}
	w := waiter{mode: PollEvent, sp: sp}
	dl := newDeadline()
	var avg time.Duration
	go func() {
		time.Sleep(2 * time.Millisecond)
		signal(ready)
	}()
	w.wait(ready, make(chan struct{}), dl, &avg)
	require.Zero(t, sp.polls.Load(), "PollEvent never polls")
	require.Zero(t, avg, "only an adaptive wait keeps the average it reads")
}

// An adaptive wait whose completion is in the CQ already takes it at its
// first poll: no clock, no spin, and it counts as a wait of zero.
func TestWaitAdaptiveFirstPoll(t *testing.T) {
	ready := make(chan struct{}, 1)
	sp := &fakeSpinner{ready: ready, readyAfter: 1}
	w := waiter{mode: PollAdaptive, spinTime: time.Millisecond, sp: sp}
	avg := 8 * time.Microsecond
	require.True(t, w.wait(ready, make(chan struct{}), newDeadline(), &avg), "not parked")
	require.Equal(t, int32(1), sp.polls.Load())
	require.Equal(t, 7*time.Microsecond, avg, "a wait of zero folded in")
	require.Zero(t, sp.starts.Load(), "never counted as a spinner")
}

func TestWaitAdaptive(t *testing.T) {
	ready := make(chan struct{}, 1)
	sp := &fakeSpinner{ready: ready}
	w := waiter{mode: PollAdaptive, spinTime: time.Millisecond, sp: sp}
	dl := newDeadline()
	var signaled atomic.Bool
	go func() {
		time.Sleep(20 * time.Millisecond)
		signaled.Store(true)
		signal(ready)
	}()
	// Recent waits far longer than any spin: it parks at once. The
	// average is clipped at twice maxAdaptiveSpin, so a parked wait
	// cannot drag it far above the spin limit. (No clock is compared: the
	// test bed's vCPUs may disagree about the time.)
	avg := 10 * time.Second
	require.False(t, w.wait(ready, make(chan struct{}), dl, &avg), "parked")
	require.True(t, signaled.Load(), "it waited for the signal")
	require.Equal(t, int32(1), sp.polls.Load(), "after long waits one poll (for a completion already there), no spin")
	require.Less(t, avg, 10*time.Second)
	require.Greater(t, avg, 2*maxAdaptiveSpin)

	// Waits as long, but a SpinTime longer still: it spins first.
	go func() {
		time.Sleep(20 * time.Millisecond)
		signal(ready)
	}()
	w = waiter{mode: PollAdaptive, spinTime: time.Hour, sp: sp}
	avg = maxAdaptiveSpin + time.Microsecond
	require.True(t, w.wait(ready, make(chan struct{}), dl, &avg), "caught spinning")
	require.Greater(t, sp.polls.Load(), int32(2), "it spun")

	// Short recent waits stretch the spin: a reply found after spinTime
	// but within twice the average is still caught spinning. The reply
	// comes with the poll after spinTime's first check, so only a spinner
	// held off the CPU for the whole stretched budget (2 ms) could miss it.
	sp2 := &fakeSpinner{ready: ready, readyAfter: 2 * spinCheck}
	w = waiter{mode: PollAdaptive, spinTime: time.Nanosecond, sp: sp2}
	avg = maxAdaptiveSpin - time.Nanosecond
	require.True(t, w.wait(ready, make(chan struct{}), dl, &avg), "caught spinning")
	require.Equal(t, int32(2*spinCheck), sp2.polls.Load(), "spun past spinTime until the reply")
}

// An adaptive wait's spin: SpinTime, stretched to twice the recent waits'
// average while that is under maxAdaptiveSpin; none while the recent
// waits were longer than both, but for every probeEvery-th such wait.
func TestAdaptiveBudget(t *testing.T) {
	w := waiter{mode: PollAdaptive, spinTime: 50 * time.Microsecond}
	require.Equal(t, 50*time.Microsecond, w.adaptiveBudget(0))
	require.Equal(t, 50*time.Microsecond, w.adaptiveBudget(20*time.Microsecond))
	require.Equal(t, 600*time.Microsecond, w.adaptiveBudget(300*time.Microsecond))
	require.Equal(t, 50*time.Microsecond, w.adaptiveBudget(maxAdaptiveSpin), "at the bound: not stretched, not skipped")
	for i := 1; i <= 2*probeEvery; i++ {
		want := time.Duration(0)
		if i%probeEvery == 0 {
			want = 50 * time.Microsecond
		}
		require.Equal(t, want, w.adaptiveBudget(2*maxAdaptiveSpin), "long wait %d", i)
	}
	long := waiter{mode: PollAdaptive, spinTime: time.Hour}
	require.Equal(t, time.Hour, long.adaptiveBudget(2*maxAdaptiveSpin), "a SpinTime longer than the waits")
}

func TestSpinReportsBudget(t *testing.T) {
	ready := make(chan struct{}, 1)
	w := waiter{sp: &fakeSpinner{ready: ready}}
	require.True(t, w.spin(ready, make(chan struct{}), 0, time.Now()), "an exhausted budget")
	require.True(t, w.spin(ready, make(chan struct{}), 0, time.Time{}), "an exhausted budget, from the first look at the clock")
	signal(ready)
	require.False(t, w.spin(ready, make(chan struct{}), time.Hour, time.Now()), "ready")
}

// Only an adaptive wait reads the clock for its average: the others'
// waits start at the zero time.
func TestWaiterClock(t *testing.T) {
	for _, m := range []PollMode{PollBusy, PollEvent} {
		require.True(t, (&waiter{mode: m}).clock().IsZero(), m.String())
	}
	require.False(t, (&waiter{mode: PollAdaptive}).clock().IsZero())
}

// A one-sided operation's wait follows the connection's mode: busy spins
// until the completion, adaptive spins its budget and then parks, event
// parks at once; each returns when the completion or ctx comes.
func TestWaiterWaitDone(t *testing.T) {
	closing := make(chan struct{})
	newDone := func() *doneFlag { return &doneFlag{ch: make(chan struct{}, 1)} }

	busy := &fakeSpinner{readyAfter: 100, done: newDone()}
	w := waiter{mode: PollBusy, sp: busy}
	w.waitDone(context.Background(), busy.done, closing, 0, w.clock())
	require.GreaterOrEqual(t, busy.polls.Load(), int32(100), "busy: the completion found by polling")
	require.Equal(t, busy.starts.Load(), busy.ends.Load())
	require.False(t, busy.done.parked.Load(), "busy: never parked, so never signaled")

	adaptive := &fakeSpinner{done: newDone()}
	w = waiter{mode: PollAdaptive, spinTime: time.Millisecond, sp: adaptive}
	go func() {
		time.Sleep(20 * time.Millisecond)
		adaptive.done.set()
	}()
	w.waitDone(context.Background(), adaptive.done, closing, 0, w.clock())
	require.Positive(t, adaptive.polls.Load(), "adaptive: spins first")
	require.Equal(t, int32(1), adaptive.ends.Load(), "then parks until the completion")
	require.True(t, adaptive.done.isSet())

	// After long waits, an adaptive one parks at once.
	parker := &fakeSpinner{done: newDone()}
	w = waiter{mode: PollAdaptive, spinTime: time.Millisecond, sp: parker}
	go func() {
		time.Sleep(20 * time.Millisecond)
		parker.done.set()
	}()
	w.waitDone(context.Background(), parker.done, closing, 10*time.Second, w.clock())
	require.Zero(t, parker.polls.Load(), "adaptive after long waits: parks at once")
	require.True(t, parker.done.isSet())

	event := &fakeSpinner{done: newDone()}
	w = waiter{mode: PollEvent, sp: event}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	w.waitDone(ctx, event.done, closing, 0, w.clock())
	require.Zero(t, event.polls.Load(), "event: parks at once")
	require.Error(t, ctx.Err(), "returns on ctx")

	// A busy wait ends with the connection's close, too.
	never := &fakeSpinner{done: newDone()}
	w = waiter{mode: PollBusy, sp: never}
	close(closing)
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	w.waitDone(ctx, never.done, closing, 0, w.clock())
	require.Positive(t, never.polls.Load())
}

// A completion and a waiter that parks at the same moment never miss
// each other: either the waiter sees the flag, or the completion sees
// the waiter parked and signals it. A slot's next use starts with no
// stale signal.
func TestDoneFlagRace(t *testing.T) {
	d := &doneFlag{ch: make(chan struct{}, 1)}
	w := waiter{mode: PollEvent}
	for range 2000 {
		// The slot's lock orders a set before the next reset (see
		// doneFlag.reset): here the setter's end does.
		d.reset()
		set := make(chan struct{})
		go func() { d.set(); close(set) }()
		w.waitDone(context.Background(), d, make(chan struct{}), 0, time.Time{})
		require.True(t, d.isSet())
		<-set
	}
	d.parked.Store(true)
	d.set()
	d.reset()
	require.Zero(t, len(d.ch), "reset takes back a signal nobody received")
	require.False(t, d.isSet())
}

func TestSpinGate(t *testing.T) {
	limit := int32(2)
	g := spinGate{limit: func() int32 { return limit }}
	require.True(t, g.enter())
	require.True(t, g.enter())
	require.False(t, g.enter(), "past the bound a wait parks at once")
	g.leave()
	require.True(t, g.enter(), "a slot given back is taken again")
	limit = 1 // GOMAXPROCS lowered: seen within gateRefresh entries, then no new spinner until one leaves
	g.leave()
	for range gateRefresh {
		if g.enter() {
			g.leave()
		}
	}
	require.False(t, g.enter())
	g.leave()
	require.True(t, g.enter())
	g.leave()
	require.Zero(t, g.n.Load())

	require.GreaterOrEqual(t, adaptiveSpins.limit(), int32(1), "a process always has a spinner")
}
