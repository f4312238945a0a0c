package rdma

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/wire"
)

// testFrag is a fragment as the receive path hands it to the reassembler.
type testFrag struct {
	h wire.DgramHeader
	p []byte
}

// testDatagram is a datagram of n bytes whose contents depend on id.
func testDatagram(id uint32, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + int(id)*13 + i>>8)
	}
	return b
}

// fragmentsOf cuts data into fragments of size bytes the way a sender
// does, through the wire codec.
func fragmentsOf(t testing.TB, id uint32, data []byte, size int) []testFrag {
	t.Helper()
	var fs []testFrag
	for off := 0; off < len(data); off += size {
		h := wire.DgramHeader{Port: 9, Fragment: true, ID: id, Total: len(data), Offset: off, FragSize: size}
		msg := make([]byte, h.Len()+min(size, len(data)-off))
		copy(msg[wire.PutDgramHeader(msg, h):], data[off:])
		ph, p, err := wire.ParseDatagram(msg)
		require.NoError(t, err)
		fs = append(fs, testFrag{ph, p})
	}
	require.Len(t, fs, wire.DgramFragments(len(data), size))
	return fs
}

var (
	dgramSrcA = netip.MustParseAddrPort("10.0.0.1:4000")
	dgramSrcB = netip.MustParseAddrPort("10.0.0.2:4000")
	dgramT0   = time.Unix(1000, 0)
)

// feedFrags adds fragments in the order given and returns what completed and
// the drops counted.
func feedFrags(r *reassembler, src netip.AddrPort, fs []testFrag, order []int, now time.Time) (done [][]byte, dropped int) {
	for _, i := range order {
		d, n, _ := r.add(src, fs[i].h, fs[i].p, now)
		dropped += n
		if d != nil {
			done = append(done, d)
		}
	}
	return done, dropped
}

func TestReassemblyOrders(t *testing.T) {
	data := testDatagram(1, 10000)
	for _, tc := range []struct {
		name  string
		order []int // of the 3 fragments of 4080 bytes
	}{
		{"in order", []int{0, 1, 2}},
		{"reversed", []int{2, 1, 0}},
		{"last first", []int{2, 0, 1}},
		{"middle first", []int{1, 2, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReassembler(reassemblyLimits{})
			fs := fragmentsOf(t, 1, data, 4080)
			for k, i := range tc.order {
				d, dropped, _ := r.add(dgramSrcA, fs[i].h, fs[i].p, dgramT0)
				require.Zero(t, dropped)
				if k < len(tc.order)-1 {
					require.Nil(t, d, "complete after %d of 3 fragments", k+1)
					require.Equal(t, 16384, r.held(), "charged its size class")
					continue
				}
				require.Equal(t, data, d)
			}
			require.Zero(t, r.held())
			require.Empty(t, r.partial)
			require.Empty(t, r.sources)
		})
	}
}

func TestReassemblyDuplicates(t *testing.T) {
	r := newReassembler(reassemblyLimits{})
	data := testDatagram(2, 300)
	fs := fragmentsOf(t, 2, data, 64) // 5 fragments
	done, dropped := feedFrags(r, dgramSrcA, fs, []int{0, 0, 1, 1, 1, 3, 3, 2}, dgramT0)
	require.Empty(t, done, "duplicates complete nothing")
	require.Zero(t, dropped, "nor count as drops")
	done, dropped = feedFrags(r, dgramSrcA, fs, []int{4}, dgramT0)
	require.Zero(t, dropped)
	require.Equal(t, [][]byte{data}, done)
	require.Zero(t, r.held())

	// A duplicate after the datagram completed begins nothing.
	done, dropped = feedFrags(r, dgramSrcA, fs, []int{2}, dgramT0)
	require.Empty(t, done)
	require.Zero(t, dropped)
	require.Zero(t, r.held())
}

