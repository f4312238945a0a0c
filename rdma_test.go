package rdma_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/goverbs/rdma"
)

// Device tests run where RDMA_TEST_ADDR names the address of an interface
// with an RDMA device (the test bed sets it to its rxe netdev's address).
var testAddr = os.Getenv("RDMA_TEST_ADDR")

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

func TestEchoRoundTrip(t *testing.T) {
	c, s := pair(t, nil, nil)
	go io.Copy(s, s)
	transfer(t, c, c, "hello over rdma") // through the echo

	require.Equal(t, "rdma", c.LocalAddr().Network())
	require.Equal(t, c.LocalAddr().String(), s.RemoteAddr().String())
	require.Equal(t, c.RemoteAddr().String(), s.LocalAddr().String())
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
				io.Copy(c, c)
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

// TestEchoConcurrent: 16 connections, each 1,000 messages of random sizes
// from 1 B to 1 MiB, echoed back and verified by checksum.
func TestEchoConcurrent(t *testing.T) {
	needDevice(t)
	conns, msgs := 16, 1000
	if testing.Short() { // the race detector's run: same paths, less data
		conns, msgs = 4, 100
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	srv := serveEcho(ln)
	errs := make(chan error, conns)
	var bytesMoved int64
	var mu sync.Mutex
	for i := 0; i < conns; i++ {
		go func(seed int64) {
			errs <- func() error {
				r := rand.New(rand.NewSource(seed))
				c, err := rdma.Dial("rdma", ln.Addr().String())
				if err != nil {
					return err
				}
				defer c.Close()
				sent, got := sha256.New(), sha256.New()
				done := make(chan error, 1)
				var total int64
				sizes := make([]int, msgs)
				for j := range sizes {
					sizes[j] = randomSize(r)
				}
				sizes[0], sizes[1] = 1, 1<<20 // both ends, always
				for _, size := range sizes {
					total += int64(size)
				}
				go func() {
					n, err := io.CopyN(got, c, total)
					if err == nil && n != total {
						err = fmt.Errorf("read %d of %d bytes", n, total)
					}
					if err != nil {
						c.Close() // unblock the writer
					}
					done <- err
				}()
				buf := make([]byte, 1<<20)
				for _, size := range sizes {
					r.Read(buf[:size])
					sent.Write(buf[:size])
					if _, err := c.Write(buf[:size]); err != nil {
						if rerr := <-done; rerr != nil {
							return rerr
						}
						return err
					}
				}
				if err := <-done; err != nil {
					return err
				}
				if !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
					return errors.New("echoed bytes differ from sent bytes")
				}
				mu.Lock()
				bytesMoved += total
				mu.Unlock()
				return nil
			}()
		}(int64(i))
	}
	for i := 0; i < conns; i++ {
		require.NoError(t, <-errs)
	}
	t.Logf("%d connections echoed %d messages, %d MB each way", conns, conns*msgs, bytesMoved>>20)
	ln.Close()
	srv.Wait()
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

// TestFloodNoRNR: a writer much faster than its reader is held back by
// credits; the NIC never sees a receiver-not-ready condition.
func TestFloodNoRNR(t *testing.T) {
	c, s := pair(t, nil, &rdma.Dialer{Options: rdma.Options{BufferSize: 4096, RecvDepth: 4, SendDepth: 8}})
	before := rnrCounters(t)
	const total = 4 << 20
	go func() {
		buf := make([]byte, 1000)
		for sent := 0; sent < total; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
		c.CloseWrite()
	}()
	n := 0
	buf := make([]byte, 512)
	for i := 0; ; i++ {
		m, err := s.Read(buf)
		n += m
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if i%64 == 0 {
			time.Sleep(time.Millisecond) // the slow reader
		}
	}
	require.Equal(t, (total+999)/1000*1000, n) // whole writes of 1000 bytes
	require.Equal(t, before, rnrCounters(t))
	t.Logf("RNR counters unchanged: %v", before)
}

func requireOpError(t *testing.T, err error, op string) *net.OpError {
	t.Helper()
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "rdma", oe.Net)
	require.Equal(t, op, oe.Op)
	return oe
}

func TestDialRefused(t *testing.T) {
	needDevice(t)
	// A port that was just free: listen, note it, close.
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	d := rdma.Dialer{Timeout: 20 * time.Second}
	_, err = d.Dial("rdma", addr)
	require.Error(t, err)
	requireOpError(t, err, "dial")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Contains(t, err.Error(), "refused")
}

func TestNoDevice(t *testing.T) {
	needDevice(t)
	_, err := rdma.Dial("rdma", "127.0.0.1:7471")
	require.Error(t, err)
	requireOpError(t, err, "dial")
	require.ErrorIs(t, err, rdma.ErrNoDevice)
	require.Contains(t, err.Error(), "no RDMA device")

	_, err = rdma.Listen("rdma", "127.0.0.1:0")
	require.Error(t, err)
	requireOpError(t, err, "listen")
	require.ErrorIs(t, err, rdma.ErrNoDevice)
}

func TestGracefulClose(t *testing.T) {
	c, s := pair(t, nil, nil)
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	go func() {
		c.Write(data)
		c.Close()
	}()
	got, err := io.ReadAll(s)
	require.NoError(t, err)
	require.Equal(t, data, got)
	n, err := s.Read(make([]byte, 10))
	require.Equal(t, 0, n)
	require.Equal(t, io.EOF, err)
}

func TestCloseUnblocksAndIsIdempotent(t *testing.T) {
	c, _ := pair(t, nil, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, c.Close())
	err := <-errc
	requireOpError(t, err, "read")
	require.ErrorIs(t, err, net.ErrClosed)

	err = c.Close()
	requireOpError(t, err, "close")
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = c.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

func TestReadDeadline(t *testing.T) {
	c, s := pair(t, nil, nil)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := c.Read(make([]byte, 10))
	oe := requireOpError(t, err, "read")
	require.True(t, oe.Timeout())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	// Still usable after a timeout.
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	transfer(t, s, c, "ok")
}

// TestForeignClientRejected: a perftest client dialing our listener is
// refused, and the listener keeps serving.
func TestForeignClientRejected(t *testing.T) {
	needDevice(t)
	path, err := exec.LookPath("ib_send_lat")
	if err != nil {
		t.Skip("ib_send_lat (perftest) not installed")
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*rdma.Addr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-R", "-p", strconv.Itoa(port), "-n", "5", testAddr).CombinedOutput()
	require.Error(t, err, "ib_send_lat should fail against a foreign listener: %s", out)
	require.NoError(t, ctx.Err(), "ib_send_lat hung")

	go func() {
		if c, err := ln.Accept(); err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("still serving"))
	require.NoError(t, err)
	b := make([]byte, 13)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)
}

// TestForeignServer: dialing a perftest server fails with ErrProtocol (or
// is refused), never hangs.
func TestForeignServer(t *testing.T) {
	needDevice(t)
	path, err := exec.LookPath("ib_send_lat")
	if err != nil {
		t.Skip("ib_send_lat (perftest) not installed")
	}
	const port = 18515
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, path, "-R", "-p", strconv.Itoa(port), "-n", "5")
	require.NoError(t, srv.Start())
	defer srv.Wait()
	defer srv.Process.Kill()
	addr := net.JoinHostPort(testAddr, strconv.Itoa(port))
	var derr error
	for i := 0; i < 50; i++ { // until the server listens
		d := rdma.Dialer{Timeout: 10 * time.Second}
		var c net.Conn
		c, derr = d.Dial("rdma", addr)
		if c != nil {
			c.Close()
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Error(t, derr)
	requireOpError(t, derr, "dial")
	require.ErrorIs(t, derr, rdma.ErrProtocol)
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

// TestPeerKilled: a peer killed mid-transfer becomes an error on Read
// within seconds, not a hang.
func TestPeerKilled(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RDMA_TEST_PEER="+ln.Addr().String())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer cmd.Wait()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "connected\n", line)
	c, err := ln.Accept()
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, 64<<10)
	for read := 0; read < 1<<20; {
		n, err := c.Read(buf)
		require.NoError(t, err)
		read += n
	}
	require.NoError(t, cmd.Process.Kill())
	killed := time.Now()
	var rerr error
	for rerr == nil {
		_, rerr = c.Read(buf)
	}
	took := time.Since(killed)
	t.Logf("Read failed %v after the kill: %v", took.Round(time.Millisecond), rerr)
	requireOpError(t, rerr, "read")
	require.Less(t, took, 10*time.Second)
	_, werr := c.Write(buf)
	require.Error(t, werr)
}

// TestNetTestConn runs golang.org/x/net/nettest's net.Conn conformance
// suite over connection pairs made with Listen and Dial.
func TestNetTestConn(t *testing.T) {
	needDevice(t)
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		acc := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			acc <- c
		}()
		c1, err = rdma.Dial("rdma", ln.Addr().String())
		if err != nil {
			return nil, nil, nil, err
		}
		c2 = <-acc
		if c2 == nil {
			c1.Close()
			return nil, nil, nil, errors.New("accept failed")
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}

// TestHTTP serves HTTP over an rdma listener and fetches through an
// http.Transport whose DialContext is Dialer.DialContext.
func TestHTTP(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	body := bytes.Repeat([]byte("rdma"), 100<<10)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(body)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	d := &rdma.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	for i := 0; i < 3; i++ { // the second and third reuse the connection
		resp, err := client.Get("http://" + ln.Addr().String() + "/")
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, body, got)
	}
}

var testAddr6 = os.Getenv("RDMA_TEST_ADDR6")

// echoOnce dials addr, writes a message and reads it back through an echo
// server on ln.
func echoOnce(t *testing.T, ln net.Listener, network, addr string) (net.Conn, net.Conn) {
	t.Helper()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
		io.Copy(c, c)
	}()
	c, err := rdma.Dial(network, addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s := <-acc
	require.NotNil(t, s)
	t.Cleanup(func() { s.Close() })
	transfer(t, c, c, "ping") // through the echo
	return c, s
}

func TestIPv6(t *testing.T) {
	needDevice(t)
	if testAddr6 == "" {
		t.Skip("set RDMA_TEST_ADDR6 to an IPv6 address of an RDMA interface (make test does)")
	}
	ln, err := rdma.Listen("rdma6", net.JoinHostPort(testAddr6, "0"))
	require.NoError(t, err)
	defer ln.Close()
	addr := ln.Addr().(*rdma.Addr)
	require.Equal(t, net.ParseIP(testAddr6).String(), addr.IP.String())
	require.NotZero(t, addr.Port)
	c, s := echoOnce(t, ln, "rdma6", ln.Addr().String())
	require.Equal(t, testAddr6, c.RemoteAddr().(*rdma.Addr).IP.String())
	require.Equal(t, c.LocalAddr().String(), s.RemoteAddr().String())

	_, err = rdma.Dial("rdma4", ln.Addr().String())
	require.Error(t, err, "rdma4 cannot dial an IPv6 address")
}

// TestWildcardListener: a listener on all addresses ("[::]:0" or ":0")
// serves connections to the device's addresses.
func TestWildcardListener(t *testing.T) {
	needDevice(t)
	for _, tc := range []struct{ network, listen string }{
		{"rdma", ":0"},
		{"rdma6", "[::]:0"},
	} {
		t.Run(tc.network, func(t *testing.T) {
			ln, err := rdma.Listen(tc.network, tc.listen)
			require.NoError(t, err)
			defer ln.Close()
			port := strconv.Itoa(ln.Addr().(*rdma.Addr).Port)
			host := testAddr
			if tc.network == "rdma6" {
				if testAddr6 == "" {
					t.Skip("no RDMA_TEST_ADDR6")
				}
				host = testAddr6
			}
			c, _ := echoOnce(t, ln, "rdma", net.JoinHostPort(host, port))
			require.Equal(t, host, c.LocalAddr().(*rdma.Addr).IP.String())
		})
	}
}

func TestListenerCloseUnblocksAccept(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, ln.Close())
	err = <-errc
	requireOpError(t, err, "accept")
	require.ErrorIs(t, err, net.ErrClosed)
	err = ln.Close()
	requireOpError(t, err, "close")
	require.ErrorIs(t, err, net.ErrClosed)
}

// TestBacklog: connections beyond the backlog that nobody accepts are
// refused, and the queued ones are closed with the listener.
func TestBacklog(t *testing.T) {
	needDevice(t)
	lc := rdma.ListenConfig{Backlog: 2}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		c, err := rdma.Dial("rdma", ln.Addr().String())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	_, err = rdma.Dial("rdma", ln.Addr().String())
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.NoError(t, ln.Close())
	// The queued connections were closed by the listener: their peers
	// see the end of the stream.
	for _, c := range conns {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err)
		require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "read: %v", err)
	}
}

