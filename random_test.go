package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/rdma"
)

// TestRandomConcurrentOps runs connection pairs in parallel for a bounded
// time, each with a random life: Writes of 0 B to 1 MiB and Reads of random
// sizes both ways (stream and message-oriented), ReadFrom and WriteTo,
// deadlines in the past, near and cleared, CloseWrite, CloseRead and Close
// from either side in the middle of it all, regions registered, read and
// written while their connection closes, and Dials cancelled during their
// setup. Every byte read is checked against what was written (position by
// position), a message-oriented Read never spans two Writes, a clean
// io.EOF comes only after everything written, and every error is one of
// the kinds the package documents. A watchdog dumps every goroutine and
// fails the test when a call outlives its deadline (or its connection's
// close) by 5 s.
//
// RDMA_TEST_SEED replays a run's choices (the scheduling differs);
// RDMA_TEST_RANDOM_DURATION sets how long it runs (default 20 s, 6 s with
// -short); RDMA_TEST_RANDOM_WORKERS how many pairs live at once (default 8).
func TestRandomConcurrentOps(t *testing.T) {
	needDevice(t)
	seed := time.Now().UnixNano()
	if v := os.Getenv("RDMA_TEST_SEED"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("RDMA_TEST_SEED: %v", err)
		}
		seed = s
	}
	dur := 20 * time.Second
	if testing.Short() {
		dur = 6 * time.Second
	}
	if v := os.Getenv("RDMA_TEST_RANDOM_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("RDMA_TEST_RANDOM_DURATION: %v", err)
		}
		dur = d
	}
	workers := envInt(t, "RDMA_TEST_RANDOM_WORKERS", 8)
	t.Logf("seed %d (replay with RDMA_TEST_SEED=%d), %v, %d pairs at once", seed, seed, dur, workers)

	rt := &randomRun{t: t, seed: seed, ops: map[int64]*watchedOp{}}
	stopWatch := rt.watch()
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rt.worker(w, end)
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(dur + 90*time.Second):
		dumpGoroutines()
		t.Fatalf("seed %d: the pairs did not finish within 90 s of the end (goroutines dumped)", seed)
	}
	stopWatch()
	t.Logf("seed %d: %d pairs, %d operations, %d stream bytes verified, %d one-sided bytes verified, %d dials cancelled mid-setup; errors seen: %v",
		seed, rt.pairs.Load(), rt.nops.Load(), rt.streamBytes.Load(), rt.regionBytes.Load(), rt.cancelled.Load(), rt.errKinds())
	if rt.pairs.Load() == 0 || rt.streamBytes.Load() == 0 {
		t.Fatalf("seed %d: nothing was exercised", seed)
	}
}

type randomRun struct {
	t    *testing.T
	seed int64

	mu     sync.Mutex
	ops    map[int64]*watchedOp
	nextOp int64
	kinds  map[string]int

	pairs, nops, streamBytes, regionBytes, cancelled atomic.Int64

	live map[int64][2]*rdma.Conn // pairs by number, under mu: their state goes with a stuck call's report
}

type watchedOp struct {
	what  string
	start time.Time
	limit time.Time // when it must have returned (deadline or close), before the grace
}

// watchGrace is how far past its limit a call may run before the
// watchdog calls it stuck.
const watchGrace = 5 * time.Second

// do runs f as a watched operation that must return by limit.
func (rt *randomRun) do(what string, limit time.Time, f func() error) error {
	rt.mu.Lock()
	rt.nextOp++
	id := rt.nextOp
	rt.ops[id] = &watchedOp{what: what, start: time.Now(), limit: limit}
	rt.mu.Unlock()
	err := f()
	rt.mu.Lock()
	delete(rt.ops, id)
	rt.mu.Unlock()
	rt.nops.Add(1)
	return err
}

