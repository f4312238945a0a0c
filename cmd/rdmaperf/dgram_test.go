package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Over TCP the datagram tests send their datagrams over Go's UDP, on the
// loopback address of the connection: the same client and server logic as
// over rdma, without a device.

func TestDgramLatency(t *testing.T) {
	r := &run{dial: startTCP(t), size: 64, count: 200, warmup: 5, conns: 1}
	m, err := r.dgramLatency()
	if err != nil {
		t.Fatal(err)
	}
	if m["count"]+m["lost"] != 200 || m["p50_us"] <= 0 || m["p99_us"] < m["p50_us"] {
		t.Errorf("implausible datagram latency figures %v", m)
	}
}

func TestDgramStream(t *testing.T) {
	for _, batch := range []int{1, 8} {
		r := &run{dial: startTCP(t), size: 1000, count: 50, conns: 1, batch: batch}
		m, err := r.dgramStream()
		if err != nil {
			t.Fatal(err)
		}
		// A count is of WriteTo or WriteBatch calls: batch datagrams each.
		sent := float64(50 * batch)
		if m["count"] != sent || m["recv_count"] <= 0 || m["recv_count"] > sent ||
			m["msg_s"] <= 0 || m["recv_mb_s"] <= 0 || m["loss_pct"] < 0 || m["loss_pct"] >= 100 {
			t.Errorf("batch %d: implausible datagram stream figures %v", batch, m)
		}
	}
}

// dgramClient runs rdmaperf -json with args and returns its record.
func dgramClient(t *testing.T, args ...string) Result {
	t.Helper()
	doc, _, err := runJSON(t, args...)
	require.NoError(t, err)
	return doc.Rdmaperf
}

// checkDgramCommand runs the three datagram tests against the server at
// addr over netw and checks their records, and the rate test's document
// as iperf3's UDP one.
func checkDgramCommand(t *testing.T, addr, netw, self string) {
	t.Helper()
	lat := dgramClient(t, "-c", addr, "-net", netw, "-test", "dgram-lat", "-t", "0.3")
	if lat.Impl != self || lat.Workload != "dgram-lat" || lat.Size != 64 || lat.Metrics["p50_us"] <= 0 {
		t.Errorf("dgram-lat: %+v", lat)
	}
	doc, tree, err := runJSON(t, "-c", addr, "-net", netw, "-test", "dgram-rate", "-batch", "16", "-t", "0.3")
	require.NoError(t, err)
	rate := doc.Rdmaperf
	if rate.Impl != self+" batch" || rate.Workload != "dgram-rate" || rate.Metrics["batch"] != 16 ||
		rate.Metrics["recv_msg_s"] <= 0 || rate.Metrics["msg_s"] < rate.Metrics["recv_msg_s"]*0.5 {
		t.Errorf("dgram-rate -batch 16: %+v", rate)
	}
	requireDgramDoc(t, doc, tree, iperfProtocol(netw, "dgram-rate"), 64)
	// The default size is the largest datagram, which over rdma goes in
	// fragments.
	bw := dgramClient(t, "-c", addr, "-net", netw, "-test", "dgram-bw", "-t", "0.3")
	if bw.Impl != self || bw.Size != maxDatagram || bw.Metrics["recv_mb_s"] <= 0 {
		t.Errorf("dgram-bw: %+v", bw)
	}
}

// TestCommandDgramUDP runs the datagram tests as users do, over Go's UDP
// (-net udp) against a server of -net udp.
func TestCommandDgramUDP(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the command as processes")
	}
	addr := startServer(t, "-net", "udp", "-addr", "127.0.0.1:0")
	checkDgramCommand(t, addr, "udp", "rdmaperf/udp")
}

// TestCommandDgramDevice runs them over PacketConns.
func TestCommandDgramDevice(t *testing.T) {
	host := os.Getenv("RDMA_TEST_ADDR")
	if host == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test runs this in the VM)")
	}
	addr := startServer(t, "-addr", host+":0")
	checkDgramCommand(t, addr, "rdma", "rdmaperf/rdma")
}

