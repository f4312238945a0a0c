package rdma

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// fakeCQ hands out scripted batches of completions, then nothing.
type fakeCQ struct {
	mu        sync.Mutex
	batches   [][]ibv.WC
	polls     int
	armed     int
	armErr    error
	onArm     func()
	pollErr   error
	lastLimit int
	// clock, if set, advances by pollCost at each poll.
	clock    *fakeClock
	pollCost time.Duration
}

// fakeClock is a clock that moves only when told to.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func (q *fakeCQ) Poll(wcs []ibv.WC) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.polls++
	q.lastLimit = len(wcs)
	if q.clock != nil {
		q.clock.advance(q.pollCost)
	}
	if q.pollErr != nil {
		return 0, q.pollErr
	}
	if len(q.batches) == 0 {
		return 0, nil
	}
	n := copy(wcs, q.batches[0])
	q.batches[0] = q.batches[0][n:]
	if len(q.batches[0]) == 0 {
		q.batches = q.batches[1:]
	}
	return n, nil
}

func (q *fakeCQ) add(wcs ...ibv.WC) {
	q.mu.Lock()
	q.batches = append(q.batches, wcs)
	q.mu.Unlock()
}

func (q *fakeCQ) ReqNotify() error {
	q.mu.Lock()
	q.armed++
	f, err := q.onArm, q.armErr
	q.mu.Unlock()
	if f != nil {
		f()
	}
	return err
}

// fakeChannel parks Wait until an event is sent or it is interrupted.
type fakeChannel struct {
	events chan struct{}
	closed chan struct{}
	once   sync.Once
	waits  chan struct{} // signaled when a Wait starts
}

func newFakeChannel() *fakeChannel {
	return &fakeChannel{events: make(chan struct{}, 1), closed: make(chan struct{}), waits: make(chan struct{}, 16)}
}

func (ch *fakeChannel) Wait() error {
	ch.waits <- struct{}{}
	select {
	case <-ch.events:
		return nil
	case <-ch.closed:
		return errors.New("interrupted")
	}
}

func (ch *fakeChannel) interrupt() { ch.once.Do(func() { close(ch.closed) }) }

// fakeCompleter records its completions and flushes.
type fakeCompleter struct {
	p         *poller
	mu        sync.Mutex
	got       []ibv.WC
	wantFlush bool
	flushes   int
	lockedCQ  bool // cqMu was held during a flush
	done      chan struct{}
	failed    []error // failAsync's errors
	removed   bool
}

func (c *fakeCompleter) failAsync(err error, removed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed = append(c.failed, err)
	c.removed = c.removed || removed
}

func (c *fakeCompleter) failures() ([]error, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.failed...), c.removed
}

func (c *fakeCompleter) complete(wc ibv.WC) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, wc)
	if c.done != nil {
		signal(c.done)
	}
	return c.wantFlush
}

func (c *fakeCompleter) lockAndFlush() {
	free := c.p.cqMu.TryLock()
	if free {
		c.p.cqMu.Unlock()
	}
	c.mu.Lock()
	c.flushes++
	c.lockedCQ = c.lockedCQ || !free
	c.mu.Unlock()
}

func wc(qp uint32, id uint64) ibv.WC { return ibv.WC{QPNum: qp, WRID: id} }

func TestPollerDispatchesBatchToSeveralConnections(t *testing.T) {
	cq := &fakeCQ{}
	p := newPoller(cq, newFakeChannel())
	a := &fakeCompleter{p: p, wantFlush: true}
	b := &fakeCompleter{p: p}
	c := &fakeCompleter{p: p, wantFlush: true}
	p.add(1, a)
	p.add(2, b)
	p.add(3, c)
	cq.add(wc(1, 10), wc(2, 20), wc(1, 11), wc(9, 90), wc(3, 30), wc(1, 12), wc(3, 31))

	var fl [ibv.MaxPollBatch]completer
	require.Equal(t, 7, p.poll(fl[:0]))
	require.Equal(t, []ibv.WC{wc(1, 10), wc(1, 11), wc(1, 12)}, a.got, "in the CQ's order")
	require.Equal(t, []ibv.WC{wc(2, 20)}, b.got)
	require.Equal(t, []ibv.WC{wc(3, 30), wc(3, 31)}, c.got)
	require.Equal(t, 1, a.flushes, "a connection is flushed once per batch")
	require.Zero(t, b.flushes, "nothing to post, no flush")
	require.Equal(t, 1, c.flushes)
	require.False(t, a.lockedCQ || c.lockedCQ, "flushes run after the CQ lock is released")

	// A torn-down connection's late completions are dropped.
	p.remove(1)
	cq.add(wc(1, 13), wc(2, 21))
	require.Equal(t, 2, p.poll(fl[:0]))
	require.Len(t, a.got, 3)
	require.Len(t, b.got, 2)

	cq.pollErr = errors.New("poll failed")
	require.Zero(t, p.poll(fl[:0]), "a failing poll dispatches nothing")
	require.True(t, p.cqMu.TryLock(), "and leaves the CQ unlocked")
	p.cqMu.Unlock()
}

