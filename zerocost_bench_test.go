package rdma

// The library against C, per message, over the zero-cost provider
// (internal/zerocost): two Conns joined in one process by two QPs whose
// posts are memory copies and whose completions are polled from memory,
// through the library's real cgo data path (internal/ibv's shims, the
// poller, the waits in PollBusy, and in the default PollAdaptive for the
// rows named Default and Goroutines). Nothing is left to the kernel or a
// device, so what a message costs here is the library's own CPU, cgo
// crossings included, and what carries over to a NIC whose post is a few
// stores. Each row has a Go and a C sub-benchmark on the same provider in
// the same run; C runs the library's message pattern (zc_bench.c says how
// closely), and its row reports go/c, the ratio of the two.
//
// Where one goroutine plays both ends (the round trip, the rates, the
// READ), ns/op is the CPU of both sides' work for one message, and so is
// C's. The streams run a writer and a reader at once, in Go and in C, both
// busy-polling: ns/op is the time per message, CPU the process's. The
// Goroutines row runs a client and a server goroutine and the poller
// goroutine, parked on the provider's completion events when nobody
// spins: ns/op is the time of a round trip.
//
// Beside ns/op each Go row reports, per message, its CPU, its cgo calls,
// the provider's verbs calls (posts, polls) and completions, and its
// goroutine wakeups (wakeups/msg, see schedRuns): what the Goroutines row
// spends on handoffs that the single-goroutine rows do not.

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/rdma/internal/wire"
	"github.com/goverbs/rdma/internal/zerocost"
)

// zcInline is the inline data the library asks its QPs for.
const zcInline = 256

// zcEnd is one Conn of a zcPair, with its memory; it allocates and
// registers the rings the connection grows to.
type zcEnd struct {
	w   *zerocost.Wire
	i   int
	c   *Conn
	mem []byte
}

func (e *zcEnd) allocRing(size int, remote bool) (*ringMem, error) {
	buf, err := zerocost.Alloc(size)
	if err != nil {
		return nil, err
	}
	var a zerocost.Access
	if remote {
		a = zerocost.RemoteWrite
	}
	key, err := e.w.Register(e.i, buf, a)
	if err != nil {
		zerocost.Free(buf)
		return nil, err
	}
	m := &ringMem{buf: buf, base: zerocost.Addr(buf), lkey: key, reg: key}
	if remote {
		m.rkey = key
	}
	return m, nil
}

func (e *zcEnd) freeRing(m *ringMem) {
	e.w.Deregister(e.i, m.reg.(uint32))
	zerocost.Free(m.buf)
}

// zcPair is two established Conns over a zero-cost wire.
type zcPair struct {
	w    *zerocost.Wire
	p    *poller // the CQ's, which only spinning waits poll unless runPoller started it
	e    [2]*zcEnd
	free [][]byte
	stop func() // stops the poller goroutine, if it runs
}

// runPoller starts the CQ's poller goroutine over the provider's
// completion events, as a device's runs over its completion channel.
func (z *zcPair) runPoller(tb testing.TB) {
	ev, err := z.w.Events(0)
	if err != nil {
		tb.Fatal(err)
	}
	z.p.ch = ev
	go z.p.run()
	z.stop = func() { z.p.shutdown(func() { ev.Close() }) }
}

// needZeroCost skips a benchmark in a build without the provider.
func needZeroCost(tb testing.TB) {
	if !zerocost.Available {
		tb.Skip("the zero-cost provider is C: this build has no cgo (or no libibverbs headers)")
	}
}

// newZCPair joins two Conns with options oa and ob (PollBusy: no
// completion channel) over a new wire; the benchmark's cleanup closes them.
func newZCPair(tb testing.TB, oa, ob Options) *zcPair { return newZCPairMode(tb, oa, ob, PollBusy) }

