package rdma

import (
	"sync"
	"sync/atomic"
	"time"
)

// deadline is a settable point in time whose passing closes a channel, so
// a blocked Read or Write can select on it beside its data signal. Moving
// the deadline while a call waits takes effect at once: a later deadline
// re-arms the timer on the same channel, an earlier (or past) one closes it.
type deadline struct {
	mu      sync.Mutex // serializes set and stop
	timer   *time.Timer
	stopped bool                          // by stop: the connection is closed, set does nothing
	cancel  atomic.Pointer[chan struct{}] // closed when the deadline passes
	// wake, if set, runs once the channel is closed: a Conn's parked
	// Read or Write waits on its own channel alone (see waiter.alone),
	// which wake signals.
	wake func()
}

// newDeadline returns a deadline that is not set. Its channel is read
// without the lock: every Read and Write looks at it, and a lock there
// cost a fifth of a small Write.
func newDeadline() *deadline {
	d := new(deadline)
	ch := make(chan struct{})
	d.cancel.Store(&ch)
	return d
}

// set arms the deadline for t; the zero time clears it. It reports false,
// and does nothing, once stop has run: a setter that raced the
// connection's Close then reports the close.
func (d *deadline) set(t time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return false
	}
	d.disarm()

	cancel := *d.cancel.Load()
	closed := isClosed(cancel)
	var dur time.Duration
	if !t.IsZero() {
		dur = time.Until(t)
	}
	if t.IsZero() || dur > 0 {
		// Not (or no longer) passed: a fresh channel if the old one is
		// closed, armed for the future deadline.
		if closed {
			cancel = make(chan struct{})
			d.cancel.Store(&cancel)
		}
		if dur > 0 {
			d.timer = time.AfterFunc(dur, func() { close(cancel); d.woke() })
		}
		return true
	}
	if !closed {
		close(cancel)
		d.woke()
	}
	return true
}

// woke runs wake, if set, for a deadline that has just passed.
func (d *deadline) woke() {
	if d.wake != nil {
		d.wake()
	}
}

// disarm stops the timer, if any, and forgets it; mu is held. A timer
// that already fired has its close of the channel landed when disarm
// returns, so the caller sees the channel as the timer left it.
func (d *deadline) disarm() {
	if d.timer != nil && !d.timer.Stop() {
		<-*d.cancel.Load() // the timer fired; wait for its close to land
	}
	d.timer = nil
}

// wait returns a channel that is closed when the deadline passes.
func (d *deadline) wait() chan struct{} { return *d.cancel.Load() }

// expired reports whether the deadline has passed.
func (d *deadline) expired() bool { return isClosed(d.wait()) }

// stop releases the timer for good: a later set does nothing. A timer
// left recorded after its Stop would look fired to the next set, which
// would then wait for a close that never comes.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.disarm()
	d.stopped = true
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
