package main

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// dials measures what a client that dials, asks one question and hangs up
// pays: Dial, the first round trip (the header out, the server's ready
// byte back) and Close. Each sample is a burst of r.conns connections
// opened at once, each by a goroutine of its own, and lasts until the last
// of them is closed, so a burst of 20 can be set beside a single dial.
// Besides the whole, it records when the burst's last Dial returned
// (setup_us): connection establishment alone, which is what a C tool that
// times rdma_cm's steps reports.
//
// With -warmup above 0, one burst runs unmeasured first: it pays what only
// a process's first connection does (opening the device, starting the
// connection manager's event loop), which a long-lived client pays once.
func (r *run) dials() (map[string]float64, error) {
	h := header{kind: kindEcho, size: r.size}
	if r.warmup > 0 {
		if _, _, err := r.burst(h); err != nil {
			return nil, err
		}
	}
	var samples, setups []time.Duration
	cpu0 := cpuNow()
	start := time.Now()
	deadline := start.Add(r.duration)
	for i := 0; r.more(i, deadline); i++ {
		total, setup, err := r.burst(h)
		if err != nil {
			return nil, err
		}
		samples = append(samples, total)
		setups = append(setups, setup)
	}
	elapsed := time.Since(start)
	cpu := r.cpuSince(cpu0)
	if len(samples) == 0 {
		return nil, errors.New("no dial completed")
	}
	us := func(d time.Duration) float64 { return d.Seconds() * 1e6 }
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	slices.Sort(samples)
	slices.Sort(setups)
	conns := len(samples) * r.conns
	return map[string]float64{
		"p50_us":   us(percentile(samples, 50)),
		"p99_us":   us(percentile(samples, 99)),
		"avg_us":   us(sum / time.Duration(len(samples))),
		"min_us":   us(samples[0]),
		"setup_us": us(percentile(setups, 50)),
		"count":    float64(conns),
		"samples":  float64(len(samples)),
		"seconds":  elapsed.Seconds(),
		"conn_s":   float64(conns) / elapsed.Seconds(),
		"cpu_s":    cpu,
	}, nil
}

// burst opens r.conns connections at once, each doing one first round
// trip and closing, and returns how long the slowest took from the start,
// and how long until the last Dial returned.
func (r *run) burst(h header) (total, setup time.Duration, err error) {
	start := time.Now()
	if r.conns == 1 {
		// No goroutine: a single dial is timed as a client program makes it.
		setup, err = r.dialOnce(h, start)
		return time.Since(start), setup, err
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
		first  error
	)
	for range r.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := r.dialOnce(h, start)
			mu.Lock()
			defer mu.Unlock()
			setup = max(setup, d)
			if err != nil {
				failed++
				if first == nil {
					first = err
				}
			}
		}()
	}
	wg.Wait()
	total = time.Since(start)
	if first != nil {
		// One cause is enough: a burst's failures are usually all alike.
		return total, setup, fmt.Errorf("%d of %d connections failed: %w", failed, r.conns, first)
	}
	return total, setup, nil
}

// dialOnce dials, does the first round trip and closes, and returns how
// long after start the Dial returned.
func (r *run) dialOnce(h header, start time.Time) (time.Duration, error) {
	c, err := r.dial()
	dialed := time.Since(start)
	if err != nil {
		return dialed, err
	}
	c, err = greet(c, h)
	if err != nil {
		return dialed, err
	}
	return dialed, c.Close()
}