// A fragment that disagrees with its datagram's first fragment drops what
// there was: the bytes of two datagrams are never put together. It
// begins the datagram anew, so one sent whole again under the same id
// gets through.
func TestReassemblyMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		size int
	}{
		{"other length", testDatagram(7, 5000), 1000},
		{"other fragment size", testDatagram(8, 3000), 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReassembler(reassemblyLimits{})
			first := fragmentsOf(t, 3, testDatagram(3, 3000), 1000)
			done, dropped := feedFrags(r, dgramSrcA, first, []int{0, 1}, dgramT0)
			require.Empty(t, done)
			require.Zero(t, dropped)

			second := fragmentsOf(t, 3, tc.data, tc.size)
			done, dropped = feedFrags(r, dgramSrcA, second, []int{1}, dgramT0)
			require.Empty(t, done)
			require.Equal(t, 1, dropped, "the first datagram")
			// The first datagram's last fragment no longer fits what
			// is being assembled under its id: a drop again, not a mix.
			done, dropped = feedFrags(r, dgramSrcA, first, []int{2}, dgramT0)
			require.Empty(t, done)
			require.Equal(t, 1, dropped)

			r.reset()
			done, dropped = feedFrags(r, dgramSrcA, second, []int{0}, dgramT0)
			require.Zero(t, dropped)
			require.Empty(t, done)
			rest := make([]int, 0, len(second))
			for i := 1; i < len(second); i++ {
				rest = append(rest, i)
			}
			done, dropped = feedFrags(r, dgramSrcA, second, rest, dgramT0)
			require.Zero(t, dropped)
			require.Equal(t, [][]byte{tc.data}, done)
		})
	}
}

func TestReassemblyTimeout(t *testing.T) {
	r := newReassembler(reassemblyLimits{Timeout: time.Second})
	a := fragmentsOf(t, 1, testDatagram(1, 5000), 1000)
	b := fragmentsOf(t, 2, testDatagram(2, 5000), 1000)
	feedFrags(r, dgramSrcA, a, []int{0, 1}, dgramT0)
	feedFrags(r, dgramSrcB, b, []int{0}, dgramT0.Add(500*time.Millisecond))
	require.Equal(t, 2*8192, r.held())

	// Timed from the first fragment, not the latest.
	_, dropped := feedFrags(r, dgramSrcA, a, []int{2}, dgramT0.Add(999*time.Millisecond))
	require.Zero(t, dropped)
	require.Zero(t, r.expire(dgramT0.Add(999*time.Millisecond)))
	require.Equal(t, 1, r.expire(dgramT0.Add(time.Second)), "a's second is up")
	require.Equal(t, 8192, r.held())

	// b's fragments after its time find it gone, and the sweep of the
	// add counts it; its later fragments begin nothing.
	done, dropped := feedFrags(r, dgramSrcB, b, []int{1, 2, 3, 4}, dgramT0.Add(1500*time.Millisecond))
	require.Empty(t, done)
	require.Equal(t, 1, dropped)
	require.Zero(t, r.held())
	require.Zero(t, r.expire(dgramT0.Add(time.Hour)))

	// And a's late fragments are ignored, not begun again, for the
	// timeout after a was given up.
	done, dropped = feedFrags(r, dgramSrcA, a, []int{3, 4}, dgramT0.Add(1999*time.Millisecond))
	require.Empty(t, done)
	require.Zero(t, dropped)
	require.Zero(t, r.held())
}

