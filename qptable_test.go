package rdma

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQPTable(t *testing.T) {
	var tab qpTable
	a, b := &fakeCompleter{}, &fakeCompleter{}
	require.Nil(t, tab.get(7), "an empty table")
	nums := []uint32{0, 7, 0x11, 0x1100, 0x110000, 0xffffff, 0xffffffff}
	for _, n := range nums {
		tab.set(n, a)
	}
	tab.set(7, b) // replaced, not added
	require.Equal(t, len(nums), tab.n)
	require.Same(t, b, tab.get(7))
	require.Same(t, a, tab.get(0xffffff))
	require.Nil(t, tab.get(8), "a neighbour of an entry")
	require.Nil(t, tab.get(0x120000), "a number whose path does not exist")
	tab.set(0x1100, retiredQP{})
	_, retired := tab.get(0x1100).(retiredQP)
	require.True(t, retired)
	seen := map[completer]int{}
	tab.each(func(c completer) { seen[c]++ })
	require.Equal(t, map[completer]int{a: 5, b: 1, retiredQP{}: 1}, seen)
	for _, n := range nums {
		tab.del(n)
	}
	tab.del(8) // nothing there: no change
	require.Zero(t, tab.n)
	require.Nil(t, tab.get(7))
	tab.each(func(completer) { t.Fatal("an entry in an empty table") })
}

// TestQPTableConcurrent has lookups run while entries come and go, as
// dispatch runs while connections are set up and torn down (for the race
// detector: a lookup sees an entry or none, never a torn one).
func TestQPTableConcurrent(t *testing.T) {
	var tab qpTable
	var mu sync.Mutex
	c := &fakeCompleter{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for n := uint32(0); n < 1024; n += 3 {
				if got := tab.get(n << 8); got != nil {
					require.Same(t, c, got)
				}
			}
		}
	}()
	for i := range 2000 {
		n := uint32(i%1024) << 8
		mu.Lock()
		if i%2 == 0 {
			tab.set(n, c)
		} else {
			tab.del(n)
		}
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
}
