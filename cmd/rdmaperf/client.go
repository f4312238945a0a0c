package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// dialFunc opens one transport connection to the server.
type dialFunc func() (net.Conn, error)

// run is one client-side test.
type run struct {
	dial     dialFunc
	size     int
	count    int           // iterations (per connection); 0: run for duration
	duration time.Duration // used when count is 0
	conns    int
	warmup   int // latency round trips not measured
	copyLen  int64
	plain    bool // copy: hide ReadFrom and WriteTo
}

// open dials, sends the header and waits for the server's ready byte.
func (r *run) open(h header) (net.Conn, error) {
	c, err := r.dial()
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(h.marshal()); err != nil {
		c.Close()
		return nil, fmt.Errorf("sending header: %w", err)
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != readyByte {
		c.Close()
		if err == nil {
			err = fmt.Errorf("unexpected byte %#x", b[0])
		}
		return nil, fmt.Errorf("waiting for the server to accept the test: %w", err)
	}
	return c, nil
}

// more says whether iteration i should run: a count, or a deadline checked
// every iteration (cheap next to any transfer).
func (r *run) more(i int, deadline time.Time) bool {
	if r.count > 0 {
		return i < r.count
	}
	return time.Now().Before(deadline)
}

// latency measures ping-pong round trips of size bytes and reports half of
// each, as ib_send_lat does, so the figures compare with perftest's.
func (r *run) latency() (map[string]float64, error) {
	c, err := r.open(header{kind: kindEcho, size: r.size})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg := make([]byte, r.size)
	back := make([]byte, r.size)
	roundTrip := func() error {
		if _, err := c.Write(msg); err != nil {
			return err
		}
		_, err := io.ReadFull(c, back)
		return err
	}
	// Warm-up round trips fault the buffers in and let the transport
	// settle (credits, TCP's window) before anything counts.
	for range r.warmup {
		if err := roundTrip(); err != nil {
			return nil, err
		}
	}
	samples := make([]time.Duration, 0, max(r.count, 1024))
	cpu0 := cpuTime()
	start := time.Now()
	deadline := start.Add(r.duration)
	for i := 0; r.more(i, deadline); i++ {
		t := time.Now()
		if err := roundTrip(); err != nil {
			return nil, err
		}
		samples = append(samples, time.Since(t))
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	if len(samples) == 0 {
		return nil, errors.New("no round trip completed")
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	oneWayUs := func(d time.Duration) float64 { return d.Seconds() * 1e6 / 2 }
	return map[string]float64{
		"p50_us":  oneWayUs(percentile(samples, 50)),
		"p99_us":  oneWayUs(percentile(samples, 99)),
		"avg_us":  oneWayUs(sum / time.Duration(len(samples))),
		"min_us":  oneWayUs(samples[0]),
		"count":   float64(len(samples)),
		"seconds": elapsed.Seconds(),
		"cpu_s":   cpu,
	}, nil
}

// percentile returns the nearest-rank percentile of sorted samples.
func percentile(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100 // ceil(n*p/100), a 1-based rank
	return sorted[max(i-1, 0)]
}

// stream writes size-byte messages one way over r.conns connections at
// once and reports the total throughput and message rate. The clock runs
// from the first write until every sink has confirmed receipt of all
// bytes, so queued but undelivered data does not count.
func (r *run) stream() (map[string]float64, error) {
	conns := make([]net.Conn, 0, r.conns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// All connections are set up before the clock starts: rdma_cm
	// connection setup is far slower than the transfers measured.
	for range r.conns {
		c, err := r.open(header{kind: kindSink, size: r.size})
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		writes int
		errs   []error
	)
	cpu0 := cpuTime()
	start := time.Now()
	deadline := start.Add(r.duration)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := r.send(c, deadline)
			mu.Lock()
			defer mu.Unlock()
			writes += n
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	bytes := float64(writes) * float64(r.size)
	return map[string]float64{
		"mb_s":    bytes / elapsed.Seconds() / 1e6,
		"msg_s":   float64(writes) / elapsed.Seconds(),
		"count":   float64(writes),
		"seconds": elapsed.Seconds(),
		"cpu_s":   cpu,
	}, nil
}

// send is one connection's share of a stream test: write, close the
// writing side, and wait for the sink's byte count.
func (r *run) send(c net.Conn, deadline time.Time) (int, error) {
	msg := make([]byte, r.size)
	n := 0
	for ; r.more(n, deadline); n++ {
		if _, err := c.Write(msg); err != nil {
			return n, err
		}
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return n, fmt.Errorf("%T cannot close its writing side", c)
	}
	if err := cw.CloseWrite(); err != nil {
		return n, err
	}
	var reply [countLen]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return n, fmt.Errorf("waiting for the sink's count: %w", err)
	}
	if got, sent := binary.BigEndian.Uint64(reply[:]), uint64(n)*uint64(r.size); got != sent {
		return n, fmt.Errorf("sink received %d bytes, %d were sent", got, sent)
	}
	return n, nil
}

// idle opens a connection, checks that it works, and reports the CPU time
// the whole process uses while the connection sits unused for d. With
// -local that covers both ends, so it shows whether the transport (e.g. a
// completion poller) burns CPU when there is nothing to do.
func (r *run) idle(d time.Duration) (map[string]float64, error) {
	c, err := r.open(header{kind: kindIdle, size: r.size})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg := make([]byte, r.size)
	ping := func() error {
		if _, err := c.Write(msg); err != nil {
			return err
		}
		_, err := io.ReadFull(c, msg)
		return err
	}
	for range 10 {
		if err := ping(); err != nil {
			return nil, err
		}
	}
	cpu0 := cpuTime()
	start := time.Now()
	time.Sleep(d)
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	if err := ping(); err != nil {
		return nil, fmt.Errorf("connection broken after idling: %w", err)
	}
	return map[string]float64{
		"cpu_s":   cpu,
		"cpu_pct": 100 * cpu / elapsed.Seconds(),
		"seconds": elapsed.Seconds(),
	}, nil
}

// cpuTime returns the user plus system CPU seconds used by this process.
func cpuTime() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// copyFile writes a file of copyLen bytes, then measures io.Copy of it to
// the connection, and at the server io.Copy to io.Discard, until the
// server has counted every byte. With the connection's ReadFrom and
// WriteTo, each byte is copied once in user space (file to registered
// buffer); plain, io.Copy goes through its own buffers on both sides.
func (r *run) copyFile() (map[string]float64, error) {
	f, err := os.CreateTemp("", "rdmaperf-copy-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for left := r.copyLen; left > 0; left -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(left, int64(len(chunk)))]); err != nil {
			return nil, err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	k := kindCopy
	if r.plain {
		k = kindCopyPlain
	}
	c, err := r.open(header{kind: k, size: int(min(r.copyLen, maxMsgSize))})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var dst io.Writer = c
	var src io.Reader = f
	if r.plain {
		dst, src = struct{ io.Writer }{c}, struct{ io.Reader }{f}
	}
	cpu0 := cpuTime()
	start := time.Now()
	n, err := io.Copy(dst, src)
	if err != nil {
		return nil, err
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return nil, err
	}
	var reply [countLen]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return nil, fmt.Errorf("waiting for the sink's count: %w", err)
	}
	if got := binary.BigEndian.Uint64(reply[:]); got != uint64(n) || n != r.copyLen {
		return nil, fmt.Errorf("sink received %d bytes, %d were copied of %d", got, n, r.copyLen)
	}
	elapsed := time.Since(start)
	return map[string]float64{
		"mb_s":    float64(n) / elapsed.Seconds() / 1e6,
		"seconds": elapsed.Seconds(),
		"cpu_s":   cpuTime() - cpu0,
	}, nil
}
