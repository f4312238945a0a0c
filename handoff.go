package rdma

import "sync"

// handoff runs jobs on a goroutine of its own, one at a time and in the
// order they came, so that the goroutine that hands them over goes on at
// once: a listener's refusals (the Refused hook, rdma_reject,
// rdma_destroy_id), which would otherwise run on the process's CM
// goroutine and make every connection request and event of the process
// wait behind a flood of bad requests, or behind a slow hook. The
// goroutine exists while there is work. At most limit jobs wait; past
// that the caller runs the job itself, so a flood is slowed where it
// comes in instead of queued without bound. A handoff needs only its
// limit set.
type handoff struct {
	limit   int
	mu      sync.Mutex
	jobs    []func()
	running bool
	busy    inFlight // the goroutine, while it runs
}

// do runs job on the handoff's goroutine, or on the caller's if limit
// jobs already wait.
func (h *handoff) do(job func()) {
	h.mu.Lock()
	if len(h.jobs) >= h.limit {
		h.mu.Unlock()
		job()
		return
	}
	h.jobs = append(h.jobs, job)
	start := !h.running
	if start {
		h.running = true
		h.busy.Add(1)
	}
	h.mu.Unlock()
	if start {
		go h.run()
	}
}

func (h *handoff) run() {
	defer h.busy.Done()
	for {
		h.mu.Lock()
		if len(h.jobs) == 0 {
			h.running = false
			h.jobs = nil // a flood's backing array goes with it
			h.mu.Unlock()
			return
		}
		job := h.jobs[0]
		h.jobs[0] = nil
		h.jobs = h.jobs[1:]
		h.mu.Unlock()
		job()
	}
}

// wait returns once every job handed over so far has run.
func (h *handoff) wait() { h.busy.Wait() }
