package rdma

import "sync"

// An inbox hands a connection's CM events from the CM goroutine to the
// connection. The CM goroutine delivers the events of every id of the
// process, one at a time, and unregister (which every release, every
// failed Dial and Listener.Close calls) waits for the delivery in
// progress: were it to take a connection's lock, a Read or Write holding
// that lock would stall connection setup and teardown for the whole
// process. So it only appends to the inbox, under the inbox's own lock
// (a leaf: nothing else is taken or waited for while it is held), and a
// goroutine of the connection's, started while events wait and none runs,
// handles them in order, taking whatever locks they need.
//
// Lock order, for the record: the CM goroutine holds cmLoop.dispatchMu,
// then cmMu, an inbox's mu or a listener's mu, each briefly and alone (a
// listener's handler starts a new connection's setup on a goroutine of
// its own). A connection's handler, on its inbox's goroutine, takes the
// connection's mu, then, after releasing it, a listener's mu.
type inbox[E any] struct {
	mu      sync.Mutex
	evs     []E
	running bool
	wg      sync.WaitGroup // the handling goroutine
}

// post queues ev for handle (the same function every time), starting
// the handling goroutine if none runs.
func (b *inbox[E]) post(ev E, handle func(E)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.evs = append(b.evs, ev)
	if b.running {
		return
	}
	b.running = true
	b.wg.Add(1)
	go b.run(handle)
}

func (b *inbox[E]) run(handle func(E)) {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		if len(b.evs) == 0 {
			b.running = false
			b.evs = nil
			b.mu.Unlock()
			return
		}
		ev := b.evs[0]
		b.evs = b.evs[1:]
		b.mu.Unlock()
		handle(ev)
	}
}

// wait returns once every event posted so far has been handled. No event
// may be posted during or after it (the id is unregistered first).
func (b *inbox[E]) wait() { b.wg.Wait() }
