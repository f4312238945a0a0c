package rdma

import "sync"

// releasing counts the releases of verbs objects that Close left running
// (see teardown).
var releasing inFlight

// inFlight counts work in progress, and Wait waits until there is none.
// Unlike a sync.WaitGroup it may grow from zero while another goroutine
// waits: a connection's Close starts a release while ReleaseIdleDevices
// (in tests) waits for the others.
type inFlight struct {
	mu   sync.Mutex
	cond sync.Cond
	n    int
}

// Add adds d (negative to retire) to the count.
func (f *inFlight) Add(d int) {
	f.mu.Lock()
	f.n += d
	if f.n == 0 && f.cond.L != nil {
		f.cond.Broadcast()
	}
	f.mu.Unlock()
}
