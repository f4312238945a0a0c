package rdma

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The inbox takes events without waiting, whatever its handler is doing,
// and hands them over in order, one at a time.
func TestInboxOrderAndNoWait(t *testing.T) {
	var b inbox[int]
	var mu sync.Mutex
	var got []int
	block := make(chan struct{})
	handle := func(ev int) {
		if ev == 0 {
			<-block // a handler stuck on a connection's lock, say
		}
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
	}
	posted := make(chan struct{})
	go func() {
		for i := range 100 {
			b.post(i, handle)
		}
		close(posted)
	}()
	select {
	case <-posted:
	case <-time.After(10 * time.Second):
		t.Fatal("post waited for a handler")
	}
	close(block)
	b.wait()
	want := make([]int, 100)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, got)

	// Once idle, the next event starts a handler again.
	b.post(100, handle)
	b.wait()
	require.Equal(t, 100, got[len(got)-1])
}

// A handler runs one event at a time: never two at once.
func TestInboxOneAtATime(t *testing.T) {
	var b inbox[int]
	var running, most int
	var mu sync.Mutex
	handle := func(int) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		mu.Lock()
		running--
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				b.post(i, handle)
			}
		}()
	}
	wg.Wait()
	b.wait()
	require.Equal(t, 1, most)
}
