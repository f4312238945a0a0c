package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goverbs/rdma"
	"github.com/goverbs/rdma/internal/wire"
)

// Device tests run where RDMA_TEST_ADDR names the address of an interface
// with an RDMA device (the test bed sets it to its rxe netdev's address).
var testAddr = os.Getenv("RDMA_TEST_ADDR")

var testAddr6 = os.Getenv("RDMA_TEST_ADDR6")

// siw reports whether the device tests run on soft-iWARP (the test bed's
// --provider siw), for the few checks where it differs by design; see
// needNotSiw.
func siw() bool { return os.Getenv("RDMA_TEST_PROVIDER") == "siw" }

// registered is what a connection with options o registers on the test
// bed's device: Options.RegisteredMemory, and on iWARP the header slots.
func registered(t testing.TB, o rdma.Options) int {
	t.Helper()
	n, err := o.RegisteredMemory()
	require.NoError(t, err)
	if siw() {
		// An 80-byte header slot per receive, in whole pages.
		d := o.RecvDepth
		if d == 0 {
			d = rdma.DefaultRecvDepth
		}
		n += ((d+wire.CtrlDepth+wire.FinSlots)*80 + 4095) &^ 4095
	}
	return n
}

// needNotSiw skips a test that cannot run on soft-iWARP, for the reason
// given.
func needNotSiw(t testing.TB, why string) {
	t.Helper()
	if siw() {
		t.Skip("not on siw: " + why)
	}
}

func needDevice(t testing.TB) {
	t.Helper()
	if testAddr == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test does, in the VM)")
	}
}

// TestMain checks, after all tests, that no goroutine is left and that the
// verbs objects of the whole device are back to what they were before.
func TestMain(m *testing.M) {
	if os.Getenv("RDMA_TEST_PEER") != "" {
		os.Exit(runPeer())
	}
	if os.Getenv("RDMA_TEST_ROLE") == "agent" {
		os.Exit(runAgent())
	}
	if role := os.Getenv("RDMA_TEST_MEMLOCK_ROLE"); role != "" {
		os.Exit(runMemlockChild(role))
	}
	if os.Getenv("RDMA_TEST_POST_HELD") != "" {
		// The software providers' connections post as a NIC's do, with
		// their lock held (make test runs the random test so).
		rdma.SetPostHeld(true)
	}
	var before map[string]int
	if testAddr != "" {
		// librdmacm opens each device once per process and keeps it open
		// (the ctx count); take the baseline after that has happened.
		if ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0")); err == nil {
			ln.Close()
		}
		before = resources()
	}
	code := m.Run()
	// A test may leave the last teardown to a goroutine (a server side
	// closed once its peer's fin arrives, a listener's eviction), and one
	// whose peer vanished takes seconds: wait for the connections to be
	// gone before the devices are let go. One never closed keeps its
	// device, and goleak below finds the device's goroutines.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		conns := 0
		for _, d := range rdma.Devices() {
			conns += d.Connections
		}
		if conns == 0 {
			break
		}
	}
	rdma.ReleaseIdleDevices()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	if code == 0 && before != nil {
		after := resources()
		for deadline := time.Now().Add(5 * time.Second); !equalCounts(before, after) && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			after = resources()
		}
		if !equalCounts(before, after) {
			fmt.Fprintf(os.Stderr, "verbs objects leaked: before %v, after %v\n", before, after)
			code = 1
		} else {
			fmt.Printf("rdma resource show: back to baseline %v\n", after)
		}
	}
	os.Exit(code)
}

var resourceRE = regexp.MustCompile(`\b(pd|cq|qp|cm_id|mr|ctx|srq) (\d+)`)

// resources sums `rdma resource show` over all devices.
func resources() map[string]int {
	out, err := exec.Command("rdma", "resource", "show").Output()
	if err != nil {
		return map[string]int{"error": 1}
	}
	m := map[string]int{}
	for _, f := range resourceRE.FindAllStringSubmatch(string(out), -1) {
		n, _ := strconv.Atoi(f[2])
		m[f[1]] += n
	}
	return m
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// pair returns a connected (dialed, accepted) pair and closes everything at
// the end of the test.
func pair(t testing.TB, lc *rdma.ListenConfig, d *rdma.Dialer) (*rdma.Conn, net.Conn) {
	t.Helper()
	needDevice(t)
	if lc == nil {
		lc = &rdma.ListenConfig{}
	}
	if d == nil {
		d = &rdma.Dialer{}
	}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	nc, err := d.DialContext(context.Background(), "rdma", ln.Addr().String())
	require.NoError(t, err)
	r := <-ch
	require.NoError(t, r.err)
	t.Cleanup(func() {
		nc.Close()
		r.c.Close()
	})
	return nc.(*rdma.Conn), r.c
}

// transfer writes msg to from and requires it to arrive, whole, at to.
func transfer(t *testing.T, from, to net.Conn, msg string) {
	t.Helper()
	_, err := from.Write([]byte(msg))
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(to, got)
	require.NoError(t, err)
	require.Equal(t, msg, string(got))
}

// serveEcho accepts connections on ln until it is closed and echoes each
// one back to itself; Wait waits for the echoing goroutines to finish.
func serveEcho(ln net.Listener) *sync.WaitGroup {
	return serve(ln, func(c net.Conn) { io.Copy(c, c) })
}

// serve accepts connections on ln until it is closed and runs handle on
// each, on a goroutine of its own, closing the connection after it; Wait
// waits for those goroutines to finish.
func serve(ln net.Listener, handle func(net.Conn)) *sync.WaitGroup {
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return &wg
}

// randomSize draws message sizes from 1 B to 1 MiB, log-uniformly and
// skewed small (most RPC traffic is), so that every size class is covered
// while the whole test moves a volume the emulated test bed can carry.
func randomSize(r *rand.Rand) int {
	if r.Intn(50) == 0 {
		return 1 << 20 >> r.Intn(4) // the large end: 128 KiB .. 1 MiB
	}
	return 1 + r.Intn(1<<r.Intn(14))
}

// rnrCounters reads the RNR counters of every RDMA link.
func rnrCounters(t testing.TB) map[string]int {
	out, err := exec.Command("rdma", "statistic", "show").Output()
	require.NoError(t, err, "rdma statistic show")
	m := map[string]int{}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if strings.Contains(f[i], "rnr") {
			n, err := strconv.Atoi(f[i+1])
			if err == nil {
				m[f[i]] += n
			}
		}
	}
	require.NotEmpty(t, m, "no RNR counters in: %s", out)
	return m
}

