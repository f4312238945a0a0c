package rdma

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Callers of a turn never hold it at once, and every one gets it, however
// they race.
func TestTurnExclusive(t *testing.T) {
	var mu sync.Mutex
	tn := newTurn()
	inside, most, total := 0, 0, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				mu.Lock()
				tn.take(&mu)
				inside++
				most = max(most, inside)
				// Let go of the lock with the turn held, as a Read's
				// copy or wait does.
				mu.Unlock()
				mu.Lock()
				inside--
				total++
				tn.give()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, most, "one holder at a time")
	require.Equal(t, 8*500, total)
	require.False(t, tn.held)
	require.Zero(t, tn.waits)
}

// A turn given back with nobody waiting leaves no signal behind for a
// later waiter to take by mistake.
func TestTurnNoStaleSignal(t *testing.T) {
	var mu sync.Mutex
	tn := newTurn()
	mu.Lock()
	tn.take(&mu)
	tn.give()
	mu.Unlock()
	require.Zero(t, len(tn.free))
}
