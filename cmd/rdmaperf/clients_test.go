package main

import (
	"context"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		name   string
		counts []int
		want   fairness
	}{
		{"none", nil, fairness{}},
		{"one", []int{7}, fairness{min: 7, p10: 7, median: 7, max: 7}},
		{"even", []int{5, 5, 5, 5}, fairness{min: 5, p10: 5, median: 5, max: 5}},
		// Nearest rank: the median of four is the second smallest.
		{"four", []int{9, 1, 4, 8}, fairness{min: 1, p10: 1, median: 4, max: 9, starved: 1}},
		// Exactly half the median is not fewer than half.
		{"half", []int{5, 10, 10, 10, 4}, fairness{min: 4, p10: 4, median: 10, max: 10, starved: 1}},
		// An odd median: 4 < 9/2 but 5 is not.
		{"odd median", []int{4, 5, 9, 9, 9}, fairness{min: 4, p10: 4, median: 9, max: 9, starved: 1}},
		// Connections that got nothing are the starved ones the test is for.
		{"starving", []int{0, 0, 20, 19, 21, 20, 18, 22, 20, 20}, fairness{min: 0, p10: 0, median: 20, max: 22, starved: 2}},
		{"p10 of twenty", []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, fairness{min: 1, p10: 2, median: 10, max: 20, starved: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]int(nil), tc.counts...)
			require.Equal(t, tc.want, spread(in))
			require.Equal(t, tc.counts, in, "spread reordered its input")
		})
	}
}

func TestClients(t *testing.T) {
	var (
		mu    sync.Mutex
		seen  = map[int]clientSample{}
		addrs = map[string]bool{}
	)
	r := &run{dial: startTCP(t), size: 64, duration: 200 * time.Millisecond, conns: 20,
		perConn: func(i int, addr string, s clientSample) {
			mu.Lock()
			defer mu.Unlock()
			seen[i] = s
			addrs[addr] = true
		}}
	m, err := r.clients()
	require.NoError(t, err)
	require.Len(t, seen, 20)
	require.Len(t, addrs, 20, "each connection its own address")
	total := 0
	for _, s := range seen {
		total += s.done
		require.GreaterOrEqual(t, len(s.lat), s.done, "every request done in the window was timed")
		require.False(t, s.unanswered)
		require.Len(t, s.perSecond, 1, "a window of 0.2 s has one (partial) second")
		require.Equal(t, s.done, s.perSecond[0])
	}
	require.Equal(t, float64(total), m["count"])
	require.Equal(t, 0.2, m["seconds"])
	require.InDelta(t, float64(total)/0.2, m["req_s"], 1e-6)
	require.Positive(t, m["p50_us"])
	require.GreaterOrEqual(t, m["p99_us"], m["p50_us"])
	require.GreaterOrEqual(t, m["max_us"], m["p99_us"])
	require.LessOrEqual(t, m["min_req"], m["p10_req"])
	require.LessOrEqual(t, m["p10_req"], m["median_req"])
	require.LessOrEqual(t, m["median_req"], m["max_req"])
	require.Positive(t, m["min_req"], "loopback TCP served every connection")
	require.Positive(t, m["dial_s"])
	require.GreaterOrEqual(t, m["close_s"], 0.0)
	require.Zero(t, m["unanswered"])
	require.NotContains(t, m, "release_s", "TCP has no device to release")
	require.Contains(t, describe(Result{Impl: "rdmaperf/tcp", Workload: "clients", Size: 64, Conns: 20, Metrics: m}),
		"requests per connection in 0.20 s: min ")
}

// TestClientsUnanswered: a connection whose answers stop is counted as
// unanswered once the grace after the window has passed, not waited for
// forever, and the others still count.
func TestClientsUnanswered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for first := true; ; first = false {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !first {
				go func() { handle(c, false, nil); c.Close() }()
				continue
			}
			// The first connection is accepted and then never answered.
			go func() {
				readHeader(c)
				c.Write([]byte{readyByte})
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	r := &run{size: 64, duration: 100 * time.Millisecond, grace: 100 * time.Millisecond, conns: 4,
		dial: func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }}
	m, err := r.clients()
	require.NoError(t, err)
	require.Equal(t, 1.0, m["unanswered"])
	require.Zero(t, m["min_req"])
	require.Equal(t, 1.0, m["starved"])
	require.Positive(t, m["median_req"])
}

// TestClientsDialFailure: a dial that fails fails the test, with how many
// failed, and the connections opened are closed.
func TestClientsDialFailure(t *testing.T) {
	dial := startTCP(t)
	var mu sync.Mutex
	n, opened := 0, []net.Conn{}
	r := &run{size: 64, duration: time.Second, conns: 10, dial: func() (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n%5 == 0 {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
		c, err := dial()
		if err == nil {
			opened = append(opened, c)
		}
		return c, err
	}}
	_, err := r.clients()
	require.ErrorContains(t, err, "2 of 10 connections failed")
	require.Len(t, opened, 8)
	for _, c := range opened {
		_, err := c.Write([]byte{0})
		require.ErrorIs(t, err, net.ErrClosed, "a connection left open")
	}
}

func TestParseArgsClients(t *testing.T) {
	var out strings.Builder
	c, err := parseArgs([]string{"-c", "h", "-test", "clients", "-P", "1000", "-t", "8", "-perconn", "f"}, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, "clients", c.workload)
	require.Equal(t, 1000, c.conns)
	require.Equal(t, 8*time.Second, c.duration)
	require.Equal(t, 64, c.size)
	require.Equal(t, "f", c.perConn)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-c", "h", "-test", "clients", "-n", "5"}, "-test clients runs for -t seconds: no -n"},
		{[]string{"-c", "h", "-test", "clients", "-P", "0"}, "-conns must be at least 1"},
		{[]string{"-c", "h", "-test", "lat", "-perconn", "f"}, "-perconn is for -test clients"},
		{[]string{"-c", "h", "-test", "clients", "-R"}, "not clients"},
	} {
		out.Reset()
		_, err := parseArgs(tc.args, &out)
		require.Error(t, err, "%q", tc.args)
		require.Contains(t, out.String(), tc.says)
	}
}

// TestClientsDevice runs the many-client test over RDMA, both ends in one
// process as bench/clients.sh runs it, with enough connections that the
// device puts them on several CQs (about 300 ends each on rxe): every
// connection is answered, and the device's resources come back.
func TestClientsDevice(t *testing.T) {
	host := os.Getenv("RDMA_TEST_ADDR")
	if host == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test runs this in the VM)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := command(ctx, t, "-local", "-addr", net.JoinHostPort(host, "0"), "-net", "rdma", "-test", "clients", "-P", "400", "-t", "2")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	out := string(b)
	t.Logf("rdmaperf clients:\n%s%s", out, stderr.String())
	require.NoError(t, err)
	m := regexp.MustCompile(`x 400 conns: .* min (\d+), p10 \d+, median (\d+), max \d+, \d+ under half the median(, \d+ unanswered)?; .*device resources released`).FindStringSubmatch(out)
	require.NotNil(t, m, "no clients line with the device's release")
	require.Empty(t, m[3], "connections left unanswered")
	least, _ := strconv.Atoi(m[1])
	require.Positive(t, least, "a connection got no answer in the window")
}