// TestPollerRetiredQP: completions of a QP being destroyed, or left in
// the CQ by its destroy, never reach the connection of a new QP that the
// provider gives the same number (siw does, at once).
func TestPollerRetiredQP(t *testing.T) {
	cq := &fakeCQ{}
	p := newPoller(cq, newFakeChannel())
	old, other := &fakeCompleter{p: p}, &fakeCompleter{p: p}
	p.add(5, old)
	p.add(6, other)
	p.retire(5)
	var fl [ibv.MaxPollBatch]completer
	cq.add(wc(5, 1), wc(6, 1))
	require.Equal(t, 2, p.poll(fl[:0]))
	require.Empty(t, old.got, "a retired QP's completions are dropped")
	require.Len(t, other.got, 1)

	// The destroy flushed more than a batch into the CQ; then the number
	// comes back for a new QP before anyone polled.
	stale := make([]ibv.WC, ibv.MaxPollBatch+3)
	for i := range stale {
		stale[i] = wc(5, uint64(100+i))
	}
	cq.add(stale...)
	fresh := &fakeCompleter{p: p}
	p.add(5, fresh)
	require.Empty(t, fresh.got, "none of the old QP's completions")
	require.Empty(t, old.got)
	cq.add(wc(5, 7))
	require.Equal(t, 1, p.poll(fl[:0]))
	require.Equal(t, []ibv.WC{wc(5, 7)}, fresh.got, "the new QP's own")

	// forget after the number was taken again leaves the new QP alone.
	p.forget(5)
	require.Same(t, completer(fresh), p.conn(5))

	// forget without a new QP drops what the destroy left, then the
	// entry.
	p.retire(6)
	cq.add(wc(6, 2), wc(6, 3))
	p.forget(6)
	require.Nil(t, p.conn(6))
	require.Len(t, other.got, 1)
	require.True(t, p.cqMu.TryLock(), "and leaves the CQ unlocked")
	p.cqMu.Unlock()
}

func TestPollerTryPoll(t *testing.T) {
	cq := &fakeCQ{}
	p := newPoller(cq, newFakeChannel())
	a := &fakeCompleter{p: p}
	p.add(1, a)
	cq.add(wc(1, 1))

	p.cqMu.Lock()
	p.tryPoll()
	require.Zero(t, cq.polls, "another goroutine is polling: a spinner does not wait for it")
	p.cqMu.Unlock()

	p.tryPoll()
	require.Equal(t, 1, cq.polls)
	require.Equal(t, spinBatch, cq.lastLimit)
	require.Len(t, a.got, 1)
}

func TestPollerRunParksAndWakes(t *testing.T) {
	cq := &fakeCQ{}
	ch := newFakeChannel()
	p := newPoller(cq, ch)
	a := &fakeCompleter{p: p, done: make(chan struct{}, 1)}
	p.add(1, a)
	go p.run()

	// Idle: it spins idlePolls times, arms the CQ and parks.
	<-ch.waits
	cq.mu.Lock()
	require.Equal(t, 1, cq.armed)
	require.Equal(t, idlePolls+2, cq.polls, "a poll per idle round, and one after arming")
	cq.mu.Unlock()

	// An event wakes it and the completion is dispatched.
	cq.add(wc(1, 5))
	ch.events <- struct{}{}
	<-a.done
	<-ch.waits // parked again

	// A completion that lands between arming and parking is not lost: the
	// poll after arming finds it.
	cq.mu.Lock()
	var once sync.Once
	cq.onArm = func() { once.Do(func() { cq.add(wc(1, 6)) }) }
	cq.mu.Unlock()
	ch.events <- struct{}{}
	<-a.done
	<-ch.waits
	a.mu.Lock()
	require.Equal(t, []ibv.WC{wc(1, 5), wc(1, 6)}, a.got)
	a.mu.Unlock()

	p.shutdown(ch.interrupt)
	select {
	case <-p.done:
	default:
		t.Fatal("shutdown returned before run")
	}
}

