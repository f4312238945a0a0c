//go:build faultinject && linux && cgo

package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goverbs/rdma"
	"github.com/goverbs/rdma/internal/faults"
)

// The fault sweep: a scenario that uses every part of the library (Listen,
// Dial, a stream both ways that grows the rings, one-sided READ, WRITE and atomics,
// Close, a second Dial, Listener.Close) runs once per call that
// libibverbs and librdmacm make into the kernel's RDMA interface, with
// that call failing (see internal/faults). Whatever fails, the scenario
// must end with documented errors and without waiting out a deadline, the
// process must serve a new connection afterwards, and every goroutine and
// verbs object must be gone again.
//
// Built only with -tags faultinject (make test builds and runs it in the
// VM). RDMA_FAULT_POINTS=a-b sweeps only those points.

// faultStep bounds every step of the scenario: a step that runs into it
// got stuck (the emulated test bed does each in milliseconds).
const faultStep = 15 * time.Second

// faultHang is how long a whole scenario may take before the sweep
// declares it hung and dumps the goroutines.
const faultHang = 90 * time.Second

// faultData is what the scenario streams each way: enough in full-size
// messages for both ends to grow their rings.
const faultData = 256 << 10

type stepErr struct {
	step string
	err  error
}

func (s stepErr) String() string { return s.step + ": " + s.err.Error() }

// faultScenario runs the scenario against addr and returns the errors its
// steps met, in order (none when every step succeeded).
func faultScenario(addr string, data []byte) []stepErr {
	var errs []stepErr
	fail := func(step string, err error) bool {
		if err != nil {
			errs = append(errs, stepErr{step, err})
			return true
		}
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), faultStep)
	defer cancel()
	ln, err := (&rdma.ListenConfig{}).Listen(ctx, "rdma", net.JoinHostPort(addr, "0"))
	if fail("listen", err) {
		return errs
	}
	srv := make(chan []stepErr, 1)
	go func() { srv <- faultServer(ln, len(data)) }()

	for round := 0; round < 2; round++ {
		if !faultClient(ln.Addr().String(), data, round == 0, fail) {
			break
		}
	}
	if err := ln.Close(); err != nil {
		fail("listener close", err)
	}
	select {
	case s := <-srv:
		for _, e := range s {
			errs = append(errs, stepErr{"server " + e.step, e.err})
		}
	case <-time.After(faultStep):
		errs = append(errs, stepErr{"server", fmt.Errorf("still running %v after Listener.Close: %w", faultStep, os.ErrDeadlineExceeded)})
	}
	return errs
}

// faultClient dials, and on the first round streams data both ways and
// writes and reads the server's region; it reports whether the round
// succeeded.
func faultClient(addr string, data []byte, full bool, fail func(string, error) bool) bool {
	d := rdma.Dialer{Timeout: faultStep}
	nc, err := d.Dial("rdma", addr)
	if fail("dial", err) {
		return false
	}
	c := nc.(*rdma.Conn)
	ok := func() bool {
		if fail("set deadline", c.SetDeadline(time.Now().Add(faultStep))) {
			return false
		}
		if !full {
			_, err := c.Write([]byte{'q'})
			if fail("write", err) {
				return false
			}
			_, err = io.ReadFull(c, make([]byte, 1))
			return !fail("read", err)
		}
		kb := make([]byte, rdma.RemoteKeyLen)
		_, err := io.ReadFull(c, kb)
		if fail("read key", err) {
			return false
		}
		var key rdma.RemoteKey
		if fail("key", key.UnmarshalBinary(kb)) {
			return false
		}
		// The stream: written from a goroutine while this one reads the
		// echo, since neither side's rings hold it all.
		wrote := make(chan error, 1)
		go func() {
			_, err := c.Write(data)
			wrote <- err
		}()
		back := make([]byte, len(data))
		_, err = io.ReadFull(c, back)
		werr := <-wrote
		if fail("write", werr) || fail("read", err) {
			return false
		}
		if !bytes.Equal(back, data) {
			fail("read", errors.New("the echo differs from what was written"))
			return false
		}
		remote := c.Remote(key)
		block := data[:4096]
		_, err = remote.WriteAt(block, 4096)
		if fail("one-sided write", err) {
			return false
		}
		got := make([]byte, len(block))
		_, err = remote.ReadAt(got, 4096)
		if fail("one-sided read", err) {
			return false
		}
		if !bytes.Equal(got, block) {
			fail("one-sided read", errors.New("read back other bytes than written"))
			return false
		}
		// The region's first word is the scenario's counter.
		prev, err := remote.FetchAdd(context.Background(), 0, 5)
		if fail("fetch-add", err) {
			return false
		}
		if prev, err = remote.CompareAndSwap(context.Background(), 0, prev+5, 9); fail("compare-and-swap", err) {
			return false
		}
		if prev != 5 {
			fail("compare-and-swap", fmt.Errorf("the counter held %d, want 5", prev))
			return false
		}
		_, err = c.Write([]byte{'q'})
		if fail("write", err) {
			return false
		}
		_, err = io.ReadFull(c, make([]byte, 1))
		return !fail("read", err)
	}()
	if err := c.Close(); err != nil && ok {
		fail("close", err)
		return false
	}
	return ok
}