// TestDialContext: cancellation and deadlines during address resolution
// (10.77.0.2 is on the test bed's subnet but nobody answers for it) and
// before dialing.
func TestDialContext(t *testing.T) {
	needDevice(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var d rdma.Dialer
	_, err := d.DialContext(ctx, "rdma", net.JoinHostPort(testAddr, "1"))
	requireOpError(t, err, "dial")
	require.ErrorIs(t, err, context.Canceled)

	silent := os.Getenv("RDMA_TEST_SILENT_ADDR")
	if silent == "" {
		t.Skip("set RDMA_TEST_SILENT_ADDR to an address on the RDMA subnet that nobody answers for")
	}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = d.DialContext(ctx, "rdma", net.JoinHostPort(silent, "7471"))
	oe := requireOpError(t, err, "dial")
	require.True(t, oe.Timeout(), "%v", err)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	t.Logf("dial to a silent address gave up after %v: %v", time.Since(start).Round(time.Millisecond), err)

	d.Timeout = 300 * time.Millisecond
	_, err = d.Dial("rdma", net.JoinHostPort(silent, "7471"))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

func TestCloseWrite(t *testing.T) {
	c, s := pair(t, nil, nil)
	// c half-closes: s reads to EOF, then still writes back to c.
	_, err := c.Write([]byte("request"))
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	_, err = c.Write([]byte("x"))
	requireOpError(t, err, "write")
	got, err := io.ReadAll(s)
	require.NoError(t, err)
	require.Equal(t, "request", string(got))
	_, err = s.Write([]byte("response"))
	require.NoError(t, err)
	// More messages than the receive window: c keeps returning credits
	// after its fin.
	more := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	go func() {
		for range 8 {
			if _, err := s.Write(more); err != nil {
				return
			}
		}
		s.(*rdma.Conn).CloseWrite()
	}()
	got, err = io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "response"+strings.Repeat(string(more), 8), string(got))
}

// TestWritesCoalesce: while the peer has no receive buffer free, small
// Writes gather in one pending buffer instead of blocking, go out as one
// message when credit returns, and Reads take in several messages at once.
// Close delivers what is still pending before the fin.
func TestWritesCoalesce(t *testing.T) {
	opts := rdma.Options{BufferSize: 4096, SendDepth: 4, RecvDepth: 4}
	c, s := pair(t, &rdma.ListenConfig{Options: opts}, &rdma.Dialer{Options: opts})
	// Four messages fill the peer's window, then 40 writes of 100 bytes
	// fit the pending buffer: none of them may block, though s reads
	// nothing yet. The deadline turns a blocked Write into a failure.
	const writes, size = 44, 100
	var want []byte
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(10*time.Second)))
	for i := range writes {
		msg := bytes.Repeat([]byte{byte('A' + i%26)}, size)
		_, err := c.Write(msg)
		require.NoError(t, err, "write %d", i)
		want = append(want, msg...)
	}
	// Close waits for the fin's acknowledgement, and the fin goes behind
	// the pending data: it returns once s has read.
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()

	var got []byte
	reads := 0
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		reads++
	}
	require.NoError(t, <-closed)
	require.Equal(t, want, got)
	require.Less(t, reads, writes/4, "each Read should take in whole batches of writes")
}