// The idle phase follows the parks: a park longer than a full phase halves
// it, down to none; one shorter than a full phase, or a phase that finds a
// completion, restores it; without one, every probeEvery-th phase is full.
func TestIdlePhase(t *testing.T) {
	s := newIdlePhase()
	require.Equal(t, idlePolls, s.next())
	s.spent(idlePolls, idlePolls*10*time.Microsecond) // 10 µs a poll
	require.Equal(t, 10*time.Microsecond, s.perPoll)
	full := idlePolls * s.perPoll
	for want := idlePolls / 2; want >= 0; want /= 2 {
		s.parked(full + time.Microsecond)
		require.Equal(t, want, s.polls)
		if want == 0 {
			break
		}
		require.Equal(t, want, s.next())
	}
	s.parked(full + time.Microsecond)
	require.Zero(t, s.polls, "none stays none while parks are long")
	for i := 1; i < 2*probeEvery; i++ {
		want := 0
		if i%probeEvery == 0 {
			want = idlePolls
		}
		require.Equal(t, want, s.next(), "phase %d", i)
	}
	s.parked(full - time.Microsecond)
	require.Equal(t, idlePolls, s.next(), "a park the phase would have caught restores it")

	s.polls = 0
	s.caught()
	require.Equal(t, idlePolls, s.next(), "a phase that found a completion restores it")

	// The cost of a poll is a moving average: one slow phase moves it by
	// an eighth of the difference.
	s.spent(1, 90*time.Microsecond)
	require.Equal(t, 20*time.Microsecond, s.perPoll)
}

// The poller goroutine adapts its idle phase: parks longer than the phase
// leave it without idle polls, and a short one brings them back. Its clock
// is a fake one that each poll moves by 10 µs, so that a full phase lasts
// 640 µs whatever the machine's load.
func TestPollerIdlePhaseFollowsParks(t *testing.T) {
	clk := &fakeClock{}
	cq := &fakeCQ{clock: clk, pollCost: 10 * time.Microsecond}
	ch := newFakeChannel()
	p := newPoller(cq, ch)
	p.now = clk.now
	go p.run()
	polls := func() int {
		cq.mu.Lock()
		defer cq.mu.Unlock()
		return cq.polls
	}
	<-ch.waits // parked after a full idle phase
	for range 8 {
		clk.advance(10 * time.Millisecond) // a long park
		ch.events <- struct{}{}
		<-ch.waits
	}
	before := polls()
	clk.advance(10 * time.Millisecond)
	ch.events <- struct{}{}
	<-ch.waits
	require.Equal(t, 2, polls()-before, "after long parks: a poll, no idle phase, one after arming")
	// A park that ends at once (sooner than a phase lasts) restores it.
	before = polls()
	ch.events <- struct{}{}
	<-ch.waits
	require.Equal(t, idlePolls+2, polls()-before)
	p.shutdown(ch.interrupt)
}

func TestPollerStepsAsideForSpinners(t *testing.T) {
	cq := &fakeCQ{}
	ch := newFakeChannel()
	p := newPoller(cq, ch)
	p.spinStart()
	go p.run()
	time.Sleep(10 * time.Millisecond)
	cq.mu.Lock()
	polls, armed := cq.polls, cq.armed
	cq.mu.Unlock()
	require.Zero(t, armed, "while a Read spins, the poller neither arms the CQ nor parks on it")
	require.LessOrEqual(t, polls, 2)

	p.spinEnd() // the last spinner wakes it
	<-ch.waits
	p.shutdown(ch.interrupt)
}

// A CQ that cannot be armed for a moment (ENOMEM) costs a pause, not its
// connections: the poller tries again, and keeps dispatching meanwhile.
func TestPollerRetriesArming(t *testing.T) {
	cq := &fakeCQ{}
	fails := 3
	cq.armErr = errors.New("arm failed")
	cq.onArm = func() {
		cq.mu.Lock()
		defer cq.mu.Unlock()
		if fails--; fails < 0 {
			cq.armErr = nil
		}
	}
	ch := newFakeChannel()
	p := newPoller(cq, ch)
	c := &fakeCompleter{p: p, done: make(chan struct{}, 1)}
	p.add(7, c)
	go p.run()
	<-ch.waits // armed at last, and parked
	cq.add(ibv.WC{QPNum: 7, WRID: 1})
	ch.events <- struct{}{}
	<-c.done
	failed, _ := c.failures()
	require.Empty(t, failed, "a failure that passes fails no connection")
	p.shutdown(ch.interrupt)
}