// faultServer serves the scenario's connections until ln is closed: the
// first gets a region and the echo of n bytes, every one a byte back for
// its last byte.
func faultServer(ln net.Listener, n int) []stepErr {
	var errs []stepErr
	fail := func(step string, err error) bool {
		if err != nil {
			errs = append(errs, stepErr{step, err})
			return true
		}
		return false
	}
	for first := true; ; first = false {
		nc, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				fail("accept", err)
			}
			return errs
		}
		c := nc.(*rdma.Conn)
		func() {
			defer func() {
				if err := c.Close(); err != nil {
					fail("close", err)
				}
			}()
			if fail("set deadline", c.SetDeadline(time.Now().Add(faultStep))) {
				return
			}
			if first {
				r, err := c.RegisterRegion(16<<10, rdma.RemoteRead|rdma.RemoteWrite|rdma.RemoteAtomic)
				if fail("register", err) {
					return
				}
				defer r.Close()
				kb, _ := r.Key().MarshalBinary()
				if _, err := c.Write(kb); fail("write key", err) {
					return
				}
				// Through ReadFrom and WriteTo.
				if _, err := io.CopyN(c, c, int64(n)); fail("echo", err) {
					return
				}
			}
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); fail("read", err) {
				return
			}
			_, err := c.Write(b)
			fail("write", err)
		}()
	}
}

// documented reports whether err is one of the errors the package
// documents: an *net.OpError of network "rdma", or io.EOF (io.ReadFull's
// io.ErrUnexpectedEOF included).
func documented(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Net == "rdma"
}

// connsGone waits until no connection holds a device, and lets the
// devices go.
func connsGone() error {
	rdma.WaitReleases()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		conns := 0
		for _, d := range rdma.Devices() {
			conns += d.Connections
		}
		if conns == 0 {
			// And with them their memory's count: what a connection
			// counted as registered on its device, its every way out
			// (a failed setup included) took back.
			for _, d := range rdma.Devices() {
				if d.RegisteredBytes != 0 {
					return fmt.Errorf("device %s: no connection, %d bytes registered", d.Name, d.RegisteredBytes)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d connections still hold a device", conns)
		}
	}
	rdma.ReleaseIdleDevices()
	return nil
}

// backToBaseline waits until `rdma resource show` counts what it counted
// before.
func backToBaseline(before map[string]int) error {
	after := resources()
	for deadline := time.Now().Add(10 * time.Second); !equalCounts(before, after) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		after = resources()
	}
	if !equalCounts(before, after) {
		return fmt.Errorf("verbs objects: before %v, after %v", before, after)
	}
	return nil
}

// runFaultPoint runs the scenario once with the calls at..at+span-1 failing
// with errno (at 0: none), and checks what the issue asks of every point.
// It returns the scenario's errors and the calls the scenario made.
func runFaultPoint(t *testing.T, sc scenario, data []byte, at, span int, errno syscall.Errno, only faults.Call) ([]stepErr, []faults.Call, int) {
	t.Helper()
	done := make(chan []stepErr, 1)
	faults.Arm(at, span, errno, only)
	go func() { done <- sc(testAddr, data) }()
	var errs []stepErr
	select {
	case errs = <-done:
	case <-time.After(faultHang):
		faults.Disarm()
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		t.Fatalf("point %d: the scenario still runs after %v (goroutines above)", at, faultHang)
	}
	trace := faults.Trace()
	failed := faults.Failed()
	faults.Disarm()
	return errs, trace, failed
}

// checkAfter checks what must hold after every point: the process serves
// a new connection, nothing leaked. A leak of verbs objects is reported and
// the sweep goes on from the new counts, so that one run shows every point
// that leaks.
func checkAfter(t *testing.T, sc scenario, at int, before map[string]int, ignore goleak.Option) map[string]int {
	t.Helper()
	if errs := sc(testAddr, make([]byte, 8<<10)); len(errs) > 0 {
		t.Fatalf("point %d: afterwards, with no fault, the scenario failed: %v", at, errs)
	}
	require.NoError(t, connsGone(), "point %d", at)
	require.NoError(t, goleak.Find(ignore), "point %d", at)
	if err := backToBaseline(before); err != nil {
		t.Errorf("point %d: %v", at, err)
		return resources()
	}
	return before
}

