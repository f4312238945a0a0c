package rdma_test

import (
	"context"
	"errors"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of dialing: contexts and deadlines, refusals, a server that
// is not of this package, many dials at once and cancelled ones.

// TestDialContext: cancellation and deadlines during address resolution
// (10.77.0.2 is on the test bed's subnet but nobody answers for it; on
// iWARP, during rdma_connect, which connects TCP) and before dialing.
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

	// On siw each Dial left its rdma_connect running (the call connects
	// TCP, blocking while TCP tries, after asking the port mapper, iwpmd,
	// if it runs); its connection goes once the call returns: when TCP
	// gives up, after 2^(r+1)-1 s for r SYN retries, besides iwpmd's
	// wait for the silent peer's mapper (the test bed allows one retry
	// and runs no iwpmd: measured 6.4 s, 16.4 s with iwpmd; the kernel's
	// default of 6 retries takes two minutes).
	limit := 40 * time.Second
	if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_syn_retries"); err == nil {
		if r, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && r < 10 {
			limit = max(limit, time.Duration(1<<(r+1))*time.Second+30*time.Second)
		}
	}
	waitDeviceFor(t, limit, "the abandoned dials' connections gone", func(d rdma.DeviceStats, listed bool) bool {
		return !listed || d.Connections == 0
	})
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
	require.Contains(t, err.Error(), "refused: no RDMA listener on that port")
	var re *rdma.RefusedError
	require.ErrorAs(t, err, &re)
	require.Equal(t, rdma.RefusedNoListener, re.Reason)
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

// TestConcurrentDials opens 20 connections at once against one listener,
// as an HTTP client with 20 workers does: every one is set up, accepted and
// usable, and closing the listener while another burst is in progress
// leaves nothing behind (TestMain checks the goroutines and verbs objects).
func TestConcurrentDials(t *testing.T) {
	needDevice(t)
	const n = 20
	lc := rdma.ListenConfig{Backlog: n}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := rdma.Dial("rdma", ln.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			msg := []byte("hello")
			if _, err := c.Write(msg); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadFull(c, msg); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, uint64(n), ln.(*rdma.Listener).Stats().Accepted)

	// A second burst, cut short by Close: the dials fail or succeed, and
	// whatever was being set up is torn down.
	dials := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			d := rdma.Dialer{Timeout: 10 * time.Second}
			c, err := d.Dial("rdma", ln.Addr().String())
			if err == nil {
				c.Close()
			}
			dials <- err
		}()
	}
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, ln.Close())
	for i := 0; i < n; i++ {
		<-dials
	}
}

// Dials cancelled at random points of their handshake, many at once: each
// fails with the context's error or succeeds, the process does not crash
// (librdmacm used to process a connect response on the QP a cancelled
// Dial was destroying: SIGSEGV at address 0 in rdma_get_cm_event), and
// everything goes back (TestMain checks the device's objects).
func TestCancelledDials(t *testing.T) {
	needDevice(t)
	dials, rounds := 200, envInt(t, "RDMA_TEST_CANCEL_ROUNDS", 1)
	if testing.Short() {
		dials = 100
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	closeAccepted(ln)
	// Cancel anywhere from before the request goes out to after the
	// connection is up: twenty dials at once take several times as long
	// as one (they share the CPU), so spread the cancels over ten.
	var span time.Duration
	for range 2 { // the first sets the device up
		start := time.Now()
		c, err := rdma.Dial("rdma", ln.Addr().String())
		if siw() && errors.Is(err, syscall.ECONNABORTED) {
			// On iWARP the server is established before the dialer: its
			// Accept and Close can beat the dialer's own handshake.
			t.Logf("warm-up dial: %v", err)
			continue
		}
		require.NoError(t, err)
		c.Close()
		span = max(time.Millisecond, time.Since(start)*10)
	}
	if span == 0 {
		span = 20 * time.Millisecond
	}
	t.Logf("cancelling within %v of the start", span)
	recvsLeft := rdma.UnconnectedRecvsLeft()
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok, cancelled := 0, 0
		sem := make(chan struct{}, 20)
		for i := 0; i < dials; i++ {
			d := time.Duration(r.Int63n(int64(span)))
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(d, cancel)
				c, err := (&rdma.Dialer{Timeout: 30 * time.Second}).DialContext(ctx, "rdma", ln.Addr().String())
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					ok++
					c.Close()
					return
				}
				cancelled++
				if siw() && errors.Is(err, syscall.ECONNABORTED) {
					// As in the warm-up: the server's Accept and Close
					// (closeAccepted) can beat the dialer's handshake.
					return
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("a cancelled Dial: %v", err)
				}
			}()
		}
		wg.Wait()
		t.Logf("round %d: %d dials, %d connected, %d cancelled", round, dials, ok, cancelled)
	}
	// A dial given up before its QP was connected leaves receives posted
	// on it: the release flushes them before the QP goes (on iWARP
	// rdma_disconnect does not, for such a QP).
	ln.Close()
	rdma.WaitReleases()
	require.Equal(t, recvsLeft, rdma.UnconnectedRecvsLeft(), "releases of unconnected dials that left receives posted")
}

// TestDialServerWritesFirst: servers that write as soon as they accept
// (a banner, a greeting: SSH, SMTP, Redis's replicas). On iWARP the
// connection's first bytes after the MPA exchange must not reach the
// dialing side before it has taken the MPA reply: siw reads the reply
// and then finds more bytes behind it, a protocol error it reports as
// CONNECT_ERROR, while the server has the connection accepted.
func TestDialServerWritesFirst(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	wg := serve(ln, func(c net.Conn) {
		if _, err := c.Write([]byte("banner")); err == nil {
			io.Copy(io.Discard, c)
		}
	})
	defer wg.Wait()
	defer ln.Close()
	dials := 100
	if testing.Short() {
		dials = 20
	}
	for i := range dials {
		c, err := (&rdma.Dialer{Timeout: 10 * time.Second}).Dial("rdma", ln.Addr().String())
		require.NoError(t, err, "dial %d", i)
		got := make([]byte, 6)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err, "dial %d: the listener's %+v; the dialed end's %+v", i, ln.Stats(), c.(*rdma.Conn).Stats())
		require.Equal(t, "banner", string(got))
		require.NoError(t, c.Close())
	}
}