// watch checks the operations in flight twice a second until stopped.
func (rt *randomRun) watch() (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		dumped := false
		for {
			select {
			case <-quit:
				return
			case now := <-tick.C:
				rt.mu.Lock()
				var stuck []string
				for _, op := range rt.ops {
					if now.After(op.limit.Add(watchGrace)) {
						stuck = append(stuck, fmt.Sprintf("%s (running %v, limit passed %v ago)", op.what, now.Sub(op.start).Round(time.Millisecond), now.Sub(op.limit).Round(time.Millisecond)))
						op.limit = now.Add(time.Hour) // report once
					}
				}
				live := maps.Clone(rt.live)
				rt.mu.Unlock()
				if len(stuck) > 0 {
					if !dumped {
						dumpGoroutines()
						dumped = true
					}
					rt.t.Errorf("seed %d: stuck calls: %v", rt.seed, stuck)
					for id, p := range live {
						rt.t.Logf("pair #%d:\n  c: %s\n  s: %s", id, rdma.DebugState(p[0]), rdma.DebugState(p[1]))
					}
				}
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// check requires err to be nil or one of the errors a call may return in
// these lives: net's kinds, wrapped in a *net.OpError of Net "rdma" (io.EOF
// bare).
func (rt *randomRun) check(what string, err error) {
	kind := ""
	switch {
	case err == nil:
		return
	case err == io.EOF:
		kind = "EOF"
	case errors.Is(err, os.ErrDeadlineExceeded):
		kind = "deadline"
	case errors.Is(err, net.ErrClosed):
		kind = "closed"
	case errors.Is(err, syscall.EPIPE):
		kind = "EPIPE"
	case errors.Is(err, rdma.ErrRemoteAccess):
		kind = "remote access refused"
	case errors.Is(err, syscall.ECONNRESET):
		kind = "reset"
	case bytes.Contains([]byte(err.Error()), []byte("cut short")):
		kind = "message cut"
	default:
		rt.t.Errorf("seed %d: %s: unexpected error %v", rt.seed, what, err)
		return
	}
	if err != io.EOF {
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Net != "rdma" {
			rt.t.Errorf("seed %d: %s: error %v is not a *net.OpError of Net rdma", rt.seed, what, err)
		}
	}
	rt.mu.Lock()
	if rt.kinds == nil {
		rt.kinds = map[string]int{}
	}
	rt.kinds[kind]++
	rt.mu.Unlock()
}

func (rt *randomRun) errKinds() map[string]int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.kinds
}

func (rt *randomRun) fail(format string, args ...any) {
	rt.t.Errorf("seed %d: "+format, append([]any{rt.seed}, args...)...)
}

// worker runs pairs until end, on listeners of its own (one stream, one
// message-oriented), so that it knows which accepted connection is whose.
func (rt *randomRun) worker(w int, end time.Time) {
	r := rand.New(rand.NewSource(rt.seed + int64(w)*1_000_003))
	lns := make([]net.Listener, 2)
	acc := make([]chan net.Conn, 2)
	var accepting sync.WaitGroup
	for i, msgs := range []bool{false, true} {
		lc := &rdma.ListenConfig{Options: rdma.Options{Messages: msgs}}
		ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
		if err != nil {
			rt.fail("worker %d: Listen: %v", w, err)
			return
		}
		lns[i], acc[i] = ln, make(chan net.Conn, 64)
		accepting.Add(1)
		go func() {
			defer accepting.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				acc[i] <- c
			}
		}()
	}
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
		accepting.Wait()
		for _, ch := range acc {
			close(ch)
			for c := range ch {
				c.Close()
			}
		}
	}()
	for time.Now().Before(end) {
		i := r.Intn(2)
		rt.pair(r, lns[i].Addr().String(), acc[i], i == 1)
	}
}