// scenario is what a sweep runs at each point: the connections'
// (faultScenario) or the datagrams' (packetScenario).
type scenario func(addr string, data []byte) []stepErr

func TestFaultSweep(t *testing.T) { faultSweep(t, faultScenario) }

// TestFaultSweepPacket sweeps the datagrams' scenario (packetScenario).
func TestFaultSweepPacket(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD")
	}
	faultSweep(t, packetScenario)
}

// faultSweep runs scenario sc with each of its calls into the kernel
// failing in turn. A listener stays open meanwhile: without it the
// scenario's last Close destroys the device's last id, and librdmacm then
// deallocates a protection domain of its own, ignoring a failure (the PD
// stays until the process exits; one sweep saw that call fall inside the
// swept ones), which is not this package's to handle.
func faultSweep(t *testing.T, sc scenario) {
	needDevice(t)
	anchor, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer anchor.Close()
	data := make([]byte, faultData)
	rand.New(rand.NewSource(1)).Read(data)
	ignore := goleak.IgnoreCurrent()
	require.NoError(t, connsGone())
	before := resources()

	// Count the calls, twice: their number varies a little with timing
	// (the poller arms the CQ only when it runs out of completions).
	most := 0
	var trace []faults.Call
	for i := 0; i < 2; i++ {
		errs, tr, _ := runFaultPoint(t, sc, data, 0, 0, 0, 0)
		require.Empty(t, errs, "the scenario without faults")
		if len(tr) > most {
			most, trace = len(tr), tr
		}
		before = checkAfter(t, sc, 0, before, ignore)
	}
	hist := map[faults.Call]int{}
	for _, c := range trace {
		hist[c]++
	}
	t.Logf("the scenario makes %d calls into the kernel's RDMA interface: %s", most, histString(hist))

	from, to := 1, most+5
	if p := os.Getenv("RDMA_FAULT_POINTS"); p != "" {
		a, b, _ := strings.Cut(p, "-")
		from, _ = strconv.Atoi(a)
		to, _ = strconv.Atoi(b)
	}
	// ENOMEM may pass; EIO is what a device in trouble says.
	errnos := []syscall.Errno{syscall.ENOMEM, syscall.EIO}
	outcomes := map[string]int{}
	for at := from; at <= to; at++ {
		for _, errno := range errnos {
			before = sweepPoint(t, sc, data, at, errno, outcomes, before, ignore)
		}
	}
	t.Logf("swept points %d-%d, each with %v: %s", from, to, errnos, mapString(outcomes))
}

// sweepPoint runs the scenario with call at failing with errno, checks
// the outcome, and counts it in outcomes; it returns the verbs objects'
// counts to compare the next point with.
func sweepPoint(t *testing.T, sc scenario, data []byte, at int, errno syscall.Errno, outcomes map[string]int, before map[string]int, ignore goleak.Option) map[string]int {
	t.Helper()
	errs, tr, failed := runFaultPoint(t, sc, data, at, 1, errno, 0)
	call := "none (fewer calls this time)"
	if at <= len(tr) {
		call = tr[at-1].String()
	}
	outcome := "absorbed"
	for _, e := range errs {
		if errors.Is(e.err, os.ErrDeadlineExceeded) {
			t.Errorf("point %d (%s, %v): stuck: %v", at, call, errno, e)
		} else if !documented(e.err) {
			t.Errorf("point %d (%s, %v): undocumented error %T: %v", at, call, errno, e.err, e)
		}
	}
	if len(errs) > 0 {
		outcome = "failed at " + errs[0].step
	}
	if failed == 0 {
		outcome = "no call failed"
	}
	outcomes[outcome]++
	t.Logf("point %d: %s failed with %v: %s %v", at, call, errno, outcome, errs)
	return checkAfter(t, sc, at, before, ignore)
}

func histString(h map[faults.Call]int) string {
	m := map[string]int{}
	for c, n := range h {
		m[c.String()] += n
	}
	return mapString(m)
}

func mapString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

