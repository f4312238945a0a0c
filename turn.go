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

// readTurn is a Read with mu and the Read turn held. Both are given back
// by a defer (open-coded: it costs next to nothing), so that a panic
// under them does not leave the connection locked for its Close.
func (c *Conn) readTurn(b []byte) (int, error) {
	c.mu.Lock()
	c.rturn.take(&c.mu)
	defer c.endTurn(&c.rturn)
	return c.read(b)
}

// writeTurn is a Write with mu and the Write turn held, as readTurn.
func (c *Conn) writeTurn(b []byte) (int, error) {
	c.mu.Lock()
	c.wturn.take(&c.mu)
	defer c.endTurn(&c.wturn)
	return c.write(b)
}

// endTurn gives t back and lets go of mu.
func (c *Conn) endTurn(t *turn) {
	t.give()
	c.mu.Unlock()
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
