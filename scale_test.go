package rdma_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// TestScale opens RDMA_TEST_SCALE_PAIRS connections at once, both ends in
// this process (make test runs it in a VM of its own with more memory, for
// 10,000 pairs: 20,000 connection ends), or as many as the machine's
// available memory allows with the default Options, which it states. Every
// connection carries a round trip; the test reports the registered memory,
// the completion queues and the verbs objects in use, and checks that
// everything goes back once the connections close.
func TestScale(t *testing.T) {
	needDevice(t)
	want, _ := strconv.Atoi(os.Getenv("RDMA_TEST_SCALE_PAIRS"))
	if want <= 0 {
		t.Skip("set RDMA_TEST_SCALE_PAIRS (make test runs this in a test bed VM of its own, with more memory)")
	}
	if testing.Short() {
		t.Skip("-short: thousands of connections under the race detector take too long")
	}
	perEnd := registered(t, rdma.Options{})
	// Registered memory is pinned: leave the rest of the machine a third
	// of what is available.
	avail := memAvailable(t)
	pairs := min(want, int(avail*2/3)/(2*perEnd))
	if pairs < want {
		t.Logf("the machine's available memory (%d MiB) holds %d pairs of %d KiB connection ends, not %d",
			avail>>20, pairs, perEnd>>10, want)
	}
	require.Positive(t, pairs)

	rdma.ReleaseIdleDevices()
	before := resources()
	lc := rdma.ListenConfig{Backlog: 1024}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	var (
		mu       sync.Mutex
		accepted []net.Conn
	)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c)
			mu.Unlock()
		}
	}()

	// Dial from a few goroutines at once, as a client pool would.
	start := time.Now()
	dialed := make([]net.Conn, pairs)
	errs := make(chan error, 16)
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				k := i
				i++
				next.Unlock()
				if k >= pairs {
					return
				}
				c, err := rdma.Dial("rdma", ln.Addr().String())
				if err != nil {
					errs <- err
					return
				}
				dialed[k] = c
			}
		}()
	}
	wg.Wait()
	close(errs)
	defer func() {
		for _, c := range dialed {
			if c != nil {
				c.Close()
			}
		}
	}()
	for err := range errs {
		require.NoError(t, err)
	}
	opened := time.Since(start)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) == pairs
	}, time.Minute, 10*time.Millisecond, "every connection accepted")

	// One round trip on each: client to server and back.
	mu.Lock()
	servers := accepted
	mu.Unlock()
	byLocal := make(map[string]net.Conn, pairs)
	for _, s := range servers {
		byLocal[s.RemoteAddr().String()] = s
	}
	b := make([]byte, 1)
	for k, c := range dialed {
		s := byLocal[c.LocalAddr().String()]
		require.NotNil(t, s, "connection %d's accepted end", k)
		_, err := c.Write([]byte{byte(k)})
		require.NoError(t, err)
		_, err = io.ReadFull(s, b)
		require.NoError(t, err)
		_, err = s.Write(b)
		require.NoError(t, err)
		_, err = io.ReadFull(c, b)
		require.NoError(t, err)
		require.Equal(t, byte(k), b[0])
	}

	devs := rdma.Devices()
	require.Len(t, devs, 1)
	d := devs[0]
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("%d connection ends open (dialed in %v): %d CQs of %d entries in all, %d MiB registered (%d KiB per end), Go heap %d MiB, %d goroutines; rdma resource show: %v",
		2*pairs, opened.Round(time.Millisecond), d.CompletionQueues, d.CQEntries, d.RegisteredBytes>>20, perEnd>>10,
		ms.HeapAlloc>>20, runtime.NumGoroutine(), resources())
	require.Equal(t, 2*pairs, d.Connections)
	require.Equal(t, 2*pairs*perEnd, d.RegisteredBytes)

	// Everything goes back: the connections, then the listener and the
	// device's lingering objects.
	var cw sync.WaitGroup
	for _, group := range [][]net.Conn{dialed, servers} {
		for w := range 8 {
			cw.Add(1)
			go func() {
				defer cw.Done()
				for k := w; k < len(group); k += 8 {
					group[k].Close()
				}
			}()
		}
	}
	cw.Wait()
	require.NoError(t, ln.Close())
	<-acceptDone
	rdma.ReleaseIdleDevices()
	after := resources()
	for deadline := time.Now().Add(30 * time.Second); !equalCounts(before, after) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		rdma.ReleaseIdleDevices()
		after = resources()
	}
	require.Equal(t, before, after, "verbs objects back to what they were")
	require.Empty(t, rdma.Devices())
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable(t *testing.T) int {
	f, err := os.Open("/proc/meminfo")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}