// The datagrams finished are remembered for the timeout, no longer: a
// fragment of one of the same id and geometry meanwhile is dropped and
// reported stale, as are duplicates; after it, or at once with another
// geometry, a datagram under that id (a restarted sender's) completes.
func TestReassemblyDoneMemoExpires(t *testing.T) {
	r := newReassembler(reassemblyLimits{Timeout: time.Second})
	first := fragmentsOf(t, 1, testDatagram(1, 3000), 1008)
	done, dropped := feedFrags(r, dgramSrcA, first, []int{0, 1, 2}, dgramT0)
	require.Len(t, done, 1)
	require.Zero(t, dropped)

	again := fragmentsOf(t, 1, testDatagram(2, 3000), 1008)
	for _, i := range []int{0, 1, 2} {
		d, n, stale := r.add(dgramSrcA, again[i].h, again[i].p, dgramT0.Add(999*time.Millisecond))
		require.Nil(t, d)
		require.Zero(t, n)
		require.True(t, stale, "fragment %d: remembered", i)
	}
	require.Zero(t, r.held())

	// Another geometry under the id is another datagram.
	other := fragmentsOf(t, 1, testDatagram(3, 2500), 1008)
	done, dropped = feedFrags(r, dgramSrcA, other, []int{2, 1, 0}, dgramT0.Add(time.Millisecond))
	require.Zero(t, dropped)
	require.Equal(t, [][]byte{testDatagram(3, 2500)}, done)

	done, dropped = feedFrags(r, dgramSrcA, again, []int{1, 0, 2}, dgramT0.Add(time.Second))
	require.Zero(t, dropped)
	require.Equal(t, [][]byte{testDatagram(2, 3000)}, done, "forgotten after the timeout")

	// A duplicate of a fragment held is stale too.
	next := fragmentsOf(t, 2, testDatagram(4, 3000), 1008)
	_, _, stale := r.add(dgramSrcA, next[0].h, next[0].p, dgramT0.Add(time.Second))
	require.False(t, stale)
	_, _, stale = r.add(dgramSrcA, next[0].h, next[0].p, dgramT0.Add(time.Second))
	require.True(t, stale)
}

// With sweepOnTimer the timeouts run on a timer while anything is held:
// an incomplete datagram goes at its deadline with no add to sweep it,
// counted, and reset stops the timer.
func TestReassemblyTimer(t *testing.T) {
	var mu sync.Mutex
	var timeouts atomic.Uint64
	r := newReassembler(reassemblyLimits{Timeout: 20 * time.Millisecond})
	r.sweepOnTimer(&mu, &timeouts)
	held := func() int {
		mu.Lock()
		defer mu.Unlock()
		return r.held()
	}
	fs := fragmentsOf(t, 1, testDatagram(1, 5000), 1000)
	mu.Lock()
	feedFrags(r, dgramSrcA, fs, []int{0}, time.Now())
	mu.Unlock()
	require.Eventually(t, func() bool { return held() == 0 }, 2*time.Second, time.Millisecond)
	require.Equal(t, uint64(1), timeouts.Load())

	// A datagram that completes leaves the timer nothing to count.
	mu.Lock()
	done, _ := feedFrags(r, dgramSrcA, fragmentsOf(t, 2, testDatagram(2, 5000), 1000), []int{0, 1, 2, 3, 4}, time.Now())
	mu.Unlock()
	require.Len(t, done, 1)
	time.Sleep(40 * time.Millisecond)
	require.Equal(t, uint64(1), timeouts.Load())

	mu.Lock()
	r.limits.Timeout = time.Hour
	feedFrags(r, dgramSrcA, fragmentsOf(t, 3, testDatagram(3, 5000), 1000), []int{0}, time.Now())
	require.True(t, r.armed)
	r.reset()
	require.False(t, r.armed)
	require.False(t, r.timer.Stop(), "stopped by reset")
	mu.Unlock()
	require.Equal(t, uint64(1), timeouts.Load())
}