// newZCPairMode is newZCPair with the waits of mode. Without a completion
// channel a wait must never park: PollAdaptive serves where the one
// goroutine that plays both ends finds every completion it waits for
// already in the CQ (the provider completes a post at once).
func newZCPairMode(tb testing.TB, oa, ob Options, mode PollMode) *zcPair {
	needZeroCost(tb)
	var opts [2]Options
	var lays [2]layout
	for i, o := range []Options{oa, ob} {
		o.Poll = mode
		o, err := o.normalized()
		if err != nil {
			tb.Fatal(err)
		}
		opts[i], lays[i] = o, newLayout(o)
	}
	sq := max(lays[0].sendQueue(), lays[1].sendQueue())
	rq := max(lays[0].recvSlots, lays[1].recvSlots)
	// One CQ for both, as one device's serves the connections of a
	// process, with an entry reserved for every work request of each.
	w, err := zerocost.New(sq, rq, lays[0].cqEntries()+lays[1].cqEntries(), true)
	if err != nil {
		tb.Fatal(err)
	}
	z := &zcPair{w: w, p: newPoller(w.End(0).CQ, nil)}
	var hellos [2]wire.Hello
	for i := range z.e {
		o, lay, end := opts[i], lays[i], w.End(i)
		mem, err := zerocost.Alloc(lay.size())
		if err != nil {
			tb.Fatal(err)
		}
		rkey, err := w.Register(i, mem[:lay.ring], zerocost.RemoteWrite)
		if err != nil {
			tb.Fatal(err)
		}
		skey, err := w.Register(i, mem[lay.sendOff():], 0)
		if err != nil {
			tb.Fatal(err)
		}
		e := &zcEnd{w: w, i: i, mem: mem}
		c := newConn(phaseEstablished)
		e.c = c
		z.p.add(end.QPNum, c)
		base := zerocost.Addr(mem)
		c.mu.Lock()
		if err := c.initDataPath(end.QP, mem, lay, base+uint64(lay.sendOff()), skey, zcInline, o, z.p); err != nil {
			tb.Fatal(err)
		}
		c.rs.arenaRx.rkey, c.rs.arenaRx.lkey = rkey, rkey
		c.rs.alloc = e
		c.postHeld = true // the provider stands in for a NIC, whose post is no system call
		c.mu.Unlock()
		var flags uint8
		if o.Messages {
			flags = wire.HelloMessages
		}
		hellos[i] = wire.Hello{Flags: flags, RecvDepth: uint16(o.RecvDepth), CtrlDepth: wire.CtrlDepth, BufSize: uint32(o.BufferSize),
			RingSize: uint32(lay.ring), RingAddr: base, RKey: rkey}
		z.e[i] = e
		z.free = append(z.free, mem)
	}
	for i, e := range z.e {
		e.c.mu.Lock()
		e.c.open(hellos[1-i], lays[i])
		e.c.mu.Unlock()
		signal(e.c.txReady)
	}
	tb.Cleanup(func() { z.close(tb) })
	return z
}

