package rdma

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Jobs run in order on another goroutine: a job that blocks holds up the
// jobs behind it, never the goroutine that hands them over.
func TestHandoffRunsJobsElsewhereInOrder(t *testing.T) {
	h := &handoff{limit: 8}
	block := make(chan struct{})
	var mu sync.Mutex
	var ran []int
	h.do(func() { <-block })
	for i := range 5 {
		h.do(func() {
			mu.Lock()
			ran = append(ran, i)
			mu.Unlock()
		})
	}
	// do returned while the first job blocks.
	mu.Lock()
	require.Empty(t, ran, "nothing runs past the blocked job")
	mu.Unlock()
	close(block)
	h.wait()
	require.Equal(t, []int{0, 1, 2, 3, 4}, ran)
	h.mu.Lock()
	require.False(t, h.running, "the goroutine is gone once idle")
	h.mu.Unlock()

	// It starts again for the next job.
	done := make(chan struct{})
	h.do(func() { close(done) })
	<-done
	h.wait()
}

// Past limit waiting jobs, the caller runs the job itself: the queue
// stays bounded.
func TestHandoffFullRunsOnTheCaller(t *testing.T) {
	h := &handoff{limit: 2}
	block := make(chan struct{})
	h.do(func() { <-block }) // taken by the goroutine
	require.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.jobs) == 0
	}, 5*time.Second, time.Millisecond)
	queued := 0
	h.do(func() { queued++ })
	h.do(func() { queued++ })
	inline := false
	h.do(func() { inline = true }) // two wait: this one runs here
	require.True(t, inline, "the third waiting job ran on the caller")
	require.Zero(t, queued)
	close(block)
	h.wait()
	require.Equal(t, 2, queued)
}