// pair lives one pair's random life.
func (rt *randomRun) pair(r *rand.Rand, addr string, accepted <-chan net.Conn, msgs bool) {
	if r.Intn(4) == 0 {
		// A Dial cancelled somewhere in its setup.
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Intn(20000))*time.Microsecond)
		var c net.Conn
		err := rt.do("cancelled Dial", time.Now().Add(5*time.Second), func() (err error) {
			c, err = (&rdma.Dialer{}).DialContext(ctx, "rdma", addr)
			return err
		})
		cancel()
		if err == nil {
			c.Close()
			// Its server end is taken below or by the worker's cleanup.
		} else if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
			rt.cancelled.Add(1)
		} else {
			rt.fail("a cancelled Dial: %v", err)
		}
	}
	var nc net.Conn
	if err := rt.do("Dial", time.Now().Add(20*time.Second), func() (err error) {
		nc, err = (&rdma.Dialer{Timeout: 20 * time.Second}).Dial("rdma", addr)
		return err
	}); err != nil {
		rt.fail("Dial: %v", err)
		return
	}
	var ns net.Conn
	// Skip server ends of cancelled Dials that connected after all: a
	// dial's server end is the one whose remote address is its local one.
	for ns == nil {
		select {
		case s := <-accepted:
			if s.RemoteAddr().String() == nc.LocalAddr().String() {
				ns = s
			} else {
				s.Close()
			}
		case <-time.After(20 * time.Second):
			rt.fail("nothing accepted for %v", nc.LocalAddr())
			nc.Close()
			return
		}
	}
	id := rt.pairs.Add(1)
	c, s := nc.(*rdma.Conn), ns.(*rdma.Conn)
	rt.mu.Lock()
	if rt.live == nil {
		rt.live = map[int64][2]*rdma.Conn{}
	}
	rt.live[id] = [2]*rdma.Conn{c, s}
	rt.mu.Unlock()
	defer func() {
		rt.mu.Lock()
		delete(rt.live, id)
		rt.mu.Unlock()
	}()
	// Every call ends by the time both ends are closed and torn down:
	// the closer closes both within closeBy; a Close may take its linger
	// and drain (3 s each) on top.
	lifetime := time.Duration(r.Intn(1500)) * time.Millisecond
	closeBy := time.Now().Add(lifetime)
	limit := closeBy.Add(8 * time.Second)

	ab := newStreamCheck(msgs)  // c writes, s reads (s's Options.Messages)
	ba := newStreamCheck(false) // s writes, c reads
	var wg sync.WaitGroup
	stop := make(chan struct{})
	seeds := [6]int64{r.Int63(), r.Int63(), r.Int63(), r.Int63(), r.Int63(), r.Int63()}
	run := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	cs, sc := fmt.Sprintf("#%d c→s", id), fmt.Sprintf("#%d s→c", id)
	run(func() { rt.writer(rand.New(rand.NewSource(seeds[0])), c, ab, limit, stop, cs) })
	run(func() { rt.reader(rand.New(rand.NewSource(seeds[1])), s, ab, limit, cs) })
	run(func() { rt.writer(rand.New(rand.NewSource(seeds[2])), s, ba, limit, stop, sc) })
	run(func() { rt.reader(rand.New(rand.NewSource(seeds[3])), c, ba, limit, sc) })
	if r.Intn(3) == 0 {
		run(func() { rt.regions(rand.New(rand.NewSource(seeds[4])), s, c, limit, stop) })
	}
	// The closer: ends the pair's life in one of the ways a program
	// might, while everything above is under way.
	cr := rand.New(rand.NewSource(seeds[5]))
	time.Sleep(lifetime)
	ends := []*rdma.Conn{c, s}
	first := cr.Intn(2)
	switch cr.Intn(5) {
	case 0: // both write sides shut, then both close
		for _, e := range []int{first, 1 - first} {
			rt.check("CloseWrite", rt.do("CloseWrite", limit, ends[e].CloseWrite))
		}
	case 1: // one side stops reading first
		reads := []*streamCheck{ba, ab}[first] // c reads s→c, s reads c→s
		reads.mu.Lock()
		reads.readClosed = true
		reads.mu.Unlock()
		rt.check("CloseRead", rt.do("CloseRead", limit, ends[first].CloseRead))
	case 2: // one side closes its write side only, the other closes
		rt.check("CloseWrite", rt.do("CloseWrite", limit, ends[first].CloseWrite))
	}
	close(stop)
	time.Sleep(time.Duration(cr.Intn(100)) * time.Millisecond)
	for _, e := range []int{first, 1 - first} {
		// ETIMEDOUT: the peer left no receive free for the linger time
		// (it stopped reading), and Close says what it dropped.
		if err := rt.do("Close", limit, ends[e].Close); err != nil && !errors.Is(err, syscall.ETIMEDOUT) {
			rt.check("Close", err)
		}
	}
	wg.Wait()
	rt.streamBytes.Add(ab.verified.Load() + ba.verified.Load())
}

// streamCheck follows one direction of a pair: what the writer had
// accepted, and, for a message-oriented reader, where each Write ends.
type streamCheck struct {
	msgs bool

	mu         sync.Mutex
	written    int64   // bytes Writes accepted
	bounds     []int64 // where Writes end (planned), ascending
	readClosed bool    // the reading end called CloseRead: its io.EOF is its own
	endOnce    sync.Once
	endedCh    chan struct{} // closed when the writer is done: written is final
	verified   atomic.Int64
}

