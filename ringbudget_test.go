package rdma

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/wire"
)

func TestRingBudget(t *testing.T) {
	defer func(d time.Duration) { ringRefill = d }(ringRefill)
	ringRefill = time.Second
	var b ringBudget
	t0 := time.Unix(1000, 0)
	for i := range ringBurst {
		require.True(t, b.take(t0), "token %d of a full bucket", i)
	}
	require.False(t, b.take(t0), "the bucket is empty")
	require.False(t, b.take(t0.Add(999*time.Millisecond)), "not a whole refill yet")
	require.True(t, b.take(t0.Add(time.Second)), "one token a second")
	require.False(t, b.take(t0.Add(1500*time.Millisecond)))
	require.True(t, b.take(t0.Add(2*time.Second)))
	require.False(t, b.take(t0.Add(2*time.Second)))

	// A long pause refills it, up to the burst and no more.
	t1 := t0.Add(time.Hour)
	for i := range ringBurst {
		require.True(t, b.take(t1), "token %d after an hour", i)
	}
	require.False(t, b.take(t1))

	// Three seconds give three tokens, counted from when the first of
	// them was spent.
	t2 := t1.Add(3 * time.Second)
	for range 3 {
		require.True(t, b.take(t2))
	}
	require.False(t, b.take(t2))

	// A steady peer at one registration per refill never runs dry.
	var s ringBudget
	for i := range 100 {
		require.True(t, s.take(t0.Add(time.Duration(i)*time.Second)), "registration %d", i)
	}
}

// countingAlloc registers fake rings and counts them.
type countingAlloc struct {
	mu           sync.Mutex
	allocs, live int
}

func (a *countingAlloc) allocRing(size int, remote bool) (*ringMem, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.allocs++
	a.live++
	return &ringMem{buf: make([]byte, size), base: 0x5000000, lkey: 5, rkey: 5, reg: a}, nil
}

func (a *countingAlloc) freeRing(*ringMem) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.live--
}

func (a *countingAlloc) counts() (allocs, live int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.allocs, a.live
}

// A peer that offers a big ring and then the small one again, over and
// over, has this side register and deregister a send ring each time: the
// first ringBurst times, and then the offers are declined (the answer a
// sender short of memory gives) and nothing more is registered, while the
// connection keeps working.
func TestRingOffersPastTheBudgetDeclined(t *testing.T) {
	defer func(d time.Duration) { ringRefill = d }(ringRefill)
	ringRefill = time.Hour // no refill during the test
	p := newFakeConn(t, 8, 4096)
	a := &countingAlloc{}
	p.c.mu.Lock()
	p.c.rs.alloc = a
	big, small := p.c.rs.ownBig, len(p.c.rs.arenaTx.buf)
	p.c.mu.Unlock()
	require.Greater(t, big, small, "a big offer needs a registered send ring")

	ctrl := 0 // control messages sent and not yet acknowledged
	offer := func(size int) uint8 {
		t.Helper()
		b := make([]byte, wire.RingDescLen)
		wire.RingDesc{Addr: 0x7000000, RKey: 3, Size: uint32(size)}.Put(b)
		p.deliver(wire.Header{Type: wire.MsgRing, CtrlAck: uint8(ctrl)}, b)
		ctrl = 0
		var answer uint8
		require.Eventually(t, func() bool {
			for _, wr := range p.sent() {
				h := wire.HeaderOf(wr.Imm)
				if wire.IsControl(h.Type) {
					ctrl++
				}
				if h.Type == wire.MsgSwitched || h.Type == wire.MsgDecline {
					answer = h.Type
				}
			}
			return answer != 0
		}, 5*time.Second, time.Millisecond, "the offer of %d bytes is answered", size)
		p.ack()
		return answer
	}
	const rounds = 3 * ringBurst
	switched := 0
	for i := range rounds {
		switch offer(big) {
		case wire.MsgSwitched:
			switched++
			require.Equal(t, uint8(wire.MsgSwitched), offer(small), "round %d: back to the arena's ring", i)
		case wire.MsgDecline:
		}
	}
	require.Equal(t, ringBurst, switched, "big offers followed until the budget ran out")
	require.Eventually(t, func() bool {
		allocs, live := a.counts()
		return allocs == ringBurst && live == 0
	}, 5*time.Second, time.Millisecond, "ringBurst send rings registered, all given back")

	// The connection still carries data both ways.
	_, err := p.c.Write([]byte("still here"))
	require.NoError(t, err)
	p.deliver(wire.Header{Type: wire.MsgData, CtrlAck: uint8(ctrl)}, []byte("and here"))
	buf := make([]byte, 16)
	n, err := p.c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "and here", string(buf[:n]))
}

// A stream of large messages grows the receive ring only while the budget
// has a token: with none left the ring stays small for now.
func TestRingGrowthWaitsForTheBudget(t *testing.T) {
	defer func(d time.Duration) { ringRefill = d }(ringRefill)
	ringRefill = time.Hour
	for _, spent := range []bool{false, true} {
		p := newFakeConn(t, 8, 4096)
		c := p.c
		c.mu.Lock()
		c.rs.alloc = &countingAlloc{}
		if spent {
			c.rs.budget = ringBudget{used: ringBurst, since: time.Now()}
		}
		c.rs.working = true // the worker is not to run: only the decision is checked
		for range growAfter*c.rx.span/c.rx.maxMsg + 1 {
			c.noteData(c.rx.maxMsg)
		}
		require.Equal(t, !spent, c.rs.wantGrow, "budget spent: %v", spent)
		c.rs.working = false
		c.rs.wantGrow = false
		c.mu.Unlock()
	}
}