func requireOpError(t *testing.T, err error, op string) *net.OpError {
	t.Helper()
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "rdma", oe.Net)
	require.Equal(t, op, oe.Op)
	return oe
}

// runPeer is the child process of TestPeerKilled: it dials the parent and
// writes until killed.
func runPeer() int {
	c, err := rdma.Dial("rdma", os.Getenv("RDMA_TEST_PEER"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("connected")
	buf := make([]byte, 4096)
	for {
		if _, err := c.Write(buf); err != nil {
			return 1
		}
	}
}

// deviceStat returns the totals of the test device's entry in rdma.Devices,
// and whether it is listed.
func deviceStat() (rdma.DeviceStats, bool) {
	rdma.WaitReleases()
	for _, d := range rdma.Devices() {
		return d, true // the test bed has one device
	}
	return rdma.DeviceStats{}, false
}

// pooledQPs is how many QPs the device's pool keeps for n closed
// connection ends: none on iWARP, which keeps none.
func pooledQPs(n int) int {
	if siw() {
		return 0
	}
	return n
}

// waitDevice waits up to 5 s for the device's entry to satisfy ok.
func waitDevice(t *testing.T, what string, ok func(d rdma.DeviceStats, listed bool) bool) rdma.DeviceStats {
	t.Helper()
	return waitDeviceFor(t, 5*time.Second, what, ok)
}

// waitDeviceFor waits up to limit for the device's entry to satisfy ok.
func waitDeviceFor(t *testing.T, limit time.Duration, what string, ok func(d rdma.DeviceStats, listed bool) bool) rdma.DeviceStats {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		d, listed := deviceStat()
		if ok(d, listed) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: device still %+v (listed %v)", what, d, listed)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// deviceTotals sums rdma.Devices: connections and registered bytes.
func deviceTotals() (conns, registered int) {
	rdma.WaitReleases()
	for _, d := range rdma.Devices() {
		conns += d.Connections
		registered += d.RegisteredBytes
	}
	return conns, registered
}

// waitDeviceTotals waits up to 10 seconds for the device totals to be
// back to base: everything the test set up is released.
func waitDeviceTotals(t *testing.T, baseConns, baseRegistered int) {
	t.Helper()
	conns, reg := deviceTotals()
	for deadline := time.Now().Add(10 * time.Second); (conns != baseConns || reg != baseRegistered) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		conns, reg = deviceTotals()
	}
	if conns != baseConns || reg != baseRegistered {
		t.Errorf("after closing everything the devices hold %d connections and %d registered bytes, before the test %d and %d",
			conns, reg, baseConns, baseRegistered)
	}
}

// roundTrip writes msg to c, an echoed connection, and requires it back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	defer c.SetDeadline(time.Time{})
	transfer(t, c, c, msg)
}

// within runs f and fails the test if it has not returned after d: for
// calls that must not hang (d is a hang bound, far above what the call
// takes, not a performance figure). f runs on a goroutine of its own, so
// it reports failures as its error instead of through t.
func within(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(d):
		dumpGoroutines()
		t.Fatalf("%s did not return in %v (goroutines dumped to stderr)", what, d)
	}
}

// dumpGoroutines writes every goroutine's stack to stderr: what a hang
// waits on.
func dumpGoroutines() {
	pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
}

// roundTripNew dials addr, writes msg, reads it at the accepted end and
// closes both: a connection's whole life, for within.
func roundTripNew(addr string, accepted <-chan net.Conn, msg string) error {
	c, err := (&rdma.Dialer{Timeout: 15 * time.Second}).Dial("rdma", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	var s net.Conn
	select {
	case s = <-accepted:
	case <-time.After(15 * time.Second):
		return errors.New("nothing accepted")
	}
	defer s.Close()
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	b := make([]byte, len(msg))
	s.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.ReadFull(s, b); err != nil {
		return err
	}
	if string(b) != msg {
		return errors.New("corrupted")
	}
	if err := c.Close(); err != nil {
		return err
	}
	return s.Close()
}

// closeAccepted closes every connection ln accepts, until Accept fails.
func closeAccepted(ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// acceptAll serves ln's Accept into a channel until it fails.
func acceptAll(ln net.Listener) <-chan net.Conn {
	ch := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	return ch
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// envInt is the integer in the environment variable name, or def when it
// is not set; a value that is not an integer fails the test.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}