func newStreamCheck(msgs bool) *streamCheck {
	return &streamCheck{msgs: msgs, endedCh: make(chan struct{})}
}

// pattern is the byte at stream position off.
func pattern(off int64) byte { return byte(off*131 + off>>9 + 7) }

func (sc *streamCheck) fill(b []byte, off int64) {
	for i := range b {
		b[i] = pattern(off + int64(i))
	}
}

// plan records where a Write about to start ends (a reader may see its
// bytes before it returns); unplan drops it for a Write that sent nothing.
func (sc *streamCheck) plan(end int64) {
	sc.mu.Lock()
	sc.bounds = append(sc.bounds, end)
	sc.mu.Unlock()
}

func (sc *streamCheck) unplan() {
	sc.mu.Lock()
	sc.bounds = sc.bounds[:len(sc.bounds)-1]
	sc.mu.Unlock()
}

func (sc *streamCheck) accepted(n int) {
	sc.mu.Lock()
	sc.written += int64(n)
	sc.mu.Unlock()
}

func (sc *streamCheck) end() { sc.endOnce.Do(func() { close(sc.endedCh) }) }

// spans reports whether [from, to) crosses the end of a Write.
func (sc *streamCheck) spans(from, to int64) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	i := sort.Search(len(sc.bounds), func(i int) bool { return sc.bounds[i] > from })
	return i < len(sc.bounds) && sc.bounds[i] < to
}

// randomDeadline picks a deadline for the next call (past, near, far or
// cleared) and says by when that call must return: the deadline, or the
// pair's limit if that comes first (or the deadline is cleared).
func randomDeadline(r *rand.Rand, limit time.Time) (deadline, mustReturn time.Time) {
	switch r.Intn(6) {
	case 0:
		deadline = time.Now().Add(-time.Second) // past
	case 1, 2:
		deadline = time.Now().Add(time.Duration(r.Intn(50_000)) * time.Microsecond) // near
	case 3:
		deadline = time.Now().Add(2 * time.Second)
	default:
		return time.Time{}, limit // cleared
	}
	if deadline.Before(limit) {
		return deadline, deadline
	}
	return deadline, limit
}

func randomSize1M(r *rand.Rand) int {
	switch r.Intn(8) {
	case 0:
		return 0
	case 1, 2, 3:
		return 1 + r.Intn(64)
	case 4, 5:
		return 1 + r.Intn(8<<10)
	case 6:
		return 1 + r.Intn(128<<10)
	}
	return 1 + r.Intn(1<<20)
}

// writer writes the pattern with Writes and ReadFrom until an error ends
// it or the pair is told to stop.
func (rt *randomRun) writer(r *rand.Rand, c *rdma.Conn, sc *streamCheck, limit time.Time, stop <-chan struct{}, dir string) {
	var off int64
	buf := make([]byte, 1<<20)
	defer sc.end()
	for {
		select {
		case <-stop:
			return
		default:
		}
		dl, opLimit := randomDeadline(r, limit)
		if err := c.SetWriteDeadline(dl); err != nil {
			rt.check(dir+" SetWriteDeadline", err)
			return
		}
		var n int64
		var err error
		if r.Intn(5) == 0 {
			// io.Copy's path: a source whose Reads are random sizes.
			src := &patternReader{r: rand.New(rand.NewSource(r.Int63())), sc: sc, off: off, left: int64(randomSize1M(r)) + 1}
			err = rt.do(dir+" ReadFrom", opLimit, func() (err error) {
				n, err = c.ReadFrom(src)
				return err
			})
		} else {
			size := randomSize1M(r)
			b := buf[:size]
			sc.fill(b, off)
			if size > 0 {
				sc.plan(off + int64(size))
			}
			err = rt.do(dir+" Write", opLimit, func() error {
				k, err := c.Write(b)
				n = int64(k)
				return err
			})
			if size > 0 && n == 0 {
				sc.unplan()
			}
		}
		off += n
		sc.accepted(int(n))
		if err != nil {
			rt.check(dir+" write", err)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
		}
	}
}

