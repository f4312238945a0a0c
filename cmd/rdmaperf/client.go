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
	"sync/atomic"
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
	reverse  bool // bw, rate: the server sends, the client receives (-R)
	// keepConns: http keeps an idle connection per client (-keep).
	keepConns bool
	// interval, when positive, is how often a bw or rate test calls report
	// with what moved since the previous call (-i).
	interval time.Duration
	report   func(Interval)
	// batch is how many datagrams a datagram blast sends per WriteBatch
	// (-batch; 1: one WriteTo each).
	batch int
	// perConn, when set (-perconn), gets each connection's share of a
	// clients test, in dial order, with its local address.
	perConn func(i int, addr string, s clientSample)
	// grace is how long a clients test waits after its window for the
	// requests outstanding (0: clientGrace).
	grace time.Duration
	// rdma says the connections are this library's (a clients test then
	// times the devices' release of them).
	rdma bool
	// tail, when set (-tail), gets the latency test's breakdown of its
	// slowest round trips (see tailProbe).
	tail func(string)
	// obs, when set (-json), notes what iperf3's report shape asks for
	// beyond the metrics.
	obs *observed
}

// Interval is what moved during one interval of a bw or rate test: the
// bytes the client's Writes accepted, or, reverse, the bytes it received.
// Start and End are seconds since the test's clock started.
type Interval struct {
	Start float64 `json:"start"`
	End   float64 `json:"end"`
	Bytes int64   `json:"bytes"`
	MBs   float64 `json:"mb_s"`
	MsgS  float64 `json:"msg_s"`
	// Streams splits Bytes by connection, in the order they were opened.
	// Kept out of the record, whose shape bench/run.sh's results keep: the
	// iperf3-shaped report carries it.
	Streams []int64 `json:"-"`
}

func (iv Interval) String() string {
	return fmt.Sprintf("[%6.2f-%6.2f s] %10.2f MB/s %12.0f msg/s", iv.Start, iv.End, iv.MBs, iv.MsgS)
}

// counter is one connection's byte count, read by the interval reporter
// while the connection's goroutine adds to it; padded to a cache line of
// its own so connections do not slow each other down.
type counter struct {
	n atomic.Int64
	_ [56]byte
}

// open dials, sends the header and waits for the server's ready byte.
func (r *run) open(h header) (net.Conn, error) {
	c, err := r.dial()
	if err != nil {
		return nil, err
	}
	if c, err = greet(c, h); err == nil && h.kind != kindDgramEcho && h.kind != kindDgramSink {
		// A datagram test's data does not go over this connection:
		// openDgramTest notes its datagram end point instead.
		r.obs.connect(c.LocalAddr(), c.RemoteAddr())
	}
	return c, err
}

// greet sends the header on a new connection and waits for the server's
// ready byte; it closes the connection if that fails.
func greet(c net.Conn, h header) (net.Conn, error) {
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
	if r.tail != nil {
		p := newTailProbe(c)
		roundTrip = func() error { return p.roundTrip(msg, back) }
		defer func() { r.tail(p.report()) }()
	}
	// Warm-up round trips fault the buffers in and let the transport
	// settle (credits, TCP's window) before anything counts.
	return r.timeOps(roundTrip, true, "round trip")
}