// TestCloseReportsUndelivered: when the peer never reads, data a Write
// accepted but could not send is discarded at Close, and Close says so
// instead of returning nil. The peer reads what did arrive, then a reset.
func TestCloseReportsUndelivered(t *testing.T) {
	opts := rdma.Options{BufferSize: 4096, RecvDepth: 2, SendDepth: 2}
	c, s := pair(t, &rdma.ListenConfig{Options: opts}, &rdma.Dialer{Options: opts})
	require.NoError(t, c.SetNoDelay(true))
	msg := bytes.Repeat([]byte("z"), 100)
	for range 5 { // two messages fill the peer's window, three wait
		_, err := c.Write(msg)
		require.NoError(t, err)
	}
	err := c.Close()
	requireOpError(t, err, "close")
	require.ErrorIs(t, err, syscall.ETIMEDOUT)

	got, err := io.ReadAll(s)
	require.Error(t, err)
	require.NotErrorIs(t, err, io.EOF)
	require.Equal(t, bytes.Repeat(msg, 2), got)
}

// TestHoldAndNoDelay: once the peer has two earlier messages unconsumed, a
// small Write waits, and goes out, with the Writes after it, once the peer
// has read them; SetNoDelay(true) sends each Write at once. Either way
// every byte arrives, in order.
func TestHoldAndNoDelay(t *testing.T) {
	for _, noDelay := range []bool{false, true} {
		t.Run(fmt.Sprint("nodelay=", noDelay), func(t *testing.T) {
			c, s := pair(t, nil, nil)
			require.NoError(t, c.SetNoDelay(noDelay))
			var want []byte
			for i := range 10 {
				msg := bytes.Repeat([]byte{byte('a' + i)}, 100)
				_, err := c.Write(msg)
				require.NoError(t, err)
				want = append(want, msg...)
			}
			var got []byte
			first := -1
			buf := make([]byte, 64<<10)
			for len(got) < len(want) {
				n, err := s.Read(buf)
				require.NoError(t, err)
				if first < 0 {
					first = n
				}
				got = append(got, buf[:n]...)
			}
			require.Equal(t, want, got)
			if !noDelay {
				require.LessOrEqual(t, first, 200, "Writes 3 to 10 went out before the peer read 1 and 2")
			}
		})
	}
}