// patternReader is a Reader of the pattern in random-sized pieces; each
// piece is a message of its own to a message-oriented peer.
type patternReader struct {
	r    *rand.Rand
	sc   *streamCheck
	off  int64
	left int64
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(b)), p.left, int64(1+p.r.Intn(64<<10)))
	p.sc.fill(b[:n], p.off)
	p.sc.plan(p.off + n)
	p.off += n
	p.left -= n
	return int(n), nil
}

// reader reads with Read and WriteTo and checks every byte.
func (rt *randomRun) reader(r *rand.Rand, c *rdma.Conn, sc *streamCheck, limit time.Time, dir string) {
	var off int64
	buf := make([]byte, 2<<20)
	check := func(b []byte) bool {
		for i, x := range b {
			if x != pattern(off+int64(i)) {
				rt.fail("%s: byte %d is %#x, written %#x", dir, off+int64(i), x, pattern(off+int64(i)))
				return false
			}
		}
		if sc.msgs && sc.spans(off, off+int64(len(b))) {
			rt.fail("%s: a message-oriented Read of [%d, %d) spans two Writes", dir, off, off+int64(len(b)))
			return false
		}
		off += int64(len(b))
		sc.verified.Add(int64(len(b)))
		return true
	}
	for {
		dl, opLimit := randomDeadline(r, limit)
		if err := c.SetReadDeadline(dl); err != nil {
			rt.check(dir+" SetReadDeadline", err)
			return
		}
		var err error
		if r.Intn(5) == 0 {
			bad := false
			err = rt.do(dir+" WriteTo", opLimit, func() error {
				_, err := c.WriteTo(writerFunc(func(b []byte) (int, error) {
					if !check(b) {
						bad = true
						return 0, errors.New("corrupted")
					}
					return len(b), nil
				}))
				return err
			})
			if bad {
				return
			}
			if err == nil {
				err = io.EOF // WriteTo ends at the fin without an error
			}
		} else {
			b := buf[:1+r.Intn(len(buf))]
			var n int
			err = rt.do(dir+" Read", opLimit, func() (err error) {
				n, err = c.Read(b)
				return err
			})
			if !check(b[:n]) {
				return
			}
		}
		if err == io.EOF {
			// A clean end delivered everything the writer accepted.
			select {
			case <-sc.endedCh:
			case <-time.After(time.Until(limit) + watchGrace):
				rt.fail("%s: io.EOF, and the writer never ended", dir)
				return
			}
			// The fin follows everything accepted (a Close that could
			// not deliver sends none, and its peer sees a reset).
			sc.mu.Lock()
			written, own := sc.written, sc.readClosed
			sc.mu.Unlock()
			if off > written || (!own && off != written) {
				rt.fail("%s: io.EOF after %d bytes, the writer's Writes accepted %d (CloseRead: %v)", dir, off, written, own)
			}
			return
		}
		if err != nil {
			rt.check(dir+" read", err)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
		}
	}
}

// regions registers regions on s and has c read and write them, while
// the pair closes.
func (rt *randomRun) regions(r *rand.Rand, s, c *rdma.Conn, limit time.Time, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		size := 1 + r.Intn(256<<10)
		var reg *rdma.Region
		err := rt.do("RegisterRegion", limit, func() (err error) {
			reg, err = s.RegisterRegion(size, rdma.RemoteRead|rdma.RemoteWrite)
			return err
		})
		if err != nil {
			rt.check("RegisterRegion", err)
			return
		}
		remote := c.Remote(reg.Key())
		for i := 0; i < 1+r.Intn(8); i++ {
			n := 1 + r.Intn(size)
			off := int64(r.Intn(size - n + 1))
			p := make([]byte, n)
			r.Read(p)
			err := rt.do("WriteAt", limit, func() error {
				_, err := remote.WriteAt(p, off)
				return err
			})
			if err != nil {
				rt.check("WriteAt", err)
				reg.Close()
				return
			}
			q := make([]byte, n)
			err = rt.do("ReadAt", limit, func() error {
				_, err := remote.ReadAt(q, off)
				return err
			})
			if err != nil {
				rt.check("ReadAt", err)
				reg.Close()
				return
			}
			if !bytes.Equal(p, q) {
				rt.fail("one-sided: ReadAt of [%d, %d) is not what WriteAt wrote", off, off+int64(n))
			}
			rt.regionBytes.Add(int64(n))
		}
		if err := rt.do("Region.Close", limit, reg.Close); err != nil {
			rt.check("Region.Close", err)
		}
	}
}