func TestReassemblyPerSourceLimit(t *testing.T) {
	// Room for two 64 KiB datagrams from a source.
	r := newReassembler(reassemblyLimits{PerSource: 2 * maxReassemblyBuf, Total: 8 * maxReassemblyBuf})
	big := func(id uint32) []testFrag { return fragmentsOf(t, id, testDatagram(id, wire.MaxDatagram), 4080) }
	d1, d2, d3 := big(1), big(2), big(3)
	feedFrags(r, dgramSrcA, d1, []int{0}, dgramT0)
	feedFrags(r, dgramSrcA, d2, []int{0}, dgramT0)
	require.Equal(t, 2*maxReassemblyBuf, r.held())

	// A third gives up the source's oldest, which is likely one that
	// lost a fragment.
	_, dropped := feedFrags(r, dgramSrcA, d3, []int{0}, dgramT0)
	require.Equal(t, 1, dropped)
	require.Equal(t, 2*maxReassemblyBuf, r.held())
	done, dropped := feedFrags(r, dgramSrcA, d1, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, dgramT0)
	require.Empty(t, done, "d1 is gone")
	require.Zero(t, dropped, "and counted once")
	var all []int
	for i := range d2 {
		all = append(all, i)
	}
	done, _ = feedFrags(r, dgramSrcA, d2, all[1:], dgramT0)
	require.Equal(t, [][]byte{testDatagram(2, wire.MaxDatagram)}, done)
	done, _ = feedFrags(r, dgramSrcA, d3, all[1:], dgramT0)
	require.Equal(t, [][]byte{testDatagram(3, wire.MaxDatagram)}, done)
	require.Zero(t, r.held())

	// A datagram bigger than a source may hold is refused, once.
	small := newReassembler(reassemblyLimits{PerSource: 4096})
	done, dropped = feedFrags(small, dgramSrcA, fragmentsOf(t, 1, testDatagram(1, 5000), 1000), []int{0, 1, 2, 3, 4}, dgramT0)
	require.Empty(t, done)
	require.Equal(t, 1, dropped)
	require.Zero(t, small.held())
}

// A source that floods the reassembler with datagrams it never completes
// takes its own share and no more: another source's datagrams complete
// all along.
func TestReassemblyFloodFromOneSource(t *testing.T) {
	r := newReassembler(reassemblyLimits{PerSource: 1 << 20, Total: 2 << 20})
	data := testDatagram(5, 20000)
	good := fragmentsOf(t, 0, data, 4080)
	now := dgramT0
	floodDropped := 0
	for i := range 5000 {
		now = now.Add(10 * time.Microsecond)
		id := uint32(i + 1)
		// The flood: the first fragment of another 64 KiB datagram.
		h := wire.DgramHeader{Port: 1, Fragment: true, ID: id, Total: wire.MaxDatagram, Offset: 0, FragSize: 4080}
		d, n, _ := r.add(dgramSrcA, h, make([]byte, 4080), now)
		require.Nil(t, d)
		floodDropped += n
		require.LessOrEqual(t, r.held(), 2<<20)

		if i%10 == 0 {
			for k := range good {
				good[k].h.ID = id
			}
			done, dropped := feedFrags(r, dgramSrcB, good, []int{4, 0, 2, 1, 3}, now)
			require.Zero(t, dropped, "datagram %d of the honest source", i)
			require.Len(t, done, 1)
			require.Equal(t, data, done[0])
			r.release(done[0])
		}
	}
	require.Greater(t, floodDropped, 4900, "the flood drops its own")
	require.Equal(t, 1<<20, r.held(), "the flood holds its share")

	// Total bounds all sources: a second flooding source finds the
	// other half, a third finds none, and none of it pushes out the
	// others' datagrams.
	dgramSrcC := netip.MustParseAddrPort("[fd00::3]:5")
	for _, src := range []netip.AddrPort{dgramSrcB, dgramSrcC} {
		for i := range 100 {
			h := wire.DgramHeader{Port: 1, Fragment: true, ID: uint32(i), Total: wire.MaxDatagram, FragSize: 4080}
			r.add(src, h, make([]byte, 4080), now)
			require.LessOrEqual(t, r.held(), 2<<20)
		}
	}
	require.Equal(t, 2<<20, r.held())
	require.Equal(t, 1<<20, r.sources[dgramSrcA.Addr()].held)
	require.Equal(t, 1<<20, r.sources[dgramSrcB.Addr()].held)
	require.Nil(t, r.sources[dgramSrcC.Addr()])

	// Everyone's time comes.
	require.Equal(t, 32, r.expire(now.Add(time.Second)))
	require.Zero(t, r.held())
}

