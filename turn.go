package rdma

import "sync"

// turn lets one caller at a time through a connection's direction (its
// Reads, its Writes), under the connection's lock: taking it is a flag
// set inside the critical section the call takes anyway, where a mutex of
// its own cost a Read or a Write one more lock and unlock (about a tenth
// of a 64 B round trip over the zero-cost provider). The turn is held
// while the call lets go of the lock (a copy, a post, a wait), so that
// partial messages stay consistent and Writes do not interleave.
type turn struct {
	held  bool
	waits int           // callers waiting for the turn
	free  chan struct{} // capacity 1: the turn was given back while someone waited
}

func newTurn() turn { return turn{free: make(chan struct{}, 1)} }

// take waits until the turn is free and takes it; mu is held, and let go
// of while waiting. A caller that finds the turn free as it comes takes it
// before a waiter woken for it (as sync.Mutex lets a newcomer in): the
// waiter looks again, and the next give wakes it.
func (t *turn) take(mu *sync.Mutex) {
	for t.held {
		t.waits++
		mu.Unlock()
		<-t.free
		mu.Lock()
		t.waits--
	}
	t.held = true
}

// give gives the turn back and wakes one waiter; mu is held. While a
// waiter is counted, the turn free means a signal is in free or a woken
// waiter is on its way to take it: none is left waiting for ever.
func (t *turn) give() {
	t.held = false
	if t.waits > 0 {
		signal(t.free)
	}
}

// takeTurn takes t for a call that holds no lock (see turn.take).
func (c *Conn) takeTurn(t *turn) {
	c.mu.Lock()
	t.take(&c.mu)
	c.mu.Unlock()
}

// giveTurn gives t back for a call that holds no lock.
func (c *Conn) giveTurn(t *turn) {
	c.mu.Lock()
	t.give()
	c.mu.Unlock()
}