// A CQ whose arming keeps failing fails its connections with the error,
// tells the device, and is polled without events until it is shut down.
func TestPollerLosesEventsWhenArmingKeepsFailing(t *testing.T) {
	armErr := errors.New("arm failed")
	cq := &fakeCQ{armErr: armErr}
	ch := newFakeChannel()
	p := newPoller(cq, ch)
	lost := make(chan error, 1)
	p.onLost = func(err error) { lost <- err }
	c := &fakeCompleter{p: p, done: make(chan struct{}, 1)}
	p.add(7, c)
	go p.run()
	var err error
	select {
	case err = <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the poller did not give up")
	}
	require.ErrorIs(t, err, armErr)
	failed, removed := c.failures()
	require.Len(t, failed, 1)
	require.ErrorIs(t, failed[0], armErr)
	require.Contains(t, failed[0].Error(), "completion events lost")
	require.False(t, removed)

	// Completions still reach the connection (its teardown waits for its
	// flushed work requests).
	cq.add(ibv.WC{QPNum: 7, WRID: 2})
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a completion after the loss was not dispatched")
	}
	p.shutdown(ch.interrupt)
}

// So does a completion channel whose reads keep failing.
func TestPollerLosesEventsWhenWaitKeepsFailing(t *testing.T) {
	cq := &fakeCQ{}
	waitErr := errors.New("ibv_get_cq_event failed")
	p := newPoller(cq, failingChannel{waitErr})
	lost := make(chan error, 1)
	p.onLost = func(err error) { lost <- err }
	c := &fakeCompleter{p: p}
	p.add(7, c)
	go p.run()
	select {
	case err := <-lost:
		require.ErrorIs(t, err, waitErr)
	case <-time.After(10 * time.Second):
		t.Fatal("the poller did not give up")
	}
	failed, _ := c.failures()
	require.Len(t, failed, 1)
	p.shutdown(func() {})
}

type failingChannel struct{ err error }

func (f failingChannel) Wait() error { return f.err }

// Once the poller is shut down, a spinning Read or one-sided wait polls
// the CQ no more: the device destroys it next.
func TestPollerTryPollAfterShutdown(t *testing.T) {
	cq := &fakeCQ{}
	ch := newFakeChannel()
	p := newPoller(cq, ch)
	a := &fakeCompleter{p: p}
	p.add(1, a)
	go p.run()
	<-ch.waits
	p.shutdown(ch.interrupt)
	cq.mu.Lock()
	polls := cq.polls
	cq.mu.Unlock()

	cq.add(wc(1, 1))
	p.spinStart()
	for range 100 {
		p.tryPoll()
	}
	p.spinEnd()
	cq.mu.Lock()
	require.Equal(t, polls, cq.polls, "no poll after shutdown")
	cq.mu.Unlock()
	require.Empty(t, a.got)
	require.True(t, p.cqMu.TryLock(), "tryPoll leaves the CQ unlocked")
	p.cqMu.Unlock()
}

// Pollers spin in their idle phase only while they hold one of a bounded
// number of slots; one that finds none arms its CQ and parks at once, and
// every way out of a phase gives the slot back.
func TestPollerIdleSlots(t *testing.T) {
	slots := &idleSlots{}
	slots.follow(2)
	require.True(t, slots.take(), "the only slot of 2 Ps")
	require.False(t, slots.take(), "half the Ps: one slot")

	cq := &fakeCQ{}
	ch := newFakeChannel()
	p := newPoller(cq, ch)
	p.idlers = slots
	go p.run()
	<-ch.waits
	cq.mu.Lock()
	require.Equal(t, 2, cq.polls, "no slot: a poll, no idle phase, one after arming")
	cq.mu.Unlock()

	slots.give()
	ch.events <- struct{}{}
	<-ch.waits
	cq.mu.Lock()
	// (The phase is shorter than idlePolls: the park before it was longer
	// than a phase whose polls cost nothing so far, see idlePhase.)
	require.Greater(t, cq.polls, 2+2, "with the slot free: an idle phase")
	cq.mu.Unlock()
	require.Zero(t, slots.n.Load(), "parked: the slot is given back")

	// A phase that catches a completion gives it back too.
	a := &fakeCompleter{p: p, done: make(chan struct{}, 1)}
	p.add(1, a)
	var once sync.Once
	cq.mu.Lock()
	cq.onArm = func() { once.Do(func() { cq.add(wc(1, 1)) }) }
	cq.mu.Unlock()
	ch.events <- struct{}{}
	<-a.done
	<-ch.waits
	require.Zero(t, slots.n.Load())
	p.shutdown(ch.interrupt)
	require.Zero(t, slots.n.Load())

	big := &idleSlots{}
	big.follow(16)
	require.EqualValues(t, 8, big.max.Load())
}