// close closes both Conns and then the wire, and fails the benchmark if
// the provider refused a work request on the way.
func (z *zcPair) close(tb testing.TB) {
	// The provider flushes nothing: the teardown's drain waits for no
	// completion.
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = time.Millisecond
	var wg sync.WaitGroup
	for _, e := range z.e {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.c.Close()
		}()
	}
	// Nobody else polls: the closes' completions are dispatched here.
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	for !isClosed(done) {
		z.p.tryPoll()
		runtime.Gosched()
	}
	releasing.Wait()
	if z.stop != nil {
		z.stop()
	}
	err := z.w.Err()
	z.w.Close()
	for _, m := range z.free {
		zerocost.Free(m)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// calls is the provider's calls at both ends so far.
func (z *zcPair) calls() zerocost.Stats { return z.w.Stats(0).Add(z.w.Stats(1)) }

// zcMeter measures a Go or C loop: CPU, cgo crossings and provider
// calls per message.
type zcMeter struct {
	b     *testing.B
	cpu   time.Duration
	cgo   int64
	start time.Time
	stats func() zerocost.Stats
	st    zerocost.Stats
	runs  uint64
}

// schedRuns estimates how many times goroutines were made runnable and
// then run (woken from a channel or a parked poller, or put back by
// Gosched) since the process started: the runtime records the latency of
// one in gTrackingPeriod (8) such transitions in /sched/latencies.
func schedRuns() uint64 {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	var n uint64
	for _, c := range s[0].Value.Float64Histogram().Counts {
		n += c
	}
	return 8 * n
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startMeter(b *testing.B, stats func() zerocost.Stats) *zcMeter {
	m := &zcMeter{b: b, stats: stats}
	m.st = stats()
	m.cgo = runtime.NumCgoCall()
	m.runs = schedRuns()
	m.cpu = cpuTime()
	m.start = time.Now()
	b.ResetTimer()
	return m
}

// stop reports the metrics of n messages and returns the time per
// message.
func (m *zcMeter) stop(n int) float64 {
	m.b.StopTimer()
	wall := time.Since(m.start)
	cpu := cpuTime() - m.cpu
	cgo := runtime.NumCgoCall() - m.cgo
	runs := schedRuns() - m.runs
	st := m.stats().Sub(m.st)
	f := float64(n)
	m.b.ReportMetric(float64(cpu.Nanoseconds())/f, "cpu-ns/msg")
	m.b.ReportMetric(float64(cgo)/f, "cgo/msg")
	m.b.ReportMetric(float64(st.Calls())/f, "verbs/msg")
	m.b.ReportMetric(float64(st.PostSend)/f, "posts/msg")
	m.b.ReportMetric(float64(st.Polls)/f, "polls/msg")
	m.b.ReportMetric(float64(st.CQEs)/f, "cqes/msg")
	m.b.ReportMetric(float64(runs)/f, "wakeups/msg")
	return float64(wall.Nanoseconds()) / f
}

// zcRow runs a row's Go loop and C loop as the sub-benchmarks Go and C; C
// reports go/c, Go's time per message over C's.
func zcRow(b *testing.B, goLoop func(b *testing.B) float64, cLoop func(b *testing.B) float64) {
	var goNs float64
	b.Run("Go", func(b *testing.B) { goNs = goLoop(b) })
	b.Run("C", func(b *testing.B) {
		if c := cLoop(b); goNs > 0 && c > 0 {
			b.ReportMetric(goNs/c, "go/c")
		}
	})
}

// zcC is a C loop of pattern p over a new wire sized as a default
// connection's.
func zcC(p zerocost.Pattern, size int) func(b *testing.B) float64 {
	return func(b *testing.B) float64 {
		needZeroCost(b)
		o, err := Options{}.normalized()
		if err != nil {
			b.Fatal(err)
		}
		lay := newLayout(o)
		w, err := zerocost.New(lay.sendQueue(), lay.recvSlots, 2*lay.cqEntries(), true)
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		m := startMeter(b, func() zerocost.Stats { return w.Stats(0).Add(w.Stats(1)) })
		if err := w.RunC(p, b.N, size); err != nil {
			b.Fatal(err)
		}
		return m.stop(b.N)
	}
}

// BenchmarkZeroCostCgoCall is one cgo call to a C function that does
// nothing: the toll each verb pays in Go and not in C, so that a row's
// floor (its C time plus its cgo calls at this toll) can be told apart
// from the library's own work.
func BenchmarkZeroCostCgoCall(b *testing.B) {
	needZeroCost(b)
	for range b.N {
		zerocost.Noop()
	}
}

// BenchmarkZeroCost is the Go-against-C table; bench/README.md says how
// to read it.
func BenchmarkZeroCost(b *testing.B) {
	b.Run("RoundTrip64", func(b *testing.B) {
		zcRow(b, func(b *testing.B) float64 { return zcRoundTrip(b, PollBusy) }, zcC(zerocost.PingPong, 64))
	})
	// The same with the default Options (PollAdaptive), as a user who
	// sets none pays it.
	b.Run("RoundTrip64Default", func(b *testing.B) {
		zcRow(b, func(b *testing.B) float64 { return zcRoundTrip(b, PollAdaptive) }, zcC(zerocost.PingPong, 64))
	})
	// A client goroutine and a server goroutine, the default Options and
	// the CQ's poller goroutine running, as a service's connection runs;
	// Chan is a ping-pong of two goroutines over channels in the same
	// run: what the Go runtime itself needs for the two handoffs.
	b.Run("RoundTrip64Goroutines", func(b *testing.B) {
		zcRow(b, zcRoundTripGoroutines, zcC(zerocost.PingPong, 64))
		b.Run("Chan", zcChanPingPong)
	})
	b.Run("Rate64Messages", func(b *testing.B) {
		zcRow(b, func(b *testing.B) float64 { return zcRate(b, Options{}, Options{Messages: true}, false) }, zcC(zerocost.Rate, 64))
	})
	b.Run("Rate64NoDelay", func(b *testing.B) {
		zcRow(b, func(b *testing.B) float64 { return zcRate(b, Options{}, Options{}, true) }, zcC(zerocost.Rate, 64))
	})
	for _, size := range []int{4 << 10, 64 << 10} {
		name := "Stream4K"
		if size > 4<<10 {
			name = "Stream64K"
		}
		b.Run(name, func(b *testing.B) {
			zcRow(b, func(b *testing.B) float64 { return zcStream(b, size) }, zcC(zerocost.Stream, size))
		})
	}
	b.Run("Read64", func(b *testing.B) { zcRow(b, zcRead, zcC(zerocost.Read, 64)) })
}

// zcRoundTrip is a 64 B message and its answer, one goroutine playing
// both ends: a Write, the peer's Read and Write, a Read; the waits are
// mode's.
func zcRoundTrip(b *testing.B, mode PollMode) float64 {
	z := newZCPairMode(b, Options{}, Options{}, mode)
	a, p := z.e[0].c, z.e[1].c
	buf := make([]byte, 64)
	rt := func() {
		if _, err := a.Write(buf); err != nil {
			b.Fatal(err)
		}
		if n, err := p.Read(buf); n != 64 || err != nil {
			b.Fatal(n, err)
		}
		if _, err := p.Write(buf); err != nil {
			b.Fatal(err)
		}
		if n, err := a.Read(buf); n != 64 || err != nil {
			b.Fatal(n, err)
		}
	}
	for range 1000 {
		rt()
	}
	b.ReportAllocs()
	m := startMeter(b, z.calls)
	for range b.N {
		rt()
	}
	return m.stop(b.N)
}

// zcRoundTripGoroutines is zcRoundTrip's message and answer with a
// client goroutine (Write, Read) and a server goroutine (Read, Write), the
// default Options, and the poller goroutine running.
func zcRoundTripGoroutines(b *testing.B) float64 {
	z := newZCPairMode(b, Options{}, Options{}, PollAdaptive)
	z.runPoller(b)
	a, p := z.e[0].c, z.e[1].c
	cbuf, sbuf := make([]byte, 64), make([]byte, 64)
	run := func(n int) {
		errc := make(chan error, 1)
		go func() {
			for range n {
				if k, err := p.Read(sbuf); k != 64 || err != nil {
					errc <- fmt.Errorf("server read: %d, %v", k, err)
					return
				}
				if _, err := p.Write(sbuf); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for range n {
			if _, err := a.Write(cbuf); err != nil {
				b.Fatal(err)
			}
			if k, err := a.Read(cbuf); k != 64 || err != nil {
				b.Fatal(k, err)
			}
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	run(1000)
	b.ReportAllocs()
	m := startMeter(b, z.calls)
	run(b.N)
	return m.stop(b.N)
}

// zcChanPingPong is a round trip between two goroutines over unbuffered
// channels.
func zcChanPingPong(b *testing.B) {
	ping, pong := make(chan struct{}), make(chan struct{})
	go func() {
		for range ping {
			pong <- struct{}{}
		}
	}()
	b.ResetTimer()
	for range b.N {
		ping <- struct{}{}
		<-pong
	}
	b.StopTimer()
	close(ping)
}

// zcRate is one 64 B message per Write, read by the peer, one goroutine
// playing both ends.
func zcRate(b *testing.B, oa, ob Options, noDelay bool) float64 {
	z := newZCPair(b, oa, ob)
	a, p := z.e[0].c, z.e[1].c
	a.SetNoDelay(noDelay)
	buf, rbuf := make([]byte, 64), make([]byte, 64)
	one := func() {
		if _, err := a.Write(buf); err != nil {
			b.Fatal(err)
		}
		if n, err := p.Read(rbuf); n != 64 || err != nil {
			b.Fatal(n, err)
		}
	}
	for range 1000 {
		one()
	}
	b.ReportAllocs()
	m := startMeter(b, z.calls)
	for range b.N {
		one()
	}
	return m.stop(b.N)
}

// zcStream is a writer goroutine's Writes of size bytes and a reader's
// Reads, at once.
func zcStream(b *testing.B, size int) float64 {
	z := newZCPair(b, Options{}, Options{})
	a, p := z.e[0].c, z.e[1].c
	wbuf, rbuf := make([]byte, size), make([]byte, size)
	run := func(n int) {
		errc := make(chan error, 1)
		go func() {
			for range n {
				if _, err := a.Write(wbuf); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for left := n * size; left > 0; {
			k, err := p.Read(rbuf[:min(left, size)])
			if err != nil {
				b.Fatal(err)
			}
			left -= k
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	// Long enough for the rings to grow, as a stream's do.
	run(max(2000, 64<<20/size/4))
	b.SetBytes(int64(size))
	b.ReportAllocs()
	m := startMeter(b, z.calls)
	run(b.N)
	return m.stop(b.N)
}

// zcRead is a 64 B RDMA READ of the peer's region into one of ours,
// posted and waited for.
func zcRead(b *testing.B) float64 {
	z := newZCPair(b, Options{}, Options{})
	a := z.e[0].c
	local := zcRegion(b, z, 0, 4096, 0)
	remote := zcRegion(b, z, 1, 4096, RemoteRead)
	rr := a.Remote(remote.key)
	ctx := context.Background()
	for range 1000 {
		if err := rr.ReadAtContext(ctx, local, 0, 64, 128); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	m := startMeter(b, z.calls)
	for range b.N {
		if err := rr.ReadAtContext(ctx, local, 0, 64, 128); err != nil {
			b.Fatal(err)
		}
	}
	return m.stop(b.N)
}

// zcRegion is a region of end i's registered with the provider, as
// RegisterRegion registers one with a device.
func zcRegion(b *testing.B, z *zcPair, i, size int, access Access) *Region {
	mem, err := zerocost.Alloc(size)
	if err != nil {
		b.Fatal(err)
	}
	z.free = append(z.free, mem)
	var a zerocost.Access
	if access&RemoteRead != 0 {
		a |= zerocost.RemoteRead
	}
	if access&RemoteWrite != 0 {
		a |= zerocost.RemoteWrite
	}
	key, err := z.w.Register(i, mem, a)
	if err != nil {
		b.Fatal(err)
	}
	c := z.e[i].c
	r := &Region{c: c, mem: mem, size: size, access: access, base: zerocost.Addr(mem), lkey: key, unpinned: make(chan struct{}, 1),
		key: RemoteKey{Addr: zerocost.Addr(mem), Size: uint64(size), RKey: key, Access: access}}
	c.mu.Lock()
	c.os.regions = append(c.os.regions, r)
	c.mu.Unlock()
	return r
}
