package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/goverbs/rdma"
)

// The clients test is a server with many clients: r.conns connections to
// one echo server, each with one request of r.size bytes outstanding at a
// time, for r.duration once every connection is dialed. Besides the
// aggregate rate and the latency of a request, it reports how evenly the
// server served them: the requests each connection completed in the
// window, whose spread a fair server keeps narrow.

// clientDialers is how many dials the clients test has in flight at once:
// enough to keep a connection manager busy, few enough that a listener's
// backlog (128 by default on Linux) does not overflow at thousands.
const clientDialers = 64

// clientGrace is how long after the window a request still outstanding
// may take before its connection is given up on (counted as unanswered):
// the slowest requests are what the test looks for, so they get time.
const clientGrace = 30 * time.Second

// clientSample is one connection's share of the window: the requests it
// completed by the window's end, and the latency of every request it
// completed (those finishing after the end too).
type clientSample struct {
	done       int
	lat        []time.Duration
	unanswered bool // its last request got no answer within clientGrace
	// perSecond is the requests completed in each second of the window
	// (the last one partial if the window is): a timeline that shows
	// whether connections stalled together.
	perSecond []int
}

// fairness is the spread of the requests each connection completed in the
// window: the least, the 10th percentile, the median, the most, and how
// many connections completed fewer than half the median.
type fairness struct {
	min, p10, median, max int
	starved               int
}

// spread computes the fairness of per-connection counts (any order; the
// slice is not changed). Percentiles are nearest-rank, as percentile's.
func spread(counts []int) fairness {
	if len(counts) == 0 {
		return fairness{}
	}
	s := slices.Clone(counts)
	slices.Sort(s)
	rank := func(p int) int { return s[max((len(s)*p+99)/100-1, 0)] }
	f := fairness{min: s[0], p10: rank(10), median: rank(50), max: s[len(s)-1]}
	for _, n := range s {
		// Fewer than half: n < median/2, in integers without rounding.
		if 2*n < f.median {
			f.starved++
		}
	}
	return f
}

// clients runs the clients test; r.perConn, when set, gets each
// connection's share, in dial order, with its local address.
func (r *run) clients() (map[string]float64, error) {
	h := header{kind: kindEcho, size: r.size}
	conns, dialTime, err := r.dialAll(h)
	if err != nil {
		return nil, err
	}
	samples := make([]clientSample, len(conns))
	var wg sync.WaitGroup
	begin := make(chan struct{})
	var start, deadline time.Time // set before begin is closed
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-begin
			samples[i] = r.request(c, start, deadline)
		}()
	}
	// Every goroutine is waiting on begin before the clock starts, so no
	// connection gets a head start.
	cpu0 := cpuNow()
	start = time.Now()
	deadline = start.Add(r.duration)
	close(begin)
	wg.Wait()
	// The window is the duration; the requests that end after it count
	// for latency only, and what they cost is small beside the window.
	cpu := r.cpuSince(cpu0)
	window := r.duration.Seconds()

	closeStart := time.Now()
	closeAll(conns)
	closeTime := time.Since(closeStart)
	release := r.releaseTime()

	counts := make([]int, len(samples))
	var lats []time.Duration
	total, unanswered := 0, 0
	for i, s := range samples {
		counts[i] = s.done
		total += s.done
		lats = append(lats, s.lat...)
		if s.unanswered {
			unanswered++
		}
	}
	if r.perConn != nil {
		for i, c := range conns {
			r.perConn(i, c.LocalAddr().String(), samples[i])
		}
	}
	if len(lats) == 0 {
		return nil, errors.New("no request completed")
	}
	slices.Sort(lats)
	f := spread(counts)
	us := func(d time.Duration) float64 { return d.Seconds() * 1e6 }
	m := map[string]float64{
		"req_s":      float64(total) / window,
		"count":      float64(total),
		"p50_us":     us(percentile(lats, 50)),
		"p99_us":     us(percentile(lats, 99)),
		"max_us":     us(lats[len(lats)-1]),
		"seconds":    window,
		"cpu_s":      cpu,
		"dial_s":     dialTime.Seconds(),
		"close_s":    closeTime.Seconds(),
		"min_req":    float64(f.min),
		"p10_req":    float64(f.p10),
		"median_req": float64(f.median),
		"max_req":    float64(f.max),
		"starved":    float64(f.starved),
		"unanswered": float64(unanswered),
	}
	if total > 0 {
		m["cpu_us_per_req"] = cpu * 1e6 / float64(total)
	}
	if release >= 0 {
		m["release_s"] = release.Seconds()
	}
	return m, nil
}

// request is one connection's part of the window, which began at start: a request, its answer,
// the next, until the window ends; the request outstanding then is
// waited for (up to clientGrace), so that its latency counts.
func (r *run) request(c net.Conn, start, deadline time.Time) clientSample {
	s := clientSample{perSecond: make([]int, (r.duration+time.Second-1)/time.Second)}
	msg := make([]byte, r.size)
	back := make([]byte, r.size)
	grace := r.grace
	if grace == 0 {
		grace = clientGrace
	}
	if err := c.SetReadDeadline(deadline.Add(grace)); err != nil {
		s.unanswered = true
		return s
	}
	for time.Now().Before(deadline) {
		t := time.Now()
		if _, err := c.Write(msg); err != nil {
			s.unanswered = true
			return s
		}
		if _, err := io.ReadFull(c, back); err != nil {
			s.unanswered = true
			return s
		}
		end := time.Now()
		s.lat = append(s.lat, end.Sub(t))
		if !end.After(deadline) {
			s.done++
			s.perSecond[min(int(end.Sub(start)/time.Second), len(s.perSecond)-1)]++
		}
	}
	return s
}

// dialAll opens r.conns connections, clientDialers at a time, each with
// its header sent and the server's ready byte back, and returns them in
// the order their dials began, with the time until the last was ready. On
// a failure it closes those it opened.
func (r *run) dialAll(h header) ([]net.Conn, time.Duration, error) {
	conns := make([]net.Conn, r.conns)
	errs := make([]error, r.conns)
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range min(clientDialers, r.conns) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				conns[i], errs[i] = r.open(h)
			}
		}()
	}
	for i := range r.conns {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	failed := 0
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if first != nil {
		closeAll(conns)
		return nil, elapsed, fmt.Errorf("%d of %d connections failed: %w", failed, r.conns, first)
	}
	return conns, elapsed, nil
}

// closeAll closes the connections (nil ones skipped), clientDialers at a
// time, as dialAll opened them.
func closeAll(conns []net.Conn) {
	next := make(chan net.Conn)
	var wg sync.WaitGroup
	for range min(clientDialers, len(conns)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				c.Close()
			}
		}()
	}
	for _, c := range conns {
		if c != nil {
			next <- c
		}
	}
	close(next)
	wg.Wait()
}

// releaseLimit bounds how long releaseTime waits for the devices.
const releaseLimit = 60 * time.Second

// releaseTime is how long after the connections' Close returned this
// process's RDMA devices have no connection left (their QPs destroyed,
// their memory deregistered or pooled): -1 when the test ran over TCP, or
// the devices still had connections after releaseLimit. With -local that
// includes the server's ends.
func (r *run) releaseTime() time.Duration {
	if !r.rdma {
		return -1
	}
	start := time.Now()
	for {
		busy := false
		for _, d := range rdma.Devices() {
			busy = busy || d.Connections > 0
		}
		if !busy {
			return time.Since(start)
		}
		if time.Since(start) > releaseLimit {
			return -1
		}
		time.Sleep(10 * time.Millisecond)
	}
}