func TestParseArgsDgram(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want func(*config) bool
	}{
		{[]string{"-c", "h", "-test", "dgram-lat"}, func(c *config) bool { return c.size == 64 && c.batch == 1 && c.netw == "rdma" }},
		{[]string{"-c", "h", "-test", "dgram-rate", "-batch", "32", "-net", "udp"}, func(c *config) bool {
			return c.size == 64 && c.batch == 32 && c.netw == "udp"
		}},
		{[]string{"-c", "h", "-test", "dgram-bw"}, func(c *config) bool { return c.size == maxDatagram }},
		{[]string{"-c", "h", "-test", "dgram-bw", "-l", "4092"}, func(c *config) bool { return c.size == 4092 }},
		{[]string{"-s", "-net", "udp"}, func(c *config) bool { return c.server && c.netw == "udp" }},
	} {
		var out strings.Builder
		c, err := parseArgs(tc.args, &out)
		if err != nil || !tc.want(c) {
			t.Errorf("%q: got %+v, %v (%s)", tc.args, c, err, out.String())
		}
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-c", "h", "-test", "dgram-bw", "-size", "65536"}, "at most 65507 bytes"},
		{[]string{"-c", "h", "-test", "dgram-lat", "-net", "tcp"}, "-net rdma or udp"},
		{[]string{"-c", "h", "-test", "lat", "-net", "udp"}, "not lat"},
		{[]string{"-c", "h", "-test", "dgram-rate", "-batch", "0"}, "-batch must be at least 1"},
		{[]string{"-c", "h", "-test", "dgram-rate", "-P", "2"}, "no -conns"},
		{[]string{"-c", "h", "-test", "dgram-rate", "-R"}, "not dgram-rate"},
	} {
		var out strings.Builder
		if c, err := parseArgs(tc.args, &out); err == nil {
			t.Errorf("%q accepted: %+v", tc.args, c)
		} else if !strings.Contains(out.String(), tc.says) {
			t.Errorf("%q: the complaint %q does not say %q", tc.args, out.String(), tc.says)
		}
	}
}

func TestRenderDgram(t *testing.T) {
	lat := func(round int, impl string, p50 float64) Result {
		return Result{Round: round, Impl: impl, Workload: "dgram-lat", Size: 64, Conns: 1,
			Metrics: map[string]float64{"p50_us": p50, "p99_us": 2 * p50, "avg_us": p50, "lost": 0}}
	}
	rate := func(round int, impl string, recv float64) Result {
		return Result{Round: round, Impl: impl, Workload: "dgram-rate", Size: 64, Conns: 1,
			Metrics: map[string]float64{"recv_msg_s": recv, "msg_s": 2 * recv, "loss_pct": 50}}
	}
	br := &benchRun{
		Date: "2026-01-01T00:00:00Z", Kernel: "6.1", Environment: "test bed",
		Results: []Result{
			{Round: 1, Impl: "rdmaperf/rdma", Workload: "lat", Size: 64, Conns: 1, Metrics: map[string]float64{"p50_us": 10, "p99_us": 30, "avg_us": 12}},
			lat(1, "rdmaperf/rdma", 20), lat(1, "perftest", 10), lat(1, "rdmaperf/udp", 40),
			lat(2, "rdmaperf/rdma", 30), lat(2, "perftest", 10), lat(2, "rdmaperf/udp", 40),
			rate(1, "rdmaperf/rdma batch", 900), rate(1, "perftest", 1000), rate(1, "rdmaperf/udp", 500), rate(1, "rdmaperf/udp batch", 1000),
			{Round: 1, Impl: "rdmaperf/rdma batch", Workload: "dgram-bw", Size: maxDatagram, Conns: 1, Error: "timed out"},
		},
	}
	var b strings.Builder
	renderMarkdown(&b, br)
	out := b.String()
	for _, want := range []string{
		// The stream rows keep their table; the datagrams have their own.
		"| latency (one-way) 64 B | p50 µs | 10.0 |",
		"## Datagrams",
		"| workload | figure | this library, WriteTo | this library, WriteBatch |",
		// Medians of rounds (20, 30), ratios the medians of per-round
		// ratios (2, 3 ÷ perftest; 0.5, 0.75 ÷ Go UDP).
		"| datagram latency (one-way) 64 B | p50 µs | 25.0 | — | — | — | 10.0 | 40.0 | — | 2.50 | 0.62 |",
		// What arrived and what was sent; losses without ratios.
		"| datagram rate 64 B | msg/s received | — | 900 | — | — | 1000 | 500 | 1000 |  |  | 0.90 | 1.80 | 0.90 |",
		"| datagram rate 64 B | % lost | — | 50.0 | — | — | 50.0 | 50.0 | 50.0 |  |  |  |  |  |  |  |",
		"| 64 B round trip p50 ≤ 1.3× ib_send_lat -c UD | 2.50 | no |",
		"| 64 B round trip p50 below Go UDP's | 0.62 | yes |",
		"| 64 B rate with WriteBatch (received) ≥ 0.8× ib_send_bw -c UD | 0.90 | yes |",
		"| 64 B rate with WriteBatch (received) ≥ Go UDP's, WriteTo and WriteBatch | 1.80, 0.90 | no |",
		"| largest datagrams (received) ≥ 0.8× the bytes/s of ib_send_bw -c UD at the MTU | — (perftest) | not measured |",
		"rdmaperf/rdma batch, datagram throughput 65507 B (round 1): timed out",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered table lacks %q:\n%s", want, out)
		}
	}
}
