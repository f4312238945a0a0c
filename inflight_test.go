package rdma

import (
	"testing"
	"time"
)

// TestInFlight: Wait returns once every Add is retired, and an Add from
// zero while another goroutine waits is allowed (a sync.WaitGroup's
// misuse, which the race detector reports).
func TestInFlight(t *testing.T) {
	var f inFlight
	f.Wait() // nothing in flight
	f.Add(1)
	waited := make(chan struct{})
	go func() {
		f.Wait()
		close(waited)
	}()
	f.Add(1)
	f.Done()
	select {
	case <-waited:
		t.Fatal("Wait returned with one still in flight")
	case <-time.After(20 * time.Millisecond):
	}
	f.Done()
	<-waited
}
