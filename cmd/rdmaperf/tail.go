package main

import (
	"fmt"
	"io"
	"net"
	"runtime/metrics"
	"slices"
	"strings"
	"time"

	"github.com/goverbs/rdma"
)

// tailProbe splits each latency round trip (-tail) into its Write and its
// Read, and notes what happened during it that could make it slow: a
// wait of the connection's that parked (rdma: Conn.Stats' Parks), a
// garbage collection cycle. tailReport then compares the round trips
// above the 99th percentile with all of them, and adds the Go scheduler's
// latencies over the run (runtime/metrics: how long goroutines waited to
// run once runnable). It measures the client side only; the server's
// share shows as Read time.
type tailProbe struct {
	c       net.Conn
	rc      *rdma.Conn // nil on TCP
	samples []tailSample
	gc      []metrics.Sample
	sched0  *metrics.Float64Histogram
}

type tailSample struct {
	total, write, read time.Duration
	parked, gc         bool
}

func newTailProbe(c net.Conn) *tailProbe {
	p := &tailProbe{c: c, gc: []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}}
	p.rc, _ = c.(*rdma.Conn)
	p.sched0 = schedLatencies()
	return p
}

func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64Histogram()
}

func (p *tailProbe) parks() uint64 {
	if p.rc == nil {
		return 0
	}
	return p.rc.Stats().Parks
}

// roundTrip is the latency test's round trip, measured in parts.
func (p *tailProbe) roundTrip(msg, back []byte) error {
	metrics.Read(p.gc)
	gc0, parks0 := p.gc[0].Value.Uint64(), p.parks()
	t0 := time.Now()
	if _, err := p.c.Write(msg); err != nil {
		return err
	}
	t1 := time.Now()
	if _, err := io.ReadFull(p.c, back); err != nil {
		return err
	}
	t2 := time.Now()
	metrics.Read(p.gc)
	p.samples = append(p.samples, tailSample{total: t2.Sub(t0), write: t1.Sub(t0), read: t2.Sub(t1),
		parked: p.parks() != parks0, gc: p.gc[0].Value.Uint64() != gc0})
	return nil
}

// report describes the round trips at or above the 99th percentile beside
// all of them (the warm-up's included).
func (p *tailProbe) report() string {
	all := p.samples
	if len(all) == 0 {
		return "tail: no round trips"
	}
	byTotal := slices.Clone(all)
	slices.SortFunc(byTotal, func(a, b tailSample) int { return int(a.total - b.total) })
	cut := byTotal[(len(byTotal)*99)/100].total
	var slow []tailSample
	for _, s := range all {
		if s.total >= cut {
			slow = append(slow, s)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "tail: %d round trips, p99 %v; scheduler latency over the run: %s\n", len(all), cut.Round(time.Microsecond), schedDelta(p.sched0, schedLatencies()))
	for _, g := range []struct {
		name string
		s    []tailSample
	}{{"all", all}, {"at or above p99", slow}} {
		fmt.Fprintf(&b, "  %-16s n=%d  median Write %v, Read %v; parked %.1f%%, in a GC %.1f%%; Write the larger part in %.1f%%\n",
			g.name, len(g.s), medianOf(g.s, func(s tailSample) time.Duration { return s.write }),
			medianOf(g.s, func(s tailSample) time.Duration { return s.read }),
			share(g.s, func(s tailSample) bool { return s.parked }), share(g.s, func(s tailSample) bool { return s.gc }),
			share(g.s, func(s tailSample) bool { return s.write > s.read }))
	}
	return strings.TrimRight(b.String(), "\n")
}

func medianOf(s []tailSample, f func(tailSample) time.Duration) time.Duration {
	d := make([]time.Duration, len(s))
	for i, x := range s {
		d[i] = f(x)
	}
	slices.Sort(d)
	return d[len(d)/2].Round(100 * time.Nanosecond)
}

func share(s []tailSample, f func(tailSample) bool) float64 {
	n := 0
	for _, x := range s {
		if f(x) {
			n++
		}
	}
	return 100 * float64(n) / float64(len(s))
}

// schedDelta gives the p50 and p99 of the scheduler latencies recorded
// between two readings of the histogram.
func schedDelta(a, b *metrics.Float64Histogram) string {
	counts := make([]uint64, len(b.Counts))
	var total uint64
	for i := range b.Counts {
		counts[i] = b.Counts[i]
		if a != nil && i < len(a.Counts) {
			counts[i] -= a.Counts[i]
		}
		total += counts[i]
	}
	if total == 0 {
		return "none recorded"
	}
	q := func(p float64) time.Duration {
		want := uint64(p * float64(total))
		var n uint64
		for i, c := range counts {
			n += c
			if n > want {
				return time.Duration(b.Buckets[i+1] * 1e9) // the bucket's upper bound
			}
		}
		return time.Duration(b.Buckets[len(b.Buckets)-1] * 1e9)
	}
	return fmt.Sprintf("%d goroutine wakeups, p50 ≤ %v, p99 ≤ %v, p99.9 ≤ %v", total, q(0.5), q(0.99), q(0.999))
}