func TestReassemblyReset(t *testing.T) {
	r := newReassembler(reassemblyLimits{})
	for id := range uint32(10) {
		feedFrags(r, dgramSrcA, fragmentsOf(t, id, testDatagram(id, 9000), 1000), []int{0, 3}, dgramT0)
		feedFrags(r, dgramSrcB, fragmentsOf(t, id, testDatagram(id, 900), 100), []int{8}, dgramT0)
	}
	require.Equal(t, 10*16384+10*1024, r.held())
	r.reset()
	require.Zero(t, r.held())
	require.Empty(t, r.partial)
	require.Empty(t, r.sources)
	require.Nil(t, r.oldest)
	require.Zero(t, r.expire(dgramT0.Add(time.Hour)))

	// It works as new afterwards.
	data := testDatagram(1, 9000)
	done, dropped := feedFrags(r, dgramSrcA, fragmentsOf(t, 1, data, 1000), []int{8, 7, 6, 5, 4, 3, 2, 1, 0}, dgramT0)
	require.Zero(t, dropped)
	require.Equal(t, [][]byte{data}, done)
}

func TestReassemblyClasses(t *testing.T) {
	for _, tc := range []struct{ n, class int }{
		{65, 0}, {1024, 0}, {1025, 1}, {2048, 1}, {4097, 3}, {32768, 5}, {32769, 6}, {wire.MaxDatagram, 6},
	} {
		require.Equal(t, tc.class, reassemblyClass(tc.n), "%d bytes", tc.n)
		require.GreaterOrEqual(t, minReassemblyBuf<<tc.class, tc.n)
	}
	require.Equal(t, reassemblyClasses-1, reassemblyClass(wire.MaxDatagram))

	// Released buffers are kept up to reassemblyIdle bytes; foreign
	// ones are not.
	r := newReassembler(reassemblyLimits{})
	for range 2 * reassemblyIdle / maxReassemblyBuf {
		r.release(make([]byte, 100, maxReassemblyBuf))
	}
	require.Equal(t, reassemblyIdle, r.idle)
	r.release(make([]byte, 3000))
	r.release(make([]byte, 100))
	require.Equal(t, reassemblyIdle, r.idle)
}

// Reassembling 64 KiB datagrams whose buffers the caller gives back
// allocates nothing once warm.
func TestReassemblyAllocs(t *testing.T) {
	r := newReassembler(reassemblyLimits{})
	data := testDatagram(1, wire.MaxDatagram)
	fs := fragmentsOf(t, 1, data, 4080)
	order := []int{3, 0, 1, 2, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4}
	id := uint32(0)
	round := func() {
		id++
		for k := range fs {
			fs[k].h.ID = id
		}
		for _, i := range order {
			if d, _, _ := r.add(dgramSrcA, fs[i].h, fs[i].p, dgramT0); d != nil {
				r.release(d)
			}
		}
	}
	for range 100 {
		round()
	}
	require.Zero(t, testing.AllocsPerRun(1000, round))
	require.Zero(t, r.held())
}

// TestReassemblyPerSourceByIP: a sender that names other ports in its
// headers is still one source: its first fragments from four ports share
// one per-source bound, and another sender's datagram still completes.
func TestReassemblyPerSourceByIP(t *testing.T) {
	r := newReassembler(reassemblyLimits{Total: 4 << 20, PerSource: 1 << 20, Timeout: time.Second})
	now := time.Now()
	for port := uint16(1); port <= 4; port++ {
		src := netip.AddrPortFrom(dgramSrcA.Addr(), port)
		for i := range 40 {
			h := wire.DgramHeader{Port: port, Fragment: true, ID: uint32(i), Total: wire.MaxDatagram, FragSize: 4080}
			r.add(src, h, make([]byte, 4080), now)
		}
	}
	require.LessOrEqual(t, r.sources[dgramSrcA.Addr()].held, 1<<20, "one bound for all of the sender's ports")
	data := make([]byte, 20000)
	var got []byte
	for off := 0; off < len(data); off += 4080 {
		h := wire.DgramHeader{Port: 9, Fragment: true, ID: 1, Total: len(data), Offset: off, FragSize: 4080}
		d, _, _ := r.add(dgramSrcB, h, data[off:min(len(data), off+4080)], now)
		if d != nil {
			got = d
		}
	}
	require.Len(t, got, len(data), "the other sender's datagram completed")
}