// newRing makes n pollers over fake CQs in one ring, as a device's.
func newRing(n int) ([]*poller, []*fakeCQ) {
	ring := &cqRing{}
	ps := make([]*poller, n)
	cqs := make([]*fakeCQ, n)
	for i := range ps {
		cqs[i] = &fakeCQ{}
		ps[i] = newPoller(cqs[i], newFakeChannel())
		ps[i].ring = ring
	}
	ring.set(ps)
	return ps, cqs
}

// Whichever poller polls, it takes the device's CQs in turn, a batch
// each, skipping one that another goroutine is polling; a round that
// finds nothing reports nothing.
func TestPollerPollsTheRingInTurn(t *testing.T) {
	ps, cqs := newRing(3)
	var got []*fakeCompleter
	for i := range ps {
		c := &fakeCompleter{p: ps[i]}
		ps[i].add(uint32(i+1), c)
		// Two batches each: one poll takes one.
		cqs[i].add(wc(uint32(i+1), 1))
		cqs[i].add(wc(uint32(i+1), 2))
		got = append(got, c)
	}
	var fl [ibv.MaxPollBatch]completer
	for range 3 {
		require.Equal(t, 1, ps[0].pollTurn(fl[:0]))
	}
	for i, c := range got {
		require.Len(t, c.got, 1, "CQ %d: one batch per turn", i)
	}
	// The second round, with CQ 2 held by another goroutine: it is left
	// to that one, and its batch stays in the CQ.
	next := int(ps[0].ring.next.Load()+1) % 3
	held := ps[(next+1)%3]
	held.cqMu.Lock()
	require.Equal(t, 1, ps[1].pollTurn(fl[:0]))
	require.Equal(t, 1, ps[2].pollTurn(fl[:0]), "the held CQ is skipped")
	require.Zero(t, ps[1].pollTurn(fl[:0]), "a round of empty or held CQs")
	held.cqMu.Unlock()
	require.Equal(t, 1, ps[0].pollTurn(fl[:0]))
	for i, c := range got {
		require.Len(t, c.got, 2, "CQ %d", i)
	}

	// A poller goroutine serves the other CQs before it parks on its own.
	for i := 1; i < 3; i++ {
		cqs[i].add(wc(uint32(i+1), 3))
	}
	ch := ps[0].ch.(*fakeChannel)
	go ps[0].run()
	<-ch.waits
	for i := 1; i < 3; i++ {
		require.Len(t, got[i].got, 3, "CQ %d served before the park", i)
	}
	ps[0].shutdown(ch.interrupt)
}

// While pollerMax Reads that polls woke wait to run, the poller goroutine
// polls nothing and yields; past the spinners' bound, a spinning Read's
// or Write's poll polls nothing either.
func TestPollerWaitsForWokenReads(t *testing.T) {
	cq := &fakeCQ{}
	ch := newFakeChannel()
	p := newPoller(cq, ch)
	c := &fakeCompleter{p: p, done: make(chan struct{}, 1)}
	p.add(1, c)
	cq.add(wc(1, 1))
	polls := func() int {
		cq.mu.Lock()
		defer cq.mu.Unlock()
		return cq.polls
	}

	wokenReads.add(wokenReads.spinnerMax.Load())
	p.tryPoll()
	require.Zero(t, polls(), "a spinner leaves the CQ to the pollers")

	wokenReads.add(pollerMax - wokenReads.spinnerMax.Load())
	go p.run()
	time.Sleep(10 * time.Millisecond)
	require.Zero(t, polls(), "the poller waits for the woken Reads")
	wokenReads.add(-pollerMax)
	<-c.done
	<-ch.waits
	p.shutdown(ch.interrupt)
	require.Zero(t, wokenReads.n.Load())
}

func TestWokenCountFollowsProcs(t *testing.T) {
	var w wokenCount
	w.follow(1)
	require.EqualValues(t, 2, w.spinnerMax.Load())
	w.follow(16)
	require.EqualValues(t, 16, w.spinnerMax.Load())
	w.add(15)
	require.False(t, w.spinnersFull())
	w.add(1)
	require.True(t, w.spinnersFull())
	require.False(t, w.pollersFull())
	w.add(pollerMax - 16)
	require.True(t, w.pollersFull())
}