// timeOps runs op after the warm-up for -n times or -duration and reports
// its percentiles in µs, halved for a round trip that stands for two
// one-way trips; what names an op in the error when none completed.
func (r *run) timeOps(op func() error, halve bool, what string) (map[string]float64, error) {
	for range r.warmup {
		if err := op(); err != nil && err != errLost {
			return nil, err
		}
	}
	samples := make([]time.Duration, 0, max(r.count, 1024))
	cpu0 := cpuNow()
	start := time.Now()
	deadline := start.Add(r.duration)
	for i := 0; r.more(i, deadline); i++ {
		t := time.Now()
		if err := op(); err == errLost {
			continue
		} else if err != nil {
			return nil, err
		}
		samples = append(samples, time.Since(t))
	}
	elapsed := time.Since(start)
	cpu := r.cpuSince(cpu0)
	if len(samples) == 0 {
		return nil, errors.New("no " + what + " completed")
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	us := func(d time.Duration) float64 {
		if halve {
			return d.Seconds() * 1e6 / 2
		}
		return d.Seconds() * 1e6
	}
	return map[string]float64{
		"p50_us":  us(percentile(samples, 50)),
		"p99_us":  us(percentile(samples, 99)),
		"avg_us":  us(sum / time.Duration(len(samples))),
		"min_us":  us(samples[0]),
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

// stream moves size-byte messages one way over r.conns connections at
// once and reports the total throughput and message rate: the client
// writes and the server's sink counts, or, reverse, the server writes and
// the client counts. The clock runs from the start until the receiving
// side has all the bytes, so data queued but undelivered does not count.
func (r *run) stream() (map[string]float64, error) {
	h := header{kind: kindSink, size: r.size}
	if r.reverse {
		h = header{kind: kindSource, size: r.size, count: uint64(r.count)}
	}
	conns := make([]net.Conn, 0, r.conns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// All connections are set up before the clock starts: rdma_cm
	// connection setup is far slower than the transfers measured.
	for range r.conns {
		c, err := r.open(h)
		if err != nil {
			if r.reverse {
				err = fmt.Errorf("%w (a server older than -R closes the connection here)", err)
			}
			return nil, err
		}
		conns = append(conns, c)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		counts = make([]*counter, len(conns))
	)
	for i := range counts {
		counts[i] = new(counter)
	}
	cpu0 := cpuNow()
	start := time.Now()
	deadline := start.Add(r.duration)
	stopReports := r.reportIntervals(start, counts)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if r.reverse {
				err = r.receive(c, deadline, counts[i])
			} else {
				err = r.send(c, deadline, counts[i])
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := r.cpuSince(cpu0)
	stopReports()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var bytes int64
	perConn := make([]int64, len(counts))
	for i, n := range counts {
		perConn[i] = n.n.Load()
		bytes += perConn[i]
	}
	if r.obs != nil {
		r.obs.streams = perConn
	}
	writes := float64(bytes) / float64(r.size)
	return map[string]float64{
		"mb_s":    float64(bytes) / elapsed.Seconds() / 1e6,
		"msg_s":   writes / elapsed.Seconds(),
		"count":   writes,
		"seconds": elapsed.Seconds(),
		"cpu_s":   cpu,
	}, nil
}

// reportIntervals calls r.report every r.interval, from its own goroutine,
// with what the counters gained since the previous call, until the
// returned stop is called; stop reports the last, partial interval if
// anything moved in it, and returns once the goroutine is done.
func (r *run) reportIntervals(start time.Time, counts []*counter) (stop func()) {
	if r.interval <= 0 || r.report == nil {
		return func() {}
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(r.interval)
		defer tick.Stop()
		from, before := start, int64(0)
		prev := make([]int64, len(counts))
		emit := func(last bool) {
			// The ticker's own time would be late whenever this
			// goroutine is: the interval is measured, not assumed.
			now := time.Now()
			var total int64
			streams := make([]int64, len(counts))
			for i, n := range counts {
				v := n.n.Load()
				streams[i] = v - prev[i]
				prev[i] = v
				total += v
			}
			if last && total == before {
				return
			}
			secs := now.Sub(from).Seconds()
			delta := total - before
			r.report(Interval{
				Start:   from.Sub(start).Seconds(),
				End:     now.Sub(start).Seconds(),
				Bytes:   delta,
				MBs:     float64(delta) / secs / 1e6,
				MsgS:    float64(delta) / float64(r.size) / secs,
				Streams: streams,
			})
			from, before = now, total
		}
		for {
			select {
			case <-tick.C:
				emit(false)
			case <-quit:
				emit(true)
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// send is one connection's share of a stream test: write, close the
// writing side, and wait for the sink's byte count.
func (r *run) send(c net.Conn, deadline time.Time, sent *counter) error {
	msg := make([]byte, r.size)
	n := 0
	for ; r.more(n, deadline); n++ {
		if _, err := c.Write(msg); err != nil {
			return err
		}
		sent.n.Add(int64(r.size))
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return fmt.Errorf("%T cannot close its writing side", c)
	}
	if err := cw.CloseWrite(); err != nil {
		return err
	}
	var reply [countLen]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return fmt.Errorf("waiting for the sink's count: %w", err)
	}
	if got, sent := binary.BigEndian.Uint64(reply[:]), uint64(n)*uint64(r.size); got != sent {
		return fmt.Errorf("sink received %d bytes, %d were sent", got, sent)
	}
	return nil
}

// receive is one connection's share of a reverse stream test: tell the
// server to start, read until it half-closes, and, running for a
// duration, half-close at the deadline to tell it to stop (what is in
// flight then still arrives and counts).
func (r *run) receive(c net.Conn, deadline time.Time, got *counter) error {
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return fmt.Errorf("%T cannot close its writing side", c)
	}
	if _, err := c.Write([]byte{startByte}); err != nil {
		return err
	}
	stopErr := make(chan error, 1)
	if r.count == 0 {
		t := time.AfterFunc(time.Until(deadline), func() {
			err := cw.CloseWrite()
			if err != nil {
				c.Close() // the server would never stop: end the Read below
			}
			stopErr <- err
		})
		defer t.Stop()
	}
	// Large enough for many TCP segments, or many rdma messages, per read.
	buf := make([]byte, 1<<20)
	for {
		n, err := c.Read(buf)
		got.n.Add(int64(n))
		if err == io.EOF {
			break
		}
		if err != nil {
			select {
			case e := <-stopErr:
				if e != nil {
					return fmt.Errorf("telling the server to stop: %w", e)
				}
			default:
			}
			return err
		}
	}
	if want := uint64(r.count) * uint64(r.size); r.count > 0 && uint64(got.n.Load()) != want {
		return fmt.Errorf("received %d bytes, the server was to send %d", got.n.Load(), want)
	}
	return nil
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
	cpu0 := cpuNow()
	start := time.Now()
	time.Sleep(d)
	elapsed := time.Since(start)
	cpu := r.cpuSince(cpu0)
	if err := ping(); err != nil {
		return nil, fmt.Errorf("connection broken after idling: %w", err)
	}
	return map[string]float64{
		"cpu_s":   cpu,
		"cpu_pct": 100 * cpu / elapsed.Seconds(),
		"seconds": elapsed.Seconds(),
	}, nil
}

// cpuSample is the CPU time this process has used, in seconds.
type cpuSample struct{ user, sys float64 }

func cpuNow() cpuSample {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return cpuSample{}
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return cpuSample{tv(ru.Utime), tv(ru.Stime)}
}

// cpuSince returns the user plus system CPU seconds used since c0 (a
// test's cpu_s), and notes the two parts apart for the iperf3-shaped
// report, whose CPU figures split them.
func (r *run) cpuSince(c0 cpuSample) float64 {
	now := cpuNow()
	d := cpuSample{now.user - c0.user, now.sys - c0.sys}
	if r.obs != nil {
		r.obs.cpu = d
	}
	return d.user + d.sys
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
	cpu0 := cpuNow()
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
		"cpu_s":   r.cpuSince(cpu0),
	}, nil
}