// TestFaultCMEventsLost makes every read of the process's CM events fail
// (rdma_get_cm_event, with ENOMEM) for good: a pending Dial, Accept and an
// established connection must each fail with an error that says so, and,
// once reads work again, a new Listen and Dial must work as before.
func TestFaultCMEventsLost(t *testing.T) {
	needDevice(t)
	ignore := goleak.IgnoreCurrent()
	require.NoError(t, connsGone())
	before := resources()

	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		require.NoError(t, err)
		accepted <- c
	}()
	a, err := rdma.Dial("rdma", ln.Addr().String())
	require.NoError(t, err)
	b := <-accepted

	const getEvent = 12 // RDMA_USER_CM_CMD_GET_EVENT
	faults.Arm(1, 1<<30, syscall.ENOMEM, faults.UCMA(getEvent))
	acceptErr := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		acceptErr <- err
	}()
	// The dial's first event is the first that cannot be read.
	_, err = (&rdma.Dialer{Timeout: faultStep}).Dial("rdma", ln.Addr().String())
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the dial failed at once, not at its deadline: %v", err)
	require.ErrorContains(t, err, "connection manager events lost")
	require.ErrorIs(t, err, syscall.ENOMEM)
	requireOpError(t, err, "dial")

	select {
	case err = <-acceptErr:
	case <-time.After(faultStep):
		t.Fatal("Accept still waits")
	}
	require.ErrorContains(t, err, "connection manager events lost")
	requireOpError(t, err, "accept")
	for _, c := range []net.Conn{a, b} {
		c.SetReadDeadline(time.Now().Add(faultStep))
		_, err = c.Read(make([]byte, 1))
		require.ErrorContains(t, err, "connection manager events lost")
		requireOpError(t, err, "read")
	}
	require.NotZero(t, faults.Failed())
	faults.Disarm()

	a.Close()
	b.Close()
	ln.Close()
	// A new loop serves new connections.
	if errs := faultScenario(testAddr, make([]byte, 8<<10)); len(errs) > 0 {
		t.Fatalf("afterwards: %v", errs)
	}
	require.NoError(t, connsGone())
	require.NoError(t, backToBaseline(before))
	require.NoError(t, goleak.Find(ignore))
}

// packetScenario is the datagrams' scenario: two PacketConns, a small
// datagram each way (the second to a destination resolved from the
// first's source), a fragmented one, a batch, Close. A read waits
// packetWait at most: on one device nothing is lost unless a call failed,
// and a call that failed must show in an error, not as a datagram that
// never comes.
func packetScenario(addr string, data []byte) (errs []stepErr) {
	fail := func(step string, err error) bool {
		if err != nil {
			errs = append(errs, stepErr{step, err})
			return true
		}
		return false
	}
	a, err := rdma.ListenPacket("rdma", net.JoinHostPort(addr, "0"))
	if fail("listen packet", err) {
		return errs
	}
	defer func() { fail("close", a.Close()) }()
	b, err := rdma.ListenPacket("rdma", net.JoinHostPort(addr, "0"))
	if fail("listen packet", err) {
		return errs
	}
	defer func() { fail("close", b.Close()) }()
	a.SetDeadline(time.Now().Add(faultStep))
	b.SetWriteDeadline(time.Now().Add(faultStep))
	b.SetReadDeadline(time.Now().Add(packetWait))
	buf := make([]byte, 70000)
	exchange := func(from, to *rdma.PacketConn, msg []byte) (net.Addr, bool) {
		to.SetReadDeadline(time.Now().Add(packetWait))
		if _, err := from.WriteTo(msg, to.LocalAddr()); fail("write to", err) {
			return nil, false
		}
		n, src, err := to.ReadFrom(buf)
		if fail("read from", err) {
			return nil, false
		}
		if !bytes.Equal(buf[:n], msg) {
			fail("read from", errors.New("another datagram than sent"))
			return nil, false
		}
		return src, true
	}
	src, ok := exchange(a, b, data[:64])
	if !ok {
		return errs
	}
	if _, err := b.WriteTo(data[:100], src); fail("reply", err) {
		return errs
	}
	a.SetReadDeadline(time.Now().Add(packetWait))
	if _, _, err := a.ReadFrom(buf); fail("read reply", err) {
		return errs
	}
	if _, ok := exchange(a, b, data[:min(len(data), 20000)]); !ok {
		return errs
	}
	ms := make([]rdma.Message, 40)
	in := make([]rdma.Message, len(ms))
	for i := range ms {
		ms[i] = rdma.Message{Buffers: [][]byte{data[:32]}, Addr: b.LocalAddr()}
		in[i] = rdma.Message{Buffers: [][]byte{make([]byte, 32)}}
	}
	if _, err := a.WriteBatch(ms, 0); fail("write batch", err) {
		return errs
	}
	got := 0
	b.SetReadDeadline(time.Now().Add(packetWait))
	for got < len(ms) {
		n, err := b.ReadBatch(in, 0)
		if fail("read batch", err) {
			return errs
		}
		got += n
	}
	return errs
}

// packetWait bounds a read of the datagrams' scenario.
const packetWait = 3 * time.Second