// TestPollModes: round trips and deadlines work in every poll mode.
func TestPollModes(t *testing.T) {
	for _, m := range []rdma.PollMode{rdma.PollAdaptive, rdma.PollBusy, rdma.PollEvent} {
		t.Run(m.String(), func(t *testing.T) {
			opts := rdma.Options{Poll: m}
			c, s := pair(t, &rdma.ListenConfig{Options: opts}, &rdma.Dialer{Options: opts})
			go io.Copy(s, s)
			buf := make([]byte, 64)
			for i := range 100 {
				binary.BigEndian.PutUint64(buf, uint64(i))
				_, err := c.Write(buf)
				require.NoError(t, err)
				_, err = io.ReadFull(c, buf)
				require.NoError(t, err)
				require.Equal(t, uint64(i), binary.BigEndian.Uint64(buf))
			}
			require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
			_, err := c.Read(buf)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		})
	}
	_, err := (&rdma.Dialer{Options: rdma.Options{Poll: 7}}).Dial("rdma", net.JoinHostPort(testAddr, "1"))
	require.ErrorContains(t, err, "poll mode")
}

// TestErrors pins the error contract in the spirit of net/error_test.go:
// what each failing call returns, its type and what it wraps.
func TestErrors(t *testing.T) {
	needDevice(t)
	c, s := pair(t, nil, nil)
	require.NoError(t, c.Close())
	for _, tc := range []struct {
		name string
		op   string
		err  func() error
		is   error
	}{
		{"read after close", "read", func() error { _, err := c.Read(make([]byte, 1)); return err }, net.ErrClosed},
		{"write after close", "write", func() error { _, err := c.Write([]byte("x")); return err }, net.ErrClosed},
		{"close twice", "close", c.Close, net.ErrClosed},
		{"close write after close", "close", c.CloseWrite, net.ErrClosed},
		{"set deadline after close", "set", func() error { return c.SetDeadline(time.Now()) }, net.ErrClosed},
		{"dial unknown network", "dial", func() error { _, err := rdma.Dial("udp", "10.0.0.1:1"); return err }, nil},
		{"dial bad address", "dial", func() error { _, err := rdma.Dial("rdma", "no-port"); return err }, nil},
		{"listen bad address", "listen", func() error { _, err := rdma.Listen("rdma", "no-port"); return err }, nil},
		{"dial no device", "dial", func() error { _, err := rdma.Dial("rdma", "127.0.0.1:1"); return err }, rdma.ErrNoDevice},
		{"listen no device", "listen", func() error { _, err := rdma.Listen("rdma", "127.0.0.1:0"); return err }, rdma.ErrNoDevice},
		{"dial bad options", "dial", func() error {
			d := rdma.Dialer{Options: rdma.Options{BufferSize: 1}}
			_, err := d.Dial("rdma", net.JoinHostPort(testAddr, "1"))
			return err
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			oe := requireOpError(t, err, tc.op)
			require.NotNil(t, oe.Err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
		})
	}
	// The peer of a closed connection reads EOF, bare.
	_, err := s.Read(make([]byte, 1))
	require.Equal(t, io.EOF, err)
	// A timeout is a net.Error with Timeout() true that stays usable.
	require.NoError(t, s.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err = s.Read(make([]byte, 1))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

func TestCloseRead(t *testing.T) {
	c, s := pair(t, nil, &rdma.Dialer{Options: rdma.Options{BufferSize: 1024, RecvDepth: 2}})
	_, err := s.Write([]byte("before"))
	require.NoError(t, err)
	require.NoError(t, c.CloseRead())
	n, err := c.Read(make([]byte, 10))
	require.Equal(t, 0, n)
	require.Equal(t, io.EOF, err)
	// The peer's writes are discarded but never block, far beyond the
	// receive window.
	buf := make([]byte, 1000)
	for i := 0; i < 100; i++ {
		_, err := s.Write(buf)
		require.NoError(t, err)
	}
	// The other direction still works.
	transfer(t, c, s, "after")
}

// TestSteadyStateAllocs: a round trip (Write, then Read of the echo, with
// the echo server and the poller running in the same process) allocates
// nothing once warmed up.
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c, s := pair(t, nil, nil)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if err != nil {
				return
			}
			if _, err := s.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	for _, size := range []int{64, 4096, 64 << 10} {
		msg := make([]byte, size)
		back := make([]byte, size)
		roundTrip := func() {
			if _, err := c.Write(msg); err != nil {
				panic(err)
			}
			if _, err := io.ReadFull(c, back); err != nil {
				panic(err)
			}
		}
		for i := 0; i < 50; i++ {
			roundTrip()
		}
		allocs := testing.AllocsPerRun(200, roundTrip)
		t.Logf("%d B round trip: %.2f allocations", size, allocs)
		require.Zero(t, allocs, "%d B round trip allocates", size)
	}
}

// TestManyConnections: 256 connections open at once, all usable. The CQ
// they share grows as they come.
func TestManyConnections(t *testing.T) {
	needDevice(t)
	n := 256
	if testing.Short() {
		n = 64
	}
	opts := rdma.Options{BufferSize: 4096, SendDepth: 4, RecvDepth: 4}
	lc := rdma.ListenConfig{Backlog: n, Options: opts}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	srv := serveEcho(ln)
	defer srv.Wait()
	d := rdma.Dialer{Options: opts}
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := d.Dial("rdma", ln.Addr().String())
		require.NoError(t, err, "connection %d", i)
		conns = append(conns, c)
	}
	for i, c := range conns {
		transfer(t, c, c, fmt.Sprintf("conn %d", i)) // through the echo
	}
	t.Logf("%d connections open; rdma resource show: %v", n, resources())
}

// BenchmarkRoundTrip measures a Write and its echo, in the default and the
// busy poll mode (make microbench runs it in the VM).
func BenchmarkRoundTrip(b *testing.B) {
	for _, m := range []rdma.PollMode{rdma.PollAdaptive, rdma.PollBusy} {
		for _, size := range []int{64, 4096} {
			b.Run(fmt.Sprintf("%s/%d", m, size), func(b *testing.B) {
				opts := rdma.Options{Poll: m}
				c, s := pair(b, &rdma.ListenConfig{Options: opts}, &rdma.Dialer{Options: opts})
				go io.Copy(s, s)
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkStream measures one-way streaming of Writes of a given size; the
// clock covers delivery, not just queuing: it stops when the reader has
// every byte.
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{64, 4096, 65536} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			c, s := pair(b, nil, nil)
			done := make(chan int64, 1)
			go func() {
				n, _ := io.Copy(io.Discard, s)
				done <- n
			}()
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			var sent int64
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				sent += int64(size)
			}
			if err := c.CloseWrite(); err != nil {
				b.Fatal(err)
			}
			if got := <-done; got != sent {
				b.Fatalf("reader got %d bytes, %d were written", got, sent)
			}
		})
	}
}
